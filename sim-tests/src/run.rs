//! One simulation run: build the cluster, run the workload under the fault plan while
//! checking the master's invariants, then heal everything and check liveness and accounting.

use std::collections::BTreeMap;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use madsim::net::NetSim;
use madsim::rand::Rng as _;
use madsim::runtime::{Handle, NodeHandle, Runtime};
use madsim::task::NodeId;
use mooring::buggify::Site;
use mooring_core::{Checksum, ErrorCode, Event, SegmentId, Stats, invariants};
use mooring_transport_sim::disk::SimDisk;
use mooring_transport_sim::{NetFaults, NetStats};

use crate::history::{GoneWhy, Tally};
use crate::plan::{Fault, JournalFault, Member, Plan, Transport};
use crate::stranger::{self, stranger_ip};
use crate::workload::OPERATION_BOUND;
use crate::world::{CrashOrder, World, checker_ip, ip};
use crate::{coverage, members};

/// How often the supervisor applies faults and checks the master's invariants.
const TICK: Duration = Duration::from_millis(20);
/// Every this many ticks the supervisor scrubs every memory replica (see
/// [`Supervisor::scrub`]).
const SCRUB_EVERY: u64 = 5;
/// A crash-mid-write order that finds no write within this long crashes the client anyway.
const CRASH_ORDER_PATIENCE: Duration = Duration::from_secs(2);
/// Longest the workload may run (simulated) before the run counts as stuck.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(900);

/// What a run found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The plan it followed.
    pub plan: Plan,
    /// Everything found wrong (empty: the run passed).
    pub violations: Vec<String>,
    /// Operations by outcome.
    pub tally: Tally,
    /// Simulated time the run took.
    pub sim_time: Duration,
    /// The master's counters at the end of the workload.
    pub stats: Option<Stats>,
    /// What the simulated network did (transport-sim runs).
    pub net: NetStats,
    /// What the software HCA did (RDMA runs).
    pub rdma: mooring_transport_rdma::model::ModelCounts,
    /// Buggify sites that were switched on.
    pub buggified: Vec<&'static str>,
    /// (writes, reads judged, reads that found nothing judged).
    pub sizes: (usize, usize, usize),
    /// A digest of the run, equal for two runs of one seed.
    pub fingerprint: u64,
    /// Rare paths the run went down, with how often (see [`crate::coverage`]).
    pub coverage: BTreeMap<&'static str, u64>,
}

impl Report {
    /// Whether the run found nothing wrong.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The report of a run that panicked.
    pub fn panicked(plan: Plan, message: &str) -> Report {
        Report {
            plan,
            violations: vec![format!("the simulation panicked: {message}")],
            tally: Tally::default(),
            sim_time: Duration::ZERO,
            stats: None,
            net: NetStats::default(),
            rdma: Default::default(),
            buggified: Vec::new(),
            sizes: (0, 0, 0),
            fingerprint: 0,
            coverage: BTreeMap::new(),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.plan)?;
        writeln!(
            f,
            "  ran {:?} simulated: {} operations ({} ok), {} writes, {} reads judged, {} that found nothing",
            self.sim_time,
            self.tally.total(),
            self.tally.ok(),
            self.sizes.0,
            self.sizes.1,
            self.sizes.2
        )?;
        if let Some(s) = &self.stats {
            writeln!(
                f,
                "  master: {} evicted, {} writes discarded, {} objects lost with their nodes",
                s.evicted_objects, s.discarded_writes, s.lost_objects
            )?;
            if self.plan.disk.is_some() {
                writeln!(
                    f,
                    "  disks: {} copies recorded, {} objects on disk at the end of the workload, {} prefetches",
                    s.disk_copies_recorded, s.disk_replicas, s.prefetches
                )?;
            }
        }
        if self.plan.transport.datagrams() {
            let n = &self.net;
            writeln!(
                f,
                "  network: {} sent, {} lost, {} blocked, {} duplicated ({} dropped as such), {} corrupted ({} refused)",
                n.sent, n.lost, n.blocked, n.duplicated, n.deduplicated, n.corrupted, n.refused
            )?;
        }
        if self.plan.transport == Transport::Rdma {
            let r = &self.rdma;
            writeln!(
                f,
                "  RDMA: {} requests executed, {} refused (remote access), {} retry exceeded, {} flushed, {} stalls",
                r.executed, r.remote_access, r.retry_exceeded, r.flushed, r.stalls
            )?;
        }
        if !self.buggified.is_empty() {
            writeln!(f, "  buggified: {}", self.buggified.join(", "))?;
        }
        if self.passed() {
            writeln!(f, "  PASSED")
        } else {
            writeln!(f, "  FAILED: {} violation(s)", self.violations.len())?;
            for v in self.violations.iter().take(20) {
                writeln!(f, "    - {v}")?;
            }
            writeln!(f, "  replay: {}", self.plan.replay_command())
        }
    }
}

/// Runs `plan` to completion. Call it on a thread of its own (the simulator seeds per-thread
/// state from the seed: the standard library's hash keys, buggify's choices).
pub fn run(plan: Plan) -> Report {
    mooring::buggify::reset(plan.buggify);
    let mut runtime = Runtime::with_seed_and_config(plan.seed, madsim::Config::default());
    // A backstop: the run's own limits trip long before this.
    runtime.set_time_limit(Duration::from_secs(3600));
    // A run starts with no master state (a replay of the seed in this process must not find
    // the last one's) and leaves none behind.
    let state = crate::world::master_state_dir(plan.seed);
    let _ = std::fs::remove_dir_all(&state);
    let report = runtime.block_on(supervise(plan));
    let _ = std::fs::remove_dir_all(&state);
    mooring::buggify::reset(false);
    report
}

