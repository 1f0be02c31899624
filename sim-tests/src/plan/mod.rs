//! The fault plan: everything a run will do to the cluster, expanded from the seed before the
//! run starts and printed with it, so a failure report says exactly what happened.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `fault` | each [`Fault`], and how it reads |
//! | `disk` | the nodes' disk tiers ([`DiskPlan`]) and disk faults |
//! | `draw` | drawing a [`Plan`] from its seed |

mod disk;
mod draw;
mod fault;

use std::fmt;
use std::time::Duration;

use mooring_core::MasterConfig;
use mooring_transport_rdma::model::FaultRates;

pub use disk::DiskPlan;
pub use fault::{Fault, JournalFault};

/// Which transport carries the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// transport-tcp over madsim's simulated TCP: faults stall streams.
    Tcp,
    /// transport-sim datagrams: faults drop, delay, duplicate and corrupt messages.
    Sim,
    /// Bulk bytes by one-sided RDMA over the software HCA; control, the queue-pair
    /// handshake and staging over transport-sim datagrams (as `Sim`), with the HCA's own
    /// faults too.
    Rdma,
    /// As `Sim`, with the members on two hosts: a client reads and writes the segments of
    /// nodes on its own host by memcpy through shared memory (transport-shm, segments
    /// handed over in-process), out of reach of network faults.
    Shm,
}

impl Transport {
    /// Whether control messages travel as transport-sim datagrams (whose faults apply).
    pub fn datagrams(self) -> bool {
        matches!(self, Transport::Sim | Transport::Rdma | Transport::Shm)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Sim => "sim",
            Transport::Rdma => "rdma",
            Transport::Shm => "shm",
        })
    }
}

/// A member of the simulated cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Member {
    /// The master.
    Master,
    /// Storage node `i`.
    Node(usize),
    /// Client `j`.
    Client(usize),
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Member::Master => f.write_str("master"),
            Member::Node(i) => write!(f, "node{i}"),
            Member::Client(j) => write!(f, "client{j}"),
        }
    }
}

/// The cluster a run simulates and the work it does.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// Storage nodes.
    pub nodes: usize,
    /// Clients.
    pub clients: usize,
    /// How many of the clients contribute a segment.
    pub contributing: usize,
    /// Operations the clients perform in all.
    pub ops: usize,
    /// Bytes per storage node.
    pub node_bytes: u64,
    /// Bytes per contributed client segment.
    pub client_bytes: u64,
    /// Distinct keys.
    pub keys: usize,
    /// Whether the plan has faults at all.
    pub faults: bool,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            nodes: 4,
            clients: 4,
            contributing: 2,
            ops: 2000,
            node_bytes: 768 << 10,
            client_bytes: 256 << 10,
            keys: 48,
            faults: true,
        }
    }
}

/// Everything a run does, fixed by its seed.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The seed.
    pub seed: u64,
    /// The transport.
    pub transport: Transport,
    /// Whether per-site buggify distorts the services' timings.
    pub buggify: bool,
    /// Whether some reads stall between receiving their descriptors and transferring (for up
    /// to most of their lease), to widen read/evict and read/upsert races.
    pub slow_readers: bool,
    /// Writes held up partway, at most this many a run and only until the faults heal: a
    /// same-host writer descheduled mid-copy until its blocks were released and handed out
    /// again, or a node's receipt of a write held while the node remounts its segment (so the
    /// rest arrives for a mount that no longer exists). Each write's own checks must stop it:
    /// the writer's fence, the node's deadline and export. Zero in runs without faults.
    pub held_writes: u32,
    /// Operations each client keeps in flight, as a thread pool sharing one client would.
    pub streams: usize,
    /// In some runs most values are KV-cache blocks of one size (as an engine's pages are), so
    /// a key's versions often have the same length and only their version tells them apart.
    pub block_size: Option<usize>,
    /// Whether the clients' memory is failing: a bit of some values a client prefetches
    /// flips between its checking them and writing them into memory (the master must refuse
    /// them by the checksum it knows).
    pub client_rot: bool,
    /// The master's policy (timeouts shrunk to simulation scale).
    pub master: MasterConfig,
    /// Faults in order of their start (offset from the start of the workload).
    pub faults: Vec<(Duration, Fault)>,
    /// The cluster and the work.
    pub shape: Shape,
    /// The nodes' disk tiers, if they have them.
    pub disk: Option<DiskPlan>,
    /// Whether the master keeps its state on disk (`--state-dir`): in runs that kill it.
    pub master_state: bool,
    /// Whether two masters run as a group on a simulated etcd (half the TCP runs that kill
    /// the master, 30% of the transport-sim runs): a kill takes the leader, and the
    /// standby must take over with every acknowledged change.
    pub master_group: bool,
    /// The software HCA's fault rates (RDMA runs): remote access errors, queue pairs dying
    /// mid-batch, stalled completions.
    pub rdma_faults: FaultRates,
}

