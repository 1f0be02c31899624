//! Copy and move tasks: starting them (with the model's expected refusals), clients copying
//! the bytes, ending or revoking them, and the master abandoning them.

use super::harness::ClientTask;
use super::model::{MReplica, MTask};
use super::{
    CLIENTS, Harness, client_id, client_index, ensure, expect_code, key_name, segment_name,
    to_model_replica,
};
use crate::error::ErrorCode;
use crate::ids::TaskId;
use crate::object::ReplicaStatus;
use crate::segments::block_len;
use crate::time::Millis;

impl Harness {
    pub(super) fn copy(
        &mut self,
        client: u8,
        key: u8,
        source: Option<u8>,
        target: u8,
    ) -> Result<(), String> {
        let (id, key, target) = (client_id(client), key_name(key), segment_name(target));
        let source = source.map(segment_name);
        let now = self.now;
        let got = match &source {
            Some(s) => self.master.move_start(id, &key, s, &target, now),
            None => self
                .master
                .copy_start(id, &key, std::slice::from_ref(&target), now),
        };
        self.model.touch(id, now);
        self.no_events("copy")?;
        let Some(object) = self.model.objects.get(&key).cloned() else {
            return expect_code(&got, ErrorCode::OBJECT_NOT_FOUND, "copy");
        };
        if object.task.is_some() {
            return expect_code(&got, ErrorCode::OBJECT_HAS_REPLICATION_TASK, "copy");
        }
        if object.writing.is_some() || !object.has_complete() {
            return expect_code(&got, ErrorCode::REPLICA_IS_NOT_READY, "copy");
        }
        let mut move_source = None;
        if let Some(s) = &source {
            let Some(seg) = self.model.segments.get(s) else {
                return expect_code(&got, ErrorCode::SEGMENT_NOT_FOUND, "move source");
            };
            if !object
                .replicas
                .iter()
                .any(|r| r.segment == seg.id && r.complete)
            {
                return expect_code(&got, ErrorCode::REPLICA_NOT_FOUND, "move source");
            }
            move_source = Some(seg.id);
        }
        let Some(target_seg) = self.model.segments.get(&target).map(|s| s.id) else {
            return expect_code(&got, ErrorCode::SEGMENT_NOT_FOUND, "copy target");
        };
        if object.replicas.iter().any(|r| r.segment == target_seg) {
            return expect_code(&got, ErrorCode::REPLICA_ALREADY_EXISTS, "copy target");
        }
        if move_source.is_some() && object.holds > 0 {
            return expect_code(&got, ErrorCode::OBJECT_REPLICA_BUSY, "move while held");
        }
        let grant = match got {
            Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE => {
                let fits = self.model.segment_certainly_empty(target_seg)
                    && self
                        .model
                        .segment_by_id(target_seg)
                        .is_some_and(|(_, s)| s.capacity >= block_len(object.size));
                return ensure(!fits, || format!("copy refused on an empty target: {e}"));
            }
            other => other.map_err(|e| format!("copy failed: {e}"))?,
        };
        let version = object.version.expect("complete");
        ensure(
            object.replicas.iter().any(|r| {
                r.complete && r.segment == grant.source.segment && r.addr == grant.source.addr
            }) && move_source.is_none_or(|s| s == grant.source.segment),
            || format!("copy source {:?} is not a complete replica", grant.source),
        )?;
        self.check_bytes(&key, &grant.source, &[version])?;
        ensure(
            grant.targets.len() == 1 && grant.targets[0].segment == target_seg,
            || format!("copy targets {:?}", grant.targets),
        )?;
        let t = grant.targets[0];
        ensure(
            t.status == ReplicaStatus::Processing && t.len == object.size,
            || format!("target {t:?}"),
        )?;
        self.model
            .claim_block(t.segment, t.addr, object.size, now, None)?;
        self.hit(if move_source.is_some() {
            "move"
        } else {
            "copy"
        });
        let o = self.model.objects.get_mut(&key).expect("exists");
        o.replicas.push(to_model_replica(&t));
        o.task = Some(grant.task);
        let write_id = o.write_id;
        self.model.tasks.insert(
            grant.task,
            MTask {
                client: id,
                key,
                write_id,
                move_source,
                started: now,
            },
        );
        let side = &mut self.clients[client_index(id)];
        if side.tasks.len() >= 4 {
            side.tasks.remove(0);
        }
        side.tasks.push(ClientTask {
            id: grant.task,
            source: grant.source,
            targets: grant.targets,
            started: now,
            transferred: false,
        });
        Ok(())
    }