/// The madsim nodes of the cluster.
struct Nodes {
    /// The master (a group's first master).
    master: NodeHandle,
    /// A group's second master, and the simulated etcd they elect through.
    group: Option<(NodeHandle, NodeHandle)>,
    storage: Vec<NodeHandle>,
    clients: Vec<NodeHandle>,
}

impl Nodes {
    fn id(&self, member: Member) -> NodeId {
        match member {
            Member::Master => self.master.id(),
            Member::Node(i) => self.storage[i].id(),
            Member::Client(j) => self.clients[j].id(),
        }
    }

    fn members(&self) -> Vec<Member> {
        let mut all = vec![Member::Master];
        all.extend((0..self.storage.len()).map(Member::Node));
        all.extend((0..self.clients.len()).map(Member::Client));
        all
    }
}

/// Something to undo when a fault's time is up.
#[derive(Clone, Debug)]
enum Heal {
    Restart(NodeId),
    /// A process that only ever lived for the fault (the stranger) goes for good.
    Stop(NodeId),
    Unblock(Member, Member),
    Unlag(Member, Member),
    Quiet,
    Resume(NodeId),
    DiskQuiet(usize),
    /// The master's state directory has room again.
    MasterDiskRoom,
    /// The master's state directory's syncs work again.
    MasterSyncsWork,
}

fn start_cluster(world: &Arc<World>) -> Nodes {
    let handle = Handle::current();
    let shape = &world.plan.shape;
    let w = world.clone();
    let master = if world.plan.master_group {
        handle
            .create_node()
            .name("master0")
            .ip(ip(Member::Master))
            .init(move || members::group_master(w.clone(), 0))
            .build()
    } else {
        handle
            .create_node()
            .name("master")
            .ip(ip(Member::Master))
            .init(move || members::master(w.clone()))
            .build()
    };
    let group = world.plan.master_group.then(|| {
        let etcd = handle
            .create_node()
            .name("etcd")
            .ip(crate::world::etcd_addr().ip())
            .init(|| async {
                let _ = mooring_etcd::SimServer::builder()
                    .serve(crate::world::etcd_addr())
                    .await;
            })
            .build();
        let w = world.clone();
        let standby = handle
            .create_node()
            .name("master1")
            .ip(crate::world::group_master_addr(1).ip())
            .init(move || members::group_master(w.clone(), 1))
            .build();
        (standby, etcd)
    });
    let storage = (0..shape.nodes)
        .map(|i| {
            let w = world.clone();
            handle
                .create_node()
                .name(format!("node{i}"))
                .ip(ip(Member::Node(i)))
                .init(move || members::storage_node(w.clone(), i))
                .build()
        })
        .collect();
    let clients = (0..shape.clients)
        .map(|j| {
            let w = world.clone();
            handle
                .create_node()
                .name(format!("client{j}"))
                .ip(ip(Member::Client(j)))
                .init(move || members::client(w.clone(), j))
                .build()
        })
        .collect();
    Nodes {
        master,
        group,
        storage,
        clients,
    }
}

