//! The master's state directory: snapshots, and a journal of the core's inputs written with
//! group commit, so a master that is killed comes back knowing everything it acknowledged.
//!
//! Files, by generation `G`: `journal-G.log` holds the inputs applied since `snapshot-G.snap`
//! was taken (generation 0 has no snapshot: it starts from an empty master). Every journal
//! starts with a header naming its generation and the configuration its inputs were applied
//! under, and a journal the next generation follows ends with an end record (the format is
//! `mooring_proto::journal`'s). `journal-spare.log` is a retired journal kept for the next
//! generation to reuse (see `JournalFile`).
//!
//! **What is guaranteed.** Records are appended in the order the master applied them. A
//! writer thread writes whatever has accumulated and calls `fdatasync`, then wakes the
//! requests it covered: a reply that acknowledges a change (a put's start and end, a removal,
//! a mount...) leaves only once its record is on disk, while requests that arrive during one
//! sync share the next (group commit). After a crash the disk holds a prefix of the applied
//! history — at most the tail after the last sync is lost, and nothing in it was acknowledged
//! except reads, whose leases a restarted master replaces with fresh ones for every object.
//! If a sync fails, the master stops acknowledging changes until it is restarted from the
//! directory: a failed `fsync` may have dropped the bytes it covered, so no later success can
//! vouch for them. The changes that sync covered are answered `RPC_FAIL` (applied, but whether
//! they survive a restart is unknown), later ones are refused with `FILE_WRITE_FAIL` before
//! they are applied. A write that fails because the
//! directory is full is different: nothing was lost, so the writer keeps the records and
//! tries again every [`FULL_RETRY`], while the master refuses new changes with an error that
//! says the disk is full (reads, heartbeats and new clients' `Hello` go on); once space frees,
//! the held records reach the disk, the requests waiting on them are answered, and changes
//! are accepted again, with no restart.
//!
//! **Damage is never taken for a torn tail.** After each sync the writer appends a sync mark
//! (`mooring_proto::journal`): recovery that finds a bad record followed by a mark vouching
//! for bytes past it refuses to start, naming the file and the offset, rather than replaying
//! up to the damage and silently dropping every acknowledged change after it.
//!
//! All file access goes through the [`StateDir`] seam: a real directory in production
//! ([`mooring_disk::PosixStateDir`], owner-only), the simulated disk under the simulator.
//!
//! **Snapshots.** Once the journal has grown by `snapshot_after` bytes, and by at least twice
//! the size of the last snapshot ([`snapshot_due_at`]: snapshots cost at most half the
//! journal's writing, however large the state), the master's state is taken under its lock (a copy-on-write
//! share, not a copy) and the journal moves on to the next generation; a helper thread writes
//! the snapshot (to a temporary name, synced, then renamed) and then retires the generation
//! before the previous one.
//!
//! **Restarts.** A restarted master serves as soon as it has recovered: it closes the journal
//! it replayed last with an end record where its intact records end, begins the next
//! generation's journal with its configuration and a record of the resume (the fresh lease
//! every object gets), and writes that generation's snapshot in the background. Until the
//! snapshot is on disk, a restart replays the recovered journal and the new one, putting each
//! journal's configuration in force where it begins.
//!
//! **Reading a journal back.** The writer syncs at most `journal::MAX_SYNC_BYTES` of records
//! at a time, each piece followed by its sync mark, so recovery needs a journal file only up to
//! its end record, or up to a bad record and a mark's reach past it: a reused file's older
//! records (as long as a whole generation's journal) are not read. Recovery reads a journal
//! `journal::REPLAY_PIECE` bytes at a time and applies its records as they are decoded, so a
//! restart holds one piece of a journal in memory, not gigabytes of it. Decoding runs on a
//! thread of its own (inline in the simulation) while the records decoded before it are
//! applied, a window at a time, their keys looked up together first (`recover`).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use mooring_core::log_shipping::LogPosition;
use mooring_core::{
    EncodedSnapshot, Error, ErrorCode, Master, MasterConfig, Millis, Result, SnapshotState,
};
use mooring_proto::journal::{self, Input};
use mooring_proto::state_dir::{OpenMode, StateDir, StateFile};
use tracing::{error, info, warn};

use crate::master::latest::{Follower, Latest};
use crate::master::seq_waiters::SeqWaiters;

/// Journal bytes that start a snapshot, by default. A snapshot also waits until the journal
/// has grown to twice the last snapshot (see [`snapshot_due_at`]).
pub const SNAPSHOT_AFTER: u64 = 64 << 20;

