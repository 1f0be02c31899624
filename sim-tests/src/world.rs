//! What the supervisor and every simulated member of one run share.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use madsim::task::NodeId;
use mooring::MasterService;
use mooring::node::Node;
use mooring_transport_sim::SimNet;
use mooring_transport_sim::disk::{DiskFaults, SimDisk};
use mooring_transport_sim::state_dir::SimStateDir;
use tokio::time::Instant;

use crate::history::History;
use crate::leaders::Terms;
use crate::plan::{Member, Plan};
use crate::takeover::Takeover;

/// Port of the master's RPC service.
pub const MASTER_PORT: u16 = 5000;
/// Port of every data server.
pub const DATA_PORT: u16 = 6000;

/// The simulated address of `member`.
pub fn ip(member: Member) -> IpAddr {
    IpAddr::V4(match member {
        Member::Master => Ipv4Addr::new(10, 0, 0, 1),
        Member::Node(i) => Ipv4Addr::new(10, 0, 1, i as u8 + 1),
        Member::Client(j) => Ipv4Addr::new(10, 0, 2, j as u8 + 1),
    })
}

/// The address of the final checker (a client that joins after the faults heal).
pub fn checker_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 3, 1))
}

/// The master's RPC address (in a group: the first master's).
pub fn master_addr() -> SocketAddr {
    SocketAddr::new(ip(Member::Master), MASTER_PORT)
}

/// The address of master `k` of a group (the first is [`master_addr`]'s).
pub fn group_master_addr(k: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1 + k as u8)),
        MASTER_PORT,
    )
}

/// The simulated etcd's address.
pub fn etcd_addr() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)), 2379)
}

/// A group's masters (their current incarnations' role handlers), and which one leads.
type Group = (
    BTreeMap<usize, Arc<mooring::ha::RoleHandler>>,
    Option<usize>,
);

/// A request to crash a client between the start and the end of its next write.
#[derive(Clone, Copy, Debug, Default)]
pub struct CrashOrder {
    /// The client reached the point; the supervisor should kill it now.
    pub triggered: bool,
}

/// A request to take a move's target away at the last moment: when the client that carries
/// the move out has written the target and is about to end the task, the supervisor remounts
/// the target's node (its segment, and the target with it, goes away).
#[derive(Clone, Copy, Debug)]
pub struct TaskOrder {
    /// The storage node the target is on.
    pub node: usize,
    /// The client reached the point; the supervisor should remount the node now.
    pub triggered: bool,
}

/// State shared by one run's supervisor and members.
pub struct World {
    /// The plan.
    pub plan: Plan,
    /// The keys the workload uses.
    pub keys: Vec<String>,
    /// When the run started.
    pub start: Instant,
    /// Everything that happened.
    history: Mutex<History>,
    /// The running master, if it is up.
    master: Mutex<Option<Arc<MasterService>>>,
    /// What a master that was replaced (a deposed leader) reported and the supervisor had
    /// not yet taken: readers it served may have met it.
    replaced_events: Mutex<Vec<(tokio::time::Instant, mooring_core::Event)>>,
    /// The simulated network's switchboard (transport-sim runs).
    pub net: Arc<SimNet>,
    /// The software HCA fabric every member's RDMA device is on (RDMA runs).
    pub fabric: mooring_transport_rdma::model::Fabric,
    /// The nodes' shared-memory servers, reached by same-host clients (shm runs).
    pub sockets: Arc<mooring_transport_sim::shm::SimSockets>,
    /// Operations each client has left to do.
    pub budgets: Vec<AtomicUsize>,
    /// Whether each client has finished its budget.
    pub finished: Vec<AtomicBool>,
    /// Crash-mid-write orders, by the node that should crash.
    pub crash_orders: Mutex<BTreeMap<NodeId, CrashOrder>>,
    /// Members that paused themselves at a hold point, and for how long: the supervisor
    /// resumes them (a paused member cannot).
    pause_orders: Mutex<Vec<(NodeId, Duration)>>,
    /// Orders to take a move's target away before its end, by the client carrying it out.
    pub task_orders: Mutex<BTreeMap<NodeId, TaskOrder>>,
    /// Incarnations of each client, for fresh seeds after restarts.
    pub incarnations: Vec<AtomicUsize>,
    /// Each storage node's disk (if the plan gives them disks); it outlives the node's
    /// incarnations.
    pub disks: Vec<Arc<SimDisk>>,
    /// Each storage node's current incarnation, once it is up (for memory faults).
    nodes: Mutex<BTreeMap<usize, Node>>,
    /// Which storage node each simulated machine is (hold points find their node by it).
    storage_ids: Mutex<BTreeMap<NodeId, usize>>,
    /// Writes the plan may still hold up partway (see [`Plan::held_writes`]).
    held_writes_left: AtomicU32,
    /// Keys a get is reading right now (once per read): removes and upserts aim at them,
    /// so that leases and holds are what protect their bytes.
    pub reading: Mutex<Vec<String>>,
    /// Keys whose every copy a fault just damaged, and when: gets aim at them for a while,
    /// so readers meet the copies a node drops before the master hears of it.
    pub damaged_everywhere: Mutex<Vec<(String, Duration)>>,
    /// Set once every fault has healed: the simulation stops stalling members on purpose.
    pub healed: AtomicBool,
    /// A group's masters (their current incarnations), and which one leads.
    group: Mutex<Group>,
    /// A group's leadership terms: when each master began leading and last answered as one.
    terms: Mutex<Terms>,
    /// What masters held as they took over, not yet judged.
    takeovers: Mutex<Vec<Takeover>>,
    /// The lone master's state directory (runs that kill it or fill it): it outlives the
    /// master's incarnations.
    pub master_disk: Arc<SimDisk>,
    /// A group's masters' state directories (their own journal when leading, the leader's
    /// copy otherwise), by master: they outlive the masters' incarnations.
    group_disks: Vec<Arc<SimDisk>>,
    /// A bit flipped in a synced journal record while the master was down: (file, byte,
    /// bit). Its next start must refuse.
    armed_flip: Mutex<Option<(String, u64, u8)>>,
    /// The master disk's faults now (full, failing syncs, or neither).
    master_disk_now: Mutex<DiskFaults>,
}

