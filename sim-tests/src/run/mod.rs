//! One simulation run: build the cluster, run the workload under the fault plan while
//! checking the master's invariants, then heal everything and check liveness and accounting.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `cluster` | starting the cluster's madsim nodes, and the buggify hooks |
//! | `faults` | applying each fault of the plan, and healing it |
//! | `rot` | bit rot in memory and on disk, and when it destroys a value |
//! | `disk_crash` | node kills caught partway through a disk write |
//! | `checks` | the checks each tick: objects gone, invariants, the scrub |
//! | `liveness` | the checks once everything has healed, and the final sweep |
//! | `report` | what a run found ([`Report`]) |

mod checks;
mod cluster;
mod disk_crash;
mod faults;
mod liveness;
mod report;
mod rot;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use madsim::runtime::{Handle, NodeHandle, Runtime};
use madsim::task::NodeId;
use mooring::buggify::Site;

use crate::coverage;
use crate::plan::{Member, Plan};
use crate::world::World;
use faults::Heal;
use rot::DamagedRecord;

pub use report::Report;

/// How often the supervisor applies faults and checks the master's invariants.
const TICK: Duration = Duration::from_millis(20);
/// Every this many ticks the supervisor scrubs every memory replica (see
/// [`Supervisor::scrub`]) and checks what the master must still hold
/// ([`Supervisor::check_standing`]).
const SCRUB_EVERY: u64 = 5;
/// A crash-mid-write order that finds no write within this long crashes the client anyway.
const CRASH_ORDER_PATIENCE: Duration = Duration::from_secs(2);
/// Longest the workload may run (simulated) before the run counts as stuck.
const WORKLOAD_LIMIT: Duration = Duration::from_secs(900);

/// Runs `plan` to completion. Call it on a thread of its own (the simulator seeds per-thread
/// state from the seed: the standard library's hash keys, buggify's choices).
pub fn run(plan: Plan) -> Report {
    mooring::buggify::reset(plan.buggify);
    let mut runtime = Runtime::with_seed_and_config(plan.seed, madsim::Config::default());
    // A backstop: the run's own limits trip long before this.
    runtime.set_time_limit(Duration::from_secs(3600));
    // Every master keeps its state on a simulated disk of the run's world, so nothing is
    // left behind for a replay of the seed to find.
    let report = runtime.block_on(supervise(plan));
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
    /// Node kills waiting for their disks to reach a crash point.
    disk_kills: Vec<disk_crash::DiskKill>,
}

async fn supervise(plan: Plan) -> Report {
    let world = World::new(plan);
    cluster::install_crash_hook(&world);
    cluster::install_request_deadlines(&world);
    let nodes = cluster::start_cluster(&world);
    let mut sup = Supervisor {
        world: world.clone(),
        nodes,
        handle: Handle::current(),
        heals: Vec::new(),
        armed: BTreeMap::new(),
        coverage: BTreeMap::new(),
        rotted: Vec::new(),
        disk_kills: Vec::new(),
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
        sup.serve_task_orders();
        sup.serve_pause_orders(now);
        sup.serve_disk_kills(now);
        sup.heal_due(now);
        sup.record_gone();
        sup.judge_takeovers();
        sup.watch_rotted();
        sup.check_invariants();
        ticks += 1;
        if ticks.is_multiple_of(SCRUB_EVERY) {
            sup.scrub();
            sup.check_standing();
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
    if let Some(master) = world.master() {
        let reuse = master.audit_reuse_counts();
        for (path, n) in [
            (
                coverage::REUSED_AFTER_WRITER_DELAY,
                reuse.after_writer_delay,
            ),
            (
                coverage::REUSED_AFTER_WRITER_DEATH,
                reuse.after_writer_death,
            ),
            (coverage::REUSED_AFTER_READERS, reuse.after_readers),
        ] {
            if n > 0 {
                *sup.coverage.entry(path).or_default() += n;
            }
        }
    }
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
        liveness::liveness(&world, &mut sup).await;
    }
    sup.record_gone();
    sup.check_standing();
    sup.judge_takeovers();

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
