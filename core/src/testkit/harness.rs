//! The harness's state and its stepping: what the clients it plays remember, the [`Harness`]
//! itself, and the loop that applies one [`Op`] (dispatching to the per-family handlers in the
//! sibling modules), runs the invariant checker and compares the master's counts with the
//! model's, then the liveness phase ([`Harness::settle`]) that must leave everything clean.
//! The [`Op::Snapshot`] step lives here too: it swaps in the restored master, which must be
//! identical.

use super::disk::NodeDisk;
use super::memory::{self, Memory};
use super::model::Model;
use super::ops::Op;
use super::writes::Finish;
use super::{CLIENTS, ensure, harness_config};
use crate::client::{FenceRule, WriteWindow};
use crate::config::MasterConfig;
use crate::ids::{ClientId, HoldId, TaskId, WriteId};
use crate::invariants;
use crate::master::Master;
use crate::object::{ReplicaDescriptor, ReplicaStatus};
use crate::time::Millis;

/// A put or upsert grant a client holds.
#[derive(Clone, Debug)]
pub(super) struct Grant {
    pub(super) key: String,
    pub(super) write_id: WriteId,
    pub(super) version: u64,
    pub(super) replicas: Vec<ReplicaDescriptor>,
    pub(super) started: Millis,
    pub(super) transferred: bool,
    pub(super) upsert: bool,
}

/// A copy or move task a client runs.
#[derive(Clone, Debug)]
pub(super) struct ClientTask {
    pub(super) id: TaskId,
    pub(super) source: ReplicaDescriptor,
    pub(super) targets: Vec<ReplicaDescriptor>,
    pub(super) started: Millis,
    pub(super) transferred: bool,
}

/// A read issued earlier, to be carried out later inside its lease.
#[derive(Clone, Debug)]
pub(super) struct PendingRead {
    pub(super) key: String,
    pub(super) version: u64,
    pub(super) replicas: Vec<ReplicaDescriptor>,
    /// When the replica list was asked for, and the lease granted with it.
    pub(super) asked: Millis,
    pub(super) lease_ttl: Millis,
}

/// What a client remembers.
#[derive(Default)]
pub(super) struct ClientSide {
    pub(super) grants: Vec<Grant>,
    pub(super) holds: Vec<HoldId>,
    pub(super) tasks: Vec<ClientTask>,
    /// Its write fence, fed every answer the master gave it (none before the first): the
    /// client library's rule, so the model test checks that it keeps writes out of reused
    /// blocks.
    pub(super) window: Option<WriteWindow>,
}

impl ClientSide {
    /// How much longer a write or task of `size` bytes started at `started` may transfer, at
    /// `now`.
    pub(super) fn fence(&self, started: Millis, size: u64, now: Millis) -> Millis {
        self.window
            .map_or(Millis::ZERO, |w| w.fence(started, size, now))
    }
}

/// Runs operations against a master and judges everything it does.
pub struct Harness {
    /// The master under test.
    pub master: Master,
    pub(super) config: MasterConfig,
    pub(super) now: Millis,
    pub(super) model: Model,
    pub(super) memory: Memory,
    pub(super) clients: Vec<ClientSide>,
    pub(super) reads: Vec<PendingRead>,
    pub(super) next_version: u64,
    pub(super) next_base: u64,
    steps: usize,
    pub(super) coverage: std::collections::BTreeMap<&'static str, u64>,
    /// Each segment name's node disk (it outlives the segment's mounts).
    pub(super) disks: std::collections::BTreeMap<String, NodeDisk>,
    /// The last steps, with the events they produced, for failure reports.
    trace: std::collections::VecDeque<String>,
    /// What the KV events have said: checked against the readable keys after every step.
    announced: invariants::KeyEventLedger,
}

impl Harness {
    /// A harness with three segments mounted (a fourth name is left for mount operations).
    pub fn new(seed: u64) -> Harness {
        let config = harness_config(seed);
        let mut harness = Harness {
            master: Master::new(config.clone()).expect("valid harness config"),
            config,
            now: Millis(1_000),
            model: Model::default(),
            memory: Memory::default(),
            clients: (0..CLIENTS).map(|_| ClientSide::default()).collect(),
            reads: Vec::new(),
            next_version: 1,
            next_base: 1 << 32,
            steps: 0,
            coverage: Default::default(),
            disks: Default::default(),
            trace: Default::default(),
            announced: Default::default(),
        };
        for (client, segment) in [(0, 0), (1, 1), (2, 2)] {
            harness
                .apply(&Op::Mount {
                    client,
                    segment,
                    kib: 40,
                })
                .expect("initial mounts");
        }
        harness
    }

