//! Copy and move tasks: adding replicas to an existing object, or moving one to another
//! segment (Mooncake's CopyStart/CopyEnd and MoveStart/MoveEnd).
//!
//! The master allocates the target blocks (PROCESSING) and names a complete source replica;
//! the client that asked copies the bytes and reports the end. While a task runs the object
//! cannot be upserted or removed (`OBJECT_HAS_REPLICATION_TASK`) or evicted, so its source
//! stays put. A task that is not ended within the put discard timeout, or whose client dies,
//! is abandoned like a zombie put: its target blocks wait out the release timeout.

use std::collections::BTreeMap;

use smallvec::SmallVec;

use crate::checksum::Checksum;
use crate::discard::DiscardReason;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{ClientId, TaskId, WriteId};
use crate::master::Master;
use crate::object::{Replica, ReplicaDescriptor, ReplicaStatus};
use crate::task_reports::{EndedTasks, TaskAction, TaskReport, TaskState};
use crate::time::Millis;

/// What a task does when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) enum TaskKind {
    /// Keep the source; the targets become extra replicas.
    Copy,
    /// Drop the replica on segment slot `source` once the target is complete.
    Move { source: u32 },
}

/// A running copy or move.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Task {
    pub client: ClientId,
    /// The object's key, for reports (its slot may be gone by the time the task ends).
    pub key: Box<str>,
    pub slot: u32,
    /// The object's write when the task started; identifies the object if the slot is reused.
    pub write: WriteId,
    pub kind: TaskKind,
    pub started: Millis,
    /// For a repair (see `repair`), what it restores: one that does not goes back in the
    /// queue.
    pub repair: Option<crate::repair::Repair>,
}

impl Task {
    /// What the task was started to do, as reports name it.
    pub(crate) fn action(&self) -> TaskAction {
        match (self.repair, self.kind) {
            (Some(_), _) => TaskAction::Repair,
            (None, TaskKind::Copy) => TaskAction::Copy,
            (None, TaskKind::Move { .. }) => TaskAction::Move,
        }
    }
}

/// Running tasks.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Tasks {
    by_id: BTreeMap<TaskId, Task>,
    /// Objects waiting for replicas they lost (see `repair`), in the order they lost them.
    pub(crate) repairs: BTreeMap<u64, crate::repair::Repair>,
    /// The next repair's place in the queue.
    pub(crate) next_repair: u64,
    /// How recent tasks ended, for `query_task`.
    pub(crate) ended: EndedTasks,
}

impl Tasks {
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(crate) fn next_deadline(&self, timeout: Millis) -> Option<Millis> {
        self.by_id.values().map(|t| t.started + timeout).min()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&TaskId, &Task)> {
        self.by_id.iter()
    }

    pub(crate) fn get(&self, id: TaskId) -> Option<&Task> {
        self.by_id.get(&id)
    }

    pub(crate) fn rebase(&mut self, shift: impl Fn(Millis) -> Millis) {
        for task in self.by_id.values_mut() {
            task.started = shift(task.started);
        }
        for repair in self.repairs.values_mut() {
            repair.not_before = shift(repair.not_before);
        }
        self.ended.rebase(shift);
    }
}

/// A task about to start: whose, on which object, from which replica to which allocated
/// (PROCESSING) targets.
pub(crate) struct TaskPlan {
    pub client: ClientId,
    pub slot: u32,
    pub source: Replica,
    pub targets: SmallVec<[Replica; 2]>,
    pub kind: TaskKind,
    /// For a repair, what it restores.
    pub repair: Option<crate::repair::Repair>,
}

/// A started copy or move: where to read and where to write.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct CopyGrant {
    /// Present this to end or revoke the task.
    pub task: TaskId,
    /// A complete replica to read from.
    pub source: ReplicaDescriptor,
    /// The new replicas to write (PROCESSING until the task ends).
    pub targets: Vec<ReplicaDescriptor>,
    /// The value's checksum: the copier checks the source's bytes against it.
    pub checksum: Checksum,
}

/// Why a move cannot start or end: held reads of `key` may be reading its source.
fn move_while_held(key: &str) -> Error {
    Error::new(
        ErrorCode::OBJECT_REPLICA_BUSY,
        format!("{key:?} is being read by held reads, and a move would free what they read"),
    )
}

