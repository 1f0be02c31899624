//! The storage nodes' disk tiers in a plan, and the disk faults, each drawn from a stream of
//! its own.

use std::time::Duration;

use mooring::node::disk_tier::{DiskBackend, DiskEviction};
use mooring_core::rng::Rng;

use super::Fault;
use super::draw::{between, chance};

/// The storage nodes' disk tiers in a run (every node has one, on a simulated disk that
/// survives the node's restarts).
#[derive(Clone, Debug, PartialEq)]
pub struct DiskPlan {
    /// The on-disk layout.
    pub backend: DiskBackend,
    /// Most bytes each disk keeps (small: disk eviction runs).
    pub capacity: u64,
    /// Disk eviction order.
    pub eviction: DiskEviction,
    /// Direct-I/O alignment the simulated disks demand.
    pub alignment: usize,
    /// Values per offload group (bucket).
    pub group_keys: usize,
    /// How long a staged value waits for its reader.
    pub slot_ttl: Duration,
    /// On a node's kill, the chance each unsynced write is torn, and lost.
    pub torn_on_crash: f64,
    /// See `torn_on_crash`.
    pub lost_on_crash: f64,
    /// Whether every completed write is offloaded, not only evicted ones.
    pub write_through: bool,
    /// Bytes of each node's staging buffer (sometimes tight, so loaded slots that outlived
    /// their TTL are reclaimed to make room while readers race them).
    pub staging: u64,
    /// How often each node syncs its disk and reports to the master (sometimes slowly, so
    /// the master lists copies a node has already evicted for longer).
    pub sync_interval: Duration,
}

impl DiskPlan {
    /// Drawn from its own stream, so that adding disks left every other choice of a seed
    /// unchanged.
    pub(super) fn generate(seed: u64) -> Option<DiskPlan> {
        let mut rng = Rng::seeded(seed ^ 0xD15C_7E55);
        if !chance(&mut rng, 0.75) {
            return None;
        }
        let backends = [
            DiskBackend::Bucket,
            DiskBackend::FilePerKey,
            DiskBackend::OffsetFile,
        ];
        Some(DiskPlan {
            backend: backends[rng.below(backends.len())],
            // Mostly small, so nodes evict from their disks; sometimes ample.
            capacity: [96 << 10, 128 << 10, 160 << 10, 1 << 20][rng.below(4)],
            eviction: if chance(&mut rng, 0.5) {
                DiskEviction::Fifo
            } else {
                DiskEviction::Lru
            },
            alignment: [1, 512][rng.below(2)],
            group_keys: 1 + rng.below(8),
            slot_ttl: Duration::from_millis(100 + rng.below(2000) as u64),
            torn_on_crash: rng.below(50) as f64 / 100.0,
            lost_on_crash: rng.below(50) as f64 / 100.0,
            write_through: chance(&mut rng, 0.5),
            staging: [100 << 10, 128 << 10, 1 << 20][rng.below(3)],
            sync_interval: Duration::from_millis([100, 100, 1000, 2000][rng.below(4)]),
        })
    }

    /// Disk faults for a run with `nodes` storage nodes over `horizon`.
    pub(super) fn faults(seed: u64, nodes: usize, horizon: Duration) -> Vec<(Duration, Fault)> {
        let mut rng = Rng::seeded(seed ^ 0xD15C_FA17);
        let ms = |n: u64| Duration::from_millis(n);
        (0..rng.below(5))
            .map(|_| {
                let at = between(&mut rng, ms(300), horizon);
                let node = rng.below(nodes);
                let fault = match rng.below(10) {
                    0..=3 => Fault::DiskErrors {
                        node,
                        rate: (1 + rng.below(60)) as f64 / 100.0,
                        lasts: between(&mut rng, ms(100), ms(4000)),
                    },
                    4..=6 => Fault::RotDisk {
                        node,
                        pick: rng.next_u64(),
                    },
                    // A restart mid-offload or mid-eviction: the node comes back on its disk,
                    // sometimes before the master noticed it was gone.
                    _ => Fault::KillNode {
                        node,
                        down_for: between(&mut rng, ms(50), ms(4000)),
                    },
                };
                (at, fault)
            })
            .collect()
    }

    /// Crashes that recovery must clean up after, for a run with `nodes` storage nodes over
    /// `horizon`, from a stream of their own (so every earlier choice of a seed is
    /// unchanged): one to three nodes killed partway through a disk write (restarting, now
    /// and then, on a disk that fails some operations), most after a bit flip in a record on
    /// the same disk. Random kills rarely land inside a write (microseconds of every sync
    /// interval), so recovery would seldom find anything to drop.
    pub(super) fn crashes(seed: u64, nodes: usize, horizon: Duration) -> Vec<(Duration, Fault)> {
        let mut rng = Rng::seeded(seed ^ 0xD15C_C4A5);
        let ms = |n: u64| Duration::from_millis(n);
        let mut faults = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let at = between(&mut rng, ms(1000), horizon);
            let node = rng.below(nodes);
            if chance(&mut rng, 0.7) {
                let before = between(&mut rng, ms(0), ms(800));
                let pick = rng.next_u64();
                faults.push((at - before, Fault::RotRecord { node, pick }));
            }
            let change = 1 + rng.below(8) as u32;
            let down_for = between(&mut rng, ms(50), ms(2000));
            let failing = chance(&mut rng, 0.3).then(|| {
                let rate = (5 + rng.below(40)) as f64 / 100.0;
                (rate, between(&mut rng, ms(100), ms(1500)))
            });
            faults.push((
                at,
                Fault::KillNodeMidDiskWrite {
                    node,
                    change,
                    down_for,
                    failing,
                },
            ));
        }
        faults
    }
}
