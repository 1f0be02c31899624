//! Recovery: the newest snapshot, then every journal after it, replayed; damage that a
//! sync mark vouches for stops it (see the module docs of [`super`]).

use super::*;
use mooring_core::Parallel;

/// What [`recover`] found.
pub struct Recovered {
    /// The master as it was when the last intact record was applied, on that clock.
    pub master: Master,
    /// The generation the restarted master continues after.
    pub generation: u64,
    /// Journal records replayed.
    pub replayed: u64,
    /// The size of the snapshot restored (0 if none): the next snapshot's is close to it.
    pub snapshot_len: usize,
    /// The last journal replayed, if its header was intact: where its records end, for
    /// [`super::Journal::start`] to close it there.
    pub tail: Option<Tail>,
}

/// Where the last journal recovery replayed ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    /// Its generation.
    pub generation: u64,
    /// The bytes its header and intact records take: what follows is a torn record, zeros
    /// or an older generation's records, none of it acknowledged.
    pub intact: u64,
    /// It ends with its end record already.
    pub ended: bool,
}

/// Rebuilds the master kept in `dir` (created if missing): the newest snapshot, then every
/// journal from its generation on, replayed under the configuration each was written with
/// (a restart may have changed it: each journal's own is put in force where it begins), and
/// finally `config` in force. An empty directory gives a fresh master.
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
        Some(g) => Some(dir.read_whole(&snapshot_name(g)).map_err(|e| {
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
    let snapshot_len = snapshot.as_ref().map_or(0, |b| b.bytes().len());
    let mut replayed = 0;
    let mut generation = first;
    let mut tail = None;
    for (i, &g) in to_replay.iter().enumerate() {
        generation = g;
        let name = journal_name(g);
        let path = format!("{}/{name}", dir.location());
        let unreadable = |e: std::io::Error| io_error(format!("cannot read {path}: {e}"));
        let file = dir.open(&name, OpenMode::Read).map_err(unreadable)?;
        let len = file.len().map_err(unreadable)?;
        let read = |buf: &mut [u8], offset: u64| file.read_at(buf, offset).map_err(unreadable);
        // Records are applied as they are read, a window at a time; a journal found damaged
        // after some were applied fails the whole recovery below, so nothing applied from it
        // is kept.
        let mut ahead = LookAhead::default();
        let decoded = replay_overlapped(g, len, read, |now, input| {
            if let Input::Config(logged) = input {
                if let Some(m) = master.as_mut() {
                    replayed += ahead.apply(m);
                }
                let mut m = match (master.take(), snapshot.take()) {
                    (Some(m), _) => reconfigure(m, logged)?,
                    (None, Some(bytes)) => restore(logged, bytes.bytes(), first)?,
                    (None, None) => Master::new(logged)?,
                };
                // What replay changes was reported when it first happened.
                m.pause_key_changes(true);
                master = Some(m);
                info!("replaying {path}");
                return Ok(());
            }
            let Some(m) = master.as_mut() else {
                return Err(io_error(format!(
                    "{path} does not start with its configuration record"
                )));
            };
            if ahead.push(now, input) {
                replayed += ahead.apply(m);
            }
            Ok(())
        })?;
        if let Some(m) = master.as_mut() {
            replayed += ahead.apply(m);
        }
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
            // A torn write, or records left from the file's earlier use: no durable sync mark
            // vouches for what follows, so the writer had not synced past here, or had synced
            // only the last group of records before the crash (its mark, appended after that
            // sync, needs the next one). Damage within that last group reads the same as a
            // torn write and is dropped here: the one place a disk's damage can go unseen.
            crate::coverage::hit(crate::coverage::Path::JOURNAL_TORN_TAIL);
            info!("{path} ends at byte {} ({why})", decoded.intact);
        }
        tail = (decoded.intact >= journal::FILE_HEADER).then_some(Tail {
            generation: g,
            intact: decoded.intact as u64,
            ended: decoded.ended,
        });
    }
    // What replay did was reported when it first happened: its events are not news.
    if let Some(m) = master.as_mut() {
        m.drain_events();
        m.pause_key_changes(false);
    }
    let master = match (master, snapshot) {
        (Some(m), _) => reconfigure(m, config)?,
        (None, Some(bytes)) => restore(config, bytes.bytes(), first)?,
        (None, None) => Master::new(config)?,
    };
    Ok(Recovered {
        master,
        generation,
        replayed,
        snapshot_len,
        tail,
    })
}

/// [`journal::replay`] with the decoding on a thread of its own, so that reading, checking and
/// decoding the next records overlaps applying these (a restart replays millions of them):
/// `each` gets the records in order, on the caller's thread, and the result is the same.
/// Inline in the simulation, which runs everything on one thread.
fn replay_overlapped(
    generation: u64,
    len: u64,
    read: impl FnMut(&mut [u8], u64) -> Result<()> + Send,
    mut each: impl FnMut(Millis, Input) -> Result<()>,
) -> Result<journal::Decoded> {
    if cfg!(madsim) {
        return journal::replay(generation, len, journal::REPLAY_PIECE, read, each);
    }
    /// Records handed over at a time, and how many such batches the decoder may run ahead.
    /// The decoder is the faster of the two, so it waits on a full channel and every batch
    /// taken wakes it: batches of a thousand make that a few hundred wakes a second, not
    /// tens of thousands.
    const BATCH: usize = 1024;
    const BATCHES_AHEAD: usize = 4;
    std::thread::scope(|scope| {
        let (batches, received) = std::sync::mpsc::sync_channel(BATCHES_AHEAD);
        let decoder = std::thread::Builder::new()
            .name("mooring-replay".into())
            .spawn_scoped(scope, move || {
                let mut batch = Vec::with_capacity(BATCH);
                // A send fails only once the caller stopped taking records (its `each`
                // failed): that error is the one returned, this one is not seen.
                let stopped = || io_error("recovery stopped".into());
                let decoded = journal::replay(
                    generation,
                    len,
                    journal::REPLAY_PIECE,
                    read,
                    |now, input| {
                        batch.push((now, input));
                        if batch.len() == BATCH {
                            let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                            batches.send(full).map_err(|_| stopped())?;
                        }
                        Ok(())
                    },
                )?;
                if !batch.is_empty() {
                    batches.send(batch).map_err(|_| stopped())?;
                }
                Ok(decoded)
            })
            .map_err(|e| io_error(format!("cannot start the journal's decoder: {e}")))?;
        let mut failed = None;
        'batches: for batch in received.iter() {
            for (now, input) in batch {
                if let Err(e) = each(now, input) {
                    failed = Some(e);
                    break 'batches;
                }
            }
        }
        drop(received);
        let decoded = decoder
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match failed {
            Some(e) => Err(e),
            None => decoded,
        }
    })
}