/// How a task finishes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The copy is done: targets become complete.
    Complete,
    /// The client gave up after its transfers stopped: targets are freed now.
    Revoked,
    /// The client gave up while a transfer may still land: targets wait out the release
    /// timeout, as for every way of abandoning a task below.
    Aborted,
    /// The task was not ended within the put discard timeout.
    TimedOut,
    /// The client carrying it out left or was taken for dead.
    ClientGone,
    /// Its object's last copy went: with a segment, or evicted from its node's disk.
    ObjectLost,
}

impl Finish {
    /// Whether the task's client may still be writing its targets.
    fn abandons(self) -> bool {
        !matches!(self, Finish::Complete | Finish::Revoked)
    }

    /// Why a task that ended this way has no new replicas.
    fn failure(self) -> &'static str {
        match self {
            Finish::Complete => "every target segment went away while the task ran",
            Finish::Revoked => "the copier could not read the source; nothing was written",
            Finish::Aborted => "writing the new replicas failed",
            Finish::TimedOut => "the copier did not end the task within the put discard timeout",
            Finish::ClientGone => "the client carrying the task out left or was taken for dead",
            Finish::ObjectLost => {
                "the object was lost while the task ran (its last copy went with its segment, \
                 or from its disk)"
            }
        }
    }
}

impl Master {
    /// Copies `key` to each segment in `targets` (which must not already hold a replica).
    pub fn copy_start(
        &mut self,
        client: ClientId,
        key: &str,
        targets: &[String],
        now: Millis,
    ) -> Result<CopyGrant> {
        self.start_task(client, key, None, targets, now)
    }

    /// Moves `key`'s replica on segment `source` to segment `target`.
    pub fn move_start(
        &mut self,
        client: ClientId,
        key: &str,
        source: &str,
        target: &str,
        now: Millis,
    ) -> Result<CopyGrant> {
        self.start_task(client, key, Some(source), &[target.to_string()], now)
    }

    /// Ends a task whose transfers succeeded: the targets become readable (and a move drops its
    /// source once current readers' leases end).
    pub fn task_end(&mut self, client: ClientId, task: TaskId, now: Millis) -> Result<()> {
        let now = self.advance(now);
        self.touch(client, now);
        self.finish_task(client, task, Finish::Complete)
    }

