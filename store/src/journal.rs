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
//! the size of the last snapshot (so snapshots cost at most half the journal's writing,
//! however large the state), the master's state is taken under its lock (a copy-on-write
//! share, not a copy) and the journal moves on to the next generation; a helper thread writes
//! the snapshot (to a temporary name, synced, then renamed) and then retires the generation
//! before the previous one.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use mooring_core::log_shipping::LogPosition;
use mooring_core::{EncodedSnapshot, Error, ErrorCode, Master, MasterConfig, Millis, Result};
use mooring_proto::journal::{self, Input};
use mooring_proto::state_dir::{OpenMode, StateDir, StateFile};
use tracing::{error, info, warn};

use crate::latest::{Follower, Latest};
use crate::seq_waiters::SeqWaiters;

/// Journal bytes that start a snapshot, by default. A snapshot also waits until the journal
/// has grown to twice the last snapshot, so writing snapshots costs at most half as many
/// bytes as the journal, however large the state.
pub const SNAPSHOT_AFTER: u64 = 64 << 20;

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

/// What [`recover`] found.
pub struct Recovered {
    /// The master as it was when the last intact record was applied, on that clock.
    pub master: Master,
    /// The generation the restarted master continues after.
    pub generation: u64,
    /// Journal records replayed.
    pub replayed: u64,
}

/// Rebuilds the master kept in `dir` (created if missing): the newest snapshot, then every
/// journal from its generation on, replayed under the configuration each was written with,
/// and finally `config` in force. An empty directory gives a fresh master.
pub fn recover(dir: &dyn StateDir, config: MasterConfig) -> Result<Recovered> {
    dir.prepare().map_err(|e| {
        io_error(format!(
            "cannot create the state directory {}: {e}",
            dir.location()
        ))
    })?;
    let (journals, snapshots) = generations(dir)?;
    let base = snapshots.last().copied();
    let mut master: Option<Master> = None;
    let mut snapshot = match base {
        Some(g) => Some(dir.read(&snapshot_name(g)).map_err(|e| {
            io_error(format!(
                "cannot read snapshot {g} in {}: {e}",
                dir.location()
            ))
        })?),
        None => None,
    };
    let first = base.unwrap_or(0);
    let to_replay: Vec<u64> = journals.iter().copied().filter(|&g| g >= first).collect();
    if let Some(gap) = to_replay
        .iter()
        .zip(first..)
        .find(|(g, expected)| **g != *expected)
    {
        return Err(io_error(format!(
            "the state directory {} lacks journal {} (found {}): it cannot be replayed; \
             restore the missing file or start from an empty directory",
            dir.location(),
            gap.1,
            gap.0
        )));
    }
    let mut replayed = 0;
    let mut generation = first;
    for (i, &g) in to_replay.iter().enumerate() {
        generation = g;
        let name = journal_name(g);
        let path = format!("{}/{name}", dir.location());
        let bytes = dir
            .read(&name)
            .map_err(|e| io_error(format!("cannot read {path}: {e}")))?;
        let decoded = journal::decode(g, &bytes);
        let last = i + 1 == to_replay.len();
        if decoded.foreign {
            let why = decoded.stopped.as_deref().unwrap_or_default();
            return Err(io_error(format!(
                "{path} holds bytes this build cannot read ({why}): it was written by another \
                 version of Mooring; start the version that wrote it, or move the \
                 directory aside to start empty"
            )));
        }
        if let Some(damage) = decoded.damaged {
            crate::coverage::hit(crate::coverage::Path::JOURNAL_DAMAGE_REFUSED);
            let why = decoded.stopped.as_deref().unwrap_or_default();
            return Err(io_error(format!(
                "{path} is damaged at byte {} ({why}), but the master had synced it through \
                 byte {}: the changes after the damage were acknowledged, and starting would \
                 drop them silently. Restore the file from a backup or a standby's copy; to \
                 start anyway and lose every change after the damage, cut the file there \
                 (truncate -s {} {path})",
                damage.at, damage.synced_to, damage.at
            )));
        }
        if !last && !decoded.ended {
            let why = decoded
                .stopped
                .as_deref()
                .unwrap_or("before its end record");
            return Err(io_error(format!(
                "{path} is damaged ({why}), and later journals follow it: the history cannot \
                 be replayed past it; move the directory aside to start empty"
            )));
        }
        if let Some(why) = &decoded.stopped {
            // A torn write, or records left from the file's earlier use: the writer had not
            // synced past here, so nothing after it was acknowledged.
            crate::coverage::hit(crate::coverage::Path::JOURNAL_TORN_TAIL);
            info!("{path} ends at byte {} ({why})", decoded.intact);
        }
        for (now, input) in decoded.entries {
            if let Input::Config(logged) = &input {
                if master.is_none() {
                    master = Some(match snapshot.take() {
                        Some(bytes) => Master::restore_unshifted(logged.clone(), &bytes)?,
                        None => Master::new(logged.clone())?,
                    });
                }
                continue;
            }
            let Some(m) = master.as_mut() else {
                return Err(io_error(format!(
                    "{path} does not start with its configuration record"
                )));
            };
            journal::apply(m, now, input);
            replayed += 1;
        }
    }
    // What replay did was reported when it first happened: its events are not news.
    if let Some(m) = master.as_mut() {
        m.drain_events();
    }
    let master = match (master, snapshot) {
        (Some(m), _) => reconfigure(m, config)?,
        (None, Some(bytes)) => Master::restore_unshifted(config, &bytes)?,
        (None, None) => Master::new(config)?,
    };
    Ok(Recovered {
        master,
        generation,
        replayed,
    })
}