/// Records decoded and not yet applied. Applying a record looks its key up: at millions of
/// objects, a chain of cache misses (index, object, key). Looking the window's keys up
/// together first ([`Master::warm`]) puts their misses in flight at once, and the records
/// then apply from the caches.
#[derive(Default)]
struct LookAhead {
    records: Vec<(Millis, Input)>,
}

impl LookAhead {
    /// Records in a window: enough misses to keep the memory system busy, few enough that
    /// what the first ones brought in is still cached when they apply.
    const WINDOW: usize = 32;

    /// Holds a record; whether the window is full.
    fn push(&mut self, now: Millis, input: Input) -> bool {
        self.records.push((now, input));
        self.records.len() >= Self::WINDOW
    }

    /// Applies the held records to `master` in order; how many.
    fn apply(&mut self, master: &mut Master) -> u64 {
        let keys: Vec<&str> = (self.records.iter())
            .flat_map(|(_, input)| match input {
                Input::Request(request) => request.keys(),
                _ => Vec::new(),
            })
            .collect();
        master.warm(&keys);
        let n = self.records.len() as u64;
        for (now, input) in self.records.drain(..) {
            journal::apply(master, now, input);
        }
        n
    }
}

/// The master in snapshot `generation`'s `bytes`; says so first, as a large one takes a
/// while.
fn restore(config: MasterConfig, bytes: &[u8], generation: u64) -> Result<Master> {
    info!(
        "restoring snapshot {generation} ({:.1} MB)",
        bytes.len() as f64 / 1e6
    );
    let master = restore_snapshot(config, bytes)?;
    info!(
        objects = master.stats().objects,
        "snapshot {generation} restored"
    );
    Ok(master)
}