impl World {
    /// The world of a run of `plan`.
    pub fn new(plan: Plan) -> Arc<World> {
        let shape = &plan.shape;
        let per_client = shape.ops / shape.clients.max(1);
        let keys = (0..shape.keys).map(|k| format!("k{k:03}")).collect();
        let disks = match &plan.disk {
            Some(d) => (0..shape.nodes)
                .map(|i| {
                    let disk =
                        SimDisk::with_alignment(plan.seed ^ (i as u64 + 1) << 32, d.alignment);
                    disk.set_faults(World::disk_faults(&plan, 0.0));
                    Arc::new(disk)
                })
                .collect(),
            None => Vec::new(),
        };
        Arc::new(World {
            keys,
            start: Instant::now(),
            history: Mutex::default(),
            master: Mutex::default(),
            replaced_events: Mutex::default(),
            net: Arc::new(SimNet::new()),
            fabric: {
                let fabric = mooring_transport_rdma::model::Fabric::new();
                fabric.set_rates(plan.rdma_faults, plan.seed);
                fabric
            },
            sockets: Arc::default(),
            budgets: (0..shape.clients)
                .map(|_| AtomicUsize::new(per_client))
                .collect(),
            finished: (0..shape.clients).map(|_| AtomicBool::new(false)).collect(),
            crash_orders: Mutex::default(),
            pause_orders: Mutex::default(),
            task_orders: Mutex::default(),
            incarnations: (0..shape.clients).map(|_| AtomicUsize::new(0)).collect(),
            disks,
            nodes: Mutex::default(),
            reading: Mutex::default(),
            damaged_everywhere: Mutex::default(),
            healed: AtomicBool::new(false),
            storage_ids: Mutex::default(),
            held_writes_left: AtomicU32::new(plan.held_writes),
            group: Mutex::default(),
            terms: Mutex::default(),
            takeovers: Mutex::default(),
            master_disk: {
                let disk = SimDisk::new(plan.seed ^ 0x5A7E_D15C);
                disk.set_faults(World::master_disk_faults());
                Arc::new(disk)
            },
            group_disks: (0..2u64)
                .map(|k| Arc::new(SimDisk::new(plan.seed ^ 0x6A0B_D15C ^ k)))
                .collect(),
            armed_flip: Mutex::default(),
            master_disk_now: Mutex::new(World::master_disk_faults()),
            plan,
        })
    }

