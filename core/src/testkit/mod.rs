//! The operation-sequence harness shared by the proptest model test, the fuzz target and the
//! benches: a small language of operations ([`Op`]), and a [`Harness`] that runs them against
//! a real [`Master`] while a reference model ([`model`]) and a byte-level memory ([`memory`])
//! judge every result and event, and [`crate::invariants::check`] runs after every step.
//!
//! The harness plays honest clients, including zombies: a client whose write was preempted
//! keeps writing into its old grant until it learns otherwise (or the release timeout runs
//! out), which is exactly the behaviour the master's delayed release must survive. Reads are
//! judged by content: a get must return the bytes of the key's current version, and a read
//! issued earlier and carried out later, inside its lease, the bytes of the version current
//! when it was issued. Torn, stale or foreign bytes fail the run.

pub mod memory;
pub mod model;

use std::fmt::Debug;

use arbitrary::Arbitrary;

use crate::config::{MasterConfig, ReplicateConfig};
use crate::error::{ErrorCode, Result as CoreResult};
use crate::events::{DiscardCause, Event};
use crate::ids::{ClientId, HoldId, SegmentId, TaskId, WriteId};
use crate::invariants;
use crate::master::Master;
use crate::object::{ReplicaDescriptor, ReplicaStatus};
use crate::segments::{SegmentSpec, block_len};
use crate::time::Millis;
use memory::{Memory, pattern};
use model::{MObject, MReplica, MTask, MWrite, Model};

/// Clients the harness plays.
pub const CLIENTS: u8 = 3;
/// Segment names it mounts.
pub const SEGMENTS: u8 = 4;
/// Keys it uses (few, so operations collide).
pub const KEYS: u8 = 12;

/// The key numbered `k`.
pub fn key_name(k: u8) -> String {
    format!("k{}", k % KEYS)
}

fn client_id(c: u8) -> ClientId {
    ClientId(0xC11E_0000 + u128::from(c % CLIENTS))
}

fn client_index(id: ClientId) -> usize {
    (id.0 - 0xC11E_0000) as usize
}

fn segment_name(s: u8) -> String {
    format!("seg{}", s % SEGMENTS)
}

/// How a put asks to be pinned.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum Pin {
    /// No pin.
    None,
    /// Soft pin with the default TTL.
    Soft,
    /// Soft pin with its own TTL (ms).
    SoftTtl(u16),
    /// Hard pin.
    Hard,
}

/// One step of a scenario. Numeric fields pick among the harness's few clients, keys,
/// segments, grants and tasks (modulo their count), so any bytes make a meaningful step.
#[allow(missing_docs)]
#[derive(Clone, Debug, Arbitrary)]
pub enum Op {
    /// Time passes (no call).
    Advance { ms: u16 },
    /// The driver calls `tick`.
    Tick,
    /// The driver calls `tick` only if `next_deadline` has come.
    TickIfDue,
    /// A client heartbeats.
    Heartbeat { client: u8 },
    /// A client mounts a segment (or retries a mount).
    Mount { client: u8, segment: u8, kib: u8 },
    /// A client unmounts a segment.
    Unmount { client: u8, segment: u8 },
    /// PutStart.
    Put {
        client: u8,
        key: u8,
        size: u16,
        replicas: u8,
        pin: Pin,
        prefer: Option<u8>,
    },
    /// UpsertStart.
    Upsert {
        client: u8,
        key: u8,
        size: u16,
        replicas: u8,
        pin: Pin,
        prefer: Option<u8>,
    },
    /// A client writes (all or half of) the value of one of its grants.
    Transfer {
        client: u8,
        grant: u8,
        partial: bool,
    },
    /// PutEnd/UpsertEnd of one of a client's grants.
    End { client: u8, grant: u8 },
    /// PutRevoke/UpsertRevoke of one of a client's grants.
    Revoke { client: u8, grant: u8 },
    /// PutAbort of one of a client's grants (it may keep writing until its fence).
    Abort { client: u8, grant: u8 },
    /// GetReplicaList, reading the bytes at once; `keep` also remembers it for a later read.
    Get { key: u8, keep: bool },
    /// Carries out a remembered read, if its lease still allows.
    ReadLate { read: u8 },
    /// Exist.
    Exist { key: u8 },
    /// QueryByRegex on a key prefix.
    Query { prefix: u8 },
    /// Remove.
    Remove { key: u8 },
    /// RemoveAll.
    RemoveAll,
    /// RemoveByRegex on a key prefix.
    RemoveByRegex { prefix: u8 },
    /// A held read.
    Hold { client: u8, key: u8 },
    /// Releases a held read (possibly another client's).
    Release { client: u8, hold: u8, foreign: bool },
    /// CopyStart to a segment.
    Copy { client: u8, key: u8, target: u8 },
    /// MoveStart between segments.
    Move {
        client: u8,
        key: u8,
        source: u8,
        target: u8,
    },
    /// A client copies the bytes of one of its tasks.
    TaskTransfer { client: u8, task: u8 },
    /// Ends one of a client's tasks.
    TaskEnd { client: u8, task: u8 },
    /// Revokes one of a client's tasks.
    TaskRevoke { client: u8, task: u8 },
    /// Snapshot and restore; the restored master must be identical and carries on.
    Snapshot,
    /// A malformed request; it must be refused with the right code and change nothing.
    BadInput { kind: u8 },
}

/// The configuration the harness runs with: short timeouts so they all fire.
pub fn harness_config(seed: u64) -> MasterConfig {
    MasterConfig {
        seed,
        lease_ttl: Millis(100),
        lease_grace: Millis(10),
        default_soft_pin_ttl: Millis(800),
        allow_evict_soft_pinned: seed.is_multiple_of(2),
        eviction_high_watermark: 0.85,
        eviction_ratio: 0.1,
        eviction_retry_interval: Millis(50),
        put_start_discard_timeout: Millis(400),
        put_start_release_timeout: Millis(1500),
        client_ttl: Millis(1200),
        max_key_len: 64,
        max_replicas: 4,
        // The model has no disks (the SSD tier is tested in tests/offload.rs and the
        // simulation), so these change nothing here.
        offload_on_evict: true,
        offload_write_through: false,
        offload_ahead_watermark: 0.6,
    }
}

/// How a client finishes one of its writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Finish {
    End,
    Revoke,
    Abort,
}

/// What the model expects a read to return: the replicas (segment, address), the version
/// and the size.
type ExpectedRead = (Vec<(SegmentId, u64)>, u64, u64);

/// A put or upsert grant a client holds.
#[derive(Clone, Debug)]
struct Grant {
    key: String,
    write_id: WriteId,
    version: u64,
    replicas: Vec<ReplicaDescriptor>,
    started: Millis,
    transferred: bool,
    upsert: bool,
}

/// A copy or move task a client runs.
#[derive(Clone, Debug)]
struct ClientTask {
    id: TaskId,
    source: ReplicaDescriptor,
    targets: Vec<ReplicaDescriptor>,
    started: Millis,
    transferred: bool,
}

