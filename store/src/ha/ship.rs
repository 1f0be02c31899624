//! The leader's side of log shipping: standbys fetch its state files with `Follow`, each
//! request acknowledging what the standby holds, and answers that acknowledge a change wait
//! until every in-sync standby holds it (see [`mooring_core::log_shipping`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::log_shipping::{LogPosition, LogShipping, Membership};
use mooring_core::{Error, ErrorCode, Millis, Result};
use mooring_proto::state_dir::{OpenMode, StateDir};
use mooring_proto::transport::BoxFuture;
use mooring_proto::wire::{FOLLOW_CHUNK, Follow, FollowChunk, StateFile};
use tracing::{info, warn};

use crate::clock::Clock;
use crate::master::journal::{self, Journal, SyncState};
use crate::master::latest::{Follower, Latest};
use crate::master::seq_waiters::SeqWaiters;

/// How long a `Follow` waits for something new before answering with nothing.
const LONG_POLL: Duration = Duration::from_millis(500);

/// Where the in-sync set is recorded outside the leader (etcd), so only a standby holding
/// every acknowledged change can be elected. Each call replaces the whole set; it fails if
/// this master is no longer the leader.
pub trait InSyncRecord: Send + Sync + 'static {
    /// Records `members` (this leader among them) as the in-sync set.
    fn record(&self, members: Vec<String>) -> BoxFuture<'_, Result<()>>;
}

/// The leader's shipping state: standbys' positions, the in-sync set, and the last record
/// every in-sync standby holds.
pub struct Shipping {
    /// This leader's name in the in-sync set.
    me: String,
    state: Mutex<LogShipping>,
    /// The last record the leader may acknowledge, or why it may acknowledge nothing more.
    replicated: Latest<std::result::Result<u64, String>>,
    /// Requests waiting for their record to be replicated.
    waiters: SeqWaiters,
    record: Arc<dyn InSyncRecord>,
    /// Changes to the recorded set are made one at a time, in order.
    recording: tokio::sync::Mutex<()>,
    /// How long an in-sync standby may hold back an acknowledgement before it is dropped.
    timeout: Millis,
    clock: Clock,
}