    /// Storage node `i` is up as `node`.
    pub fn set_node(&self, i: usize, node: Node) {
        self.nodes.lock().expect("nodes lock").insert(i, node);
        self.storage_ids
            .lock()
            .expect("storage ids lock")
            .insert(madsim::plugin::node(), i);
    }

    /// Which storage node the calling task runs on, if it runs on one.
    pub fn storage_here(&self) -> Option<usize> {
        let here = madsim::plugin::node();
        self.storage_ids
            .lock()
            .expect("storage ids lock")
            .get(&here)
            .copied()
    }

    /// Freezes the calling member's whole process (as a stopped VM or a SIGSTOP would)
    /// from its next await, for `lasts`: every task of it stops, none is cancelled.
    pub fn pause_here(&self, lasts: Duration) {
        let here = madsim::plugin::node();
        madsim::runtime::Handle::current().pause(here);
        self.pause_orders
            .lock()
            .expect("pause orders lock")
            .push((here, lasts));
    }

    /// The pauses members asked for since the last call.
    pub fn take_pause_orders(&self) -> Vec<(NodeId, Duration)> {
        std::mem::take(&mut *self.pause_orders.lock().expect("pause orders lock"))
    }

    /// Whether the plan has held writes left.
    pub fn held_writes_remain(&self) -> bool {
        self.held_writes_left.load(Ordering::Relaxed) > 0
    }

