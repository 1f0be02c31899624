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
//! If a write or sync fails, the master stops acknowledging changes (they fail with
//! `INTERNAL_ERROR`) until it is restarted from the directory.
//!
//! **Snapshots.** Once the journal has grown by `snapshot_after` bytes, and by at least twice
//! the size of the last snapshot (so snapshots cost at most half the journal's writing,
//! however large the state), the master's state is taken under its lock (a copy-on-write
//! share, not a copy) and the journal moves on to the next generation; a helper thread writes
//! the snapshot (to a temporary name, synced, then renamed) and then retires the generation
//! before the previous one.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use mooring_core::log_shipping::LogPosition;
use mooring_core::{EncodedSnapshot, Error, ErrorCode, Master, MasterConfig, Millis, Result};
use mooring_proto::journal::{self, Input};
use tracing::{error, info, warn};

use crate::latest::{Follower, Latest};
use crate::seq_waiters::SeqWaiters;

/// Journal bytes that start a snapshot, by default. A snapshot also waits until the journal
/// has grown to twice the last snapshot, so writing snapshots costs at most half as many
/// bytes as the journal, however large the state.
pub const SNAPSHOT_AFTER: u64 = 64 << 20;

/// Where generation `generation`'s journal is kept in `dir`.
pub(crate) fn journal_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("journal-{generation:020}.log"))
}

/// Where generation `generation`'s snapshot is kept in `dir`.
pub(crate) fn snapshot_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("snapshot-{generation:020}.snap"))
}

fn io_error(what: String) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, what)
}