    /// How often each interesting path was taken, to show the runs are not vacuous.
    pub fn coverage(&self) -> &std::collections::BTreeMap<&'static str, u64> {
        &self.coverage
    }

    pub(super) fn hit(&mut self, what: &'static str) {
        *self.coverage.entry(what).or_default() += 1;
    }

    /// Runs `ops`, then the liveness phase.
    pub fn run(&mut self, ops: &[Op]) -> Result<(), String> {
        for (i, op) in ops.iter().enumerate() {
            self.apply(op).map_err(|e| {
                format!(
                    "step {i} {op:?} at {}: {e}\nrecent steps:\n{}",
                    self.now,
                    self.recent()
                )
            })?;
        }
        self.settle().map_err(|e| {
            format!(
                "settle at {}: {e}\nrecent steps:\n{}",
                self.now,
                self.recent()
            )
        })
    }

    fn recent(&self) -> String {
        self.trace.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub(super) fn note(&mut self, line: String) {
        if self.trace.len() == 200 {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    /// A one-line description of what the model and the master hold for `key` (debugging aid).
    pub fn describe_key(&mut self, key: &str) -> String {
        let model = self.model.objects.get(key).cloned();
        let bytes = model.as_ref().map(|o| {
            o.replicas
                .iter()
                .map(|r| {
                    let d = ReplicaDescriptor {
                        segment: r.segment,
                        addr: r.addr,
                        len: o.size,
                        status: ReplicaStatus::Complete,
                        medium: crate::Medium::Memory,
                    };
                    let got = self.memory.read(&d);
                    let candidates: Vec<u64> = (1..=self.next_version).collect();
                    (
                        r.segment,
                        r.addr,
                        got.and_then(|b| memory::identify(&b, &candidates)),
                    )
                })
                .collect::<Vec<_>>()
        });
        format!("model {model:?} bytes-version {bytes:?}")
    }

    /// Applies one operation and checks everything.
    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        self.steps += 1;
        let now = self.now;
        self.note(format!("{now} {op:?}"));
        self.model.mark_maybe_queued(now);
        match *op {
            Op::Advance { ms } => {
                self.now = now
                    + Millis(if ms >= 0xF000 {
                        2_500
                    } else {
                        u64::from(ms % 300)
                    });
                Ok(())
            }
            Op::Tick => self.tick(),
            Op::TickIfDue => match self.master.next_deadline() {
                Some(deadline) if deadline <= now => self.tick(),
                _ => Ok(()),
            },
            Op::Heartbeat { client } => self.heartbeat(client),
            Op::Goodbye { client } => self.goodbye(client),
            Op::Mount {
                client,
                segment,
                kib,
            } => self.mount(client, segment, kib),
            Op::Unmount { client, segment } => self.unmount(client, segment),
            Op::Put {
                client,
                key,
                size,
                replicas,
                pin,
                prefer,
            } => self.put(false, client, key, size, replicas, pin, prefer),
            Op::Upsert {
                client,
                key,
                size,
                replicas,
                pin,
                prefer,
            } => self.put(true, client, key, size, replicas, pin, prefer),
            Op::Transfer {
                client,
                grant,
                partial,
            } => {
                self.transfer(client, grant, partial);
                Ok(())
            }
            Op::End { client, grant } => self.finish_write(client, grant, Finish::End),
            Op::Revoke { client, grant } => self.finish_write(client, grant, Finish::Revoke),
            Op::Abort { client, grant } => self.finish_write(client, grant, Finish::Abort),
            Op::Get { key, keep } => self.get(key, keep),
            Op::ReadLate { read } => self.read_late(read),
            Op::Exist { key } => self.exist(key),
            Op::Query { prefix } => self.query(prefix),
            Op::Remove { key } => self.remove(key),
            Op::RemoveAll => self.remove_matching(None),
            Op::RemoveByRegex { prefix } => self.remove_matching(Some(prefix)),
            Op::Hold { client, key } => self.hold(client, key),
            Op::Release {
                client,
                hold,
                foreign,
            } => self.release(client, hold, foreign),
            Op::Copy {
                client,
                key,
                target,
            } => self.copy(client, key, None, target),
            Op::Move {
                client,
                key,
                source,
                target,
            } => self.copy(client, key, Some(source), target),
            Op::TaskTransfer { client, task } => self.task_transfer(client, task),
            Op::TaskEnd { client, task } => self.task_finish(client, task, true),
            Op::TaskRevoke { client, task } => self.task_finish(client, task, false),
            Op::Snapshot => self.snapshot(),
            Op::BadInput { kind } => self.bad_input(kind),
            Op::DiskSync {
                segment,
                want,
                fail,
                evict,
            } => self.disk_sync(segment, want, fail, evict),
        }?;
        self.acknowledge_heard();
        self.model.mark_maybe_queued(self.now);
        invariants::check(&self.master).map_err(|v| v.to_string())?;
        let changes = self.master.drain_key_changes();
        self.announced
            .observe(&self.master, &changes)
            .map_err(|v| v.to_string())?;
        self.check_agreement()
    }

    /// Every client the master heard this step got its answer now (core calls answer at
    /// once): its write window learns of it.
    fn acknowledge_heard(&mut self) {
        let rule = FenceRule::new(
            self.config.client_ttl,
            self.config.put_start_release_timeout,
        );
        let now = self.now;
        for (&client, &heard) in &self.model.clients {
            if heard != now {
                continue;
            }
            let side = &mut self.clients[super::client_index(client)];
            match &mut side.window {
                Some(window) => window.acknowledged(now, now),
                None => side.window = Some(WriteWindow::new(rule, now)),
            }
        }
    }

    /// Heals everything and lets time run past every timeout: every write must leave
    /// PROCESSING, every task end, every discarded block come back; untouched objects must
    /// still read correctly.
    pub fn settle(&mut self) -> Result<(), String> {
        for client in &mut self.clients {
            client.grants.clear();
            client.tasks.clear();
        }
        let until = self.now
            + self.config.put_start_release_timeout
            + self.config.put_start_discard_timeout
            + self.config.lease_ttl
            + self.config.lease_grace;
        let live: Vec<ClientId> = self.model.clients.keys().copied().collect();
        while self.now <= until {
            for &client in &live {
                self.master.heartbeat(client, self.now);
                self.model.touch(client, self.now);
            }
            self.model.mark_maybe_queued(self.now);
            self.tick()?;
            invariants::check(&self.master).map_err(|v| v.to_string())?;
            self.now = self.now + Millis(100);
        }
        self.model.mark_maybe_queued(self.now);
        self.tick()?;
        let stats = self.master.stats();
        ensure(stats.writing == 0, || {
            format!("{} writes still in progress", stats.writing)
        })?;
        ensure(stats.tasks == 0, || {
            format!("{} tasks still running", stats.tasks)
        })?;
        ensure(stats.discarded_blocks == 0, || {
            format!("{} discarded blocks never released", stats.discarded_blocks)
        })?;
        let keys: Vec<String> = self.model.objects.keys().cloned().collect();
        for key in keys {
            let list = self
                .master
                .get_replica_list(&key, self.now)
                .map_err(|e| format!("settled object {key:?} unreadable: {e}"))?;
            let version = self.model.objects[&key].version.expect("settled");
            for replica in &list.replicas {
                self.check_bytes(&key, replica, &[version])?;
            }
        }
        self.check_agreement()
    }

    fn check_agreement(&self) -> Result<(), String> {
        let stats = self.master.stats();
        let writing = self
            .model
            .objects
            .values()
            .filter(|o| o.writing.is_some())
            .count() as u64;
        let disk_replicas = self
            .model
            .objects
            .values()
            .filter(|o| o.disk.is_some())
            .count() as u64;
        ensure(
            stats.objects == self.model.objects.len() as u64
                && stats.writing == writing
                && stats.segments == self.model.segments.len() as u64
                && stats.clients == (self.model.clients.len() - self.model.left.len()) as u64
                && stats.tasks == self.model.tasks.len() as u64
                && stats.holds == self.model.holds.len() as u64
                && stats.disk_replicas == disk_replicas
                && stats.disk_tombstones == self.model.tombstone_count() as u64,
            || {
                format!(
                    "master {stats:?} disagrees with model: {} objects ({writing} writing), {} segments, {} clients, {} tasks, {} holds, {disk_replicas} disk copies, {} tombstones",
                    self.model.objects.len(),
                    self.model.segments.len(),
                    self.model.clients.len(),
                    self.model.tasks.len(),
                    self.model.holds.len(),
                    self.model.tombstone_count()
                )
            },
        )
    }

    fn snapshot(&mut self) -> Result<(), String> {
        let bytes = self.master.snapshot();
        let restored = Master::restore(self.config.clone(), &bytes, self.master.now())
            .map_err(|e| format!("restore failed: {e}"))?;
        let (before, after) = (
            self.master.state_fingerprint(),
            restored.state_fingerprint(),
        );
        ensure(before == after, || "restored state differs".into())?;
        self.hit("snapshot");
        self.master = restored;
        Ok(())
    }
}