    /// Gives up a task whose transfers may still land (one failed or timed out midway): the
    /// object is free for other tasks, upserts and removal at once, while the targets wait
    /// out the release timeout before their space is reused (what `PutAbort` is to a put).
    pub fn task_abort(&mut self, client: ClientId, task: TaskId, now: Millis) -> Result<()> {
        let now = self.advance(now);
        self.touch(client, now);
        if let Some(running) = self.tasks.by_id.get(&task)
            && running.client != client
        {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!("{task} belongs to client {}", running.client),
            ));
        }
        self.finish_task(client, task, Finish::Aborted)
    }

    /// Revokes a task whose transfers failed. Call it only after every transfer has stopped:
    /// the targets are freed at once.
    pub fn task_revoke(&mut self, client: ClientId, task: TaskId, now: Millis) -> Result<()> {
        let now = self.advance(now);
        self.touch(client, now);
        self.finish_task(client, task, Finish::Revoked)
    }

    fn start_task(
        &mut self,
        client: ClientId,
        key: &str,
        source: Option<&str>,
        targets: &[String],
        now: Millis,
    ) -> Result<CopyGrant> {
        let now = self.advance(now);
        self.touch(client, now);
        self.check_key(key)?;
        let slot = self.objects.find(key).ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        let object = self.objects.at(slot);
        if object.task().is_some() {
            return Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK.into());
        }
        if object.writing() || !object.has_complete_replica() {
            return Err(ErrorCode::REPLICA_IS_NOT_READY.into());
        }
        let source_replica = match source {
            Some(name) => {
                let seg = self.segments.slot_by_name(name).ok_or_else(|| {
                    Error::new(
                        ErrorCode::SEGMENT_NOT_FOUND,
                        format!("no segment named {name:?}"),
                    )
                })?;
                *object
                    .replicas
                    .iter()
                    .find(|r| r.segment == seg && r.is_complete())
                    .ok_or_else(|| {
                        Error::new(
                            ErrorCode::REPLICA_NOT_FOUND,
                            format!("{key:?} has no complete replica on {name:?}"),
                        )
                    })?
            }
            None => *object
                .replicas
                .iter()
                .find(|r| r.is_complete())
                .expect("checked above"),
        };
        if targets.is_empty() {
            return Err(Error::new(ErrorCode::INVALID_PARAMS, "no target segments"));
        }
        let mut target_slots: SmallVec<[u32; 2]> = SmallVec::new();
        for name in targets {
            let seg = self.segments.slot_by_name(name).ok_or_else(|| {
                Error::new(
                    ErrorCode::SEGMENT_NOT_FOUND,
                    format!("no segment named {name:?}"),
                )
            })?;
            if target_slots.contains(&seg) {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("segment {name:?} is named twice"),
                ));
            }
            if object.has_replica_on(seg) {
                return Err(Error::new(
                    ErrorCode::REPLICA_ALREADY_EXISTS,
                    format!("{key:?} already has a replica on {name:?}"),
                ));
            }
            target_slots.push(seg);
        }
        if source.is_some() && object.holds() > 0 {
            return Err(move_while_held(key));
        }
        let size = object.size();
        let kind = match source {
            Some(_) => TaskKind::Move {
                source: source_replica.segment,
            },
            None => TaskKind::Copy,
        };
        let mut placed: SmallVec<[Replica; 2]> = SmallVec::new();
        for &seg in &target_slots {
            match self.segments.allocate_on(seg, size) {
                Some(replica) => placed.push(replica),
                None => {
                    for replica in &placed {
                        self.segments.free(replica, size);
                    }
                    let name = &self.segments.at(seg).name;
                    return Err(Error::new(
                        ErrorCode::NO_AVAILABLE_HANDLE,
                        format!("segment {name:?} has no room for {size} bytes"),
                    ));
                }
            }
        }
        let plan = TaskPlan {
            client,
            slot,
            source: source_replica,
            targets: placed,
            kind,
            repair: None,
        };
        Ok(self.open_task(plan, now))
    }

    /// Starts the task `plan` describes.
    pub(crate) fn open_task(&mut self, plan: TaskPlan, now: Millis) -> CopyGrant {
        let TaskPlan {
            client,
            slot,
            source: source_replica,
            targets: placed,
            kind,
            repair,
        } = plan;
        let size = self.objects.at(slot).size();
        self.counters.next_task += 1;
        let id = TaskId(self.counters.next_task);
        let object = self.objects.at_mut(slot);
        object.replicas.extend(placed.iter().copied());
        object.set_task(Some(id));
        let write = object.write_id();
        let key = self.objects.key(slot).into();
        self.tasks.by_id.insert(
            id,
            Task {
                client,
                key,
                slot,
                write,
                kind,
                started: now,
                repair,
            },
        );
        CopyGrant {
            checksum: self.objects.checksum(slot),
            task: id,
            source: self.segments.describe(&source_replica, size),
            targets: placed
                .iter()
                .map(|r| self.segments.describe(r, size))
                .collect(),
        }
    }

    fn finish_task(&mut self, client: ClientId, id: TaskId, finish: Finish) -> Result<()> {
        let task = self.tasks.by_id.get(&id).cloned().ok_or_else(|| {
            Error::new(
                ErrorCode::OBJECT_NO_REPLICATION_TASK,
                format!("no running {id}"),
            )
        })?;
        if task.client != client && !finish.abandons() {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!("{id} belongs to client {}", task.client),
            ));
        }
        self.tasks.by_id.remove(&id);
        // A move frees its source, which a held read (one registered with the master, which
        // may outlast its lease) may still be reading: it cannot end while one is. Its
        // transfers are over, so its targets are freed at once.
        let held = self
            .objects
            .get(task.slot)
            .is_some_and(|o| o.write_id() == task.write && o.task() == Some(id) && o.holds() > 0);
        if finish == Finish::Complete && matches!(task.kind, TaskKind::Move { .. }) && held {
            let _ = self.close_task(id, &task, Finish::Revoked);
            let refused = Err(move_while_held(&task.key));
            self.record_task_end(id, task, finish, &refused);
            return refused;
        }
        let outcome = self.close_task(id, &task, finish);
        self.record_task_end(id, task, finish, &outcome);
        outcome
    }

    /// Applies how task `id` ended to its object.
    fn close_task(&mut self, id: TaskId, task: &Task, finish: Finish) -> Result<()> {
        let alive = self
            .objects
            .get(task.slot)
            .is_some_and(|o| o.write_id() == task.write && o.task() == Some(id));
        if !alive {
            // The object went away with a segment; there is nothing left to finish.
            return match finish {
                Finish::Complete => Err(Error::new(
                    ErrorCode::OBJECT_NOT_FOUND,
                    "the object was lost while the task ran",
                )),
                _ => Ok(()),
            };
        }
        let object = self.objects.at_mut(task.slot);
        object.set_task(None);
        let size = object.size();
        let readers_done = object.readers_done_at(self.config.lease_grace);
        let (targets, kept): (Vec<Replica>, Vec<Replica>) =
            object.replicas.iter().partition(|r| r.is_processing());
        match finish {
            Finish::Complete => {
                let mut dropped = Vec::new();
                for replica in object.replicas.iter_mut() {
                    replica.set_status(ReplicaStatus::Complete);
                }
                if let TaskKind::Move { source } = task.kind
                    && !targets.is_empty()
                {
                    dropped.extend(
                        object
                            .replicas
                            .iter()
                            .filter(|r| r.segment == source)
                            .copied(),
                    );
                    object.replicas.retain(|r| r.segment != source);
                }
                self.release_read_blocks(&dropped, size, readers_done);
                // A repair placed fewer replicas than were missing: the rest wait.
                self.requeue_repair(task, targets.is_empty());
                if targets.is_empty() {
                    return Err(Error::new(
                        ErrorCode::REPLICA_NOT_FOUND,
                        "every target segment went away while the task ran",
                    ));
                }
            }
            Finish::Revoked
            | Finish::Aborted
            | Finish::TimedOut
            | Finish::ClientGone
            | Finish::ObjectLost => {
                object.replicas = kept.into_iter().collect();
                self.requeue_repair(task, true);
                let release_at = if finish == Finish::Revoked {
                    Millis::ZERO
                } else {
                    task.started + self.config.put_start_release_timeout
                };
                let reason = DiscardReason::Preempted {
                    writer: task.client,
                };
                for replica in &targets {
                    self.release_block(replica, size, release_at, reason);
                }
            }
        }
        Ok(())
    }

    /// Keeps the report of task `id`, which ended as `finish` with `outcome`.
    fn record_task_end(&mut self, id: TaskId, task: Task, finish: Finish, outcome: &Result<()>) {
        let action = task.action();
        let (state, message) = match (finish, outcome) {
            (Finish::Complete, Ok(())) => (TaskState::Succeeded, String::new()),
            (Finish::Complete, Err(e)) => (TaskState::Failed, e.to_string()),
            (finish, _) => (TaskState::Failed, finish.failure().to_string()),
        };
        self.tasks.ended.keep(TaskReport {
            task: id,
            key: task.key.into(),
            action,
            client: task.client,
            state,
            started: task.started,
            updated: self.now,
            message,
            now: self.now,
        });
    }

    /// Puts a repair back in the queue if its object is still short of replicas: after a
    /// backoff if the task failed (`failed`), at once if it placed fewer than were missing.
    fn requeue_repair(&mut self, task: &Task, failed: bool) {
        let Some(repair) = task.repair else {
            return;
        };
        let short = self.objects.get(task.slot).is_some_and(|o| {
            o.write_id() == task.write
                && o.replicas.iter().filter(|r| r.is_complete()).count()
                    < usize::from(repair.wanted)
        });
        if short {
            let repair = if failed {
                repair.failed(self.now)
            } else {
                repair
            };
            self.tasks.queue_repair(repair);
        }
    }

    /// Abandons a task for the reason `why` (one of the ways that abandon): its targets wait
    /// out the release timeout (its client may still be copying).
    pub(crate) fn abandon_task(&mut self, id: TaskId, why: Finish) {
        debug_assert!(why.abandons());
        if let Some(task) = self.tasks.by_id.get(&id) {
            let client = task.client;
            self.finish_task(client, id, why)
                .expect("abandoning never fails");
        }
    }

    /// Abandons tasks past the discard timeout.
    pub(crate) fn expire_tasks(&mut self, now: Millis) {
        let timeout = self.config.put_start_discard_timeout;
        let stale: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.started + timeout <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            self.abandon_task(id, Finish::TimedOut);
        }
    }

    /// Abandons every task of a dead client.
    pub(crate) fn abandon_client_tasks(&mut self, client: ClientId) {
        let mine: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.client == client)
            .map(|(&id, _)| id)
            .collect();
        for id in mine {
            self.abandon_task(id, Finish::ClientGone);
        }
    }
}