/// `master` with `config` in force (a restart may change settings), on the same clock.
fn reconfigure(master: Master, config: MasterConfig) -> Result<Master> {
    Master::restore_unshifted(config, &master.snapshot())
}

/// What the writer thread has still to write.
#[derive(Default)]
struct Pending {
    /// The generation whose journal the records in `bytes` go to.
    generation: u64,
    /// Records appended since the writer last took them.
    bytes: Vec<u8>,
    /// Sequence number of the last record appended.
    appended: u64,
    /// A switch to a new generation: (its number, its header and first record, the records
    /// appended before the switch and the end record, which still go to the old journal).
    /// `bytes` then holds the records after it.
    rotate: Option<(u64, Vec<u8>, Vec<u8>)>,
    /// The journal is being dropped: write what is left and stop.
    closing: bool,
    /// The writer is waiting for records: an append that brings `appended` to `wake_at`
    /// must wake it. (While it writes and syncs, appends only add to `bytes`: waking costs a
    /// system call per append.)
    writer_waiting: bool,
    /// See `writer_waiting`.
    wake_at: u64,
}

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
    /// Starts generation `generation + 1` in `dir`: a snapshot of `master` (synced before
    /// anything else), a journal beginning with `config`, and the older files deleted.
    pub fn start(
        dir: Arc<dyn StateDir>,
        generation: u64,
        master: &Master,
        snapshot_after: u64,
    ) -> Result<Journal> {
        let generation = generation + 1;
        let snapshot_bytes = write_snapshot(&*dir, generation, &master.snapshot_state().encode(0))?;
        let file = JournalFile::create(&*dir, generation, &config_record(master, generation))
            .and_then(|file| dir.sync_dir().map(|()| file))
            .map_err(|e| {
                io_error(format!(
                    "cannot write {}/{}: {e}{}",
                    dir.location(),
                    journal_name(generation),
                    full_hint(&e)
                ))
            })?;
        retire_before(&*dir, generation, None);
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
        let writer = Writer {
            file,
            generation,
            dir: dir.clone(),
            rotating: None,
            spare: Vec::new(),
            synced: 0,
            last_woken: 0,
            last_sync: std::time::Duration::ZERO,
        };
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
        Ok(Journal {
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
        })
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
            // Serializing a snapshot costs more per byte than appending records: let the
            // journal grow to twice the last snapshot first.
            let threshold = self
                .snapshot_after
                .max(2 * self.last_snapshot.load(Ordering::Relaxed));
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
    /// last switch (else the generation numbered next would not be the next it starts).
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
                .rotate
                .is_none()
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
            debug_assert!(
                pending.rotate.is_none(),
                "checked when the snapshot fell due"
            );
            // The records so far, and the end record, close the current journal.
            let mut before = std::mem::take(&mut pending.bytes);
            let end = journal::end_payload();
            journal::record(pending.generation, master.now(), &end, &mut before);
            pending.generation = generation;
            pending.rotate = Some((generation, config_record(master, generation), before));
        }
        self.shared.work.notify_one();
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
                    let room = snapshot_after.max(2 * bytes) + PREWRITE;
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

/// Writes `snapshot` as generation `generation`, durably; returns its size. A failure
/// leaves no half-written file behind.
fn write_snapshot(dir: &dyn StateDir, generation: u64, snapshot: &EncodedSnapshot) -> Result<u64> {
    let name = snapshot_name(generation);
    let pieces = snapshot.pieces();
    dir.write_whole(&name, &pieces)
        .map(|()| snapshot.len() as u64)
        .map_err(|e| {
            io_error(format!(
                "cannot write snapshot {}/{name}: {e}{}",
                dir.location(),
                full_hint(&e)
            ))
        })
}

/// What to add to an error message when `e` says the directory is full.
fn full_hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::StorageFull {
        " (the state directory is full: free space there and start again)"
    } else {
        ""
    }
}

/// Where a retired journal waits to be reused as the next generation's file.
const SPARE: &str = "journal-spare.log";

/// Deletes the files of generations before `generation` (a snapshot of it is on disk), but
/// keeps the newest of their journals as the spare the next journal reuses (unless a spare
/// is waiting already), grown to `room` bytes when given. (No spare is made from nothing:
/// writing a whole file of zeros in the background slowed the journal's syncs as much as
/// the growth it saves.)
fn retire_before(dir: &dyn StateDir, generation: u64, room: Option<u64>) {
    if !dir.exists(SPARE)
        && let Ok((journals, _)) = generations(dir)
        && let Some(&newest) = journals.iter().rfind(|&&g| g < generation)
    {
        let retired = journal_name(newest);
        let prepared = match room {
            // Grown under another name: the writer may take the spare at any moment, and
            // then writes past its end.
            Some(room) => {
                let growing = "journal-spare-growing.log";
                let grown = dir
                    .rename(&retired, growing)
                    .and_then(|()| grow(dir, growing, room))
                    .and_then(|()| dir.rename(growing, SPARE));
                if grown.is_err() {
                    let _ = dir.remove(growing);
                }
                grown
            }
            None => dir.rename(&retired, SPARE),
        };
        if let Err(e) = prepared {
            warn!(dir = %dir.location(), "cannot keep a journal file for reuse: {e}");
        }
    }
    delete_before(dir, generation);
}