impl Shipping {
    /// Shipping for `journal`, recording the in-sync set through `record` (the caller has
    /// recorded `me` alone); runs until the journal stops or the leader loses its office
    /// (then [`Shipping::deposed`] resolves).
    pub fn start(
        me: String,
        journal: &Journal,
        record: Arc<dyn InSyncRecord>,
        timeout: Duration,
    ) -> Arc<Shipping> {
        let mut syncs = journal.syncs();
        let first = syncs.get();
        let (seq, end) = match &first {
            Ok(s) => (s.seq, s.end),
            Err(_) => (0, LogPosition::default()),
        };
        let shipping = Arc::new(Shipping {
            me,
            state: Mutex::new(LogShipping::new(seq, end)),
            replicated: Latest::new(first.clone().map(|s| s.seq)),
            waiters: SeqWaiters::new(first.map(|s| s.seq)),
            record,
            recording: tokio::sync::Mutex::new(()),
            timeout: Millis(timeout.as_millis() as u64),
            clock: Clock::new(),
        });
        let weak = Arc::downgrade(&shipping);
        tokio::spawn(async move {
            loop {
                let changed = tokio::time::timeout(Duration::from_millis(100), syncs.changed());
                if let Ok(Err(_)) = changed.await {
                    return;
                }
                let Some(shipping) = weak.upgrade() else {
                    return;
                };
                let synced = syncs.take();
                match synced {
                    Ok(s) => {
                        let now = shipping.clock.now();
                        shipping.with_state(|log| log.synced(s.seq, s.end, now));
                    }
                    Err(why) => {
                        shipping.stop(why);
                        return;
                    }
                }
                shipping.drop_overdue().await;
            }
        });
        shipping
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut LogShipping) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let result = f(&mut state);
        let replicated = state.replicated();
        drop(state);
        self.waiters.advance(replicated);
        self.replicated.update(|r| match r {
            Ok(old) if *old < replicated => {
                *old = replicated;
                true
            }
            _ => false,
        });
        result
    }

    /// Acknowledges nothing more, and changes the recorded in-sync set no more: a leader that
    /// lost its office leaves the set to the next one.
    pub fn stop(&self, why: String) {
        self.waiters.stop(why.clone());
        self.replicated.set(Err(why));
    }

    /// Resolves once record `seq` is on the leader's disk and every in-sync standby's. If it
    /// cannot, the change was applied and is on this leader's disk, so whether it survives
    /// depends on who leads next: the caller is told its outcome is unknown (`RPC_FAIL`, as
    /// for a lost reply), never that it failed.
    pub fn replicated(&self, seq: u64) -> BoxFuture<'static, Result<()>> {
        let replicated = self.waiters.wait(seq);
        Box::pin(async move {
            replicated.await.map_err(|why| {
                Error::new(
                    ErrorCode::RPC_FAIL,
                    format!(
                        "the leader applied the change but cannot acknowledge changes any more \
                         ({why}): it survives only if the next leader holds it; read the key to \
                         know"
                    ),
                )
            })
        })
    }

    /// Resolves with the reason once the leader can acknowledge nothing more.
    pub async fn deposed(&self) -> String {
        let mut replicated = self.replicated.follow();
        match replicated.wait_for(|r| r.is_err()).await {
            Ok(r) => r.err().unwrap_or_default(),
            Err(_) => "shipping stopped".into(),
        }
    }

    /// The in-sync set as it should be recorded, leaving out `dropping`.
    fn members(&self, dropping: &[String]) -> Vec<String> {
        let mut members = vec![self.me.clone()];
        members.extend(
            self.with_state(|log| log.in_sync())
                .into_iter()
                .filter(|name| !dropping.contains(name)),
        );
        members
    }

    /// Records the in-sync set; a failure means this master no longer leads.
    async fn record_members(&self, dropping: &[String]) -> bool {
        let _one_at_a_time = self.recording.lock().await;
        // Deposed: its own office may still stand in etcd for a moment (the lease is renewed
        // until it is revoked), but the standbys it would drop only fell behind because it
        // stopped answering them (seed 13216).
        if self.replicated.get().is_err() {
            return false;
        }
        let members = self.members(dropping);
        match self.record.record(members.clone()).await {
            Ok(()) => {
                info!(?members, "in-sync masters recorded");
                true
            }
            Err(e) => {
                warn!("cannot record the in-sync masters, so this leader stops acknowledging: {e}");
                self.stop(format!("cannot record the in-sync masters: {e}"));
                false
            }
        }
    }

    /// Drops the standbys that held back an acknowledgement too long: recorded out of sync
    /// first, then no longer waited for.
    async fn drop_overdue(&self) {
        let now = self.clock.now();
        let overdue = self.with_state(|log| log.overdue(now, self.timeout));
        if overdue.is_empty() {
            return;
        }
        warn!(
            ?overdue,
            "standby masters fell behind; acknowledging without them (they cannot take over until they catch up)"
        );
        crate::coverage::hit(crate::coverage::Path::STANDBY_DROPPED);
        if self.record_members(&overdue).await {
            self.with_state(|log| {
                for name in &overdue {
                    log.drop_follower(name);
                }
            });
        }
    }

    /// Notes that standby `name` holds everything before `at`/`offset`; records it as in
    /// sync when it caught up.
    async fn acked(&self, name: &str, at: StateFile, offset: u64) {
        let StateFile::Journal(generation) = at else {
            return;
        };
        let position = LogPosition { generation, offset };
        if let Membership::Join(name) = self.with_state(|log| log.acked(name, position)) {
            info!(%name, "a standby master caught up");
            self.record_members(&[]).await;
        }
    }
}

impl Shipping {
    /// Notes that `chunk` went to standby `name`: what it may acknowledge holding ends there.
    fn sent(&self, name: &str, chunk: &FollowChunk) {
        let end = match chunk.file {
            StateFile::Journal(generation) => LogPosition {
                generation,
                offset: chunk.offset + chunk.bytes.len() as u64,
            },
            // A whole snapshot of generation g is the start of journal g.
            StateFile::Snapshot(generation) if chunk.complete => LogPosition {
                generation,
                offset: 0,
            },
            StateFile::Snapshot(_) => return,
        };
        self.with_state(|log| log.sent(name, end));
    }
}

fn unavailable(what: String) -> Error {
    Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, what)
}

