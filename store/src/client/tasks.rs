//! Copy and move tasks: this client carries out the transfer the master plans.
//!
//! The master allocates the new replicas and names a complete source (`CopyStart`,
//! `MoveStart`); the client reads the source, checks its bytes against the value's checksum,
//! writes them to every target and reports the end (`TaskEnd`). While the task runs the
//! master keeps the object in place (no eviction, removal or upsert), so the source cannot
//! change under the copy. A task that fails before anything was written is revoked (the
//! targets are freed at once); one that fails while writing is aborted (the targets wait out
//! the release timeout, since a late write may still land).

use mooring_core::client::membership;

use super::*;
use crate::node::memory::value_buffer;
use mooring_core::{CopyGrant, TaskId, TaskReport};
use mooring_proto::wire::{
    CopyStart, MoveStart, QueryTask, TakeRepairs, TaskAbort, TaskEnd, TaskRevoke,
};

impl Client {
    /// Adds a replica of `key` on each segment named in `targets`, copied from one of its
    /// complete replicas. `REPLICA_ALREADY_EXISTS` if a target already holds one.
    pub async fn copy(&self, key: &str, targets: &[&str]) -> Result<()> {
        self.operation("copy", key, async {
            let grant = self.start_copy_grant(key, targets).await?;
            self.carry_out(key, grant).await
        })
        .await
    }

    /// Moves `key`'s replica on segment `source` to segment `target`; the old replica's space
    /// is freed once readers that may still be reading it are done.
    pub async fn move_replica(&self, key: &str, source: &str, target: &str) -> Result<()> {
        self.operation("move", key, async {
            let grant = self.start_move_grant(key, source, target).await?;
            self.carry_out(key, grant).await
        })
        .await
    }

    /// Starts copying `key` to each segment in `targets` and returns the task at once
    /// (Mooncake's `CreateCopyTask`): this client carries the copy out in the background, and
    /// [`Client::query_task`] tells how it went. The master refuses a copy it cannot plan
    /// (no such key or segment, a replica already there, no room) here, before anything runs.
    /// The copy fails if this client closes before it ends.
    pub async fn start_copy(&self, key: &str, targets: &[&str]) -> Result<TaskId> {
        let grant = self.start_copy_grant(key, targets).await?;
        Ok(self.carry_out_in_background("copy", key, grant))
    }

    /// Starts moving `key`'s replica on segment `source` to segment `target` and returns the
    /// task at once (Mooncake's `CreateMoveTask`); see [`Client::start_copy`].
    pub async fn start_move(&self, key: &str, source: &str, target: &str) -> Result<TaskId> {
        let grant = self.start_move_grant(key, source, target).await?;
        Ok(self.carry_out_in_background("move", key, grant))
    }

    /// Where task `task` stands, as the master knows it (Mooncake's `QueryTask`): running, or
    /// how it ended and why it failed. Any client may ask about any task.
    pub async fn query_task(&self, task: TaskId) -> Result<TaskReport> {
        self.call(QueryTask { task }).await
    }

