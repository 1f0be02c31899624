//! The writer: what is waiting to be written, and the thread (inline in the simulation)
//! that writes and syncs it in groups, holds it while the directory is full, and stops for
//! good when a sync fails.

use super::files::JournalFile;
use super::*;

/// What the writer thread has still to write.
#[derive(Default)]
pub(super) struct Pending {
    /// The generation whose journal the records in `bytes` go to.
    pub(super) generation: u64,
    /// Records appended since the writer last took them.
    pub(super) bytes: Vec<u8>,
    /// Sequence number of the last record appended.
    pub(super) appended: u64,
    /// A switch to a new generation: (its number, its header and first record, the records
    /// appended before the switch and the end record, which still go to the old journal).
    /// `bytes` then holds the records after it.
    pub(super) rotate: Option<(u64, Vec<u8>, Vec<u8>)>,
    /// The writer has taken a switch and not finished it (the directory was full): no next
    /// switch may begin until it has, or the records of the generation after it would land
    /// in its journal.
    pub(super) switching: bool,
    /// The journal is being dropped: write what is left and stop.
    pub(super) closing: bool,
    /// The writer is waiting for records: an append that brings `appended` to `wake_at`
    /// must wake it. (While it writes and syncs, appends only add to `bytes`: waking costs a
    /// system call per append.)
    pub(super) writer_waiting: bool,
    /// See `writer_waiting`.
    pub(super) wake_at: u64,
}

impl Pending {
    /// No switch to a new generation is asked for or under way.
    pub(super) fn is_idle(&self) -> bool {
        self.rotate.is_none() && !self.switching
    }
}

/// Writes what the journal has accumulated: the writer thread's work, or (in the
/// simulation, which allows no threads) done inline after each append.
pub(super) struct Writer {
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
    /// The writer of `file`, generation `generation`'s journal in `dir`, synced so far.
    pub(super) fn new(file: JournalFile, generation: u64, dir: Arc<dyn StateDir>) -> Writer {
        Writer {
            file,
            generation,
            dir,
            rotating: None,
            spare: Vec::new(),
            synced: 0,
            last_woken: 0,
            last_sync: std::time::Duration::ZERO,
        }
    }

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
    pub(super) fn write_pending(&mut self, shared: &Shared, wait: bool) -> bool {
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
                pending.switching = true;
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
        // How much of `bytes` is synced: a large batch goes in pieces, each followed by its
        // sync mark, so recovery finds a mark near any record (see `journal::MARK_REACH`).
        let mut done = 0;
        let written: io::Result<()> = (|| {
            if let Some(mut rotation) = self.rotating.take() {
                let switched = self.switch(shared, &mut rotation);
                if switched.is_err() {
                    self.rotating = Some(rotation);
                } else {
                    shared
                        .pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .switching = false;
                }
                switched?;
            }
            loop {
                let piece = journal::sync_piece(&bytes[done..]);
                self.file.append(&bytes[done..done + piece])?;
                self.file.sync()?;
                done += piece;
                if done == bytes.len() {
                    return Ok(());
                }
                self.mark_synced();
            }
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
                shared
                    .counts
                    .bytes
                    .fetch_add(done as u64, Ordering::Relaxed);
                self.hold(shared, bytes[done..].to_vec(), &e);
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
