//! What became of copy and move tasks, so whoever started one can go on and ask later
//! (Mooncake's QueryTask).
//!
//! A running task is described from the task table itself; an ended one from the report kept
//! when it ended. Only the newest [`KEPT_TASK_REPORTS`] ended tasks are kept: a master must not
//! grow with every task ever run when nobody asks.

use std::collections::BTreeMap;

use crate::error::{Error, ErrorCode, Result};
use crate::ids::{ClientId, TaskId};
use crate::master::Master;
use crate::time::Millis;

/// How many ended tasks the master remembers for `query_task`.
pub const KEPT_TASK_REPORTS: usize = 4096;

/// What a task was started to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub enum TaskAction {
    /// Add replicas, keeping the source (`copy_start`).
    Copy,
    /// Replace the replica on one segment by one on another (`move_start`).
    Move,
    /// Restore a replica lost with a segment (`take_repairs`).
    Repair,
}

/// Where a task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub enum TaskState {
    /// Started and not yet ended: its client is copying.
    Running,
    /// Ended with every new replica complete.
    Succeeded,
    /// Ended without its new replicas; `TaskReport::message` says why.
    Failed,
}

/// A task as `query_task` reports it.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct TaskReport {
    /// The task.
    pub task: TaskId,
    /// The object it copies.
    pub key: String,
    /// What it was started to do.
    pub action: TaskAction,
    /// The client carrying it out.
    pub client: ClientId,
    /// Where it stands.
    pub state: TaskState,
    /// When it started (master time).
    pub started: Millis,
    /// When its state last changed (master time): its start, or its end.
    pub updated: Millis,
    /// Why it failed; empty otherwise.
    pub message: String,
    /// The master's clock when it answered: `now - started` is the task's age, for callers
    /// that show wall-clock times.
    pub now: Millis,
}

/// Reports of ended tasks, the newest [`KEPT_TASK_REPORTS`].
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct EndedTasks {
    by_id: BTreeMap<TaskId, TaskReport>,
}

impl EndedTasks {
    /// Keeps `report`, forgetting the oldest ended task beyond the limit (task ids grow, so the
    /// smallest id is the oldest).
    pub(crate) fn keep(&mut self, report: TaskReport) {
        self.by_id.insert(report.task, report);
        while self.by_id.len() > KEPT_TASK_REPORTS {
            self.by_id.pop_first();
        }
    }

    pub(crate) fn get(&self, task: TaskId) -> Option<&TaskReport> {
        self.by_id.get(&task)
    }

    pub(crate) fn rebase(&mut self, shift: impl Fn(Millis) -> Millis) {
        for report in self.by_id.values_mut() {
            report.started = shift(report.started);
            report.updated = shift(report.updated);
        }
    }
}

impl Master {
    /// Where task `task` stands: running, or how it ended. `OBJECT_NO_REPLICATION_TASK` for a
    /// task this master never started or has forgotten (it keeps the newest
    /// [`KEPT_TASK_REPORTS`] ended ones). Changes nothing.
    pub fn query_task(&self, task: TaskId, now: Millis) -> Result<TaskReport> {
        let now = now.max(self.now);
        if let Some(report) = self.running_task_report(task, now) {
            return Ok(report);
        }
        let ended = self
            .tasks
            .ended
            .get(task)
            .cloned()
            .map(|report| TaskReport { now, ..report });
        ended.ok_or_else(|| {
            Error::new(
                ErrorCode::OBJECT_NO_REPLICATION_TASK,
                format!(
                    "{task} is unknown: it was never started here, or it ended long ago (the \
                     master keeps the last {KEPT_TASK_REPORTS} ended tasks)"
                ),
            )
        })
    }

    /// A running task's report at `now`, if `task` is running.
    fn running_task_report(&self, task: TaskId, now: Millis) -> Option<TaskReport> {
        let running = self.tasks.get(task)?;
        Some(TaskReport {
            task,
            key: running.key.to_string(),
            action: running.action(),
            client: running.client,
            state: TaskState::Running,
            started: running.started,
            updated: running.started,
            message: String::new(),
            now,
        })
    }
}