    /// Asks the master to plan a copy of `key` to `targets` (`CopyStart`).
    async fn start_copy_grant(&self, key: &str, targets: &[&str]) -> Result<CopyGrant> {
        self.call(CopyStart {
            client: self.id(),
            key: key.to_string(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
        })
        .await
    }

    /// Asks the master to plan a move of `key` from `source` to `target` (`MoveStart`).
    async fn start_move_grant(&self, key: &str, source: &str, target: &str) -> Result<CopyGrant> {
        self.call(MoveStart {
            client: self.id(),
            key: key.to_string(),
            source: source.to_string(),
            target: target.to_string(),
        })
        .await
    }

    /// Spawns the transfer of `grant`; its outcome reaches the master (and so `query_task`).
    fn carry_out_in_background(&self, name: &'static str, key: &str, grant: CopyGrant) -> TaskId {
        let task = grant.task;
        let (client, key) = (self.clone(), key.to_string());
        tokio::spawn(async move {
            let outcome = client
                .operation(name, &key, client.carry_out(&key, grant))
                .await;
            if let Err(e) = outcome {
                debug!(key, %task, "background {name} failed: {e}");
            }
        });
        task
    }

    /// Carries out up to `max` of the repair copies the master has waiting (replicas lost with
    /// a segment: see `Master::take_repairs`), all at once; returns how many completed. A
    /// repair that fails goes back in the master's queue.
    pub async fn repair(&self, max: u32) -> Result<usize> {
        let grants = self
            .call(TakeRepairs {
                client: self.id(),
                max,
            })
            .await?;
        let copies = grants.into_iter().map(|(key, grant)| async move {
            let outcome = self
                .operation("repair", &key, self.carry_out(&key, grant))
                .await;
            match &outcome {
                Ok(()) => crate::coverage::hit(crate::coverage::Path::REPLICA_REPAIRED),
                Err(e) => {
                    crate::coverage::hit(crate::coverage::Path::REPAIR_FAILED);
                    debug!(key, "repair copy failed (the master queues it again): {e}");
                }
            }
            outcome.is_ok()
        });
        Ok(join_all(copies).await.into_iter().filter(|&ok| ok).count())
    }

    /// Repairs in the background until the task is aborted: up to `per_second` objects a
    /// second, asked for ten times a second.
    pub fn spawn_repairs(&self, per_second: u32) -> tokio::task::JoinHandle<()> {
        let client = self.clone();
        let per_tick = membership::repairs_per_poll(per_second);
        let poll = Duration::from_millis(membership::REPAIR_POLL.as_millis());
        tokio::spawn(async move {
            let mut repaired = 0u64;
            loop {
                tokio::time::sleep(poll).await;
                match client.repair(per_tick).await {
                    Ok(0) => {}
                    Ok(n) => {
                        repaired += n as u64;
                        info!(n, repaired, "restored replicas lost with a segment");
                    }
                    Err(e) => debug!("asking for repairs failed: {e}"),
                }
            }
        })
    }

    /// Reads the grant's source, writes its targets and ends the task.
    async fn carry_out(&self, key: &str, grant: CopyGrant) -> Result<()> {
        let started = self.now();
        let (client, task) = (self.id(), grant.task);
        let read = async {
            let mut value = value_buffer(grant.source.len)?;
            self.read_replica(
                key,
                std::slice::from_ref(&grant.source),
                grant.checksum,
                &mut value,
            )
            .await?;
            Ok::<Vec<u8>, Error>(value)
        };
        let value = match read.await {
            Ok(value) => value,
            Err(e) => {
                // Nothing was written: the targets can be reused at once.
                if let Err(revoke) = self.call(TaskRevoke { client, task }).await {
                    debug!(
                        key,
                        "revoking the task failed (it times out instead): {revoke}"
                    );
                }
                return Err(e);
            }
        };
        let targets = PutGrant {
            write_id: WriteId(0),
            replicas: grant.targets,
        };
        let written = self
            .write_batch(&[(&targets, &value)], started)
            .await
            .pop()
            .expect("one result per job")
            .and_then(|sum| {
                if sum == grant.checksum {
                    Ok(())
                } else {
                    Err(Error::new(
                        ErrorCode::INVALID_REPLICA,
                        format!("the bytes written for {key:?} do not match its checksum"),
                    ))
                }
            });
        match written {
            Ok(()) => {
                buggify::hold(Site::CLIENT_BEFORE_TASK_END).await;
                self.call(TaskEnd { client, task }).await
            }
            Err(e) => {
                if let Err(abort) = self.call(TaskAbort { client, task }).await {
                    debug!(
                        key,
                        "aborting the task failed (it times out instead): {abort}"
                    );
                }
                Err(e)
            }
        }
    }
}
