//! What a run found, and how it prints: the plan, the counts, and each violation with the
//! command that replays the seed.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use mooring_core::Stats;
use mooring_transport_sim::NetStats;

use crate::history::Tally;
use crate::plan::{Plan, Transport};

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