/// A read issued earlier, to be carried out later inside its lease.
#[derive(Clone, Debug)]
struct PendingRead {
    key: String,
    version: u64,
    replicas: Vec<ReplicaDescriptor>,
    lease_until: Millis,
}

/// What a client remembers.
#[derive(Default)]
struct ClientSide {
    grants: Vec<Grant>,
    holds: Vec<HoldId>,
    tasks: Vec<ClientTask>,
}

/// Runs operations against a master and judges everything it does.
pub struct Harness {
    /// The master under test.
    pub master: Master,
    config: MasterConfig,
    now: Millis,
    model: Model,
    memory: Memory,
    clients: Vec<ClientSide>,
    reads: Vec<PendingRead>,
    next_version: u64,
    next_base: u64,
    steps: usize,
    coverage: std::collections::BTreeMap<&'static str, u64>,
    /// The last steps, with the events they produced, for failure reports.
    trace: std::collections::VecDeque<String>,
}

fn expect_code<T: Debug>(got: &CoreResult<T>, code: ErrorCode, what: &str) -> Result<(), String> {
    match got {
        Err(e) if e.code == code => Ok(()),
        other => Err(format!("{what}: expected {code}, got {other:?}")),
    }
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(what()) }
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
            trace: Default::default(),
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

    fn hit(&mut self, what: &'static str) {
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

    fn note(&mut self, line: String) {
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
        }?;
        invariants::check(&self.master).map_err(|v| v.to_string())?;
        self.check_agreement()
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
            self.tick()?;
            invariants::check(&self.master).map_err(|v| v.to_string())?;
            self.now = self.now + Millis(100);
        }
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
        ensure(
            stats.objects == self.model.objects.len() as u64
                && stats.writing == writing
                && stats.segments == self.model.segments.len() as u64
                && stats.clients == self.model.clients.len() as u64
                && stats.tasks == self.model.tasks.len() as u64
                && stats.holds == self.model.holds.len() as u64,
            || {
                format!(
                    "master {stats:?} disagrees with model: {} objects ({writing} writing), {} segments, {} clients, {} tasks, {} holds",
                    self.model.objects.len(),
                    self.model.segments.len(),
                    self.model.clients.len(),
                    self.model.tasks.len(),
                    self.model.holds.len()
                )
            },
        )
    }

    // ---- time and membership -------------------------------------------------------------

    fn tick(&mut self) -> Result<(), String> {
        let now = self.now;
        self.master.tick(now);
        let events = self.master.drain_events();
        let expected: Vec<ClientId> = self
            .model
            .clients
            .iter()
            .filter(|&(_, &seen)| seen + self.config.client_ttl <= now)
            .map(|(&c, _)| c)
            .collect();
        let expired: Vec<ClientId> = events
            .iter()
            .filter_map(|e| match e {
                Event::ClientExpired { client } => Some(*client),
                _ => None,
            })
            .collect();
        ensure(expired == expected, || {
            format!("expired clients {expired:?}, expected {expected:?}")
        })?;
        // The master expires clients, discards writes, expires tasks, releases blocks, then
        // evicts; replay the silent steps at the same point.
        let first_eviction = events
            .iter()
            .position(|e| matches!(e, Event::Evicted { .. }))
            .unwrap_or(events.len());
        let mut events = events;
        let evictions = events.split_off(first_eviction);
        self.apply_events(events, None, None)?;
        let timeout = self.config.put_start_discard_timeout;
        let stale: Vec<TaskId> = self
            .model
            .tasks
            .iter()
            .filter(|(_, t)| t.started + timeout <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            self.abandon_task(id);
        }
        self.model.reserved.retain(|b| b.release_at > now);
        self.apply_events(evictions, None, None)?;
        ensure(
            !self
                .model
                .objects
                .values()
                .any(|o| o.writing.is_some_and(|w| w.start + timeout <= now)),
            || "a write outlived its discard timeout through a tick".into(),
        )?;
        ensure(
            !self
                .model
                .clients
                .values()
                .any(|&seen| seen + self.config.client_ttl <= now),
            || "a silent client survived a tick".into(),
        )
    }

    fn heartbeat(&mut self, client: u8) -> Result<(), String> {
        let id = client_id(client);
        let status = self.master.heartbeat(id, self.now).status;
        let expected = if self.model.announce(id, self.now) {
            crate::HeartbeatStatus::Registered
        } else {
            crate::HeartbeatStatus::Known
        };
        ensure(status == expected, || {
            format!("heartbeat {status:?}, expected {expected:?}")
        })
    }

    fn mount(&mut self, client: u8, segment: u8, kib: u8) -> Result<(), String> {
        let (id, name) = (client_id(client), segment_name(segment));
        let size = (u64::from(kib % 60) + 4) * 1024;
        let existing = self.model.segments.get(&name).cloned();
        let base = match &existing {
            Some(s) if s.owner == id && s.capacity == size => s.base,
            _ => self.next_base,
        };
        let spec = SegmentSpec {
            name: name.clone(),
            base,
            size,
            endpoint: format!("node-{}", client % CLIENTS),
            key: 7,
        };
        let got = self.master.mount_segment(id, &spec, self.now);
        self.model.announce(id, self.now);
        let events = self.master.drain_events();
        match existing {
            Some(s) if s.owner == id && s.capacity == size && s.base == base => {
                ensure(events.is_empty(), || {
                    format!("mount retry produced {events:?}")
                })?;
                ensure(got.as_ref().ok() == Some(&s.id), || {
                    format!("mount retry gave {got:?}, expected {}", s.id)
                })
            }
            Some(s) if s.owner != id => {
                ensure(events.is_empty(), || {
                    format!("refused mount produced {events:?}")
                })?;
                expect_code(&got, ErrorCode::SEGMENT_ALREADY_EXISTS, "mount over")
            }
            _ => {
                // A fresh mount, or the owner replacing its old mount (a restarted node).
                if existing.is_some() {
                    self.hit("remount");
                }
                self.apply_events(events, Some(id), None)?;
                let seg = got.map_err(|e| format!("mount failed: {e}"))?;
                self.next_base += 1 << 32;
                self.memory.mount(seg, base, size);
                self.model.segments.insert(
                    name,
                    model::MSegment {
                        id: seg,
                        owner: id,
                        base,
                        capacity: size,
                    },
                );
                Ok(())
            }
        }
    }

    fn unmount(&mut self, client: u8, segment: u8) -> Result<(), String> {
        let (id, name) = (client_id(client), segment_name(segment));
        let got = self.master.unmount_segment(id, &name, self.now);
        self.model.touch(id, self.now);
        let events = self.master.drain_events();
        match self.model.segments.get(&name) {
            None => expect_code(&got, ErrorCode::SEGMENT_NOT_FOUND, "unmount"),
            Some(s) if s.owner != id => expect_code(&got, ErrorCode::ILLEGAL_CLIENT, "unmount"),
            Some(_) => {
                got.map_err(|e| format!("unmount failed: {e}"))?;
                self.apply_events(events, Some(id), None)
            }
        }
    }

    // ---- writes --------------------------------------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        upsert: bool,
        client: u8,
        key: u8,
        size: u16,
        replicas: u8,
        pin: Pin,
        prefer: Option<u8>,
    ) -> Result<(), String> {
        let (id, key) = (client_id(client), key_name(key));
        // Mostly a few common sizes, so upserts often keep the size (in-place and
        // copy-on-write paths); sometimes anything.
        // Occasionally a value large enough that eviction must open a contiguous range.
        let size = match size % 8 {
            0 | 4 => 1 + u64::from(size / 8) % 6000,
            7 => 8 * 1024 + u64::from(size / 8) % (16 * 1024),
            n => [700, 2048, 4000][usize::from(n % 3)],
        };
        let count = 1 + u32::from(replicas % 3);
        let mut config = ReplicateConfig::replicas(count);
        match pin {
            Pin::None => {}
            Pin::Soft => config.with_soft_pin = true,
            Pin::SoftTtl(ms) => {
                config.with_soft_pin = true;
                config.soft_pin_ttl = Some(Millis(1 + u64::from(ms % 2000)));
            }
            Pin::Hard => config.with_hard_pin = true,
        }
        if let Some(p) = prefer {
            config.preferred_segments.push(segment_name(p));
        }
        let now = self.now;
        let empty_fit = self.model.segments.iter().any(|(_, s)| {
            s.capacity >= block_len(size) && self.model.segment_certainly_empty(s.id)
        });
        let preferred_empty = prefer
            .and_then(|p| self.model.segments.get(&segment_name(p)))
            .and_then(|s| {
                (s.capacity >= block_len(size) && self.model.segment_certainly_empty(s.id))
                    .then_some(s.id)
            });

        // What the model expects before any allocation.
        let existing = self.model.objects.get(&key).cloned();
        enum Path {
            Fail(ErrorCode),
            New { preempt: bool, hard: bool },
            InPlace,
            CopyOnWrite,
            Reallocate,
        }
        let path = match &existing {
            None => Path::New {
                preempt: false,
                hard: config.with_hard_pin,
            },
            Some(o) if !upsert => {
                let zombie = o
                    .writing
                    .is_some_and(|w| w.start + self.config.put_start_discard_timeout <= now);
                if zombie {
                    Path::New {
                        preempt: true,
                        hard: config.with_hard_pin,
                    }
                } else {
                    Path::Fail(ErrorCode::OBJECT_ALREADY_EXISTS)
                }
            }
            Some(o) if o.task.is_some() => Path::Fail(ErrorCode::OBJECT_HAS_REPLICATION_TASK),
            Some(o) if o.writing.is_some() => Path::New {
                preempt: true,
                hard: o.hard || config.with_hard_pin,
            },
            Some(o) if o.holds > 0 => Path::Fail(ErrorCode::OBJECT_REPLICA_BUSY),
            Some(o) if o.size != size => Path::Reallocate,
            Some(o) if now < o.readers_done_at(self.config.lease_grace) => Path::CopyOnWrite,
            Some(_) => Path::InPlace,
        };

        let got = if upsert {
            self.master.upsert_start(id, &key, size, &config, now)
        } else {
            self.master.put_start(id, &key, size, &config, now)
        };
        self.model.touch(id, now);
        let events = self.master.drain_events();
        let preempted = events.iter().any(|e| {
            matches!(
                e,
                Event::WriteDiscarded {
                    cause: DiscardCause::Preempted,
                    ..
                }
            )
        });
        let expect_preempt = matches!(path, Path::New { preempt: true, .. });
        ensure(preempted == expect_preempt, || {
            format!("preemption {preempted}, expected {expect_preempt}; events {events:?}")
        })?;
        if let Some(Event::WriteDiscarded { key: k, .. }) = events
            .iter()
            .find(|e| matches!(e, Event::WriteDiscarded { .. }))
        {
            ensure(**k == *key, || {
                format!("preempted {k:?} while writing {key:?}")
            })?;
        }
        if matches!(path, Path::InPlace | Path::Fail(_)) {
            ensure(events.is_empty(), || {
                format!("unexpected events {events:?}")
            })?;
        }
        self.apply_events(events, None, Some(&key))?;

        let soft_ttl = if config.with_soft_pin {
            config
                .soft_pin_ttl
                .unwrap_or(self.config.default_soft_pin_ttl)
        } else {
            Millis::ZERO
        };
        let label = match &path {
            Path::Fail(_) => "start-refused",
            Path::New { preempt: true, .. } => "preempt",
            Path::New { .. } => "create",
            Path::InPlace => "upsert-in-place",
            Path::CopyOnWrite => "upsert-copy-on-write",
            Path::Reallocate => "upsert-new-size",
        };
        if got.is_ok() || matches!(path, Path::Fail(_)) {
            self.hit(label);
        } else {
            self.hit("start-no-room-or-busy");
        }
        match path {
            Path::Fail(code) => expect_code(&got, code, "start"),
            Path::New { hard, .. } => {
                let grant = match got {
                    Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE => {
                        return ensure(!empty_fit, || {
                            format!("NO_AVAILABLE_HANDLE with an empty segment that fits: {e}")
                        });
                    }
                    other => other.map_err(|e| format!("start failed: {e}"))?,
                };
                let max = (count as usize).min(self.model.segments.len());
                ensure((1..=max).contains(&grant.replicas.len()), || {
                    format!(
                        "{} replicas granted, wanted {count} of {max} segments",
                        grant.replicas.len()
                    )
                })?;
                if let Some(p) = preferred_empty {
                    ensure(grant.replicas[0].segment == p, || {
                        format!("preferred empty segment {p} not used: {:?}", grant.replicas)
                    })?;
                }
                self.accept_grant(id, &key, size, &grant, None)?;
                let version = self.fresh_version();
                self.model.objects.insert(
                    key.clone(),
                    MObject {
                        size,
                        replicas: grant.replicas.iter().map(to_model_replica).collect(),
                        writing: Some(MWrite {
                            client: id,
                            write_id: grant.write_id,
                            version,
                            start: now,
                        }),
                        writer: id,
                        write_id: grant.write_id,
                        version: None,
                        lease_expiry: Millis::ZERO,
                        last_access: Millis::ZERO,
                        leased: false,
                        soft_ttl,
                        soft_expiry: now + soft_ttl,
                        hard,
                        holds: 0,
                        task: None,
                    },
                );
                self.remember_grant(id, &key, version, grant, upsert);
                Ok(())
            }
            Path::InPlace | Path::CopyOnWrite | Path::Reallocate => {
                let old = existing.expect("exists");
                let grant = match got {
                    Err(e)
                        if matches!(path, Path::CopyOnWrite)
                            && e.code == ErrorCode::OBJECT_REPLICA_BUSY =>
                    {
                        return Ok(());
                    }
                    Err(e)
                        if matches!(path, Path::Reallocate)
                            && e.code == ErrorCode::NO_AVAILABLE_HANDLE =>
                    {
                        return ensure(!empty_fit, || {
                            format!("NO_AVAILABLE_HANDLE with an empty segment that fits: {e}")
                        });
                    }
                    other => other.map_err(|e| format!("upsert failed: {e}"))?,
                };
                if matches!(path, Path::InPlace) {
                    let same: Vec<(SegmentId, u64)> =
                        old.replicas.iter().map(|r| (r.segment, r.addr)).collect();
                    let got: Vec<(SegmentId, u64)> =
                        grant.replicas.iter().map(|r| (r.segment, r.addr)).collect();
                    ensure(same == got, || {
                        format!("in-place upsert moved the buffers: {same:?} -> {got:?}")
                    })?;
                    ensure(
                        grant
                            .replicas
                            .iter()
                            .all(|r| r.status == ReplicaStatus::Processing && r.len == size),
                        || format!("in-place grant {grant:?}"),
                    )?;
                } else {
                    let max = match path {
                        Path::CopyOnWrite => old.replicas.len(),
                        _ => (count as usize).min(self.model.segments.len()),
                    };
                    ensure((1..=max).contains(&grant.replicas.len()), || {
                        format!("{} replicas granted, at most {max}", grant.replicas.len())
                    })?;
                    self.accept_grant(id, &key, size, &grant, None)?;
                    self.model.reserve_for_readers(
                        &old.replicas,
                        old.size,
                        old.readers_done_at(self.config.lease_grace),
                    );
                }
                let version = self.fresh_version();
                let object = self.model.objects.get_mut(&key).expect("exists");
                object.size = size;
                object.replicas = grant.replicas.iter().map(to_model_replica).collect();
                object.writing = Some(MWrite {
                    client: id,
                    write_id: grant.write_id,
                    version,
                    start: now,
                });
                object.writer = id;
                object.write_id = grant.write_id;
                object.version = None;
                object.soft_ttl = soft_ttl;
                object.soft_expiry = now + soft_ttl;
                object.hard = old.hard || config.with_hard_pin;
                object.leased = false;
                self.remember_grant(id, &key, version, grant, upsert);
                Ok(())
            }
        }
    }

    /// Checks a new grant's blocks against everything live or reserved.
    fn accept_grant(
        &mut self,
        client: ClientId,
        key: &str,
        size: u64,
        grant: &crate::PutGrant,
        ignore: Option<&str>,
    ) -> Result<(), String> {
        let _ = client;
        for (i, r) in grant.replicas.iter().enumerate() {
            ensure(
                r.status == ReplicaStatus::Processing && r.len == size,
                || format!("grant replica {r:?} for {key:?} of {size} bytes"),
            )?;
            ensure(
                !grant.replicas[..i].iter().any(|o| o.segment == r.segment),
                || format!("two replicas of {key:?} on {}", r.segment),
            )?;
            self.model
                .claim_block(r.segment, r.addr, size, self.now, ignore)?;
        }
        ensure(
            grant.write_id.0
                >= self
                    .model
                    .objects
                    .values()
                    .map(|o| o.write_id.0)
                    .max()
                    .unwrap_or(0),
            || format!("write id {} reused", grant.write_id),
        )
    }

    fn remember_grant(
        &mut self,
        client: ClientId,
        key: &str,
        version: u64,
        grant: crate::PutGrant,
        upsert: bool,
    ) {
        let side = &mut self.clients[client_index(client)];
        if side.grants.len() >= 6 {
            side.grants.remove(0);
        }
        side.grants.push(Grant {
            key: key.to_string(),
            write_id: grant.write_id,
            version,
            replicas: grant.replicas,
            started: self.now,
            transferred: false,
            upsert,
        });
    }

    fn fresh_version(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    /// A client (possibly a zombie) writes its grant's value. It stops writing a grant once
    /// the release timeout has passed since the start (the client library's self-fence).
    fn transfer(&mut self, client: u8, grant: u8, partial: bool) {
        let side = &mut self.clients[usize::from(client % CLIENTS)];
        if side.grants.is_empty() {
            return;
        }
        let index = side.grants.len() - 1 - usize::from(grant) % side.grants.len();
        let g = &mut side.grants[index];
        if self.now >= g.started + self.config.put_start_release_timeout {
            return;
        }
        let len = g.replicas.first().map_or(0, |r| r.len);
        let upto = if partial { len / 2 } else { len };
        let current = self
            .model
            .objects
            .get(&g.key)
            .is_some_and(|o| o.writing.is_some_and(|w| w.write_id == g.write_id));
        let zombie = !current;
        for r in &g.replicas {
            self.memory.write(r, g.version, upto);
        }
        if !partial {
            g.transferred = true;
        }
        if zombie {
            self.hit("zombie-write");
        }
    }

    fn finish_write(&mut self, client: u8, grant: u8, how: Finish) -> Result<(), String> {
        let end = how == Finish::End;
        let id = client_id(client);
        let side = &self.clients[client_index(id)];
        if side.grants.is_empty() {
            return Ok(());
        }
        let index = side.grants.len() - 1 - usize::from(grant) % side.grants.len();
        if end {
            // An honest client writes the value before ending (a no-op if done already or if
            // its self-fence forbids it).
            self.transfer(client, grant, false);
        }
        let side = &self.clients[client_index(id)];
        let g = side.grants[index].clone();
        let object = self.model.objects.get(&g.key).cloned();
        let current = object
            .as_ref()
            .is_some_and(|o| o.writing.is_some_and(|w| w.write_id == g.write_id));
        if end && current && !g.transferred {
            return Ok(()); // an honest client does not end a write it has not finished
        }
        let now = self.now;
        let got = match (how, g.upsert) {
            (Finish::End, false) => self.master.put_end(id, &g.key, g.write_id, now),
            (Finish::End, true) => self.master.upsert_end(id, &g.key, g.write_id, now),
            (Finish::Revoke, false) => self.master.put_revoke(id, &g.key, g.write_id, now),
            (Finish::Revoke, true) => self.master.upsert_revoke(id, &g.key, g.write_id, now),
            (Finish::Abort, _) => self.master.put_abort(id, &g.key, g.write_id, now),
        };
        self.model.touch(id, now);
        let events = self.master.drain_events();
        if how == Finish::Abort && got.is_ok() {
            // The aborting client may keep writing its grant until its fence: keep it.
            let aborted = matches!(
                events.as_slice(),
                [Event::WriteDiscarded { cause: DiscardCause::Aborted, write, .. }] if *write == g.write_id
            );
            ensure(aborted, || format!("abort reported {events:?}"))?;
        } else {
            ensure(events.is_empty(), || {
                format!("end/revoke produced events {events:?}")
            })?;
            self.clients[client_index(id)].grants.remove(index);
        }
        let Some(object) = object else {
            return expect_code(&got, ErrorCode::OBJECT_NOT_FOUND, "end of a vanished key");
        };
        if object.writer != id {
            self.hit("end-illegal-client");
            return expect_code(
                &got,
                ErrorCode::ILLEGAL_CLIENT,
                "end of another client's write",
            );
        }
        if object.write_id != g.write_id {
            self.hit("end-superseded");
            return expect_code(
                &got,
                ErrorCode::OBJECT_NOT_FOUND,
                "end of a superseded write",
            );
        }
        let Some(write) = object.writing else {
            return if end {
                got.map_err(|e| format!("repeated end failed: {e}"))
            } else {
                expect_code(&got, ErrorCode::INVALID_WRITE, "revoke after end")
            };
        };
        got.map_err(|e| format!("end/revoke failed: {e}"))?;
        if how == Finish::Abort {
            self.hit("abort");
            return self.apply_events(events, None, None);
        }
        self.hit(if end { "end" } else { "revoke" });
        let o = self.model.objects.get_mut(&g.key).expect("exists");
        o.writing = None;
        if end {
            for r in &mut o.replicas {
                r.complete = true;
            }
            o.version = Some(write.version);
            o.last_access = o.last_access.max(now);
            o.refresh_soft(now);
        } else {
            o.replicas.retain(|r| r.complete);
            if o.replicas.is_empty() {
                self.model.objects.remove(&g.key);
            }
        }
        Ok(())
    }

    // ---- reads ---------------------------------------------------------------------------

    fn check_bytes(
        &self,
        key: &str,
        replica: &ReplicaDescriptor,
        versions: &[u64],
    ) -> Result<(), String> {
        let Some(bytes) = self.memory.read(replica) else {
            return Err(format!(
                "replica {replica:?} of {key:?} points outside any memory"
            ));
        };
        ensure(memory::identify(&bytes, versions).is_some(), || {
            let expected = versions.first().map(|&v| pattern(v, bytes.len() as u64));
            let diff = expected.and_then(|e| e.iter().zip(&bytes).position(|(a, b)| a != b));
            format!(
                "read of {key:?} at {replica:?} is not version {versions:?} (first difference at byte {diff:?})"
            )
        })
    }

    /// The model's verdict for a read of `key`: the error it expects, or the replicas and
    /// version it expects.
    fn expected_read(&self, key: &str) -> Result<ExpectedRead, ErrorCode> {
        let object = self
            .model
            .objects
            .get(key)
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        if !object.has_complete() {
            return Err(ErrorCode::REPLICA_IS_NOT_READY);
        }
        let replicas = object
            .replicas
            .iter()
            .filter(|r| r.complete)
            .map(|r| (r.segment, r.addr))
            .collect();
        Ok((
            replicas,
            object.version.expect("complete object has a version"),
            object.size,
        ))
    }

    fn judge_list(&mut self, key: &str, list: &crate::ReplicaList) -> Result<u64, String> {
        let (replicas, version, size) = self
            .expected_read(key)
            .map_err(|code| format!("read of {key:?} succeeded, expected {code}"))?;
        let got: Vec<(SegmentId, u64)> =
            list.replicas.iter().map(|r| (r.segment, r.addr)).collect();
        ensure(got == replicas, || {
            format!("replicas of {key:?}: {got:?}, expected {replicas:?}")
        })?;
        ensure(list.lease_ttl == self.config.lease_ttl, || {
            "lease ttl".into()
        })?;
        for r in &list.replicas {
            ensure(r.status == ReplicaStatus::Complete && r.len == size, || {
                format!("served replica {r:?} of {key:?} ({size} bytes)")
            })?;
            self.check_bytes(key, r, &[version])?;
        }
        let lease = self.config.lease_ttl;
        self.model
            .objects
            .get_mut(key)
            .expect("exists")
            .grant_lease(self.now, lease);
        Ok(version)
    }

    fn get(&mut self, key: u8, keep: bool) -> Result<(), String> {
        let key = key_name(key);
        let got = self.master.get_replica_list(&key, self.now);
        self.no_events("get")?;
        match self.expected_read(&key) {
            Err(code) => expect_code(&got, code, "get"),
            Ok(_) => {
                let list = got.map_err(|e| format!("get failed: {e}"))?;
                let version = self.judge_list(&key, &list)?;
                self.hit("read");
                if keep {
                    if self.reads.len() >= 8 {
                        self.reads.remove(0);
                    }
                    self.reads.push(PendingRead {
                        key,
                        version,
                        replicas: list.replicas,
                        lease_until: self.now + list.lease_ttl,
                    });
                }
                Ok(())
            }
        }
    }

    fn read_late(&mut self, read: u8) -> Result<(), String> {
        if self.reads.is_empty() {
            return Ok(());
        }
        let read = self.reads.remove(usize::from(read) % self.reads.len());
        if self.now >= read.lease_until {
            return Ok(()); // the reader's lease check would discard it
        }
        for r in &read.replicas {
            if self.memory.read(r).is_some() {
                self.check_bytes(&read.key, r, &[read.version])?;
            }
        }
        let replaced = self
            .model
            .objects
            .get(&read.key)
            .is_none_or(|o| o.version != Some(read.version));
        self.hit(if replaced {
            "late-read-of-replaced-value"
        } else {
            "late-read"
        });
        Ok(())
    }

    fn exist(&mut self, key: u8) -> Result<(), String> {
        let key = key_name(key);
        let got = self.master.exist(&key, self.now);
        self.no_events("exist")?;
        let expected = self
            .model
            .objects
            .get(&key)
            .is_some_and(MObject::has_complete);
        ensure(got.as_ref().ok() == Some(&expected), || {
            format!("exist {got:?}, expected {expected}")
        })?;
        if expected {
            let (now, lease) = (self.now, self.config.lease_ttl);
            self.model
                .objects
                .get_mut(&key)
                .expect("exists")
                .grant_lease(now, lease);
        }
        Ok(())
    }

    fn query(&mut self, prefix: u8) -> Result<(), String> {
        let prefix = format!("k{}", prefix % 10);
        let got = self
            .master
            .query_by_regex(&format!("^{prefix}"), self.now)
            .map_err(|e| format!("query failed: {e}"))?;
        self.no_events("query")?;
        let expected: Vec<String> = self
            .model
            .objects
            .iter()
            .filter(|(k, o)| k.starts_with(&prefix) && o.has_complete())
            .map(|(k, _)| k.clone())
            .collect();
        let keys: Vec<String> = got.iter().map(|(k, _)| k.clone()).collect();
        ensure(keys == expected, || {
            format!("query keys {keys:?}, expected {expected:?}")
        })?;
        for (key, list) in &got {
            self.judge_list(key, list)?;
        }
        Ok(())
    }

    // ---- removal -------------------------------------------------------------------------

    fn removable(&self, object: &MObject) -> Result<(), ErrorCode> {
        if object.task.is_some() {
            Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK)
        } else if object.writing.is_some() {
            Err(ErrorCode::REPLICA_IS_NOT_READY)
        } else if object.holds > 0 {
            Err(ErrorCode::OBJECT_REPLICA_BUSY)
        } else if object.lease_active(self.now) {
            Err(ErrorCode::OBJECT_HAS_LEASE)
        } else {
            Ok(())
        }
    }

    fn model_remove(&mut self, key: &str) {
        let object = self.model.objects.remove(key).expect("exists");
        self.model.reserve_for_readers(
            &object.replicas,
            object.size,
            object.readers_done_at(self.config.lease_grace),
        );
    }

    fn remove(&mut self, key: u8) -> Result<(), String> {
        let key = key_name(key);
        let got = self.master.remove(&key, self.now);
        self.no_events("remove")?;
        let Some(object) = self.model.objects.get(&key) else {
            return expect_code(&got, ErrorCode::OBJECT_NOT_FOUND, "remove");
        };
        match self.removable(object) {
            Err(code) => {
                self.hit(if code == ErrorCode::OBJECT_HAS_LEASE {
                    "remove-leased"
                } else {
                    "remove-refused"
                });
                expect_code(&got, code, "remove")
            }
            Ok(()) => {
                got.map_err(|e| format!("remove failed: {e}"))?;
                self.hit("remove");
                self.model_remove(&key);
                Ok(())
            }
        }
    }

    fn remove_matching(&mut self, prefix: Option<u8>) -> Result<(), String> {
        let prefix = prefix.map(|p| format!("k{}", p % 10));
        let got = match &prefix {
            Some(p) => self
                .master
                .remove_by_regex(&format!("^{p}"), self.now)
                .map_err(|e| format!("remove_by_regex failed: {e}"))?,
            None => self.master.remove_all(self.now),
        };
        self.no_events("remove_all")?;
        let victims: Vec<String> = self
            .model
            .objects
            .iter()
            .filter(|(k, o)| {
                prefix.as_ref().is_none_or(|p| k.starts_with(p.as_str()))
                    && self.removable(o).is_ok()
            })
            .map(|(k, _)| k.clone())
            .collect();
        ensure(got == victims.len() as u64, || {
            format!("removed {got}, expected {} ({victims:?})", victims.len())
        })?;
        for key in victims {
            self.model_remove(&key);
        }
        Ok(())
    }

    // ---- holds ---------------------------------------------------------------------------

    fn hold(&mut self, client: u8, key: u8) -> Result<(), String> {
        let (id, key) = (client_id(client), key_name(key));
        let got = self.master.acquire_hold(id, &key, self.now);
        self.model.touch(id, self.now);
        self.no_events("hold")?;
        match self.expected_read(&key) {
            Err(code) => expect_code(&got, code, "hold"),
            Ok(_) => {
                let (hold, list) = got.map_err(|e| format!("hold failed: {e}"))?;
                self.hit("hold");
                self.judge_list(&key, &list)?;
                let object = self.model.objects.get_mut(&key).expect("exists");
                object.holds += 1;
                let write_id = object.write_id;
                self.model.holds.insert(
                    hold,
                    model::MHold {
                        client: id,
                        key,
                        write_id,
                    },
                );
                self.clients[client_index(id)].holds.push(hold);
                Ok(())
            }
        }
    }

    fn release(&mut self, client: u8, hold: u8, foreign: bool) -> Result<(), String> {
        let id = client_id(client);
        let owner = if foreign {
            client_id(client.wrapping_add(1))
        } else {
            id
        };
        let side = &self.clients[client_index(owner)];
        let pick = (!side.holds.is_empty()).then(|| usize::from(hold) % side.holds.len());
        let hold_id = pick.map_or(HoldId(u64::MAX), |i| side.holds[i]);
        let got = self.master.release_hold(id, hold_id, self.now);
        self.model.touch(id, self.now);
        self.no_events("release")?;
        let Some(i) = pick else {
            return expect_code(&got, ErrorCode::INVALID_PARAMS, "release of no hold");
        };
        if owner != id {
            return expect_code(
                &got,
                ErrorCode::ILLEGAL_CLIENT,
                "release of another client's hold",
            );
        }
        got.map_err(|e| format!("release failed: {e}"))?;
        self.clients[client_index(id)].holds.remove(i);
        let held = self
            .model
            .holds
            .remove(&hold_id)
            .expect("model knows the hold");
        if let Some(o) = self.model.objects.get_mut(&held.key)
            && o.write_id == held.write_id
        {
            o.holds -= 1;
        }
        Ok(())
    }

    // ---- copy and move -------------------------------------------------------------------

    fn copy(&mut self, client: u8, key: u8, source: Option<u8>, target: u8) -> Result<(), String> {
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

    fn task_transfer(&mut self, client: u8, task: u8) -> Result<(), String> {
        let side = &self.clients[usize::from(client % CLIENTS)];
        if side.tasks.is_empty() {
            return Ok(());
        }
        let index = side.tasks.len() - 1 - usize::from(task) % side.tasks.len();
        let t = side.tasks[index].clone();
        if self.now >= t.started + self.config.put_start_release_timeout {
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

    fn task_finish(&mut self, client: u8, task: u8, end: bool) -> Result<(), String> {
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

    /// A dead client's holds are released and its tasks abandoned.
    fn release_dead_client(&mut self, client: ClientId) {
        let holds: Vec<HoldId> = self
            .model
            .holds
            .iter()
            .filter(|(_, h)| h.client == client)
            .map(|(&id, _)| id)
            .collect();
        for id in holds {
            let held = self.model.holds.remove(&id).expect("listed");
            if let Some(o) = self.model.objects.get_mut(&held.key)
                && o.write_id == held.write_id
            {
                o.holds -= 1;
            }
        }
        let tasks: Vec<TaskId> = self
            .model
            .tasks
            .iter()
            .filter(|(_, t)| t.client == client)
            .map(|(&id, _)| id)
            .collect();
        for id in tasks {
            self.abandon_task(id);
        }
    }

    /// The master abandons a task (timeout or dead client): its targets wait out the release
    /// timeout.
    fn abandon_task(&mut self, id: TaskId) {
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

    // ---- snapshots and bad input ---------------------------------------------------------

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

    fn bad_input(&mut self, kind: u8) -> Result<(), String> {
        let c = client_id(0);
        let now = self.now;
        let long_key = "x".repeat(self.config.max_key_len + 1);
        let cfg = ReplicateConfig::single();
        let m = &mut self.master;
        let outcome: (ErrorCode, String) = match kind % 12 {
            0 => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.get_replica_list("", now)),
            ),
            1 => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.put_start(c, &long_key, 10, &cfg, now)),
            ),
            2 => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.put_start(c, "k0", 0, &cfg, now)),
            ),
            3 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.upsert_start(c, "k0", 10, &ReplicateConfig::replicas(0), now)
                ),
            ),
            4 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.put_start(c, "k0", 10, &ReplicateConfig::replicas(99), now)
                ),
            ),
            5 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.put_start(
                        c,
                        "k0",
                        10,
                        &cfg.clone().soft_pinned(Some(Millis::ZERO)),
                        now
                    )
                ),
            ),
            6 => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.query_by_regex("(unclosed", now)),
            ),
            7 => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.remove_by_regex("[z-a]", now)),
            ),
            8 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.mount_segment(
                        c,
                        &SegmentSpec {
                            name: "tiny".into(),
                            base: 0,
                            size: 100,
                            endpoint: String::new(),
                            key: 7
                        },
                        now
                    )
                ),
            ),
            9 => (
                ErrorCode::OBJECT_NO_REPLICATION_TASK,
                format!("{:?}", m.task_end(c, TaskId(u64::MAX), now)),
            ),
            10 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    Master::restore(self.config.clone(), b"MOORSNAP garbage", now).map(|_| ())
                ),
            ),
            _ => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.exist(&long_key, now)),
            ),
        };
        // Calls that name a client count as a sign of life.
        if kind % 12 == 8 {
            self.model.announce(c, now);
        } else if !matches!(kind % 12, 0 | 6 | 7 | 10 | 11) {
            self.model.touch(c, now);
        }
        self.no_events("bad input")?;
        ensure(outcome.1.contains(&format!("{:?}", outcome.0)), || {
            format!(
                "bad input {kind}: expected {}, got {}",
                outcome.0, outcome.1
            )
        })
    }

    // ---- events --------------------------------------------------------------------------

    fn no_events(&mut self, what: &str) -> Result<(), String> {
        let events = self.master.drain_events();
        ensure(events.is_empty(), || {
            format!("{what} produced events {events:?}")
        })
    }

    /// Judges and applies events the master reported. `unmounter` is the client whose unmount
    /// request produced them, if any.
    /// `exempt` is a key the operation itself protects from its own eviction (an upsert
    /// allocating fresh buffers for it).
    fn apply_events(
        &mut self,
        events: Vec<Event>,
        unmounter: Option<ClientId>,
        exempt: Option<&str>,
    ) -> Result<(), String> {
        let now = self.now;
        let mut evicted: Vec<(Millis, bool)> = Vec::new();
        let mut lost_replicas: Vec<(SegmentId, u64)> = Vec::new();
        let mut expiring: Option<ClientId> = None;
        for event in &events {
            self.note(format!("    event {event:?}"));
        }
        for event in events {
            let part_of_expiry = matches!(
                event,
                Event::ClientExpired { .. }
                    | Event::ObjectLost { .. }
                    | Event::SegmentUnmounted { .. }
                    | Event::WriteDiscarded {
                        cause: DiscardCause::WriterDead,
                        ..
                    }
            );
            if !part_of_expiry && let Some(client) = expiring.take() {
                self.release_dead_client(client);
            }
            match event {
                Event::PrefetchFailed { key, .. } => {
                    return Err(format!(
                        "prefetch of {key:?}, but the harness never prefetches"
                    ));
                }
                Event::ClientExpired { client } => {
                    self.hit("client-expired");
                    self.model.clients.remove(&client);
                    self.model.announced.remove(&client);
                    let side = &mut self.clients[client_index(client)];
                    side.grants.clear();
                    side.holds.clear();
                    side.tasks.clear();
                    // The master drops the client's segments and writes first, then its holds
                    // and tasks.
                    if let Some(previous) = expiring.replace(client) {
                        self.release_dead_client(previous);
                    }
                }
                Event::ObjectLost { key, segment } => {
                    let (task, on_segment) = self.model.objects.get(&*key).map_or((None, 0), |o| {
                        (
                            o.task,
                            o.replicas.iter().filter(|r| r.segment == segment).count() as u64,
                        )
                    });
                    if let Some(task) = task {
                        self.abandon_task(task);
                    }
                    let object = self
                        .model
                        .objects
                        .get(&*key)
                        .ok_or_else(|| format!("lost unknown {key:?}"))?;
                    ensure(object.replicas.iter().all(|r| r.segment == segment), || {
                        format!("{key:?} reported lost but has replicas elsewhere")
                    })?;
                    lost_replicas.push((segment, on_segment));
                    self.hit("object-lost");
                    self.model.objects.remove(&*key);
                }
                Event::SegmentUnmounted {
                    segment,
                    name,
                    replicas_dropped,
                    objects_lost,
                } => {
                    let seg = self
                        .model
                        .segments
                        .get(&*name)
                        .filter(|s| s.id == segment)
                        .ok_or_else(|| format!("unmounted unknown segment {name:?}"))?;
                    ensure(
                        Some(seg.owner) == unmounter
                            || !self.model.clients.contains_key(&seg.owner),
                        || format!("segment {name:?} of live client {} dropped", seg.owner),
                    )?;
                    let mut dropped: u64 = lost_replicas
                        .iter()
                        .filter(|(s, _)| *s == segment)
                        .map(|(_, n)| n)
                        .sum();
                    for (key, o) in &mut self.model.objects {
                        let before = o.replicas.len();
                        o.replicas.retain(|r| r.segment != segment);
                        dropped += (before - o.replicas.len()) as u64;
                        let lost = if o.writing.is_some() {
                            o.replicas.is_empty()
                        } else {
                            !o.has_complete()
                        };
                        ensure(!lost, || format!("{key:?} lost without an event"))?;
                    }
                    let lost = lost_replicas.iter().filter(|(s, _)| *s == segment).count() as u64;
                    ensure(lost == objects_lost, || {
                        format!("{name:?} reported {objects_lost} objects lost, model saw {lost}")
                    })?;
                    ensure(dropped == replicas_dropped, || {
                        format!("{name:?} dropped {replicas_dropped} replicas, model had {dropped}")
                    })?;
                    self.model.reserved.retain(|b| b.segment != segment);
                    self.model.segments.remove(&*name);
                    self.memory.unmount(segment);
                }
                Event::WriteDiscarded {
                    key,
                    write,
                    cause,
                    object_removed,
                } => {
                    let object = self
                        .model
                        .objects
                        .get(&*key)
                        .ok_or_else(|| format!("discarded write of unknown {key:?}"))?;
                    let w = object
                        .writing
                        .filter(|w| w.write_id == write)
                        .ok_or_else(|| format!("discarded {write} which is not {key:?}'s write"))?;
                    self.hit(match cause {
                        DiscardCause::Timeout => "write-timeout",
                        DiscardCause::WriterDead => "writer-dead",
                        DiscardCause::Preempted => "write-preempted",
                        DiscardCause::Aborted => "write-aborted",
                        DiscardCause::ReplicasLost => "write-replicas-lost",
                    });
                    match cause {
                        DiscardCause::Timeout => ensure(
                            w.start + self.config.put_start_discard_timeout <= now,
                            || format!("{key:?} discarded before its timeout"),
                        )?,
                        DiscardCause::WriterDead => {
                            ensure(!self.model.clients.contains_key(&w.client), || {
                                format!("{key:?} discarded though its writer lives")
                            })?
                        }
                        DiscardCause::Preempted | DiscardCause::Aborted => {}
                        DiscardCause::ReplicasLost => {
                            return Err(format!(
                                "{key:?}: a disk-tier event in a model without disks"
                            ));
                        }
                    }
                    let object = self.model.objects.get_mut(&*key).expect("exists");
                    object.writing = None;
                    let processing: Vec<MReplica> = object
                        .replicas
                        .iter()
                        .filter(|r| !r.complete)
                        .copied()
                        .collect();
                    object.replicas.retain(|r| r.complete);
                    let (size, empty) = (object.size, object.replicas.is_empty());
                    ensure(empty == object_removed, || {
                        format!("{key:?} removal {object_removed}")
                    })?;
                    if empty {
                        self.model.objects.remove(&*key);
                    }
                    let release_at = w.start + self.config.put_start_release_timeout;
                    self.model
                        .reserve_for_writer(&processing, size, release_at, w.client);
                }
                Event::Evicted {
                    key,
                    soft_pinned,
                    bytes,
                    contiguous,
                    kept_on_disk,
                } => {
                    ensure(!kept_on_disk, || {
                        format!("{key:?} kept on disk, but the harness mounts no disk")
                    })?;
                    let object = self
                        .model
                        .objects
                        .get(&*key)
                        .ok_or_else(|| format!("evicted unknown {key:?}"))?;
                    let tier = object.eviction_tier(now);
                    ensure(tier == Some(soft_pinned), || {
                        format!(
                            "evicted {key:?} (soft {soft_pinned}) but its tier is {tier:?}: {object:?}"
                        )
                    })?;
                    ensure(!soft_pinned || self.config.allow_evict_soft_pinned, || {
                        format!("evicted soft-pinned {key:?} though not allowed")
                    })?;
                    let expected = block_len(object.size) * object.replicas.len() as u64;
                    ensure(bytes == expected, || {
                        format!("evicted {key:?} freed {bytes}, expected {expected}")
                    })?;
                    if contiguous {
                        // A window eviction may skip LRU order, but only takes objects whose
                        // blocks are free at once (lease and grace over).
                        ensure(
                            object.readers_done_at(self.config.lease_grace) <= now,
                            || format!("window-evicted {key:?} inside its lease grace"),
                        )?;
                        self.hit("evict-window");
                    } else {
                        evicted.push((object.last_access, soft_pinned));
                        self.hit(if soft_pinned {
                            "evict-soft-pinned"
                        } else {
                            "evict"
                        });
                    }
                    self.model_remove(&key);
                }
            }
        }
        if let Some(client) = expiring.take() {
            self.release_dead_client(client);
        }
        // Order: least recently used first within a tier, every unpinned candidate before any
        // soft-pinned one.
        for soft in [false, true] {
            let Some(newest) = evicted.iter().filter(|e| e.1 == soft).map(|e| e.0).max() else {
                continue;
            };
            for (key, o) in &self.model.objects {
                if Some(key.as_str()) == exempt {
                    continue;
                }
                if o.eviction_tier(now) == Some(soft) {
                    ensure(o.last_access >= newest, || {
                        format!(
                            "evicted an object used at {newest} but kept {key:?} used at {}",
                            o.last_access
                        )
                    })?;
                }
                if soft {
                    ensure(o.eviction_tier(now) != Some(false), || {
                        format!("evicted soft-pinned objects but kept unpinned {key:?}")
                    })?;
                }
            }
        }
        Ok(())
    }
}