/// Crash orders are served at the client's write steps: the client parks itself and the
/// supervisor kills it at its next tick. Slow readers stall at the read-transfer step.
fn install_crash_hook(world: &Arc<World>) {
    let w = world.clone();
    let slow_readers = world.plan.slow_readers;
    let lease = Duration::from_millis(world.plan.master.lease_ttl.as_millis());
    let slot_ttl = world
        .plan
        .disk
        .as_ref()
        .map_or(Duration::ZERO, |d| d.slot_ttl);
    let hook: mooring::buggify::HoldHook = Rc::new(move |site| {
        let stall = !w.healed.load(Ordering::Relaxed);
        if site == Site::CLIENT_BEFORE_READ_TRANSFER {
            // One read in five stalls for up to 80% of its lease (the client still checks
            // its lease after the transfer and retries a read that outlived it).
            let mut rng = madsim::rand::thread_rng();
            return (stall && slow_readers && rng.gen_bool(0.2))
                .then(|| lease.mul_f64(0.8 * rng.r#gen::<f64>()));
        }
        if site == Site::CLIENT_BEFORE_STAGE {
            // Disk reads with an old replica list: the key may be rewritten (and its new
            // value written to the same disk) before the node is asked for the old one.
            let mut rng = madsim::rand::thread_rng();
            return (stall && slow_readers && rng.gen_bool(0.5))
                .then(|| lease.mul_f64(0.6 * rng.r#gen::<f64>()));
        }
        if site == Site::CLIENT_BEFORE_STAGED_PULL {
            // Staged slots wait for their readers (inside the slot's TTL: a reader past it
            // gives up), so a tight staging buffer fills with slots a node must not take back
            // early.
            let mut rng = madsim::rand::thread_rng();
            return (stall && slow_readers && rng.gen_bool(0.8))
                .then(|| slot_ttl.min(lease).mul_f64(0.7 * rng.r#gen::<f64>()));
        }
        if site == Site::CLIENT_HELD_READ_TRANSFER {
            // A held read is not bounded by its lease: half of them outlast it, so removes,
            // upserts and eviction meet objects whose only protection is the hold.
            let mut rng = madsim::rand::thread_rng();
            return (stall && slow_readers && rng.gen_bool(0.5))
                .then(|| lease.mul_f64(0.5 + 2.0 * rng.r#gen::<f64>()));
        }
        if !matches!(
            site,
            Site::CLIENT_BEFORE_PUT_END
                | Site::CLIENT_BEFORE_BATCH_PUT_END
                | Site::CLIENT_AFTER_PUT_START
        ) {
            return None;
        }
        let node = madsim::plugin::node();
        let mut orders = w.orders();
        let order = orders.get_mut(&node)?;
        if order.triggered {
            return None;
        }
        order.triggered = true;
        Some(Duration::from_secs(3600))
    });
    mooring::buggify::set_hold_hook(Some(hook));
    let client_rot = world.plan.client_rot;
    let damage: mooring::buggify::DamageHook = Rc::new(move |site, len| {
        // A failing client's memory damages one prefetch in three.
        let mut rng = madsim::rand::thread_rng();
        (client_rot && site == Site::CLIENT_PREFETCH_BUFFER && len > 0 && rng.gen_bool(1.0 / 3.0))
            .then(|| rng.gen_range(0..len * 8))
    });
    mooring::buggify::set_damage_hook(Some(damage));
}

struct Supervisor {
    world: Arc<World>,
    nodes: Nodes,
    handle: Handle,
    heals: Vec<(Duration, Heal)>,
    /// Armed crash orders: node, armed at, how long the client stays down.
    armed: BTreeMap<NodeId, (Duration, Duration)>,
    /// What the master did on its own, by kind (see [`crate::coverage::of_event`]).
    coverage: BTreeMap<&'static str, u64>,
    /// Disk records a flip damaged while their value had other copies. Watched until the
    /// record is the value's only copy (the value is then destroyed) or is no longer the
    /// value's ([`Supervisor::watch_rotted`]).
    rotted: Vec<DamagedRecord>,
}

/// A value's record on a node's disk that a bit flip hit.
struct DamagedRecord {
    /// The node whose disk holds it, the file, and where in it the value starts.
    node: usize,
    file: String,
    start: u64,
    key: String,
    /// The write whose value it holds, and that value's length.
    version: u64,
    size: usize,
    /// The value's checksum, as the master knows it while it is the key's current value.
    checksum: Checksum,
}

impl DamagedRecord {
    /// Whether `disk` holds another record of the same value whose value is intact (the
    /// node wrote it twice): the master's disk copy may be that one.
    fn intact_twin_on(&self, disk: &SimDisk) -> bool {
        let mut header = crate::value::key_hash(&self.key).to_le_bytes().to_vec();
        header.extend_from_slice(&self.version.to_le_bytes());
        let found = disk.find(&header);
        let mut others = found
            .iter()
            .filter(|(name, start)| (name, *start) != (&self.file, self.start));
        others.any(|(name, start)| {
            disk.contents(name).is_some_and(|bytes| {
                let start = *start as usize;
                bytes.get(start..start + self.size).is_some_and(|value| {
                    crate::value::judge(&self.key, value)
                        == crate::value::Judged::Intact(self.version)
                })
            })
        })
    }
}

impl Supervisor {
    fn block(&self, from: Member, to: Member) {
        if self.world.plan.transport == Transport::Rdma {
            let (from, to) = (ip(from).to_string(), ip(to).to_string());
            self.world.fabric.block(&from, &to);
        }
        match self.world.plan.transport {
            Transport::Sim | Transport::Rdma | Transport::Shm => {
                self.world.net.block(ip(from), ip(to))
            }
            Transport::Tcp => NetSim::current().clog_link(self.nodes.id(from), self.nodes.id(to)),
        }
    }

    fn unblock(&self, from: Member, to: Member) {
        if self.world.plan.transport == Transport::Rdma {
            let (from, to) = (ip(from).to_string(), ip(to).to_string());
            self.world.fabric.unblock(&from, &to);
        }
        match self.world.plan.transport {
            Transport::Sim | Transport::Rdma | Transport::Shm => {
                self.world.net.unblock(ip(from), ip(to))
            }
            Transport::Tcp => NetSim::current().unclog_link(self.nodes.id(from), self.nodes.id(to)),
        }
    }

    fn apply(&mut self, now: Duration, fault: &Fault) {
        let until = now + fault.lasts();
        match *fault {
            Fault::KillNode { node, .. } => {
                let id = self.nodes.storage[node].id();
                self.handle.kill(id);
                // Whatever its disk had not synced is torn or lost with it.
                if let Some(disk) = self.world.disks.get(node) {
                    disk.crash();
                }
                self.heals.push((until, Heal::Restart(id)));
            }
            Fault::CrashClient {
                client,
                mid_write,
                down_for,
            } => {
                let id = self.nodes.clients[client].id();
                if mid_write {
                    self.world.orders().insert(id, CrashOrder::default());
                    self.armed.insert(id, (now, down_for));
                } else {
                    self.handle.kill(id);
                    self.heals.push((until, Heal::Restart(id)));
                }
            }
            Fault::Partition {
                from,
                to,
                both_ways,
                ..
            } => {
                self.block(from, to);
                self.heals.push((until, Heal::Unblock(from, to)));
                if both_ways {
                    self.block(to, from);
                    self.heals.push((until, Heal::Unblock(to, from)));
                }
            }
            Fault::Isolate { member, .. } => {
                for other in self.nodes.members() {
                    if other != member {
                        self.block(member, other);
                        self.block(other, member);
                        self.heals.push((until, Heal::Unblock(member, other)));
                        self.heals.push((until, Heal::Unblock(other, member)));
                    }
                }
            }
            Fault::Noise {
                loss,
                duplicate,
                corrupt,
                max_delay,
                ..
            } => {
                match self.world.plan.transport {
                    Transport::Sim | Transport::Rdma | Transport::Shm => {
                        self.world.net.set_faults(NetFaults {
                            loss,
                            duplicate,
                            corrupt,
                            max_delay,
                        })
                    }
                    Transport::Tcp => {
                        NetSim::current().update_config(|c| c.packet_loss_rate = loss)
                    }
                }
                self.heals.push((until, Heal::Quiet));
            }
            Fault::Lag { from, to, by, .. } => {
                self.world.net.lag(ip(from), ip(to), by);
                self.heals.push((until, Heal::Unlag(from, to)));
            }
            Fault::PauseNode { node, .. } => {
                let id = self.nodes.storage[node].id();
                self.handle.pause(id);
                self.heals.push((until, Heal::Resume(id)));
            }
            Fault::KillMaster { journal, .. } => {
                // What the master reported before it died is the history's; its successor
                // replays its journal without reporting it again.
                self.record_gone();
                // In a group, the kill takes whichever master leads.
                let id = match (&self.nodes.group, self.world.leader()) {
                    (Some((standby, _)), Some(1)) => standby.id(),
                    _ => self.nodes.master.id(),
                };
                self.handle.kill(id);
                match journal {
                    JournalFault::Kill => {}
                    JournalFault::PowerLoss => self.world.master_power_loss(now.as_nanos() as u64),
                    JournalFault::FlipSynced { pick } => self.world.flip_synced_journal_bit(pick),
                }
                self.heals.push((until, Heal::Restart(id)));
            }
            Fault::MasterDiskFull { .. } => {
                self.world.master_disk_full(true);
                self.heals.push((until, Heal::MasterDiskRoom));
            }
            Fault::MasterSyncFails { .. } => {
                self.world.master_syncs_fail(true);
                self.heals.push((until, Heal::MasterSyncsWork));
            }
            Fault::Stranger { .. } => {
                let world = self.world.clone();
                let stranger = self
                    .handle
                    .create_node()
                    .name("stranger")
                    .ip(stranger_ip())
                    .init(move || stranger::knock(world.clone()))
                    .build();
                self.heals.push((until, Heal::Stop(stranger.id())));
            }
            Fault::DiskErrors { node, rate, .. } => {
                let disk = &self.world.disks[node];
                disk.set_faults(World::disk_faults(&self.world.plan, rate));
                self.heals.push((until, Heal::DiskQuiet(node)));
            }
            Fault::RotMemory { node, pick } => self.rot_memory(node, pick),
            Fault::RotEveryCopy { node, pick } => self.rot_every_copy(node, pick),
            Fault::RotDisk { node, pick } => self.rot_disk(node, pick),
        }
    }

    /// Flips one bit of a file on node `node`'s disk, chosen by `pick`. If the bit is in the
    /// bytes of a value whose disk copy there is its only copy (the master lists no complete
    /// memory replica), the value is destroyed: the history may find it gone from now on. If
    /// the value has other copies, it is destroyed once they are gone (seed 10003: its memory
    /// replicas evicted or lost with a node), which [`Supervisor::watch_rotted`] looks out
    /// for.
    fn rot_disk(&mut self, node: usize, pick: u64) {
        let disk = &self.world.disks[node];
        let files = disk.files();
        let nonempty: Vec<&(String, u64)> = files.iter().filter(|(_, len)| *len > 0).collect();
        if nonempty.is_empty() {
            return;
        }
        let (name, len) = nonempty[(pick % nonempty.len() as u64) as usize];
        let at = (pick >> 16) % len;
        // Looked up first: the search reads the value's header, which the flip may hit.
        let hit = self.current_value_at(node, name, at);
        tracing::info!(%name, at, "flipping a bit");
        // The file exists: it was just listed.
        let _ = disk.flip_bit(name, at, (pick >> 8) as u8);
        match hit {
            Some((record, true)) if !record.intact_twin_on(disk) => {
                tracing::info!(key = %record.key, "the only copy of the value is damaged");
                let now = self.world.now();
                self.world
                    .history()
                    .gone(&record.key, now, GoneWhy::Destroyed);
            }
            Some((record, _)) => self.rotted.push(record),
            None => {}
        }
    }

    /// Records as destroyed each value whose damaged disk record is now its only copy (the
    /// master lists no complete memory replica, and the disk copy on the damaged node); stops
    /// watching a record that is no longer its key's current value.
    fn watch_rotted(&mut self) {
        let Some(master) = self.world.master() else {
            return;
        };
        let world = &self.world;
        // The state may have changed at any moment since the last tick.
        let since = world.now().saturating_sub(TICK);
        self.rotted.retain(|record| {
            let here = world.node(record.node).and_then(|n| n.segment());
            let key = &record.key;
            let (memory, disk) =
                master.with_master(|m, _| (m.audit_memory_replicas(key), m.audit_disk_copy(key)));
            match memory {
                Some((memory, current)) if current == record.checksum => {
                    let only_copy = memory.is_empty()
                        && disk.is_some()
                        && disk == here
                        && !record.intact_twin_on(&world.disks[record.node]);
                    if only_copy {
                        tracing::info!(%key, "a damaged disk record is the value's only copy now");
                        world.history().gone(key, since, GoneWhy::Destroyed);
                    }
                    !only_copy
                }
                // Written again, removed, or gone: the record is not the value's any more.
                _ => false,
            }
        });
    }

    /// The key whose current value's disk record (header, key or value) has a byte at offset
    /// `at` of file `name` on node `node`'s disk (seed 13707: a flip in a record's header):
    /// the key, the value's checksum, and whether that disk copy is the value's only
    /// one (the master lists it and no memory replica). A copy the node wrote and has not
    /// reported yet is found too (seed 10437): [`Supervisor::watch_rotted`] waits for the
    /// master to list it.
    fn current_value_at(&self, node: usize, name: &str, at: u64) -> Option<(DamagedRecord, bool)> {
        let master = self.world.master()?;
        let here = self.world.node(node)?.segment()?;
        let contents = self.world.disks[node].contents(name)?;
        let header = mooring_disk::record::HEADER_LEN;
        let (key, version, size, start) =
            crate::value::value_at(&contents, at as usize, &self.world.keys, header)?;
        // Only a write the history made (a stray header-like run of bytes is not a value).
        if !self
            .world
            .history()
            .writes_of(key)
            .contains(&(version, size))
        {
            return None;
        }
        let checksum = mooring_core::Checksum::of(&crate::value::encode(key, version, size));
        let (memory, current) = master.with_master(|m, _| m.audit_memory_replicas(key))?;
        if current != checksum {
            return None;
        }
        let listed_here = master.with_master(|m, _| m.audit_disk_copy(key)) == Some(here);
        let record = DamagedRecord {
            node,
            file: name.to_string(),
            start: start as u64,
            key: key.to_string(),
            version,
            size,
            checksum,
        };
        Some((record, listed_here && memory.is_empty()))
    }

    /// Flips one bit of a value held in node `node`'s memory: the first key from the one
    /// `pick` names with a complete memory replica there (reading its replica list grants a
    /// lease, as any reader's would).
    fn rot_memory(&self, node: usize, pick: u64) {
        self.rot_value(node, pick, |_, _| true);
    }

    /// Flips one bit of every copy of a value on node `node`: the first key from the one
    /// `pick` names whose only complete memory replica is there and whose records are on
    /// the node's disk, in memory and in each record (the value's key hash, which heads it).
    /// If the records include the damaged value's own, and the master knows no disk copy of
    /// it elsewhere, the value is destroyed: the history may find it gone from now on.
    fn rot_every_copy(&self, node: usize, pick: u64) {
        let disk = &self.world.disks[node];
        let records = |key: &str| disk.find(&crate::value::key_hash(key).to_le_bytes());
        let only_here = |key: &str, elsewhere: usize| elsewhere == 0 && !records(key).is_empty();
        let Some((key, version)) = self.rot_value(node, pick, only_here) else {
            return;
        };
        let mut own_record = crate::value::key_hash(&key).to_le_bytes().to_vec();
        own_record.extend_from_slice(&version.to_le_bytes());
        let own_record_here = !disk.find(&own_record).is_empty();
        for (name, at) in records(&key) {
            tracing::info!(%key, %name, at, "flipping a bit of a record on disk");
            // The file exists: it was just searched.
            let _ = disk.flip_bit(&name, at, (pick >> 24) as u8);
        }
        let here = self.world.node(node).and_then(|n| n.segment());
        let no_disk_copy_elsewhere = self.world.master().is_some_and(|master| {
            master
                .with_master(|m, _| m.audit_disk_copy(&key))
                .is_none_or(|segment| Some(segment) == here)
        });
        if own_record_here && no_disk_copy_elsewhere {
            tracing::info!(%key, version, "every copy of the value is damaged");
            let at = self.world.now();
            self.world.history().gone(&key, at, GoneWhy::Destroyed);
        }
    }

    /// Flips one bit of a value held in node `node`'s memory: the first key from the one
    /// `pick` names with a complete memory replica there that `also(key, replicas
    /// elsewhere)` accepts. Returns the key and the version its damaged value had.
    fn rot_value(
        &self,
        node: usize,
        pick: u64,
        also: impl Fn(&str, usize) -> bool,
    ) -> Option<(String, u64)> {
        let master = self.world.master()?;
        let target = self.world.node(node)?;
        let segment = target.segment()?;
        let keys = &self.world.keys;
        let start = (pick % keys.len() as u64) as usize;
        let (key, replica) = keys
            .iter()
            .cycle()
            .skip(start)
            .take(keys.len())
            .find_map(|key| {
                // Behind the master's back, changing nothing: a lease granted here would be
                // an input its journal never saw.
                let (replicas, _) = master.with_master(|m, _| m.audit_memory_replicas(key))?;
                let elsewhere = replicas.iter().filter(|r| r.segment != segment).count();
                let replica = replicas
                    .into_iter()
                    .find(|r| r.segment == segment && r.len > 0)?;
                also(key, elsewhere).then(|| (key.clone(), replica))
            })?;
        // Every value the workload writes is at least a header long and says its version.
        let mut header = [0u8; crate::value::HEADER];
        if replica.len < header.len() as u64 || !target.memory().copy_out(replica.addr, &mut header)
        {
            return None;
        }
        let version = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let at = replica.addr + (pick >> 16) % replica.len;
        let mut byte = [0u8];
        if !target.memory().copy_out(at, &mut byte) {
            return None;
        }
        byte[0] ^= 1 << ((pick >> 8) % 8);
        let _ = target.memory().copy_in(at, &byte);
        tracing::info!(%key, at, "flipping a bit in memory");
        self.world.history().note_rot(&key);
        Some((key, version))
    }

    fn heal(&mut self, heal: &Heal) {
        match *heal {
            Heal::Restart(id) => {
                // madsim's restart alone keeps the old incarnation's sockets bound (only kill
                // closes them), and a second scheduled restart may find the node running.
                self.handle.kill(id);
                self.handle.restart(id);
            }
            Heal::Unblock(from, to) => self.unblock(from, to),
            Heal::Unlag(from, to) => self.world.net.unlag(ip(from), ip(to)),
            Heal::Quiet => match self.world.plan.transport {
                Transport::Sim | Transport::Rdma | Transport::Shm => {
                    self.world.net.set_faults(NetFaults::default())
                }
                Transport::Tcp => NetSim::current().update_config(|c| c.packet_loss_rate = 0.0),
            },
            Heal::Resume(id) => self.handle.resume(id),
            Heal::Stop(id) => self.handle.kill(id),
            Heal::DiskQuiet(node) => {
                self.world.disks[node].set_faults(World::disk_faults(&self.world.plan, 0.0))
            }
            Heal::MasterDiskRoom => self.world.master_disk_full(false),
            Heal::MasterSyncsWork => {
                // The disk works again, and the master whose journal stopped is restarted
                // on it (as an operator restarts it after the alarm).
                self.world.master_syncs_fail(false);
                self.record_gone();
                let id = self.nodes.master.id();
                self.handle.kill(id);
                self.handle.restart(id);
            }
        }
    }

    fn heal_due(&mut self, now: Duration) {
        let (due, later): (Vec<_>, Vec<_>) = self.heals.drain(..).partition(|(at, _)| *at <= now);
        self.heals = later;
        for (_, heal) in due {
            self.heal(&heal);
        }
    }

    /// Kills clients that reached their crash point (or waited too long for one).
    fn serve_crash_orders(&mut self, now: Duration) {
        let ready: Vec<NodeId> = self
            .armed
            .iter()
            .filter(|(id, (armed_at, _))| {
                let triggered = self.world.orders().get(id).is_some_and(|o| o.triggered);
                triggered || now >= *armed_at + CRASH_ORDER_PATIENCE
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            let (_, down_for) = self.armed.remove(&id).expect("armed");
            self.world.orders().remove(&id);
            self.handle.kill(id);
            self.heals.push((now + down_for, Heal::Restart(id)));
        }
    }

    /// Hands the history every object the master let go of on its own since the last tick,
    /// and counts what the master did.
    fn record_gone(&mut self) {
        let events = self.world.take_master_events();
        let mut history = self.world.history();
        for (when, event) in events {
            let at = when.duration_since(self.world.start);
            *self.coverage.entry(coverage::of_event(&event)).or_default() += 1;
            match event {
                // A node's disk copy going (its eviction or damage) frees no memory.
                Event::Evicted {
                    key,
                    kept_on_disk: false,
                    bytes: 0,
                    ..
                } => history.gone(&key, at, GoneWhy::DiskDropped),
                Event::Evicted {
                    key,
                    kept_on_disk: false,
                    ..
                } => history.gone(&key, at, GoneWhy::Evicted),
                Event::ObjectLost { key, .. } | Event::ReadableCopyLost { key, .. } => {
                    history.gone(&key, at, GoneWhy::Lost)
                }
                Event::WriteDiscarded {
                    key,
                    object_removed: true,
                    ..
                } => history.gone(&key, at, GoneWhy::Discarded),
                _ => {}
            }
        }
    }

    fn check_invariants(&self) {
        let granting = self.world.granting();
        if granting.len() > 1 {
            self.world.history().violation(format!(
                "masters {granting:?} grant at once at {:?}",
                self.world.now()
            ));
        }
        if let Some(master) = self.world.master()
            && let Err(violation) = master.with_master(|m, _| invariants::check(m))
        {
            self.world.history().violation(format!(
                "master invariant broken at {:?}: {violation}",
                self.world.now()
            ));
        }
        if let Some(master) = self.world.master()
            && let Some(violation) = master.audit_failure()
        {
            self.world
                .history()
                .violation(format!("master evicted out of order: {violation}"));
        }
    }

    /// Checks every complete memory replica the master lists against the value's checksum,
    /// reading the bytes straight out of the node's memory: damage that no read happened to
    /// meet (a late write landing on reused blocks, blocks freed under a live object, a read
    /// that fell back past a damaged replica) is caught where it lies. Keys whose memory was
    /// rotted on purpose are skipped.
    fn scrub(&self) {
        let Some(master) = self.world.master() else {
            return;
        };
        let nodes: Vec<(SegmentId, mooring::Node)> = (0..self.world.plan.shape.nodes)
            .filter_map(|i| {
                let node = self.world.node(i)?;
                Some((node.segment()?, node))
            })
            .collect();
        for key in &self.world.keys {
            if self.world.history().was_rotted(key) {
                continue;
            }
            let Some((replicas, checksum)) =
                master.with_master(|m, _| m.audit_memory_replicas(key))
            else {
                continue;
            };
            for replica in replicas {
                let Some((_, node)) = nodes.iter().find(|(s, _)| *s == replica.segment) else {
                    continue;
                };
                let mut bytes = vec![0u8; replica.len as usize];
                let found = node.memory().copy_out(replica.addr, &mut bytes);
                if !found || Checksum::of(&bytes) != checksum {
                    self.world.history().violation(format!(
                        "scrub at {:?}: {key:?}'s complete replica on {} at {:#x} ({} bytes) {}",
                        self.world.now(),
                        replica.segment,
                        replica.addr,
                        replica.len,
                        if found {
                            "fails the value's checksum"
                        } else {
                            "lies outside the node's memory"
                        }
                    ));
                }
            }
        }
    }

    /// Heals everything now, including faults whose time is not up.
    fn heal_all(&mut self) {
        let now = self.world.now();
        mooring::buggify::calm();
        self.world.healed.store(true, Ordering::Relaxed);
        // The HCA stops failing too.
        self.world
            .fabric
            .set_rates(mooring_transport_rdma::model::FaultRates::default(), 0);
        for (id, (_, _)) in std::mem::take(&mut self.armed) {
            self.world.orders().remove(&id);
            // An armed client that parked itself is stuck in its hold: restart it.
            self.handle.kill(id);
            self.heals.push((now, Heal::Restart(id)));
        }
        let heals = std::mem::take(&mut self.heals);
        for (_, heal) in &heals {
            self.heal(heal);
        }
        self.world.net.heal();
    }
}

async fn supervise(plan: Plan) -> Report {
    let world = World::new(plan);
    install_crash_hook(&world);
    let nodes = start_cluster(&world);
    let mut sup = Supervisor {
        world: world.clone(),
        nodes,
        handle: Handle::current(),
        heals: Vec::new(),
        armed: BTreeMap::new(),
        coverage: BTreeMap::new(),
        rotted: Vec::new(),
    };

    // Safety phase: the workload under faults, invariants checked every tick.
    let mut faults = world.plan.faults.clone().into_iter().peekable();
    let mut ticks = 0u64;
    loop {
        tokio::time::sleep(TICK).await;
        let now = world.now();
        while let Some((at, fault)) = faults.next_if(|(at, _)| *at <= now) {
            tracing::info!(?at, %fault, "applying fault");
            sup.apply(now, &fault);
        }
        sup.serve_crash_orders(now);
        sup.heal_due(now);
        sup.record_gone();
        sup.watch_rotted();
        sup.check_invariants();
        ticks += 1;
        if ticks.is_multiple_of(SCRUB_EVERY) {
            sup.scrub();
        }
        if world.all_finished() || world.history().failed() {
            break;
        }
        if now > WORKLOAD_LIMIT {
            world.history().violation(format!(
                "the workload had not finished after {WORKLOAD_LIMIT:?} of simulated time"
            ));
            break;
        }
    }
    let workload_stats = world.master().map(|m| m.stats());
    if let Some(s) = &workload_stats {
        for (path, n) in coverage::of_upserts(&s.upserts) {
            if n > 0 {
                *sup.coverage.entry(path).or_default() += n;
            }
        }
    }

    // Liveness phase: heal everything; every client finishes; nothing stays in flight.
    sup.heal_all();
    if !world.history().failed() {
        liveness(&world, &mut sup).await;
    }
    sup.record_gone();

    let mut history = world.history();
    history.settle();
    let violations = history.judge();
    let fingerprint = history.fingerprint() ^ world.now().as_nanos() as u64;
    let report = Report {
        violations,
        tally: history.tally.clone(),
        sim_time: world.now(),
        stats: workload_stats,
        net: world.net.stats(),
        rdma: world.fabric.counts(),
        buggified: mooring::buggify::active_sites()
            .into_iter()
            .map(Site::name)
            .collect(),
        sizes: history.sizes(),
        fingerprint,
        coverage: coverage::of_run(sup.coverage, &history),
        plan: world.plan.clone(),
    };
    drop(history);
    // Stop every member (their tasks keep the world and their segments otherwise).
    let mut members: Vec<NodeId> = sup
        .nodes
        .members()
        .into_iter()
        .map(|m| sup.nodes.id(m))
        .collect();
    if let Some((second, etcd)) = &sup.nodes.group {
        members.extend([second.id(), etcd.id()]);
    }
    for id in members {
        sup.handle.kill(id);
    }
    world.release();
    report
}

async fn liveness(world: &Arc<World>, sup: &mut Supervisor) {
    let healed = world.now();
    while !world.all_finished() {
        tokio::time::sleep(TICK).await;
        sup.check_invariants();
        if world.now() > healed + OPERATION_BOUND * 2 {
            world.history().violation(format!(
                "clients still busy {:?} after every fault healed",
                OPERATION_BOUND * 2
            ));
            return;
        }
    }
    // Let every timeout run out: discarded writes released, dead clients expired, every
    // node remounted.
    let m = &world.plan.master;
    let quiet = Duration::from_millis(
        (m.put_start_discard_timeout
            + m.put_start_release_timeout
            + m.client_ttl
            + m.lease_ttl
            + m.lease_grace)
            .as_millis(),
    ) + Duration::from_secs(2)
        + world.disk_settle();
    tokio::time::sleep(quiet).await;
    sup.check_invariants();
    let Some(master) = world.master() else {
        world
            .history()
            .violation("no master at the end of the run".into());
        return;
    };
    // Repair copies go on after the workload (retried, with backoff, while a source stays
    // unreadable), and one that fails leaves its destination blocks waiting out the release
    // timeout (seed 142 on RDMA). Give such blocks one more discard and release timeout;
    // what is still pending after that never ends.
    let late = Duration::from_millis(
        (m.put_start_discard_timeout + m.put_start_release_timeout).as_millis(),
    );
    let give_up = world.now() + late;
    while world.now() < give_up {
        let stats = master.stats();
        if stats.writing == 0 && stats.discarded_blocks == 0 {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let stats = master.stats();
    let shape = &world.plan.shape;
    let mut problems = Vec::new();
    if stats.writing != 0 {
        problems.push(format!(
            "{} key(s) still being written {quiet:?} after the faults healed (past the discard timeout)",
            stats.writing
        ));
    }
    if stats.discarded_blocks != 0 {
        problems.push(format!(
            "{} discarded block(s) never released",
            stats.discarded_blocks
        ));
    }
    // Repair copies are background work by live nodes, retried (with backoff) while a source
    // stays unreadable: one may be under way at any moment.
    let tasks = stats.tasks - stats.repairs_running;
    if stats.holds != 0 || tasks != 0 {
        problems.push(format!(
            "{} held read(s) and {} copy task(s) outlived their clients",
            stats.holds, tasks
        ));
    }
    if stats.segments != shape.nodes as u64 {
        problems.push(format!(
            "{} segment(s) mounted after healing, expected the {} storage nodes",
            stats.segments, shape.nodes
        ));
    }
    for p in problems {
        world.history().violation(p);
    }
    if world.history().failed() {
        return;
    }
    final_sweep(world, &master).await;
}

/// A fresh client reads every key (each read judged), then removes everything: the
/// allocators must then account for every byte.
async fn final_sweep(world: &Arc<World>, master: &Arc<mooring::MasterService>) {
    let w = world.clone();
    let m = master.clone();
    let checker = Handle::current()
        .create_node()
        .name("checker")
        .ip(checker_ip())
        .build();
    let outcome = checker
        .spawn(async move {
            let client = members::connect(&w, checker_ip(), None)
                .await
                .map_err(|e| format!("the checker cannot connect after healing: {e}"))?;
            let rotted = w
                .plan
                .faults
                .iter()
                .any(|(_, f)| matches!(f, Fault::RotDisk { .. } | Fault::RotEveryCopy { .. }));
            for key in &w.keys {
                let invoked = w.now();
                let mut got = client.get(key).await;
                if rotted && got.as_ref().is_err_and(|e| e.code == ErrorCode::FILE_READ_FAIL) {
                    // A copy damaged by bit rot is refused, never served; its node drops it
                    // and tells the master at its next disk sync.
                    tokio::time::sleep(w.disk_settle()).await;
                    got = client.get(key).await;
                }
                match got {
                    Ok(bytes) => {
                        let now = w.now();
                        w.history()
                            .read_value("final get", key, invoked, now, &bytes)
                    }
                    // Not found is fine only if the master agrees: a replica it lists (a
                    // disk copy, say) must serve the value.
                    Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => {
                        if client.exist(key).await.unwrap_or(false) {
                            return Err(format!(
                                "after healing, the master lists {key:?} but reading it finds nothing: {e}"
                            ));
                        }
                    }
                    // Every copy damaged in memory: refused by its checksum, never served.
                    Err(e)
                        if e.code == ErrorCode::INVALID_REPLICA && w.history().was_rotted(key) => {}
                    Err(e) => {
                        return Err(format!("after healing, reading {key:?} still fails: {e}"));
                    }
                }
            }
            tokio::time::sleep(w.lease() * 2).await;
            let mut removed = 0;
            // Two holds outlive the workload legitimately: an offload on its way to a disk
            // keeps its object until the node reports it, and a background repair's read
            // leases its object (one whose every copy is damaged is retried, seconds apart,
            // for as long as it exists). Remove again until both have run out. A repair
            // copy under way when its object is removed leaves its target blocks waiting out
            // the release timeout (RDMA seeds 690 and 758): wait that out too.
            let release = Duration::from_millis(w.plan.master.put_start_release_timeout.as_millis());
            let settled = w.now()
                + w.disk_settle().max(w.lease())
                + release
                + Duration::from_millis(100);
            loop {
                removed += client
                    .remove_all()
                    .await
                    .map_err(|e| format!("remove_all after healing failed: {e}"))?;
                let left = m.stats();
                if (left.objects == 0 && left.used == 0) || w.now() > settled {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(removed)
        })
        .await;
    match outcome {
        Ok(Ok(_)) => {}
        Ok(Err(problem)) => world.history().violation(problem),
        Err(e) => world
            .history()
            .violation(format!("the checker panicked: {e}")),
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stats = master.stats();
    if stats.objects != 0 || stats.used != 0 {
        world.history().violation(format!(
            "after removing everything, {} object(s) and {} byte(s) are still allocated \
             ({} discarded block(s) waiting for release, {} write(s) in progress)",
            stats.objects, stats.used, stats.discarded_blocks, stats.writing
        ));
    }
}
