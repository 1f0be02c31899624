//! Drawing a plan from its seed: the master's timeouts, the faults and when they fall, and
//! each optional ingredient from a stream of its own (so adding one left every other choice
//! of a seed unchanged).

use std::time::Duration;

use mooring_core::rng::Rng;
use mooring_core::{MasterConfig, Millis};
use mooring_transport_rdma::model::FaultRates;

use super::{DiskPlan, Fault, JournalFault, Member, Plan, Shape, Transport};

pub(super) fn between(rng: &mut Rng, lo: Duration, hi: Duration) -> Duration {
    let span = (hi - lo).as_millis() as usize + 1;
    lo + Duration::from_millis(rng.below(span) as u64)
}

pub(super) fn chance(rng: &mut Rng, p: f64) -> bool {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
}

impl Plan {
    /// The plan for `seed`. `transport` forces a transport (default: even seeds TCP, odd
    /// seeds sim).
    pub fn generate(seed: u64, transport: Option<Transport>, mut shape: Shape) -> Plan {
        let mut rng = Rng::seeded(seed ^ 0x706c_616e);
        let transport = transport.unwrap_or(if seed.is_multiple_of(2) {
            Transport::Tcp
        } else {
            Transport::Sim
        });
        let ms = |n: u64| Duration::from_millis(n);
        let lease = between(&mut rng, ms(300), ms(2000));
        let client_ttl = between(&mut rng, ms(1500), ms(4000));
        let discard = between(&mut rng, ms(1000), ms(3000));
        let release = discard + between(&mut rng, ms(2000), ms(4000));
        let millis = |d: Duration| Millis(d.as_millis() as u64);
        let disk = DiskPlan::generate(seed);
        if disk.is_some() {
            // Less memory, so values are evicted (offloaded) and read back from disk.
            shape.node_bytes /= 3;
        }
        let master = MasterConfig {
            seed,
            lease_ttl: millis(lease),
            put_start_discard_timeout: millis(discard),
            put_start_release_timeout: millis(release),
            client_ttl: millis(client_ttl),
            eviction_high_watermark: 0.9,
            eviction_ratio: 0.1,
            offload_write_through: disk.as_ref().is_some_and(|d| d.write_through),
            ..MasterConfig::default()
        };
        let buggify = chance(&mut rng, 0.5);
        let mut faults = Vec::new();
        if shape.faults {
            let count = 2 + rng.below(7);
            // The workload runs for roughly this long; faults fall inside it.
            let horizon = ms(12_000);
            for _ in 0..count {
                let at = between(&mut rng, ms(300), horizon);
                let fault = Self::fault(&mut rng, transport, &shape, client_ttl, release);
                faults.push((at, fault));
            }
            if disk.is_some() {
                faults.extend(DiskPlan::faults(seed, shape.nodes, horizon));
                faults.extend(DiskPlan::crashes(seed, shape.nodes, horizon));
            }
            // Drawn from its own stream, so adding it left every other choice of a seed
            // unchanged. Over TCP only: the datagram transport has no connections to attack.
            let mut strangers = Rng::seeded(seed ^ 0x57A4_6E25);
            if transport == Transport::Tcp && chance(&mut strangers, 0.5) {
                let at = between(&mut strangers, ms(300), horizon);
                let lasts = between(&mut strangers, ms(1000), ms(8000));
                faults.push((at, Fault::Stranger { lasts }));
            }
            // Its own stream too: a client's writes to a node arrive after the master has
            // given their blocks to another writer, unless the node refuses them by their
            // deadline.
            let mut lag = Rng::seeded(seed ^ 0x01A6_11A6);
            if transport.datagrams() && chance(&mut lag, 0.8) {
                let at = between(&mut lag, ms(300), horizon);
                let from = Member::Client(lag.below(shape.clients));
                let to = Member::Node(lag.below(shape.nodes));
                let by = release + between(&mut lag, ms(200), ms(2000));
                let lasts = between(&mut lag, ms(1000), ms(5000));
                faults.push((
                    at,
                    Fault::Lag {
                        from,
                        to,
                        by,
                        lasts,
                    },
                ));
            }
            // Its own stream too: the master killed and restarted on its state directory.
            let mut crash = Rng::seeded(seed ^ 0x0C4A_5E5D);
            if chance(&mut crash, 0.35) {
                let at = between(&mut crash, ms(300), horizon);
                let down_for = between(&mut crash, ms(100), ms(3000));
                faults.push((
                    at,
                    Fault::KillMaster {
                        down_for,
                        journal: JournalFault::Kill,
                    },
                ));
            }
            // Its own stream too: memory damage that only checksums can see.
            let mut rot = Rng::seeded(seed ^ 0x0B17_F11B);
            for _ in 0..rot.below(5) {
                let at = between(&mut rot, ms(300), horizon);
                let node = rot.below(shape.nodes);
                let pick = rot.next_u64();
                faults.push((at, Fault::RotMemory { node, pick }));
            }
            // Its own stream too: in half the runs with faults, nodes remount under traffic.
            let mut remount = Rng::seeded(seed ^ 0x2E30_0A7E);
            if chance(&mut remount, 0.5) {
                for _ in 0..1 + remount.below(3) {
                    let at = between(&mut remount, ms(300), horizon);
                    let node = remount.below(shape.nodes);
                    faults.push((at, Fault::Remount { node }));
                }
            }
            // Its own stream too: in some runs with disks, a value damaged in every copy.
            let mut everywhere = Rng::seeded(seed ^ 0x0E7E_2C09);
            if disk.is_some() && chance(&mut everywhere, 0.5) {
                for _ in 0..1 + everywhere.below(3) {
                    let at = between(&mut everywhere, ms(300), horizon);
                    let node = everywhere.below(shape.nodes);
                    let pick = everywhere.next_u64();
                    faults.push((at, Fault::RotEveryCopy { node, pick }));
                }
            }
            faults.sort_by_key(|(at, _)| *at);
        }
        // Drawn from its own stream, so adding it left every other choice of a seed unchanged.
        let slow_readers = chance(&mut Rng::seeded(seed ^ 0x5105_7EAD_E125), 0.5);
        // Its own stream, so every other choice of a seed is unchanged: one operation at a
        // time in a quarter of the seeds, two to four in flight in the rest.
        let streams = match Rng::seeded(seed ^ 0x0C0C_57EA).below(4) {
            0 => 1,
            n => n + 1,
        };
        // Its own stream: in half the runs with faults, up to three writes held up partway.
        let mut held = Rng::seeded(seed ^ 0x4E1D_3A17);
        let held_writes = if shape.faults && chance(&mut held, 0.5) {
            1 + held.below(3) as u32
        } else {
            0
        };
        // Its own stream too.
        let mut blocks = Rng::seeded(seed ^ 0xB10C_5E7E);
        let block_size =
            chance(&mut blocks, 0.5).then(|| [4 << 10, 16 << 10, 32 << 10][blocks.below(3)]);
        let client_rot = disk.is_some() && chance(&mut Rng::seeded(seed ^ 0xC11E_0B17), 0.4);
        let mut master_state = faults
            .iter()
            .any(|(_, f)| matches!(f, Fault::KillMaster { .. }));
        // Its own stream: 30% of the transport-sim runs with faults run a group, whose
        // leader is killed (a kill is added where the plan had none), so the default seed set
        // takes over over datagrams.
        let mut standby = Rng::seeded(seed ^ 0x5EB7_6A0C);
        let sim_group = shape.faults && transport == Transport::Sim && chance(&mut standby, 0.3);
        if sim_group && !master_state {
            let at = between(&mut standby, ms(300), ms(12_000));
            let down_for = between(&mut standby, ms(100), ms(3000));
            faults.push((
                at,
                Fault::KillMaster {
                    down_for,
                    journal: JournalFault::Kill,
                },
            ));
            faults.sort_by_key(|(at, _)| *at);
            master_state = true;
        }
        // Its own stream: half the TCP runs that kill the master run a group instead.
        let master_group = sim_group
            || (master_state
                && transport == Transport::Tcp
                && chance(&mut Rng::seeded(seed ^ 0x6A0C_E7CD), 0.5));
        // Its own stream: in half the groups the leader is cut off for a while from its
        // standby, etcd, or both; half the splits from the standby alone end with the
        // leader's death (what it acknowledged without the standby must not be lost to a
        // standby still counted in sync).
        let mut split = Rng::seeded(seed ^ 0x5B11_7EAD);
        if master_group && chance(&mut split, 0.5) {
            let at = between(&mut split, ms(300), ms(12_000));
            let lasts = between(&mut split, ms(1000), ms(6000));
            let (standby, etcd) = [(true, false), (false, true), (true, true)][split.below(3)];
            faults.push((
                at,
                Fault::SplitLeader {
                    standby,
                    etcd,
                    lasts,
                },
            ));
            if !etcd && chance(&mut split, 0.5) {
                let down_for = between(&mut split, ms(100), ms(3000));
                faults.push((
                    at + lasts.mul_f64(0.75),
                    Fault::KillMaster {
                        down_for,
                        journal: JournalFault::Kill,
                    },
                ));
            }
            faults.sort_by_key(|(at, _)| *at);
        }
        // Its own stream: a lone master's state directory is the simulated disk, and its
        // deaths do to it what deaths do to disks; in some runs with faults it fills up.
        if !master_group {
            let mut journal = Rng::seeded(seed ^ 0x004A_0DA1);
            for (_, fault) in &mut faults {
                if let Fault::KillMaster { journal: what, .. } = fault {
                    *what = match journal.below(3) {
                        0 => JournalFault::Kill,
                        1 => JournalFault::PowerLoss,
                        _ => JournalFault::FlipSynced {
                            pick: journal.next_u64(),
                        },
                    };
                }
            }
            if shape.faults && chance(&mut journal, 0.3) {
                let at = between(&mut journal, ms(300), ms(12_000));
                let lasts = between(&mut journal, ms(200), ms(3000));
                faults.push((at, Fault::MasterDiskFull { lasts }));
                // Half the time the master dies soon after: what it acknowledged while and
                // after its disk was full must be what it recovers.
                if chance(&mut journal, 0.5) {
                    let later = at + lasts + between(&mut journal, ms(100), ms(1000));
                    let down_for = between(&mut journal, ms(100), ms(1000));
                    faults.push((
                        later,
                        Fault::KillMaster {
                            down_for,
                            journal: JournalFault::Kill,
                        },
                    ));
                }
                master_state = true;
            }
            // In some runs with faults its syncs fail for a while; then it is restarted (a
            // master whose journal stopped acknowledges nothing until then).
            if shape.faults && chance(&mut journal, 0.2) {
                let at = between(&mut journal, ms(300), ms(12_000));
                let lasts = between(&mut journal, ms(20), ms(1000));
                faults.push((at, Fault::MasterSyncFails { lasts }));
                master_state = true;
            }
            faults.sort_by_key(|(at, _)| *at);
        }
        // Its own stream: the HCA's faults, in RDMA runs with faults.
        let mut hca = Rng::seeded(seed ^ 0x4843_4146);
        let rdma_faults = if transport == Transport::Rdma && shape.faults {
            FaultRates {
                remote_access: hca.below(5) as f64 / 1000.0,
                retry_exceeded: hca.below(5) as f64 / 1000.0,
                stall: hca.below(20) as f64 / 1000.0,
                stall_polls: 10 + hca.below(500) as u32,
            }
        } else {
            FaultRates::default()
        };
        Plan {
            seed,
            transport,
            buggify,
            slow_readers,
            held_writes,
            streams,
            block_size,
            client_rot,
            master,
            faults,
            shape,
            disk,
            master_state,
            master_group,
            rdma_faults,
        }
    }