/// `master` with `config` in force (a restart may change settings), on the same clock. A
/// restart with the settings it had keeps the master as it is: rebuilding it costs as much as
/// restoring the snapshot again (seconds, for tens of millions of objects).
fn reconfigure(master: Master, config: MasterConfig) -> Result<Master> {
    if *master.config() == config {
        return Ok(master);
    }
    restore_snapshot(config, &master.snapshot())
}

/// [`Master::restore_unshifted`] as a restart runs it: its two halves on two threads (one
/// after the other in the simulation, which runs everything on one thread).
pub fn restore_snapshot(config: MasterConfig, bytes: &[u8]) -> Result<Master> {
    if cfg!(madsim) {
        return Master::restore_unshifted(config, bytes, &mooring_core::Sequential);
    }
    Master::restore_unshifted(config, bytes, &Threads)
}

/// [`Parallel`] on a second thread: the first closure runs on a thread of its own while the
/// caller's runs the second.
struct Threads;

impl Parallel for Threads {
    fn join(&self, a: &mut (dyn FnMut() + Send), b: &mut (dyn FnMut() + Send)) {
        let side_by_side = std::thread::scope(|scope| {
            let first = std::thread::Builder::new()
                .name("mooring-restore".into())
                .spawn_scoped(scope, &mut *a);
            let Ok(first) = first else { return false };
            b();
            if let Err(panic) = first.join() {
                std::panic::resume_unwind(panic);
            }
            true
        });
        // No thread to be had: the same work, one half after the other.
        if !side_by_side {
            a();
            b();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generation 3's journal of `ticks` timer ticks (timed 1, 2, ...), closed by its end
    /// record.
    fn ticks_journal(ticks: u64) -> Vec<u8> {
        let mut bytes = journal::file_header(3).to_vec();
        for now in 1..=ticks {
            journal::record(3, Millis(now), &journal::tick_payload(), &mut bytes);
        }
        journal::record(3, Millis(0), &journal::end_payload(), &mut bytes);
        bytes
    }

    #[test]
    fn decoding_on_its_own_thread_hands_on_every_record_in_order_and_stops_when_told() {
        // Far more records than the decoder may run ahead of the caller.
        let bytes = ticks_journal(20_000);
        let read = |buf: &mut [u8], at: u64| {
            buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
            Ok(())
        };
        let mut seen = Vec::new();
        let decoded = replay_overlapped(3, bytes.len() as u64, read, |now, input| {
            assert_eq!(input, Input::Tick);
            seen.push(now.as_millis());
            Ok(())
        })
        .expect("it replays");
        assert_eq!(seen, (1..=20_000).collect::<Vec<u64>>());
        assert!(decoded.ended && decoded.stopped.is_none());
        assert_eq!(decoded.intact, bytes.len());

        // The caller's error ends the replay, however far ahead the decoder was.
        let mut taken = 0;
        let refused = replay_overlapped(3, bytes.len() as u64, read, |_, _| {
            taken += 1;
            match taken {
                100 => Err(io_error("the hundredth record is refused".into())),
                _ => Ok(()),
            }
        })
        .expect_err("refused");
        assert!(refused.to_string().contains("hundredth"), "{refused:?}");
        assert_eq!(taken, 100, "nothing reaches the caller after its error");

        // A read that fails is the replay's error.
        let failing = |_: &mut [u8], _: u64| Err(io_error("the disk is gone".into()));
        let failed = replay_overlapped(3, bytes.len() as u64, failing, |_, _| Ok(()))
            .expect_err("the read fails");
        assert!(
            failed.to_string().contains("the disk is gone"),
            "{failed:?}"
        );
    }
}