/// Answers a standby's `Follow`: notes what it acknowledges, then gives it the next bytes of
/// the leader's state files (waiting up to [`LONG_POLL`] for more when it has everything).
pub async fn serve_follow(
    shipping: Arc<Shipping>,
    dir: Arc<dyn StateDir>,
    mut syncs: Follower<SyncState>,
    completed_end: impl Fn(u64) -> Option<u64>,
    request: Follow,
) -> Result<FollowChunk> {
    shipping
        .acked(&request.follower, request.at, request.offset)
        .await;
    let deadline = tokio::time::Instant::now() + LONG_POLL;
    loop {
        let synced = syncs
            .take()
            .map_err(|why| unavailable(format!("the leader's journal stopped: {why}")))?;
        match next_chunk(
            &*dir,
            synced.end,
            &completed_end,
            request.at,
            request.offset,
        )? {
            Some(chunk) => {
                shipping.sent(&request.follower, &chunk);
                return Ok(chunk);
            }
            None => {
                // The standby has everything: wait for the next sync.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match tokio::time::timeout(left, syncs.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => {
                        return Err(unavailable("the leader's journal closed".into()));
                    }
                    Err(_) => {
                        return Ok(FollowChunk {
                            file: request.at,
                            offset: request.offset,
                            bytes: Vec::new(),
                            complete: false,
                        });
                    }
                }
            }
        }
    }
}

/// The bytes after `offset` in `at`, or where the standby must go instead; None when it holds
/// everything on disk. A standby that completed a journal gets the snapshot that begins the
/// next one if there is one (so its copy need not keep every journal), else the next journal;
/// one that is anywhere the leader cannot continue from starts over from the newest snapshot.
fn next_chunk(
    dir: &dyn StateDir,
    end: LogPosition,
    completed_end: &impl Fn(u64) -> Option<u64>,
    at: StateFile,
    offset: u64,
) -> Result<Option<FollowChunk>> {
    let (_, snapshots) = journal::generations(dir)?;
    let Some(&base) = snapshots.last() else {
        return Err(unavailable(
            "the leader has written no snapshot yet; retry".into(),
        ));
    };
    let from_snapshot = || {
        read_chunk(
            dir,
            &journal::snapshot_name(base),
            StateFile::Snapshot(base),
            0,
            None,
        )
    };
    match at {
        StateFile::Journal(g) if g <= end.generation => {
            let file_end = if g == end.generation {
                Some(end.offset)
            } else {
                completed_end(g)
            };
            let Some(file_end) = file_end else {
                return from_snapshot().map(Some);
            };
            if offset > file_end {
                return from_snapshot().map(Some);
            }
            if offset == file_end {
                if g == end.generation {
                    return Ok(None);
                }
                let next = g + 1;
                let snapshot = journal::snapshot_name(next);
                if snapshots.contains(&next)
                    && let Ok(chunk) =
                        read_chunk(dir, &snapshot, StateFile::Snapshot(next), 0, None)
                {
                    return Ok(Some(chunk));
                }
                return Ok(Some(FollowChunk {
                    file: StateFile::Journal(next),
                    offset: 0,
                    bytes: Vec::new(),
                    complete: false,
                }));
            }
            let chunk = read_chunk(dir, &journal::journal_name(g), at, offset, Some(file_end));
            match chunk {
                Ok(mut chunk) => {
                    chunk.complete &= g < end.generation;
                    Ok(Some(chunk))
                }
                // Deleted under us once newer snapshots were written.
                Err(_) => from_snapshot().map(Some),
            }
        }
        StateFile::Snapshot(g) if snapshots.contains(&g) => {
            match read_chunk(dir, &journal::snapshot_name(g), at, offset, None) {
                Ok(chunk) => Ok(Some(chunk)),
                Err(_) => from_snapshot().map(Some),
            }
        }
        _ => from_snapshot().map(Some),
    }
}

/// Reads up to [`FOLLOW_CHUNK`] bytes of `name` from `offset`, up to `end` (the file's length
/// when None).
fn read_chunk(
    dir: &dyn StateDir,
    name: &str,
    file: StateFile,
    offset: u64,
    end: Option<u64>,
) -> Result<FollowChunk> {
    let failed =
        |e: std::io::Error| unavailable(format!("cannot read {}/{name}: {e}", dir.location()));
    let handle = dir.open(name, OpenMode::Read).map_err(failed)?;
    let end = match end {
        Some(end) => end,
        None => handle.len().map_err(failed)?,
    };
    let len = (end.saturating_sub(offset)).min(FOLLOW_CHUNK as u64) as usize;
    let mut bytes = vec![0u8; len];
    handle.read_at(&mut bytes, offset).map_err(failed)?;
    // A retired journal is renamed away before its file is reused: if `name` still names the
    // file read, the bytes are the ones it held.
    if dir.id_of(name).map_err(failed)? != handle.id() {
        return Err(unavailable(format!(
            "{}/{name} was retired while being read",
            dir.location()
        )));
    }
    Ok(FollowChunk {
        file,
        offset,
        bytes,
        complete: offset + len as u64 == end,
    })
}