/// Writes zeros after the end of the file `name` until it holds `room` bytes, synced a
/// [`PREWRITE`] at a time (each sync carries no more than that).
fn grow(dir: &dyn StateDir, name: &str, room: u64) -> io::Result<()> {
    let file = dir.open(name, OpenMode::Write)?;
    let mut len = file.len()?;
    let zeros = vec![0u8; PREWRITE as usize];
    while len < room {
        let step = (room - len).min(PREWRITE);
        file.write_at(&zeros[..step as usize], len)?;
        file.sync()?;
        len += step;
    }
    Ok(())
}

/// Deletes the files of generations before `generation` (a snapshot of it is on disk).
pub(crate) fn delete_before(dir: &dyn StateDir, generation: u64) {
    let Ok((journals, snapshots)) = generations(dir) else {
        return;
    };
    for g in journals.into_iter().filter(|&g| g < generation) {
        let _ = dir.remove(&journal_name(g));
    }
    for g in snapshots.into_iter().filter(|&g| g < generation) {
        let _ = dir.remove(&snapshot_name(g));
    }
}

/// A journal file being appended to. Records go into blocks the file already has: syncing
/// them then needs no metadata update (no commit of the filesystem's own journal), which
/// more than halves each `fdatasync` here (150 µs rather than 390 µs for 18 KB), and keeps
/// it from waiting on other files' writes (a snapshot's, in an ordered-data filesystem).
/// A new generation reuses the file a retired one left ([`retire_before`]), whose blocks are
/// all written; past its end, zeros are written ahead of the records (`PREWRITE` at a
/// time), and the sync after that carries them. Readers take what follows the last record
/// for the end of the journal: zeros, or the older records a reused file still holds.
struct JournalFile {
    file: Box<dyn StateFile>,
    /// It was a retired journal's file (the spare).
    reused: bool,
    /// Where the next record goes.
    end: u64,
    /// How far the file has been written (with records or zeros).
    written: u64,
}

/// Zeros written ahead of the records at a time (less in the simulation, whose runs are
/// small and many).
const PREWRITE: u64 = if cfg!(madsim) { 64 << 10 } else { 8 << 20 };

impl JournalFile {
    /// Generation `generation`'s journal file in `dir`, beginning with `first` (its header
    /// and first record), synced: the spare file if there is one, else a new file. A file
    /// of that generation already there is refused, unless `again` (a switch retried after
    /// the directory was full: nothing in that file was acknowledged).
    fn create(dir: &dyn StateDir, generation: u64, first: &[u8]) -> io::Result<JournalFile> {
        Self::create_or_again(dir, generation, first, false)
    }

    fn create_or_again(
        dir: &dyn StateDir,
        generation: u64,
        first: &[u8],
        again: bool,
    ) -> io::Result<JournalFile> {
        let name = journal_name(generation);
        let (file, reused) = if dir.exists(&name) {
            if !again {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "a journal of this generation exists already",
                ));
            }
            (dir.open(&name, OpenMode::Write)?, false)
        } else if dir.rename(SPARE, &name).is_ok() {
            (dir.open(&name, OpenMode::Write)?, true)
        } else {
            (dir.open(&name, OpenMode::CreateNew)?, false)
        };
        let mut journal = JournalFile {
            reused,
            written: file.len()?,
            file,
            end: 0,
        };
        journal.append(first)?;
        journal.file.sync()?;
        Ok(journal)
    }

    /// Writes `bytes` after the last record (not yet synced). When the zeros written ahead
    /// do not fit, the records alone are tried.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let needed = self.end + bytes.len() as u64;
        if needed > self.written {
            let upto = needed.max(self.written + PREWRITE);
            let zeros = vec![0u8; (upto - self.written) as usize];
            match self.file.write_at(&zeros, self.written) {
                Ok(()) => self.written = upto,
                Err(e) if e.kind() == io::ErrorKind::StorageFull => {}
                Err(e) => return Err(e),
            }
        }
        self.file.write_at(bytes, self.end)?;
        self.end = needed;
        self.written = self.written.max(needed);
        Ok(())
    }

    /// Makes every appended record durable.
    fn sync(&self) -> io::Result<()> {
        self.file.sync()
    }
}

/// Writes what the journal has accumulated: the writer thread's work, or (in the
/// simulation, which allows no threads) done inline after each append.
struct Writer {
    file: JournalFile,
    /// The generation `file` belongs to.
    generation: u64,
    dir: Arc<dyn StateDir>,
    /// A switch to the next generation that the full directory interrupted: it is finished
    /// before anything else is written.
    rotating: Option<Rotation>,
    /// The buffer the next batch of records accumulates in, handed back and forth.
    spare: Vec<u8>,
    /// The last record on disk.
    synced: u64,
    /// How many records the last sync covered (and so how many requests it woke).
    last_woken: u64,
    /// How long the last write and sync took.
    last_sync: std::time::Duration,
}