fn to_model_replica(r: &ReplicaDescriptor) -> MReplica {
    MReplica {
        segment: r.segment,
        addr: r.addr,
        complete: r.status == ReplicaStatus::Complete,
    }
}

/// Decodes an op sequence from raw bytes (the fuzz target's input format).
pub fn ops_from_bytes(data: &[u8]) -> Vec<Op> {
    let mut u = arbitrary::Unstructured::new(data);
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < 512 {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    ops
}

/// Runs a fuzz input: a seed byte, then ops. Panics on any violation (what a fuzzer wants).
pub fn fuzz_one(data: &[u8]) {
    let Some((&seed, rest)) = data.split_first() else {
        return;
    };
    let ops = ops_from_bytes(rest);
    let mut harness = Harness::new(u64::from(seed));
    if let Err(e) = harness.run(&ops) {
        panic!("seed {seed}: {e}\nops: {ops:#?}");
    }
}

/// A snapshot of a master that has seen a bit of everything, built once.
fn sample_snapshot() -> &'static [u8] {
    static SNAPSHOT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let mut harness = Harness::new(7);
        let ops = [
            Op::Put {
                client: 0,
                key: 1,
                size: 1,
                replicas: 1,
                pin: Pin::Hard,
                prefer: None,
            },
            Op::End {
                client: 0,
                grant: 0,
            },
            Op::Put {
                client: 1,
                key: 2,
                size: 2,
                replicas: 2,
                pin: Pin::Soft,
                prefer: Some(2),
            },
            Op::End {
                client: 1,
                grant: 0,
            },
            Op::Put {
                client: 2,
                key: 3,
                size: 3,
                replicas: 0,
                pin: Pin::None,
                prefer: None,
            },
            Op::Get { key: 2, keep: true },
            Op::Hold { client: 2, key: 1 },
            Op::Copy {
                client: 1,
                key: 1,
                target: 2,
            },
            Op::Upsert {
                client: 0,
                key: 2,
                size: 2,
                replicas: 1,
                pin: Pin::None,
                prefer: None,
            },
        ];
        for op in &ops {
            harness.apply(op).expect("sample ops");
        }
        harness.master.snapshot()
    })
}