/// The journal bytes, since the last snapshot began, at which the next begins: `snapshot_after`,
/// or twice the last snapshot's size if that is more. Serializing a snapshot costs more per
/// byte than appending records, so snapshots cost at most half the journal's writing; a
/// restart replays up to twice a snapshot's size of journal after restoring it (the scale
/// bench times that worst case). Snapshots due at the journal's size instead were measured
/// (docs/master-scale.md): a shorter worst case, but not within 10 s at 10 M objects on the
/// development VM, and a slower journaled fill.
pub fn snapshot_due_at(snapshot_after: u64, last_snapshot: u64) -> u64 {
    snapshot_after.max(2 * last_snapshot)
}

/// How often a writer whose directory is full tries again.
pub const FULL_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Records held in memory while the directory is full, beyond which reads are refused too
/// (they are journaled, and would grow the held records without bound).
const FULL_HOLD_LIMIT: usize = 64 << 20;

/// The name of generation `generation`'s journal.
pub(crate) fn journal_name(generation: u64) -> String {
    format!("journal-{generation:020}.log")
}

/// The name of generation `generation`'s snapshot.
pub(crate) fn snapshot_name(generation: u64) -> String {
    format!("snapshot-{generation:020}.snap")
}

fn io_error(what: String) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, what)
}

/// The answer to a change once the journal stopped (a sync failed).
fn persist_failed(why: &str) -> Error {
    Error::new(
        ErrorCode::FILE_WRITE_FAIL,
        format!(
            "the master cannot persist changes ({why}); it acknowledges none until it is \
             restarted on a working disk"
        ),
    )
}

/// The generations present in `dir`: (journals, snapshots), each ascending.
pub(crate) fn generations(dir: &dyn StateDir) -> Result<(Vec<u64>, Vec<u64>)> {
    let names = dir.list().map_err(|e| {
        io_error(format!(
            "cannot read the state directory {}: {e}",
            dir.location()
        ))
    })?;
    let (mut journals, mut snapshots) = (Vec::new(), Vec::new());
    for name in names {
        let number = |prefix: &str, suffix: &str| {
            name.strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse::<u64>()
                .ok()
        };
        if let Some(g) = number("journal-", ".log") {
            journals.push(g);
        } else if let Some(g) = number("snapshot-", ".snap") {
            snapshots.push(g);
        }
    }
    journals.sort_unstable();
    snapshots.sort_unstable();
    Ok((journals, snapshots))
}

mod files;
mod recover;
#[cfg(test)]
mod tests;
mod writer;

#[cfg(test)]
use files::SPARE;
pub(crate) use files::delete_before;
use files::{JournalFile, PREWRITE, close_recovered, full_hint, retire_before, write_snapshot};
pub use recover::{Recovered, Tail, recover, restore_snapshot};
use writer::{Pending, Writer};

/// What a journal has written, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalCounts {
    /// Records on disk.
    pub records: u64,
    /// Bytes written.
    pub bytes: u64,
    /// `fdatasync` calls (each covers every record appended before it began: group commit).
    pub syncs: u64,
    /// Time spent writing and syncing, in microseconds.
    pub sync_micros: u64,
    /// Time spent waking the requests each sync covered, in microseconds.
    pub wake_micros: u64,
    /// Syncs that took longer than [`SLOW_SYNC`] (every change waiting on one waits that
    /// long: the device was busy, or the sync also carried the zeros written ahead).
    pub slow_syncs: u64,
    /// Time spent in those, in microseconds.
    pub slow_sync_micros: u64,
    /// Generations begun in a retired journal's file, whose blocks are all written: their
    /// syncs carry no zeros written ahead (see `JournalFile`). A master's first generations
    /// begin in new files; once this counts, the journal is in its steady state.
    pub reused_files: u64,
}

/// A write and sync longer than this is counted as slow ([`JournalCounts::slow_syncs`]).
pub const SLOW_SYNC: std::time::Duration = std::time::Duration::from_millis(1);

#[derive(Default)]
struct Counts {
    records: AtomicU64,
    bytes: AtomicU64,
    syncs: AtomicU64,
    sync_micros: AtomicU64,
    wake_micros: AtomicU64,
    slow_syncs: AtomicU64,
    slow_sync_micros: AtomicU64,
    reused_files: AtomicU64,
}

/// What a journal holds on disk: every record up to `seq`, ending at `end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Synced {
    /// The last record on disk.
    pub seq: u64,
    /// Where the journal's records end.
    pub end: LogPosition,
}

/// The last sync, or the reason the journal stopped.
pub type SyncState = std::result::Result<Synced, String>;