/// A switch to generation `generation`: `before` (the records appended before it, and the
/// end record) closes the current journal, then the new one begins with `first`.
struct Rotation {
    generation: u64,
    first: Vec<u8>,
    before: Vec<u8>,
    /// `before` is written and synced: only the new journal is left to make.
    closed: bool,
    /// Its file was begun before the directory filled up.
    again: bool,
}

impl Writer {
    /// Waits until there is something to write. The requests the last sync woke usually
    /// append again at once: waiting (for at most a quarter of a sync) until as many
    /// records are pending lets one sync cover them all, where otherwise the first few
    /// would start a sync that the rest must wait out, and every record would wait for two.
    fn gather<'a>(
        &self,
        shared: &'a Shared,
        mut pending: std::sync::MutexGuard<'a, Pending>,
    ) -> std::sync::MutexGuard<'a, Pending> {
        while pending.bytes.is_empty()
            && pending.rotate.is_none()
            && self.rotating.is_none()
            && !pending.closing
        {
            pending.writer_waiting = true;
            pending.wake_at = 0;
            pending = shared.work.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
        let target = self.synced + self.last_woken;
        let deadline = std::time::Instant::now() + self.last_sync / 4;
        while pending.appended < target && pending.rotate.is_none() && !pending.closing {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            pending.writer_waiting = true;
            pending.wake_at = target;
            pending = shared
                .work
                .wait_timeout(pending, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        pending.writer_waiting = false;
        pending
    }

    /// Closes the current journal and begins the next, as `rotation` says; on failure,
    /// `rotation` records how far it got.
    fn switch(&mut self, shared: &Shared, rotation: &mut Rotation) -> io::Result<()> {
        if !rotation.closed {
            self.file.append(&rotation.before)?;
            self.file.sync()?;
            rotation.closed = true;
        }
        let next = JournalFile::create_or_again(
            &*self.dir,
            rotation.generation,
            &rotation.first,
            rotation.again,
        );
        // A failure may leave the file begun: the retry takes it over.
        rotation.again = true;
        let next = next?;
        self.dir.sync_dir()?;
        shared.completed.insert(self.generation, self.file.end);
        if next.reused {
            shared.counts.reused_files.fetch_add(1, Ordering::Relaxed);
        }
        self.file = next;
        self.generation = rotation.generation;
        Ok(())
    }

    /// Writes and syncs everything appended so far, waiting for something to write if
    /// `wait`; then wakes the requests it covered. False once the journal is closing or
    /// broken.
    fn write_pending(&mut self, shared: &Shared, wait: bool) -> bool {
        if shared
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            // Fail-stop: a failed sync may have dropped what it covered, and no later sync
            // can vouch for it (the simulation's writer is called again after a failure).
            return false;
        }
        let (bytes, seq, closing) = {
            let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            if wait {
                pending = self.gather(shared, pending);
            }
            if self.rotating.is_none()
                && let Some((generation, first, before)) = pending.rotate.take()
            {
                self.rotating = Some(Rotation {
                    generation,
                    first,
                    before,
                    closed: false,
                    again: false,
                });
            }
            self.spare.clear();
            let bytes = std::mem::replace(&mut pending.bytes, std::mem::take(&mut self.spare));
            (bytes, pending.appended, pending.closing)
        };
        let started = std::time::Instant::now();
        let rotated_bytes = self.rotating.as_ref().map_or(0, |r| r.before.len());
        let written = (|| {
            if let Some(mut rotation) = self.rotating.take() {
                let switched = self.switch(shared, &mut rotation);
                if switched.is_err() {
                    self.rotating = Some(rotation);
                }
                switched?;
            }
            self.file.append(&bytes)?;
            self.file.sync()
        })();
        self.last_sync = started.elapsed();
        match written {
            Ok(()) => {
                let c = &shared.counts;
                let micros = self.last_sync.as_micros() as u64;
                c.sync_micros.fetch_add(micros, Ordering::Relaxed);
                if self.last_sync > SLOW_SYNC {
                    c.slow_syncs.fetch_add(1, Ordering::Relaxed);
                    c.slow_sync_micros.fetch_add(micros, Ordering::Relaxed);
                }
                c.syncs.fetch_add(1, Ordering::Relaxed);
                c.records.fetch_add(seq - self.synced, Ordering::Relaxed);
                c.bytes
                    .fetch_add((bytes.len() + rotated_bytes) as u64, Ordering::Relaxed);
                self.last_woken = seq - self.synced;
                self.synced = seq;
                self.spare = bytes;
                let waking = std::time::Instant::now();
                let end = LogPosition {
                    generation: self.generation,
                    offset: self.file.end,
                };
                shared.waiters.advance(seq);
                shared.durable.set(Ok(Synced { seq, end }));
                c.wake_micros
                    .fetch_add(waking.elapsed().as_micros() as u64, Ordering::Relaxed);
                self.mark_synced();
                let recovered = shared.full.lock().unwrap_or_else(|e| e.into_inner()).take();
                if recovered.is_some() {
                    info!(dir = %self.dir.location(), "the state directory has room again: changes are accepted");
                }
                !closing
            }
            Err(e) if e.kind() == io::ErrorKind::StorageFull => {
                self.hold(shared, bytes, &e);
                !closing
            }
            Err(e) => {
                error!(
                    dir = %self.dir.location(),
                    "the journal cannot write ({e}): the master acknowledges no more changes; \
                     fix the disk and restart it (it recovers what was synced)"
                );
                crate::coverage::hit(crate::coverage::Path::JOURNAL_FAILED);
                *shared.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                shared.stopped.store(true, Ordering::Relaxed);
                shared.waiters.stop(e.to_string());
                shared.durable.set(Err(e.to_string()));
                false
            }
        }
    }

    /// After a sync: appends the mark that vouches for every byte before it (not synced
    /// itself; see the module docs). One that does not fit is left out: marks only sharpen
    /// what recovery can tell.
    fn mark_synced(&mut self) {
        let mut mark = Vec::with_capacity(journal::synced_record_len());
        let offset = self.file.end;
        journal::record(
            self.generation,
            Millis(0),
            &journal::synced_payload(offset),
            &mut mark,
        );
        if let Err(e) = self.file.append(&mark) {
            tracing::debug!("sync mark not written: {e}");
        }
    }

    /// The directory is full: `bytes` go back before whatever was appended since, the
    /// master refuses changes until they are written, and the writer tries again after
    /// [`FULL_RETRY`] (in the simulation, when called).
    fn hold(&mut self, shared: &Shared, bytes: Vec<u8>, e: &io::Error) {
        crate::coverage::hit(crate::coverage::Path::JOURNAL_FULL);
        let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        let newer = std::mem::replace(&mut pending.bytes, bytes);
        pending.bytes.extend_from_slice(&newer);
        let was_full = shared
            .full
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(e.to_string())
            .is_some();
        if !was_full {
            warn!(
                dir = %self.dir.location(),
                "the state directory is full ({e}): the master refuses changes until there \
                 is room again (reads go on); held records are written as soon as it frees"
            );
        }
        #[cfg(not(madsim))]
        if !pending.closing {
            let _ = shared
                .work
                .wait_timeout(pending, FULL_RETRY)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use mooring_core::{Checksum, ClientId, ReplicateConfig, SegmentSpec};
    use mooring_proto::transport::RpcHandler;
    use mooring_proto::wire::{Hello, MountSegment, PutEnd, PutStart, Remove, Reply};

    use std::fs;
    use std::path::{Path, PathBuf};

    use mooring_disk::PosixStateDir;

    use super::*;
    use crate::master_service::MasterService;

    const CLIENT: ClientId = ClientId(7);

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("mooring-journal-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// Mounts a segment and puts `puts` objects (removing every third) through a persistent
    /// service in `dir`, and more until the journal reaches generation `generation`; returns
    /// the live master's state, as a fingerprint.
    fn run(dir: &Path, puts: usize, snapshot_after: u64, generation: u64) -> String {
        let service = MasterService::persistent(dir, MasterConfig::default(), snapshot_after)
            .expect("a fresh directory");
        let ok = |request: mooring_proto::wire::MasterRequest| service.handle(request).unwrap();
        ok(Hello { client: CLIENT }.into());
        ok(MountSegment {
            client: CLIENT,
            spec: SegmentSpec {
                name: "seg".into(),
                base: 0,
                size: 1 << 20,
                endpoint: "node:1".into(),
                key: 1,
                rdma_key: None,
            },
        }
        .into());
        let reached = || posix(dir).0.last() >= Some(&generation);
        for i in 0.. {
            if i >= puts && reached() {
                break;
            }
            let key = format!("k{i}");
            let Reply::PutStart(grant) = ok(PutStart {
                client: CLIENT,
                key: key.clone(),
                size: 1000,
                config: ReplicateConfig::single(),
                upsert: false,
            }
            .into()) else {
                panic!("not a grant");
            };
            ok(PutEnd {
                client: CLIENT,
                key: key.clone(),
                write: grant.write_id,
                checksum: Checksum::of(key.as_bytes()),
            }
            .into());
            if i % 3 == 0 {
                ok(Remove { key }.into());
            }
        }
        // Dropping the service drops the journal, which writes what it holds first.
        service.with_master(|m, _| m.state_fingerprint())
    }

    fn recovered(dir: &Path) -> Result<String> {
        recover(&PosixStateDir::new(dir), MasterConfig::default())
            .map(|r| r.master.state_fingerprint())
    }

    /// The generations in the real directory `dir`.
    fn posix(dir: &Path) -> (Vec<u64>, Vec<u64>) {
        generations(&PosixStateDir::new(dir)).unwrap()
    }

    fn journal_path(dir: &Path, generation: u64) -> PathBuf {
        dir.join(journal_name(generation))
    }

    #[test]
    fn a_recovered_master_is_the_master_that_was_running() {
        for snapshot_after in [SNAPSHOT_AFTER, 1] {
            let dir = scratch(&format!("same-{snapshot_after}"));
            let live = run(&dir, 40, snapshot_after, 0);
            assert_eq!(
                recovered(&dir).unwrap(),
                live,
                "snapshot after {snapshot_after}"
            );
            let _ = fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn journal_files_are_reused_and_recovery_stops_before_their_older_records() {
        use std::os::unix::fs::MetadataExt;
        let dir = scratch("reused");
        let restart = || {
            let service = MasterService::persistent(&dir, MasterConfig::default(), SNAPSHOT_AFTER)
                .expect("a restart");
            let reused = service.journal_counts().expect("a journal").reused_files;
            (service.with_master(|m, _| m.state_fingerprint()), reused)
        };
        run(&dir, 20, SNAPSHOT_AFTER, 0);
        // A restart starts the next generation and retires the journal before it.
        assert_eq!(restart().1, 0, "no retired journal to reuse yet");
        let spare = fs::metadata(dir.join(SPARE)).expect("a retired journal kept for reuse");
        // The next restart's journal is that file, reused: after its own first record come
        // the older generation's records, which recovery takes for the end.
        let (live, reused) = restart();
        assert_eq!(reused, 1, "counted as reused");
        let (journals, _) = posix(&dir);
        let g = *journals.last().unwrap();
        let path = journal_path(&dir, g);
        assert_eq!(fs::metadata(&path).unwrap().ino(), spare.ino());
        let bytes = fs::read(&path).unwrap();
        let decoded = journal::decode(g, &bytes);
        assert_eq!(decoded.entries.len(), 1, "the configuration alone");
        // The older generation's bytes (its records and sync marks) end it: not damage.
        assert!(decoded.stopped.is_some(), "{decoded:?}");
        assert_eq!(decoded.damaged, None, "{:?}", decoded.stopped);
        assert_eq!(recovered(&dir).unwrap(), live);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_tail_is_dropped_and_damage_before_later_journals_is_refused() {
        let dir = scratch("torn");
        let live = run(&dir, 10, SNAPSHOT_AFTER, 0);
        let (journals, _) = posix(&dir);
        let last = journal_path(&dir, *journals.last().unwrap());
        let mut bytes = fs::read(&last).unwrap();
        bytes.extend_from_slice(&[0x55; 11]);
        fs::write(&last, &bytes).unwrap();
        assert_eq!(
            recovered(&dir).unwrap(),
            live,
            "a torn tail loses nothing written"
        );

        // A journal closed by its end record may be followed by the next generation's.
        let g = *journals.last().unwrap();
        let decoded = journal::decode(g, &bytes);
        let mut closed = bytes[..decoded.intact].to_vec();
        journal::record(g, Millis(0), &journal::end_payload(), &mut closed);
        let mut next = journal::file_header(g + 1).to_vec();
        let config = journal::payload(&decoded.entries[0].1);
        journal::record(g + 1, Millis(0), &config, &mut next);
        fs::write(&last, &closed).unwrap();
        fs::write(journal_path(&dir, g + 1), &next).unwrap();
        assert_eq!(
            recovered(&dir).unwrap(),
            live,
            "a complete journal, then the next"
        );

        // A damaged record with a later journal after it cannot be skipped.
        let mut damaged = closed.clone();
        damaged[decoded.intact / 2] ^= 0xff;
        fs::write(&last, &damaged).unwrap();
        let refused = recovered(&dir).unwrap_err();
        assert!(refused.to_string().contains("damaged"), "{refused}");
        // Nor a journal cut short of its end record.
        fs::write(&last, &bytes[..decoded.intact]).unwrap();
        let refused = recovered(&dir).unwrap_err();
        assert!(
            refused.to_string().contains("before its end record"),
            "{refused}"
        );

        // Nor can a missing generation.
        fs::remove_file(&last).unwrap();
        let refused = recovered(&dir).unwrap_err();
        assert!(refused.to_string().contains("lacks journal"), "{refused}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_flipped_bit_early_in_the_newest_journal_stops_the_master_at_that_offset() {
        let dir = scratch("flipped");
        run(&dir, 60, SNAPSHOT_AFTER, 0);
        let (journals, _) = posix(&dir);
        let g = *journals.last().unwrap();
        let path = journal_path(&dir, g);
        let mut bytes = fs::read(&path).unwrap();
        let intact = journal::decode(g, &bytes).intact;
        // One bit, a tenth of the way in: 90% of the acknowledged history follows it.
        bytes[intact / 10] ^= 0x20;
        fs::write(&path, &bytes).unwrap();
        let refused = recovered(&dir).unwrap_err().to_string();
        let named = path.display().to_string();
        assert!(
            refused.contains(&named) && refused.contains("damaged at byte"),
            "{refused}"
        );
        let at: usize = refused
            .split("damaged at byte ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("the offset");
        assert!(
            at <= intact / 10,
            "reported at {at}, flipped at {}",
            intact / 10
        );
        // Cut there, as the message says, the master starts with what precedes the damage.
        bytes.truncate(at);
        fs::write(&path, &bytes).unwrap();
        recovered(&dir).expect("starts once the operator cut the damage off");
        let _ = fs::remove_dir_all(&dir);
    }

    /// A real directory that can be made to refuse writes for want of space, or to fail
    /// its syncs.
    #[derive(Default)]
    struct Fillable {
        dir: Option<PosixStateDir>,
        full: Arc<std::sync::atomic::AtomicBool>,
        sync_fails: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Fillable {
        fn dir(&self) -> &PosixStateDir {
            self.dir.as_ref().expect("a directory")
        }
    }

    struct FillableFile {
        file: Box<dyn StateFile>,
        full: Arc<std::sync::atomic::AtomicBool>,
        sync_fails: Arc<std::sync::atomic::AtomicBool>,
    }

    impl StateFile for FillableFile {
        fn len(&self) -> io::Result<u64> {
            self.file.len()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.file.read_at(buf, offset)
        }
        fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
            if self.full.load(Ordering::SeqCst) {
                return Err(io::Error::from(io::ErrorKind::StorageFull));
            }
            self.file.write_at(bytes, offset)
        }
        fn sync(&self) -> io::Result<()> {
            if self.sync_fails.load(Ordering::SeqCst) {
                return Err(io::Error::other("injected EIO on fsync"));
            }
            self.file.sync()
        }
        fn id(&self) -> u64 {
            self.file.id()
        }
    }

    impl StateDir for Fillable {
        fn location(&self) -> String {
            self.dir().location()
        }
        fn prepare(&self) -> io::Result<()> {
            self.dir().prepare()
        }
        fn list(&self) -> io::Result<Vec<String>> {
            self.dir().list()
        }
        fn open(&self, name: &str, mode: OpenMode) -> io::Result<Box<dyn StateFile>> {
            Ok(Box::new(FillableFile {
                file: self.dir().open(name, mode)?,
                full: self.full.clone(),
                sync_fails: self.sync_fails.clone(),
            }))
        }
        fn rename(&self, from: &str, to: &str) -> io::Result<()> {
            self.dir().rename(from, to)
        }
        fn remove(&self, name: &str) -> io::Result<()> {
            self.dir().remove(name)
        }
        fn sync_dir(&self) -> io::Result<()> {
            self.dir().sync_dir()
        }
        fn id_of(&self, name: &str) -> io::Result<u64> {
            self.dir().id_of(name)
        }
    }

    #[test]
    fn a_full_directory_refuses_changes_serves_reads_and_recovers_without_a_restart() {
        use mooring_proto::transport::Answer;
        use mooring_proto::wire::{Exist, MasterRequest};
        let path = scratch("full");
        let full = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dir = Arc::new(Fillable {
            dir: Some(PosixStateDir::new(&path)),
            full: full.clone(),
            ..Fillable::default()
        });
        let service = MasterService::persistent_in(dir, MasterConfig::default(), SNAPSHOT_AFTER)
            .expect("a fresh directory");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = |request: MasterRequest| match service.answer(request) {
            Answer::Now(response) => response,
            Answer::WhenDurable(later) => runtime.block_on(later),
        };
        let put = |key: &str| -> Answer {
            service.answer(
                PutStart {
                    client: CLIENT,
                    key: key.into(),
                    size: 1000,
                    config: ReplicateConfig::single(),
                    upsert: false,
                }
                .into(),
            )
        };
        answer(Hello { client: CLIENT }.into()).unwrap();
        answer(
            MountSegment {
                client: CLIENT,
                spec: SegmentSpec {
                    name: "seg".into(),
                    base: 0,
                    size: 1 << 20,
                    endpoint: "node:1".into(),
                    key: 1,
                    rdma_key: None,
                },
            }
            .into(),
        )
        .unwrap();

        full.store(true, Ordering::SeqCst);
        // The change that meets the full disk waits for it, unanswered.
        let Answer::WhenDurable(waiting) = put("first") else {
            panic!("a put's start waits for the disk");
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let refused = loop {
            match put("second") {
                Answer::Now(Err(e)) => break e,
                Answer::WhenDurable(_) | Answer::Now(Ok(_)) => {}
            }
            assert!(std::time::Instant::now() < deadline, "never refused");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(refused.code, ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
        assert!(refused.to_string().contains("is full"), "{refused}");
        // Reads and a new client's Hello go on.
        assert_eq!(
            answer(
                Exist {
                    key: "nothing".into()
                }
                .into()
            ),
            Ok(Reply::Exist(false))
        );
        answer(
            Hello {
                client: ClientId(8),
            }
            .into(),
        )
        .expect("a new client is welcome");

        // Space frees: the held change lands and is answered, and changes are accepted again.
        full.store(false, Ordering::SeqCst);
        runtime
            .block_on(waiting)
            .expect("the held put's start is acknowledged once it is on disk");
        let again = loop {
            match put("third") {
                Answer::Now(Err(e)) => {
                    assert!(std::time::Instant::now() < deadline, "still refused: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                other => break other,
            }
        };
        let Answer::WhenDurable(later) = again else {
            panic!("a put's start waits for the disk");
        };
        runtime
            .block_on(later)
            .expect("accepted again, with no restart");
        let live = service.with_master(|m, _| m.state_fingerprint());
        drop(service);
        assert_eq!(recovered(&path).unwrap(), live, "nothing lost or invented");
        let _ = fs::remove_dir_all(&path);
    }

    /// Puts `puts` objects through a service on `dir`, each acknowledged (on disk) before
    /// the next; returns the live state's fingerprint. The service is then abandoned as a
    /// process that dies is: nothing more reaches the disk.
    fn acknowledged_puts(dir: Arc<dyn StateDir>, puts: usize) -> String {
        use mooring_proto::transport::Answer;
        let service = MasterService::persistent_in(dir, MasterConfig::default(), 4 << 10)
            .expect("a fresh directory");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let answer = |request: mooring_proto::wire::MasterRequest| match service.answer(request) {
            Answer::Now(response) => response.unwrap(),
            Answer::WhenDurable(later) => runtime.block_on(later).unwrap(),
        };
        answer(Hello { client: CLIENT }.into());
        answer(
            MountSegment {
                client: CLIENT,
                spec: SegmentSpec {
                    name: "seg".into(),
                    base: 0,
                    size: 1 << 20,
                    endpoint: "node:1".into(),
                    key: 1,
                    rdma_key: None,
                },
            }
            .into(),
        );
        for i in 0..puts {
            let key = format!("k{i}");
            let Reply::PutStart(grant) = answer(
                PutStart {
                    client: CLIENT,
                    key: key.clone(),
                    size: 1000,
                    config: ReplicateConfig::single(),
                    upsert: false,
                }
                .into(),
            ) else {
                panic!("not a grant");
            };
            answer(
                PutEnd {
                    client: CLIENT,
                    key: key.clone(),
                    write: grant.write_id,
                    checksum: Checksum::of(key.as_bytes()),
                }
                .into(),
            );
        }
        let live = service.with_master(|m, _| m.state_fingerprint());
        // Dies: no end record, no last write.
        std::mem::forget(service);
        live
    }

    #[test]
    fn power_losses_and_flipped_bits_never_drop_an_acknowledged_change_silently() {
        use mooring_transport_sim::disk::{DiskFaults, SimDisk};
        use mooring_transport_sim::state_dir::SimStateDir;
        let (mut refused, mut intact) = (0, 0);
        for seed in 0..40u64 {
            let disk = Arc::new(SimDisk::new(seed));
            disk.set_faults(DiskFaults {
                torn_on_crash: 0.5,
                lost_on_crash: 0.3,
                ..DiskFaults::default()
            });
            let dir = SimStateDir::new(disk.clone());
            let live = acknowledged_puts(Arc::new(dir.clone()), 30 + seed as usize);
            // A power loss: what was not synced is torn or lost.
            disk.crash();
            let recovered = recover(&dir, MasterConfig::default())
                .expect("a power loss alone never stops recovery")
                .master
                .state_fingerprint();
            assert!(
                recovered == live,
                "seed {seed}: an acknowledged change was lost"
            );

            // Then a bit flips in the newest journal: half the flips among the records,
            // half anywhere (mostly the zeros written ahead of them).
            let (journals, _) = generations(&dir).unwrap();
            let g = *journals.last().unwrap();
            let name = journal_name(g);
            let bytes = disk.contents(&name).unwrap();
            let len = if seed % 2 == 0 {
                journal::decode(g, &bytes).intact as u64
            } else {
                bytes.len() as u64
            };
            let mut rng = mooring_core::rng::Rng::seeded(seed);
            let at = rng.next_u64() % len;
            disk.flip_bit(&name, at, (rng.next_u64() % 8) as u8)
                .unwrap();
            match recover(&dir, MasterConfig::default()) {
                Ok(r) => {
                    assert!(
                        r.master.state_fingerprint() == live,
                        "seed {seed}: a flip at byte {at} of {len} dropped changes silently"
                    );
                    intact += 1;
                }
                Err(e) => {
                    assert!(e.to_string().contains(&name), "{e}");
                    refused += 1;
                }
            }
        }
        assert!(
            refused > 0 && intact > 0,
            "refused {refused}, intact {intact}"
        );
    }

    #[test]
    fn a_failed_sync_stops_acknowledging_changes_for_good() {
        use mooring_proto::transport::Answer;
        use mooring_proto::wire::{Exist, MasterRequest};
        let path = scratch("sync-fails");
        let sync_fails = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dir = Arc::new(Fillable {
            dir: Some(PosixStateDir::new(&path)),
            sync_fails: sync_fails.clone(),
            ..Fillable::default()
        });
        let service = MasterService::persistent_in(dir, MasterConfig::default(), SNAPSHOT_AFTER)
            .expect("a fresh directory");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answer = |request: MasterRequest| match service.answer(request) {
            Answer::Now(response) => response,
            Answer::WhenDurable(later) => runtime.block_on(later),
        };
        let remove = |key: &str| answer(Remove { key: key.into() }.into());
        answer(Hello { client: CLIENT }.into()).unwrap();
        sync_fails.store(true, Ordering::SeqCst);
        let failed = remove("a").unwrap_err();
        assert_eq!(
            failed.code,
            ErrorCode::RPC_FAIL,
            "an outcome unknown: {failed}"
        );
        assert!(
            failed.to_string().contains("could not make it durable"),
            "{failed}"
        );
        // The disk works again, but what the failed sync covered may be gone: nothing after
        // it is acknowledged, and changes are refused before they are applied.
        sync_fails.store(false, Ordering::SeqCst);
        let refused = remove("b").unwrap_err();
        assert_eq!(
            refused.code,
            ErrorCode::FILE_WRITE_FAIL,
            "refused: {refused}"
        );
        assert!(refused.to_string().contains("cannot persist"), "{refused}");
        assert_eq!(
            answer(Exist { key: "b".into() }.into()),
            Ok(Reply::Exist(false)),
            "reads go on"
        );
        drop(service);
        let _ = fs::remove_dir_all(&path);
    }
}