/// Runs a snapshot fuzz input: the bytes are XORed into a real snapshot's payload (and also
/// tried raw), the envelope's checksum is fixed up so decoding gets past it, and the result
/// must either be refused or restore to a master that passes its invariants and survives a
/// few operations. Panics on any violation.
pub fn fuzz_snapshot(data: &[u8]) {
    let config = harness_config(7);
    let _ = Master::restore(config.clone(), data, Millis(0));
    let mut payload = crate::snapshot::payload(sample_snapshot()).to_vec();
    for (i, b) in data.iter().enumerate() {
        if payload.is_empty() {
            break;
        }
        let at = (i * 131 + usize::from(*b)) % payload.len();
        payload[at] ^= b.rotate_left(i as u32);
    }
    let bytes = crate::snapshot::envelope(&payload);
    if let Ok(mut master) = Master::restore(config, &bytes, Millis(5_000)) {
        if let Err(v) = invariants::check(&master) {
            panic!("restored a master that breaks its invariants: {v}");
        }
        let client = client_id(0);
        let now = Millis(6_000);
        master.tick(now);
        for k in 0..KEYS {
            let key = key_name(k);
            let _ = master.get_replica_list(&key, now);
            let _ = master.upsert_start(client, &key, 700, &ReplicateConfig::single(), now);
        }
        master.tick(now + Millis(100_000));
        if let Err(v) = invariants::check(&master) {
            panic!("a restored master broke its invariants: {v}");
        }
    }
}