struct Shared {
    counts: Counts,
    pending: Mutex<Pending>,
    work: Condvar,
    /// The last sync, or the reason the journal stopped (for followers of every sync).
    durable: Latest<SyncState>,
    /// Requests waiting for their record to be on disk.
    waiters: SeqWaiters,
    /// Where each generation this journal moved past ends.
    completed: CompletedEnds,
    /// Why the directory cannot take more records right now (it is full), if it cannot:
    /// the writer holds them and tries again; changes are refused meanwhile.
    full: Mutex<Option<String>>,
    /// Why the journal stopped for good (a failed sync), if it did: changes are refused
    /// until the master is restarted.
    failed: Mutex<Option<String>>,
    /// `failed` is set (read on every append, without the lock).
    stopped: std::sync::atomic::AtomicBool,
}

/// Where each generation a journal moved past ends (its file holds zeros after that).
#[derive(Clone, Default)]
pub struct CompletedEnds(Arc<Mutex<std::collections::BTreeMap<u64, u64>>>);

impl CompletedEnds {
    /// Where generation `generation`'s journal ends, if the journal moved past it.
    pub fn get(&self, generation: u64) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&generation)
            .copied()
    }

    fn insert(&self, generation: u64, end: u64) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(generation, end);
    }
}

/// The journal of a running master: appends under the master's lock, a writer thread that
/// syncs them in groups, and periodic snapshots.
pub struct Journal {
    dir: Arc<dyn StateDir>,
    shared: Arc<Shared>,
    snapshot_after: u64,
    /// Journal bytes since the last snapshot began, and the current generation.
    progress: Mutex<(u64, u64)>,
    /// The size of the last snapshot written.
    last_snapshot: Arc<AtomicU64>,
    /// The thread writing the last snapshot begun (the next waits for it to finish).
    snapshotting: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The writer thread.
    #[cfg(not(madsim))]
    writer: Option<std::thread::JoinHandle<()>>,
    /// The simulation allows no threads: appends are written and synced inline, and
    /// snapshots written at once.
    #[cfg(madsim)]
    writer: Mutex<Writer>,
}