    fn fault(
        rng: &mut Rng,
        transport: Transport,
        shape: &Shape,
        ttl: Duration,
        release: Duration,
    ) -> Fault {
        let ms = |n: u64| Duration::from_millis(n);
        // Cuts may outlast every timeout. On madsim's TCP a cut stalls the stream and delivers
        // everything when it heals (real TCP gives up after TCP_USER_TIMEOUT), so a write
        // can reach a node long after its writer gave up: the node must refuse it by its
        // deadline (see mooring_transport_tcp::data).
        let cut = ttl * 2;
        let node = rng.below(shape.nodes);
        let client = rng.below(shape.clients);
        let member = |rng: &mut Rng| match rng.below(3) {
            0 => Member::Master,
            1 => Member::Node(rng.below(shape.nodes)),
            _ => Member::Client(rng.below(shape.clients)),
        };
        match rng.below(10) {
            0 | 1 => Fault::KillNode {
                node,
                down_for: between(rng, ms(200), ttl * 2),
            },
            2 | 3 => Fault::CrashClient {
                client,
                mid_write: chance(rng, 0.7),
                down_for: between(rng, ms(100), ttl),
            },
            // A client's writes to one node stall past the release timeout while both stay in
            // touch with the master: its blocks are released and handed out again before the
            // stalled bytes can arrive.
            5 => Fault::Partition {
                from: Member::Client(client),
                to: Member::Node(node),
                both_ways: false,
                lasts: release + between(rng, ms(200), ms(3000)),
            },
            4 => {
                let (from, mut to) = (member(rng), member(rng));
                if to == from {
                    to = if from == Member::Master {
                        Member::Node(node)
                    } else {
                        Member::Master
                    };
                }
                let both_ways = chance(rng, 0.5);
                Fault::Partition {
                    from,
                    to,
                    both_ways,
                    lasts: between(rng, ms(50), cut),
                }
            }
            6 => Fault::Isolate {
                member: member(rng),
                lasts: between(rng, ms(50), cut),
            },
            7 | 8 => {
                let (duplicate, corrupt, loss, max_delay) = match transport {
                    Transport::Sim | Transport::Rdma | Transport::Shm => (
                        rng.below(20) as f64 / 100.0,
                        rng.below(10) as f64 / 100.0,
                        rng.below(20) as f64 / 100.0,
                        ms(rng.below(100) as u64),
                    ),
                    Transport::Tcp => (0.0, 0.0, rng.below(5) as f64 / 100.0, ms(0)),
                };
                Fault::Noise {
                    loss,
                    duplicate,
                    corrupt,
                    max_delay,
                    lasts: between(rng, ms(200), ms(3000)),
                }
            }
            _ => Fault::PauseNode {
                node,
                lasts: between(rng, ms(50), ttl / 4),
            },
        }
    }
}