    pub(super) fn task_transfer(&mut self, client: u8, task: u8) -> Result<(), String> {
        let side = &self.clients[usize::from(client % CLIENTS)];
        if side.tasks.is_empty() {
            return Ok(());
        }
        let index = side.tasks.len() - 1 - usize::from(task) % side.tasks.len();
        let t = side.tasks[index].clone();
        // A task's copy is a write: it stops at the writer's fence.
        if side.fence(t.started, t.source.len, self.now) == Millis::ZERO {
            return Ok(());
        }
        if let Some(mt) = self.model.tasks.get(&t.id) {
            // A live task's source is protected: it must still hold the current version.
            let version = self.model.objects[&mt.key].version.expect("complete");
            if self.memory.read(&t.source).is_some() {
                self.check_bytes(&mt.key.clone(), &t.source, &[version])?;
            }
        }
        // A copy whose source or target node is gone fails; the client will not end it.
        let mut copied = true;
        for target in &t.targets {
            copied &= self.memory.copy(&t.source, target);
        }
        if copied {
            self.clients[usize::from(client % CLIENTS)].tasks[index].transferred = true;
        }
        Ok(())
    }

    pub(super) fn task_finish(&mut self, client: u8, task: u8, end: bool) -> Result<(), String> {
        let id = client_id(client);
        let side = &self.clients[client_index(id)];
        if side.tasks.is_empty() {
            return Ok(());
        }
        let index = side.tasks.len() - 1 - usize::from(task) % side.tasks.len();
        if end {
            self.task_transfer(client, task)?;
        }
        let t = self.clients[client_index(id)].tasks[index].clone();
        let live = self.model.tasks.get(&t.id).cloned();
        if end && live.is_some() && !t.transferred {
            return Ok(());
        }
        let now = self.now;
        let got = if end {
            self.master.task_end(id, t.id, now)
        } else {
            self.master.task_revoke(id, t.id, now)
        };
        self.model.touch(id, now);
        self.no_events("task end")?;
        self.clients[client_index(id)].tasks.remove(index);
        let Some(mt) = live else {
            return expect_code(
                &got,
                ErrorCode::OBJECT_NO_REPLICATION_TASK,
                "finish of a finished task",
            );
        };
        self.model.tasks.remove(&t.id);
        let alive = self
            .model
            .objects
            .get(&mt.key)
            .is_some_and(|o| o.write_id == mt.write_id && o.task == Some(t.id));
        if !alive {
            return if end {
                expect_code(
                    &got,
                    ErrorCode::OBJECT_NOT_FOUND,
                    "end of a task whose object is gone",
                )
            } else {
                got.map_err(|e| format!("revoke failed: {e}"))
            };
        }
        let config = self.config.clone();
        let o = self.model.objects.get_mut(&mt.key).expect("alive");
        o.task = None;
        let has_targets = o.replicas.iter().any(|r| !r.complete);
        if end && mt.move_source.is_some() && o.holds > 0 {
            // Held reads may be reading the source: the move ends as if revoked.
            o.replicas.retain(|r| r.complete);
            return expect_code(&got, ErrorCode::OBJECT_REPLICA_BUSY, "move end while held");
        }
        if !end {
            o.replicas.retain(|r| r.complete);
            return got.map_err(|e| format!("revoke failed: {e}"));
        }
        for r in &mut o.replicas {
            r.complete = true;
        }
        if !has_targets {
            return expect_code(
                &got,
                ErrorCode::REPLICA_NOT_FOUND,
                "end with every target gone",
            );
        }
        got.map_err(|e| format!("task end failed: {e}"))?;
        *self.coverage.entry("task-end").or_default() += 1;
        if let Some(source) = mt.move_source {
            let dropped: Vec<MReplica> = o
                .replicas
                .iter()
                .filter(|r| r.segment == source)
                .copied()
                .collect();
            o.replicas.retain(|r| r.segment != source);
            let (size, done) = (o.size, o.readers_done_at(config.lease_grace));
            self.model.reserve_for_readers(&dropped, size, done);
        }
        Ok(())
    }

    /// The master abandons a task (timeout or dead client): its targets wait out the release
    /// timeout.
    pub(super) fn abandon_task(&mut self, id: TaskId) {
        let Some(task) = self.model.tasks.remove(&id) else {
            return;
        };
        self.hit("task-abandoned");
        let release_at = task.started + self.config.put_start_release_timeout;
        if let Some(o) = self.model.objects.get_mut(&task.key)
            && o.write_id == task.write_id
            && o.task == Some(id)
        {
            o.task = None;
            let targets: Vec<MReplica> =
                o.replicas.iter().filter(|r| !r.complete).copied().collect();
            o.replicas.retain(|r| r.complete);
            let size = o.size;
            self.model
                .reserve_for_writer(&targets, size, release_at, task.client);
        }
    }
}