    /// Takes one of the plan's held writes, if any are left.
    pub fn take_held_write(&self) -> bool {
        self.held_writes_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Storage node `i`'s latest incarnation, if it ever came up.
    pub fn node(&self, i: usize) -> Option<Node> {
        self.nodes.lock().expect("nodes lock").get(&i).cloned()
    }

    /// How long the nodes' disk tiers may take to report everything they did (two disk
    /// syncs); zero without disks.
    pub fn disk_settle(&self) -> Duration {
        self.plan
            .disk
            .as_ref()
            .map_or(Duration::ZERO, |d| d.sync_interval * 2)
    }

    /// Group master `k`'s state directory's disk.
    pub fn group_disk(&self, k: usize) -> Arc<SimDisk> {
        self.group_disks[k].clone()
    }

    /// Lets go of the run's large state (node segments, the master, disk images) once the
    /// run is judged: madsim keeps the tasks of nodes it killed, and they keep the world.
    pub fn release(&self) {
        self.nodes.lock().expect("nodes lock").clear();
        *self.master.lock().expect("master lock") = None;
        for disk in &self.disks {
            disk.clear();
        }
        self.master_disk.clear();
        for disk in &self.group_disks {
            disk.clear();
        }
    }

    /// Simulated time since the run started.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The history (all members run on the simulator's one thread; the lock is never
    /// contended).
    pub fn history(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The running master.
    pub fn master(&self) -> Option<Arc<MasterService>> {
        self.master
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the running master, keeping what the one it replaces reported and was not
    /// yet taken.
    pub fn set_master(&self, service: Arc<MasterService>) {
        let old = self
            .master
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(service.clone());
        if let Some(old) = old.filter(|old| !Arc::ptr_eq(old, &service)) {
            self.replaced_events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(old.take_events());
        }
    }

    /// What the masters running now and before reported since the last call, in order.
    pub fn take_master_events(&self) -> Vec<(tokio::time::Instant, mooring_core::Event)> {
        let mut events = std::mem::take(
            &mut *self
                .replaced_events
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        if let Some(master) = self.master() {
            events.extend(master.take_events());
        }
        events
    }

    /// Where members reach the master over datagrams: every group master's address, or the
    /// one master's.
    pub fn master_addrs(&self) -> Vec<SocketAddr> {
        if self.plan.master_group {
            vec![group_master_addr(0), group_master_addr(1)]
        } else {
            vec![master_addr()]
        }
    }

    /// Where members reach the master: every group master's address, or the one master's.
    pub fn master_target(&self) -> String {
        if self.plan.master_group {
            format!("{},{}", group_master_addr(0), group_master_addr(1))
        } else {
            master_addr().to_string()
        }
    }

    /// Group master `k`'s current incarnation serves through `handler`.
    pub fn set_group_handler(&self, k: usize, handler: Arc<mooring::ha::RoleHandler>) {
        self.lock_group().0.insert(k, handler);
    }

    /// Group master `k` leads, with `service` (recovered, about to serve): its term begins,
    /// and what it holds is kept to be judged against what was acknowledged before.
    pub fn set_leader(&self, k: usize, service: Arc<MasterService>) {
        let now = self.now();
        let mut terms = self.terms.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(overlap) = terms.began(k, now) {
            self.history().violation(overlap);
        }
        if let Some(after) = terms.previous().map(|t| t.master) {
            let takeover = service.with_master(|m, _| Takeover::of(k, after, now, &self.keys, m));
            self.takeovers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(takeover);
        }
        drop(terms);
        self.lock_group().1 = Some(k);
        self.set_master(service);
    }

    /// Group master `k` answers a request as leader now.
    pub fn answered_as_leader(&self, k: usize) {
        let now = self.now();
        let overlap = self
            .terms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .answered(k, now);
        if let Some(overlap) = overlap {
            self.history().violation(overlap);
        }
    }

    /// The takeovers not yet judged.
    pub fn take_takeovers(&self) -> Vec<Takeover> {
        std::mem::take(&mut *self.takeovers.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The group master that last started leading.
    pub fn leader(&self) -> Option<usize> {
        self.lock_group().1
    }

    /// The group masters that grant right now (never more than one).
    pub fn granting(&self) -> Vec<usize> {
        self.lock_group()
            .0
            .iter()
            .filter(|(_, handler)| handler.grants())
            .map(|(&k, _)| k)
            .collect()
    }

    fn lock_group(&self) -> MutexGuard<'_, Group> {
        self.group.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one operation from client `j`'s budget; false when it is spent.
    pub fn take_op(&self, j: usize) -> bool {
        self.budgets[j]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Whether every client has finished.
    pub fn all_finished(&self) -> bool {
        self.finished.iter().all(|f| f.load(Ordering::Relaxed))
    }

    /// The crash orders, locked.
    pub fn orders(&self) -> MutexGuard<'_, BTreeMap<NodeId, CrashOrder>> {
        self.crash_orders.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The orders to take a move's target away (see [`TaskOrder`]).
    pub fn task_orders(&self) -> MutexGuard<'_, BTreeMap<NodeId, TaskOrder>> {
        self.task_orders.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The simulated disks' faults: the plan's crash behaviour, and EIO at `error_rate`.
    pub fn disk_faults(plan: &Plan, error_rate: f64) -> DiskFaults {
        let d = plan.disk.as_ref();
        DiskFaults {
            latency: Duration::from_micros(20)..Duration::from_micros(400),
            read_error: error_rate,
            write_error: error_rate,
            sync_error: error_rate,
            torn_on_crash: d.map_or(0.0, |d| d.torn_on_crash),
            lost_on_crash: d.map_or(0.0, |d| d.lost_on_crash),
            capacity: None,
        }
    }

    /// The master disk's faults when it is not full: a power loss tears or loses unsynced
    /// writes (the journal's tail), as on the nodes' disks.
    pub fn master_disk_faults() -> DiskFaults {
        DiskFaults {
            torn_on_crash: 0.5,
            lost_on_crash: 0.3,
            ..DiskFaults::default()
        }
    }

    /// Fills the master's state directory (`full`: no file may grow), or frees it.
    pub fn master_disk_full(&self, full: bool) {
        let used = self.master_disk.files().iter().map(|(_, len)| len).sum();
        self.master_disk_state(|faults| faults.capacity = full.then_some(used));
    }

    /// Makes every sync of the master's state directory fail (`fail`), or none.
    pub fn master_syncs_fail(&self, fail: bool) {
        self.master_disk_state(|faults| faults.sync_error = if fail { 1.0 } else { 0.0 });
    }

    fn master_disk_state(&self, change: impl FnOnce(&mut DiskFaults)) {
        let mut faults = self.master_disk_now.lock().expect("master disk lock");
        change(&mut faults);
        self.master_disk.set_faults(faults.clone());
    }

    /// The newest journal on the master's disk: its name, generation and bytes.
    fn newest_journal(&self) -> Option<(String, u64, Vec<u8>)> {
        let (name, generation) = self
            .master_disk
            .files()
            .into_iter()
            .filter_map(|(name, _)| {
                let g = name.strip_prefix("journal-")?.strip_suffix(".log")?;
                let g = g.parse::<u64>().ok()?;
                Some((name, g))
            })
            .max_by_key(|(_, g)| *g)?;
        let bytes = self.master_disk.contents(&name)?;
        Some((name, generation, bytes))
    }

    /// A power loss at the master while it wrote a batch of records: a piece of a record is
    /// written after the last one, unsynced, and the disk crashes (tearing or losing it and
    /// any other unsynced bytes).
    pub fn master_power_loss(&self, pick: u64) {
        if let Some((name, generation, bytes)) = self.newest_journal() {
            let end = mooring_proto::journal::decode(generation, &bytes).intact;
            let first = mooring_proto::journal::FILE_HEADER;
            if end > first + 1 {
                // A strict prefix of the first record: cut short, so never replayed.
                let cut = first + 1 + (pick as usize) % (end - first - 1).min(64);
                let piece = bytes[first..cut].to_vec();
                let dir = SimStateDir::new(self.master_disk.clone());
                use mooring_proto::state_dir::{OpenMode, StateDir};
                if let Ok(file) = dir.open(&name, OpenMode::Write) {
                    let _ = file.write_at(&piece, end as u64);
                }
            }
        }
        self.master_disk.crash();
    }

    /// Flips a bit, chosen by `pick`, in a synced record of the master's newest journal (the
    /// master is down): its next start must refuse. What is synced is the disk's to say
    /// (its durable image), not the journal code's.
    pub fn flip_synced_journal_bit(&self, pick: u64) {
        let Some((name, generation, bytes)) = self.newest_journal() else {
            return;
        };
        let first = mooring_proto::journal::FILE_HEADER as u64;
        // The whole records within what reads as it would after a crash (a prefix of the
        // durable image: what follows it, the sync mark written after the last sync, is not
        // yet synced).
        let synced = self.master_disk.synced_prefix(&name).unwrap_or(0) as usize;
        let end = mooring_proto::journal::decode(generation, &bytes[..synced.min(bytes.len())])
            .intact as u64;
        if end <= first {
            return;
        }
        let at = first + pick % (end - first);
        let bit = (pick >> 56) as u8 % 8;
        if self.master_disk.flip_bit(&name, at, bit).is_ok() {
            *self.armed_flip.lock().expect("flip lock") = Some((name, at, bit));
        }
    }

    /// The lone master's service on its state directory, recovered. A start after a flipped
    /// bit must refuse: then the byte is restored (as an operator restores the file) and it
    /// starts; a start that does not refuse has dropped acknowledged changes silently. A
    /// start can fail because its disk will not take a write (a new generation begins with a
    /// snapshot): that error is returned, for the caller to try again as a supervisor would.
    pub fn start_persistent_master(
        &self,
        config: mooring_core::MasterConfig,
    ) -> mooring_core::Result<Arc<MasterService>> {
        let dir: Arc<dyn mooring_proto::state_dir::StateDir> =
            Arc::new(SimStateDir::new(self.master_disk.clone()));
        let armed = self.armed_flip.lock().expect("flip lock").take();
        match MasterService::persistent_in(dir.clone(), config.clone(), 16 << 10) {
            Ok(service) => {
                if let Some((name, at, bit)) = armed {
                    self.history().violation(format!(
                        "the master started on {name} with bit {bit} of synced byte {at} \
                         flipped: it dropped acknowledged changes silently instead of refusing"
                    ));
                }
                Ok(service)
            }
            Err(full) if World::start_may_retry(&full) => {
                if let Some((name, at, bit)) = armed {
                    // It recovered past the damage, and only the full disk stopped it.
                    self.history().violation(format!(
                        "the master recovered {name} with bit {bit} of synced byte {at} \
                         flipped instead of refusing (then found its disk full: {full})"
                    ));
                    let _ = self.master_disk.flip_bit(&name, at, bit);
                }
                Err(full)
            }
            Err(refused) => {
                let Some((name, at, bit)) = armed else {
                    panic!("the simulated master starts: {refused}");
                };
                assert!(
                    refused.to_string().contains(&name),
                    "the refusal names the damaged file: {refused}"
                );
                self.master_disk
                    .flip_bit(&name, at, bit)
                    .expect("the journal is there");
                MasterService::persistent_in(dir, config, 16 << 10)
            }
        }
    }

    /// Whether a master's start failed only because its disk would not take a write (full,
    /// or failing for a while): a supervisor starts it again.
    pub fn start_may_retry(e: &mooring_core::Error) -> bool {
        let why = e.to_string();
        why.contains("is full") || why.contains("cannot write")
    }

    /// The master's lease as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.plan.master.lease_ttl.as_millis())
    }
}
