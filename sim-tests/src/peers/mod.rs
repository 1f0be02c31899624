//! Peer mode's simulation world: a cluster of `mooring peer`s (the unchanged [`PeerNode`]
//! over madsim's simulated TCP) with no master, clients writing, reading and removing
//! through them (the same [`PeerGuest`] the CLI uses), and a fault plan of kills, goodbyes,
//! joins, restarts, partitions and failing disks drawn from the seed. Each peer's pool is
//! small and its disk tier a simulated disk, so values leave memory and are promoted back. Every read is judged by [`history`]; at the
//! end, after everything healed, every key is read through every live peer.
//!
//! [`PeerNode`]: mooring::peer::PeerNode
//! [`PeerGuest`]: mooring::peer::PeerGuest

pub mod history;
#[cfg(madsim)]
mod world;

#[cfg(madsim)]
pub use world::run;

/// A peer world's shape, drawn from its seed.
#[derive(Clone, Debug)]
pub struct PeerPlan {
    /// The seed.
    pub seed: u64,
    /// Peers at the start.
    pub peers: usize,
    /// Client processes.
    pub clients: usize,
    /// Operations per client.
    pub ops: usize,
    /// Distinct keys.
    pub keys: u32,
    /// Faults, in time order: when (ms after the start) and what.
    pub faults: Vec<(u64, PeerFault)>,
}

/// A fault of a peer world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerFault {
    /// SIGKILL of a peer (its values are lost).
    Kill,
    /// A peer says goodbye and stops (its values are lost; the others drop it at once).
    Leave,
    /// A new peer joins.
    Join,
    /// A peer is killed and starts again at its address with an empty pool.
    Restart,
    /// The link between two peers drops everything for this many ms.
    Partition(u64),
    /// A peer's disk fails a third of its reads and writes for this many ms (values whose
    /// copy was not written or cannot be read back are lost).
    DiskErrors(u64),
}

impl PeerPlan {
    /// The plan of `seed`, with `peers` peers (default: 3 to 6) and `ops` operations per
    /// client; `faults` false for the happy path.
    pub fn generate(seed: u64, peers: Option<usize>, ops: usize, faults: bool) -> PeerPlan {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x005e_ed0f_9ee2;
        let mut draw = move |below: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % below.max(1)
        };
        let peers = peers.unwrap_or(3 + draw(4) as usize);
        let mut plan = PeerPlan {
            seed,
            peers,
            clients: 3,
            ops,
            keys: 48 + draw(48) as u32,
            faults: Vec::new(),
        };
        if faults {
            // Faults between 4 s and 24 s: the workload runs about 30 s (simulated), so
            // quiet stretches for strict reads remain between and after them.
            let count = 1 + draw(4);
            let mut at = 4_000;
            for _ in 0..count {
                at += 1_000 + draw(6_000);
                // Half the kills are goodbyes, chosen apart from the draws so that the
                // rest of each seed's plan stays as it was.
                let graceful = (seed ^ at).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 1;
                // Half the partitions are a failing disk instead, chosen the same way.
                let disky = (seed ^ at ^ 0xD15C).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 1;
                let fault = match draw(4) {
                    0 if graceful => PeerFault::Leave,
                    0 => PeerFault::Kill,
                    1 => PeerFault::Join,
                    2 => PeerFault::Restart,
                    _ if disky => PeerFault::DiskErrors(500 + draw(4_000)),
                    _ => PeerFault::Partition(500 + draw(4_000)),
                };
                plan.faults.push((at, fault));
            }
        }
        plan
    }
}

/// What a peer world found.
#[derive(Clone, Debug, Default)]
pub struct PeerReport {
    /// The seed.
    pub seed: u64,
    /// Peers at the start.
    pub peers: usize,
    /// What went wrong (empty: the run passed).
    pub violations: Vec<String>,
    /// Operations the clients finished.
    pub ops: u64,
    /// Reads held to the latest value.
    pub strict_reads: u64,
    /// Keys the final sweep checked through every live peer.
    pub swept: u64,
    /// Faults applied, by kind.
    pub kills: u64,
    /// Goodbyes applied.
    pub leaves: u64,
    /// Joins applied.
    pub joins: u64,
    /// Restarts applied.
    pub restarts: u64,
    /// Partitions applied.
    pub partitions: u64,
    /// Disk failure windows applied.
    pub disk_errors: u64,
    /// Values the peers brought back from disk.
    pub promotes: u64,
    /// Ring changes the peers saw after the cluster first formed.
    pub ring_changes: u64,
    /// Entries read that no longer held their write (stale, skipped).
    pub stale: u64,
    /// Re-publish rounds the peers ran.
    pub republishes: u64,
    /// A digest of the run, equal for equal runs.
    pub fingerprint: u64,
}

impl PeerReport {
    /// Whether the run passed.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}