impl Plan {
    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        format!(
            "MADSIM_TEST_SEED={} scripts/sim.sh replay --transport {}",
            self.seed, self.transport
        )
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.master;
        writeln!(
            f,
            "seed {} on {}: {} nodes, {} clients ({} contributing, {} operation(s) in flight each), {} ops over {} keys, buggify {}{}{}{}",
            self.seed,
            self.transport,
            self.shape.nodes,
            self.shape.clients,
            self.shape.contributing,
            self.streams,
            self.shape.ops,
            self.shape.keys,
            if self.buggify { "on" } else { "off" },
            if self.slow_readers {
                ", slow readers"
            } else {
                ""
            },
            if self.client_rot {
                ", failing client memory (prefetch buffers)"
            } else {
                ""
            },
            match self.block_size {
                Some(b) => format!(", most values {} KiB blocks", b >> 10),
                None => String::new(),
            }
        )?;
        writeln!(
            f,
            "  timeouts: lease {}ms, client ttl {}ms, discard {}ms, release {}ms",
            m.lease_ttl.as_millis(),
            m.client_ttl.as_millis(),
            m.put_start_discard_timeout.as_millis(),
            m.put_start_release_timeout.as_millis()
        )?;
        if self.held_writes > 0 {
            writeln!(
                f,
                "  up to {} writes held up partway (same-host copies past their release; node receipts across a remount)",
                self.held_writes
            )?;
        }
        if self.master_group {
            writeln!(
                f,
                "  two masters in a group on a simulated etcd: a kill takes the leader"
            )?;
        }
        match &self.disk {
            Some(d) => writeln!(
                f,
                "  disks: {:?}, {} KiB each, {:?} eviction, alignment {}, {} per group, {} KiB staging, slot TTL {:?}, synced every {:?}, crash tears {:.2} / loses {:.2} of unsynced writes{}",
                d.backend,
                d.capacity >> 10,
                d.eviction,
                d.alignment,
                d.group_keys,
                d.staging >> 10,
                d.slot_ttl,
                d.sync_interval,
                d.torn_on_crash,
                d.lost_on_crash,
                if d.write_through {
                    ", write-through"
                } else {
                    ""
                }
            )?,
            None => writeln!(f, "  no disks")?,
        }
        if self.transport == Transport::Rdma {
            let r = &self.rdma_faults;
            writeln!(
                f,
                "  RDMA HCA faults per request: remote access {:.3}, retry exceeded {:.3}, stall {:.3} for {} polls",
                r.remote_access, r.retry_exceeded, r.stall, r.stall_polls
            )?;
        }
        if self.faults.is_empty() {
            writeln!(f, "  no faults")?;
        }
        for (at, fault) in &self.faults {
            writeln!(f, "  at {:>6}ms: {fault}", at.as_millis())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_fixed_by_their_seed_and_vary_across_seeds() {
        let a = Plan::generate(7, None, Shape::default()).to_string();
        let b = Plan::generate(7, None, Shape::default()).to_string();
        let c = Plan::generate(8, None, Shape::default()).to_string();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.contains("seed 7 on sim"));
        assert!(c.contains("seed 8 on tcp"));
    }
}

#[cfg(test)]
mod group_share {
    use super::*;

    #[test]
    fn a_fifth_of_the_default_seeds_run_a_group_whose_leader_is_killed() {
        // The CI's 200 seeds: even ones over TCP, odd ones over transport-sim.
        let groups = |transport| {
            (0..200)
                .filter(|&seed| {
                    let plan = Plan::generate(seed, transport, Shape::default());
                    plan.master_group
                        && plan
                            .faults
                            .iter()
                            .any(|(_, f)| matches!(f, Fault::KillMaster { .. }))
                })
                .count()
        };
        let default = groups(None);
        assert!(default >= 40, "{default} of 200");
        let sim = groups(Some(Transport::Sim));
        assert!(sim >= 50, "{sim} of 200 transport-sim seeds");
    }
}