/// Makes a rename or a new file in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The generations present in `dir`: (journals, snapshots), each ascending.
pub(crate) fn generations(dir: &Path) -> Result<(Vec<u64>, Vec<u64>)> {
    let entries = fs::read_dir(dir).map_err(|e| {
        io_error(format!(
            "cannot read the state directory {}: {e}",
            dir.display()
        ))
    })?;
    let (mut journals, mut snapshots) = (Vec::new(), Vec::new());
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
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
pub fn recover(dir: &Path, config: MasterConfig) -> Result<Recovered> {
    fs::create_dir_all(dir).map_err(|e| {
        io_error(format!(
            "cannot create the state directory {}: {e}",
            dir.display()
        ))
    })?;
    let (journals, snapshots) = generations(dir)?;
    let base = snapshots.last().copied();
    let mut master: Option<Master> = None;
    let mut snapshot = match base {
        Some(g) => Some(fs::read(snapshot_path(dir, g)).map_err(|e| {
            io_error(format!(
                "cannot read snapshot {g} in {}: {e}",
                dir.display()
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
            dir.display(),
            gap.1,
            gap.0
        )));
    }
    let mut replayed = 0;
    let mut generation = first;
    for (i, &g) in to_replay.iter().enumerate() {
        generation = g;
        let path = journal_path(dir, g);
        let bytes = fs::read(&path)
            .map_err(|e| io_error(format!("cannot read {}: {e}", path.display())))?;
        let decoded = journal::decode(g, &bytes);
        let last = i + 1 == to_replay.len();
        if decoded.foreign {
            let why = decoded.stopped.as_deref().unwrap_or_default();
            return Err(io_error(format!(
                "{} holds bytes this build cannot read ({why}): it was written by another \
                 version of Mooring; start the version that wrote it, or move the \
                 directory aside to start empty",
                path.display()
            )));
        }
        if !last && !decoded.ended {
            let why = decoded
                .stopped
                .as_deref()
                .unwrap_or("before its end record");
            return Err(io_error(format!(
                "{} is damaged ({why}), and later journals follow it: the history cannot \
                 be replayed past it; move the directory aside to start empty",
                path.display()
            )));
        }
        if let Some(why) = &decoded.stopped {
            // A torn write, or records left from the file's earlier use: the writer had not
            // synced past here, so nothing after it was acknowledged.
            info!("{} ends at byte {} ({why})", path.display(), decoded.intact);
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
                    "{} does not start with its configuration record",
                    path.display()
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
    dir: PathBuf,
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
        dir: &Path,
        generation: u64,
        master: &Master,
        snapshot_after: u64,
    ) -> Result<Journal> {
        let generation = generation + 1;
        let snapshot_bytes = write_snapshot(dir, generation, &master.snapshot_state().encode(0))?;
        let path = journal_path(dir, generation);
        let file = JournalFile::create(dir, generation, &config_record(master, generation))
            .and_then(|file| sync_dir(dir).map(|()| file))
            .map_err(|e| io_error(format!("cannot write {}: {e}", path.display())))?;
        retire_before(dir, generation, None);
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
        });
        let writer = Writer {
            file,
            generation,
            dir: dir.to_path_buf(),
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
        info!(dir = %dir.display(), generation, "journal started");
        Ok(Journal {
            dir: dir.to_path_buf(),
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
            journal::record(pending.generation, now, payload, &mut pending.bytes);
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
    pub fn dir(&self) -> &Path {
        &self.dir
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
                io_error(format!(
                    "the master cannot persist changes ({why}); it acknowledges none until it \
                     is restarted"
                ))
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
            match write_snapshot(&dir, generation, &encoded) {
                Ok(bytes) => {
                    last_snapshot.store(bytes, Ordering::Relaxed);
                    // The journal before this one stays a generation longer: a standby may still
                    // be copying its last records (see `crate::ha`). The one before that is
                    // reused for the next generation: room for all of it saves the writer
                    // growing its file (see `JournalFile`).
                    let room = snapshot_after.max(2 * bytes) + PREWRITE;
                    retire_before(&dir, generation.saturating_sub(1), Some(room));
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

/// Writes `snapshot` as generation `generation`, durably; returns its size.
fn write_snapshot(dir: &Path, generation: u64, snapshot: &EncodedSnapshot) -> Result<u64> {
    let path = snapshot_path(dir, generation);
    let temporary = path.with_extension("snap.tmp");
    let written = (|| {
        let mut file = File::create(&temporary)?;
        for piece in snapshot.pieces() {
            file.write_all(piece)?;
        }
        file.sync_all()?;
        fs::rename(&temporary, &path)?;
        sync_dir(dir)
    })();
    written
        .map(|()| snapshot.len() as u64)
        .map_err(|e| io_error(format!("cannot write snapshot {}: {e}", path.display())))
}

/// Where a retired journal waits to be reused as the next generation's file.
fn spare_path(dir: &Path) -> PathBuf {
    dir.join("journal-spare.log")
}

/// Deletes the files of generations before `generation` (a snapshot of it is on disk), but
/// keeps the newest of their journals as the spare the next journal reuses (unless a spare
/// is waiting already), grown to `room` bytes when given. (No spare is made from nothing:
/// writing a whole file of zeros in the background slowed the journal's syncs as much as
/// the growth it saves.)
fn retire_before(dir: &Path, generation: u64, room: Option<u64>) {
    let spare = spare_path(dir);
    if !spare.exists()
        && let Ok((journals, _)) = generations(dir)
        && let Some(&newest) = journals.iter().rfind(|&&g| g < generation)
    {
        let retired = journal_path(dir, newest);
        let prepared = match room {
            // Grown under another name: the writer may take the spare at any moment, and
            // then writes past its end.
            Some(room) => {
                let growing = dir.join("journal-spare-growing.log");
                let grown = fs::rename(&retired, &growing)
                    .and_then(|()| grow(&growing, room))
                    .and_then(|()| fs::rename(&growing, &spare));
                if grown.is_err() {
                    let _ = fs::remove_file(&growing);
                }
                grown
            }
            None => fs::rename(&retired, &spare),
        };
        if let Err(e) = prepared {
            warn!(dir = %dir.display(), "cannot keep a journal file for reuse: {e}");
        }
    }
    delete_before(dir, generation);
}

/// Writes zeros after the end of the file at `path` until it holds `room` bytes, synced a
/// [`PREWRITE`] at a time (each sync carries no more than that).
fn grow(path: &Path, room: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let mut len = file.metadata()?.len();
    let zeros = vec![0u8; PREWRITE as usize];
    while len < room {
        let step = (room - len).min(PREWRITE);
        file.write_all_at(&zeros[..step as usize], len)?;
        #[cfg(not(madsim))]
        file.sync_data()?;
        len += step;
    }
    Ok(())
}

/// Deletes the files of generations before `generation` (a snapshot of it is on disk).
pub(crate) fn delete_before(dir: &Path, generation: u64) {
    let Ok((journals, snapshots)) = generations(dir) else {
        return;
    };
    for g in journals.into_iter().filter(|&g| g < generation) {
        let _ = fs::remove_file(journal_path(dir, g));
    }
    for g in snapshots.into_iter().filter(|&g| g < generation) {
        let _ = fs::remove_file(snapshot_path(dir, g));
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
    file: File,
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
    /// and first record), synced: the spare file if there is one, else a new file.
    fn create(dir: &Path, generation: u64, first: &[u8]) -> std::io::Result<JournalFile> {
        let path = journal_path(dir, generation);
        if path.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a journal of this generation exists already",
            ));
        }
        let reused = fs::rename(spare_path(dir), &path).is_ok();
        let file = if reused {
            OpenOptions::new().write(true).open(&path)?
        } else {
            OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(&path)?
        };
        let mut journal = JournalFile {
            reused,
            written: file.metadata()?.len(),
            file,
            end: 0,
        };
        journal.append(first)?;
        journal.file.sync_all()?;
        Ok(journal)
    }

    /// Writes `bytes` after the last record (not yet synced).
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let needed = self.end + bytes.len() as u64;
        if needed > self.written {
            let upto = needed.max(self.written + PREWRITE);
            let zeros = vec![0u8; (upto - self.written) as usize];
            self.file.write_all_at(&zeros, self.written)?;
            self.written = upto;
        }
        self.file.write_all_at(bytes, self.end)?;
        self.end = needed;
        Ok(())
    }

    /// Makes every appended record durable. (A simulated crash loses no page cache: the
    /// simulation skips the real sync, which would only make its runs slow.)
    fn sync(&self) -> std::io::Result<()> {
        #[cfg(not(madsim))]
        self.file.sync_data()?;
        Ok(())
    }
}

/// Writes what the journal has accumulated: the writer thread's work, or (in the
/// simulation, which allows no threads) done inline after each append.
struct Writer {
    file: JournalFile,
    /// The generation `file` belongs to.
    generation: u64,
    dir: PathBuf,
    /// The buffer the next batch of records accumulates in, handed back and forth.
    spare: Vec<u8>,
    /// The last record on disk.
    synced: u64,
    /// How many records the last sync covered (and so how many requests it woke).
    last_woken: u64,
    /// How long the last write and sync took.
    last_sync: std::time::Duration,
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
        while pending.bytes.is_empty() && pending.rotate.is_none() && !pending.closing {
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

    /// Writes and syncs everything appended so far, waiting for something to write if
    /// `wait`; then wakes the requests it covered. False once the journal is closing or
    /// broken.
    fn write_pending(&mut self, shared: &Shared, wait: bool) -> bool {
        let (bytes, seq, rotate, closing) = {
            let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            if wait {
                pending = self.gather(shared, pending);
            }
            self.spare.clear();
            let bytes = std::mem::replace(&mut pending.bytes, std::mem::take(&mut self.spare));
            (
                bytes,
                pending.appended,
                pending.rotate.take(),
                pending.closing,
            )
        };
        let started = std::time::Instant::now();
        let written = (|| {
            if let Some((generation, config, before)) = &rotate {
                // The records before the switch end the old journal; the rest start the new.
                self.file.append(before)?;
                self.file.sync()?;
                let next = JournalFile::create(&self.dir, *generation, config)?;
                sync_dir(&self.dir)?;
                shared.completed.insert(self.generation, self.file.end);
                if next.reused {
                    shared.counts.reused_files.fetch_add(1, Ordering::Relaxed);
                }
                self.file = next;
                self.generation = *generation;
            }
            self.file.append(&bytes)?;
            self.file.sync()
        })();
        self.last_sync = started.elapsed();
        self.last_woken = seq - self.synced;
        let c = &shared.counts;
        let micros = self.last_sync.as_micros() as u64;
        c.sync_micros.fetch_add(micros, Ordering::Relaxed);
        if self.last_sync > SLOW_SYNC {
            c.slow_syncs.fetch_add(1, Ordering::Relaxed);
            c.slow_sync_micros.fetch_add(micros, Ordering::Relaxed);
        }
        c.syncs.fetch_add(1, Ordering::Relaxed);
        c.records.fetch_add(seq - self.synced, Ordering::Relaxed);
        let before_len = rotate.as_ref().map_or(0, |r| r.2.len());
        c.bytes
            .fetch_add((bytes.len() + before_len) as u64, Ordering::Relaxed);
        self.synced = seq;
        self.spare = bytes;
        match written {
            Ok(()) => {
                let waking = std::time::Instant::now();
                shared.waiters.advance(seq);
                shared.durable.set(Ok(Synced {
                    seq,
                    end: LogPosition {
                        generation: self.generation,
                        offset: self.file.end,
                    },
                }));
                c.wake_micros
                    .fetch_add(waking.elapsed().as_micros() as u64, Ordering::Relaxed);
                !closing
            }
            Err(e) => {
                error!(
                    dir = %self.dir.display(),
                    "the journal cannot write ({e}): the master acknowledges no more changes; \
                     fix the disk and restart it (it recovers what was synced)"
                );
                shared.waiters.stop(e.to_string());
                shared.durable.set(Err(e.to_string()));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use mooring_core::{Checksum, ClientId, ReplicateConfig, SegmentSpec};
    use mooring_proto::transport::RpcHandler;
    use mooring_proto::wire::{Hello, MountSegment, PutEnd, PutStart, Remove, Reply};

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
        let reached = || generations(dir).unwrap().0.last() >= Some(&generation);
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
        recover(dir, MasterConfig::default()).map(|r| r.master.state_fingerprint())
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
        let spare = fs::metadata(spare_path(&dir)).expect("a retired journal kept for reuse");
        // The next restart's journal is that file, reused: after its own first record come
        // the older generation's records, which recovery takes for the end.
        let (live, reused) = restart();
        assert_eq!(reused, 1, "counted as reused");
        let (journals, _) = generations(&dir).unwrap();
        let g = *journals.last().unwrap();
        let path = journal_path(&dir, g);
        assert_eq!(fs::metadata(&path).unwrap().ino(), spare.ino());
        let bytes = fs::read(&path).unwrap();
        let decoded = journal::decode(g, &bytes);
        assert_eq!(decoded.entries.len(), 1, "the configuration alone");
        assert!(
            decoded
                .stopped
                .as_deref()
                .is_some_and(|why| why.contains("checksum")),
            "{:?}",
            decoded.stopped
        );
        assert_eq!(recovered(&dir).unwrap(), live);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_tail_is_dropped_and_damage_before_later_journals_is_refused() {
        let dir = scratch("torn");
        let live = run(&dir, 10, SNAPSHOT_AFTER, 0);
        let (journals, _) = generations(&dir).unwrap();
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
}