impl Journal {
    /// Starts the generation after `recovered`'s in `dir` for the master recovered from it,
    /// which resumed serving at `now` ([`Master::resume`]). The new journal begins with the
    /// configuration and the resume, so replaying it after the journal recovered does what
    /// the master did. Its snapshot (of the master as resumed: resuming again at the same
    /// time changes nothing, so the snapshot and the journal agree) is written in the
    /// background when the journal recovery replayed last can be closed with an end record
    /// where its intact records end: until the snapshot is on disk, a restart replays that
    /// journal and this one. Otherwise (an empty directory, or a journal whose header never
    /// reached the disk) the snapshot is written and synced first. The snapshot is
    /// serialized into a buffer the size of the one restored (`recovered.snapshot_len`) to
    /// begin with, not grown to it. (Taken before the resume, the snapshot would share every
    /// object with the master, and the resume would copy them all: seconds at 10 M.)
    pub fn start(
        dir: Arc<dyn StateDir>,
        recovered: &Recovered,
        now: Millis,
        snapshot_after: u64,
    ) -> Result<Journal> {
        let master = &recovered.master;
        let generation = recovered.generation + 1;
        let size_hint = recovered.snapshot_len;
        let state = master.snapshot_state();
        let closed = match recovered.tail {
            Some(tail) if tail.generation + 1 == generation => {
                Some((tail.generation, close_recovered(&*dir, tail, master.now())?))
            }
            _ => None,
        };
        let mut state = Some(state);
        let mut snapshot_bytes = size_hint as u64;
        if closed.is_none() {
            let capacity = size_hint + size_hint / 8;
            let encoded = state.take().expect("taken once").encode(capacity);
            snapshot_bytes = write_snapshot(&*dir, generation, &encoded)?;
        }
        let mut first = config_record(master, generation);
        journal::record(generation, now, &journal::resume_payload(), &mut first);
        let file = JournalFile::create(&*dir, generation, &first)
            .and_then(|file| dir.sync_dir().map(|()| file))
            .map_err(|e| {
                io_error(format!(
                    "cannot write {}/{}: {e}{}",
                    dir.location(),
                    journal_name(generation),
                    full_hint(&e)
                ))
            })?;
        if closed.is_none() {
            retire_before(&*dir, generation, None);
        }
        let counts = Counts::default();
        counts
            .reused_files
            .store(u64::from(file.reused), Ordering::Relaxed);
        let shared = Arc::new(Shared {
            counts,
            pending: Mutex::new(Pending {
                generation,
                ..Pending::default()
            }),
            work: Condvar::new(),
            durable: Latest::new(Ok(Synced {
                seq: 0,
                end: LogPosition {
                    generation,
                    offset: file.end,
                },
            })),
            waiters: SeqWaiters::new(Ok(0)),
            completed: CompletedEnds::default(),
            full: Mutex::new(None),
            failed: Mutex::new(None),
            stopped: std::sync::atomic::AtomicBool::new(false),
        });
        let writer = Writer::new(file, generation, dir.clone());
        #[cfg(not(madsim))]
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("mooring-journal".into())
                .spawn(move || {
                    let mut writer = writer;
                    while writer.write_pending(&shared, true) {}
                })
                .map_err(|e| io_error(format!("cannot start the journal writer: {e}")))?
        };
        #[cfg(madsim)]
        let writer = Mutex::new(writer);
        info!(dir = %dir.location(), generation, "journal started");
        let journal = Journal {
            dir,
            shared,
            snapshot_after: snapshot_after.max(1),
            progress: Mutex::new((0, generation)),
            last_snapshot: Arc::new(AtomicU64::new(snapshot_bytes)),
            snapshotting: Mutex::new(None),
            #[cfg(not(madsim))]
            writer: Some(writer),
            #[cfg(madsim)]
            writer,
        };
        if let Some((previous, end)) = closed {
            // Standbys copy the recovered journal up to its end record.
            journal.shared.completed.insert(previous, end);
        }
        if let Some(state) = state {
            journal.write_snapshot_behind(generation, state);
        }
        Ok(journal)
    }

    /// Appends one input about to be applied at `now` to `master` (call under the master's
    /// lock, before applying it, so the journal's order is the master's); returns its
    /// sequence number for [`Journal::durable`]. A snapshot of `master` begins when one is
    /// due.
    pub fn append(&self, now: Millis, payload: &[u8], master: &Master) -> u64 {
        // A snapshot is of the state before this input: the input opens the new journal.
        let due = {
            let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            progress.0 += (journal::RECORD_HEADER + payload.len()) as u64;
            let threshold = snapshot_due_at(
                self.snapshot_after,
                self.last_snapshot.load(Ordering::Relaxed),
            );
            (progress.0 >= threshold && self.may_switch()).then(|| {
                progress.0 = 0;
                progress.1 += 1;
                progress.1
            })
        };
        if let Some(generation) = due {
            self.begin_snapshot(generation, master);
        }
        let (seq, wake) = {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // A stopped journal writes nothing more: its records would only pile up.
            if !self.shared.stopped.load(Ordering::Relaxed) {
                journal::record(pending.generation, now, payload, &mut pending.bytes);
            }
            pending.appended += 1;
            (
                pending.appended,
                pending.writer_waiting && pending.appended >= pending.wake_at,
            )
        };
        if wake {
            self.shared.work.notify_one();
        }
        #[cfg(madsim)]
        self.writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_pending(&self.shared, false);
        seq
    }

    /// Whether a snapshot may begin: the last one is written, and the writer has made the
    /// last switch (else the generation numbered next would not be the next it starts, and
    /// records of the next would go into the journal of the one it is still starting: seed
    /// 3191, two snapshots falling due while the directory was full).
    fn may_switch(&self) -> bool {
        let written = self
            .snapshotting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|thread| thread.is_finished());
        written
            && self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_idle()
    }

    /// What the journal has written so far.
    pub fn counts(&self) -> JournalCounts {
        let c = &self.shared.counts;
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        JournalCounts {
            records: read(&c.records),
            bytes: read(&c.bytes),
            syncs: read(&c.syncs),
            sync_micros: read(&c.sync_micros),
            wake_micros: read(&c.wake_micros),
            slow_syncs: read(&c.slow_syncs),
            slow_sync_micros: read(&c.slow_sync_micros),
            reused_files: read(&c.reused_files),
        }
    }

    /// The state directory.
    pub fn dir(&self) -> &Arc<dyn StateDir> {
        &self.dir
    }

    /// Why a request must be refused before it is applied, if it must: the directory is full
    /// (see the module docs), and the request changes something (`needs_durability`), or
    /// the records held for the disk have reached their limit.
    pub fn refusal(&self, needs_durability: bool) -> Option<Error> {
        if needs_durability
            && let Some(why) = &*self.shared.failed.lock().unwrap_or_else(|e| e.into_inner())
        {
            return Some(persist_failed(why));
        }
        let full = self.shared.full.lock().unwrap_or_else(|e| e.into_inner());
        let why = full.as_ref()?;
        let held = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bytes
            .len();
        (needs_durability || held >= FULL_HOLD_LIMIT).then(|| {
            Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                format!(
                    "the master's state directory {} is full ({why}), so it cannot record \
                     changes and refuses them; reads go on. Free space there: changes are \
                     accepted again by themselves, with no restart",
                    self.dir.location()
                ),
            )
        })
    }

    /// Tries again to write what a full directory held back (the simulation's writer runs
    /// only when called; the production writer thread retries by itself).
    pub fn retry_if_full(&self) {
        #[cfg(madsim)]
        if self
            .shared
            .full
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            self.writer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_pending(&self.shared, false);
        }
    }

    /// Follows each sync (standbys ship what is on disk, and nothing more).
    pub fn syncs(&self) -> Follower<SyncState> {
        self.shared.durable.follow()
    }

    /// Where each generation this journal moved past ends.
    pub fn completed_ends(&self) -> CompletedEnds {
        self.shared.completed.clone()
    }

    /// Resolves once record `seq` is on disk; an error if the journal can no longer write.
    pub fn durable(&self, seq: u64) -> impl std::future::Future<Output = Result<()>> + use<> {
        let durable = self.shared.waiters.wait(seq);
        async move {
            durable.await.map_err(|why| {
                // Applied, but perhaps not on disk: whether it survives a restart is unknown,
                // as when an answer is lost.
                Error::new(
                    ErrorCode::RPC_FAIL,
                    format!(
                        "the master applied the change but could not make it durable ({why}): \
                         it may or may not survive a restart; the master acknowledges no \
                         changes until it is restarted on a working disk"
                    ),
                )
            })
        }
    }

    /// Moves the journal to `generation` and writes a snapshot of `master` (taken now, at
    /// the rotation point, and serialized on a helper thread).
    fn begin_snapshot(&self, generation: u64, master: &Master) {
        let state = master.snapshot_state();
        {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            debug_assert!(pending.is_idle(), "checked when the snapshot fell due");
            // The records so far, and the end record, close the current journal.
            let mut before = std::mem::take(&mut pending.bytes);
            let end = journal::end_payload();
            journal::record(pending.generation, master.now(), &end, &mut before);
            pending.generation = generation;
            pending.rotate = Some((generation, config_record(master, generation), before));
        }
        self.shared.work.notify_one();
        self.write_snapshot_behind(generation, state);
    }

    /// Writes `state` as generation `generation`'s snapshot on a helper thread (at once in
    /// the simulation), then retires the generations it makes unneeded.
    fn write_snapshot_behind(&self, generation: u64, state: SnapshotState) {
        let (dir, last_snapshot) = (self.dir.clone(), self.last_snapshot.clone());
        let snapshot_after = self.snapshot_after;
        let write = move || {
            // Room for the last snapshot's size and a little more saves growing the buffer.
            let room = last_snapshot.load(Ordering::Relaxed) as usize;
            let encoded = state.encode(room + room / 8);
            drop(state);
            match write_snapshot(&*dir, generation, &encoded) {
                Ok(bytes) => {
                    last_snapshot.store(bytes, Ordering::Relaxed);
                    // The journal before this one stays a generation longer: a standby may still
                    // be copying its last records (see `crate::ha`). The one before that is
                    // reused for the next generation: room for all of it saves the writer
                    // growing its file (see `JournalFile`).
                    let room = snapshot_due_at(snapshot_after, bytes) + PREWRITE;
                    retire_before(&*dir, generation.saturating_sub(1), Some(room));
                    info!(generation, bytes, "snapshot written");
                }
                Err(e) => warn!(
                    generation,
                    "snapshot not written (the journals still hold everything): {e}"
                ),
            }
        };
        // The simulation allows no threads: the switch and the snapshot happen now.
        #[cfg(madsim)]
        {
            self.writer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_pending(&self.shared, false);
            write();
        }
        #[cfg(not(madsim))]
        match std::thread::Builder::new()
            .name("mooring-snapshot".into())
            .spawn(write)
        {
            Ok(thread) => {
                *self.snapshotting.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
            }
            Err(e) => warn!("cannot start a snapshot thread: {e}"),
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closing = true;
        self.shared.work.notify_one();
        #[cfg(not(madsim))]
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        let snapshot = self
            .snapshotting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(snapshot) = snapshot {
            let _ = snapshot.join();
        }
    }
}

/// The start of generation `generation`'s journal: the file header, and the configuration
/// its inputs are applied under.
fn config_record(master: &Master, generation: u64) -> Vec<u8> {
    let mut out = journal::file_header(generation).to_vec();
    let payload = journal::payload(&Input::Config(master.config().clone()));
    journal::record(generation, master.now(), &payload, &mut out);
    out
}
