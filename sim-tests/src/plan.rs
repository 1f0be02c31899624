//! The fault plan: everything a run will do to the cluster, expanded from the seed before the
//! run starts and printed with it, so a failure report says exactly what happened.

use std::fmt;
use std::time::Duration;

use mooring::disk_tier::{DiskBackend, DiskEviction};
use mooring_core::rng::Rng;
use mooring_core::{MasterConfig, Millis};
use mooring_transport_rdma::model::FaultRates;

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

/// One fault.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Kill a storage node (its memory is lost) and start a fresh one after `down_for`.
    KillNode {
        /// Which node.
        node: usize,
        /// How long it stays down.
        down_for: Duration,
    },
    /// Kill a client, if `mid_write` at its next step between PutStart and PutEnd, and start
    /// it again (as a new client) after `down_for`.
    CrashClient {
        /// Which client.
        client: usize,
        /// Crash between the start and the end of a write.
        mid_write: bool,
        /// How long it stays down.
        down_for: Duration,
    },
    /// Cut the link from `from` to `to` (and back, if `both_ways`).
    Partition {
        /// Sending side.
        from: Member,
        /// Receiving side.
        to: Member,
        /// Cut the reverse direction too.
        both_ways: bool,
        /// How long the cut lasts.
        lasts: Duration,
    },
    /// Cut `member` off from everyone, both ways.
    Isolate {
        /// Who.
        member: Member,
        /// How long.
        lasts: Duration,
    },
    /// Message faults everywhere (on TCP: loss and delay only, which stall streams).
    Noise {
        /// Drop chance per message.
        loss: f64,
        /// Duplication chance per message.
        duplicate: f64,
        /// Bit-flip chance per message.
        corrupt: f64,
        /// Extra delay per message, up to this.
        max_delay: Duration,
        /// How long.
        lasts: Duration,
    },
    /// Freeze a storage node's process (as a long GC pause or a stopped VM would).
    PauseNode {
        /// Which node.
        node: usize,
        /// How long.
        lasts: Duration,
    },
    /// A storage node's disk fails reads, writes and syncs (EIO) at `rate` each.
    DiskErrors {
        /// Which node.
        node: usize,
        /// Chance each operation fails.
        rate: f64,
        /// How long.
        lasts: Duration,
    },
    /// Flip one bit of a file on a storage node's disk (bit rot), chosen by `pick`.
    RotDisk {
        /// Which node.
        node: usize,
        /// Picks the file and the bit.
        pick: u64,
    },
    /// Flip one bit of a value held in a storage node's memory (a bad DIMM, a stray write),
    /// chosen by `pick`: readers must detect it by its checksum and never return it.
    RotMemory {
        /// Which node.
        node: usize,
        /// Picks the value and the bit.
        pick: u64,
    },
    /// Damage every copy of one value a storage node holds (a failing machine): a bit of its
    /// memory replica, the value's only one, and a bit of each of its records on the node's
    /// disk, chosen by `pick`. The value is lost: readers must say it is damaged, never
    /// that nothing has the key.
    RotEveryCopy {
        /// Which node.
        node: usize,
        /// Picks the value and the bits.
        pick: u64,
    },
    /// Datagrams from `from` to `to` arrive `by` late (a switch buffer, a retransmission
    /// backlog), intact; datagram-transport runs only (TCP's cut already delivers late).
    Lag {
        /// Sending side.
        from: Member,
        /// Receiving side.
        to: Member,
        /// How late each datagram arrives.
        by: Duration,
        /// How long the link lags.
        lasts: Duration,
    },
    /// A process without the cluster token knocks on every port (wrong-token handshakes,
    /// garbage, frames announced and never finished, silent connections); TCP runs only.
    Stranger {
        /// How long it keeps at it.
        lasts: Duration,
    },
    /// Kill the master (it keeps its state on disk in these runs) and start it again after
    /// `down_for`: it must come back knowing everything it acknowledged.
    KillMaster {
        /// How long it stays down.
        down_for: Duration,
        /// What happens to its state directory as it dies.
        journal: JournalFault,
    },
    /// The master's state directory fills up for `lasts`: changes must be refused, reads
    /// served, and everything held written once there is room (runs whose master keeps its
    /// state on the simulated disk).
    MasterDiskFull {
        /// How long the disk stays full.
        lasts: Duration,
    },
    /// Every sync of the master's state directory fails for `lasts` (EIO, the unsynced
    /// bytes dropped as Linux may drop them): the master must stop acknowledging changes
    /// for good (fail-stop); when the disk works again it is restarted on what it kept.
    MasterSyncFails {
        /// How long syncs fail.
        lasts: Duration,
    },
}

/// What a master's death does to its state directory (runs whose master keeps its state on
/// the simulated disk; a group's masters keep theirs on real directories and are only
/// killed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalFault {
    /// The process dies; the disk keeps everything written (the page cache survives).
    Kill,
    /// The machine loses power while a batch of records is half written: unsynced writes are
    /// torn or lost. Nothing acknowledged may go.
    PowerLoss,
    /// The process dies, then a bit flips in a synced record of the newest journal (chosen
    /// by `pick`): the restarted master must refuse to start, naming the damage; the
    /// harness then restores the byte, as an operator restores the file, and it starts.
    FlipSynced {
        /// Picks the byte and the bit.
        pick: u64,
    },
}

impl Fault {
    /// How long the fault holds before it heals on its own.
    pub fn lasts(&self) -> Duration {
        match self {
            Fault::KillNode { down_for, .. }
            | Fault::CrashClient { down_for, .. }
            | Fault::KillMaster { down_for, .. } => *down_for,
            Fault::Partition { lasts, .. }
            | Fault::Isolate { lasts, .. }
            | Fault::Noise { lasts, .. }
            | Fault::PauseNode { lasts, .. }
            | Fault::DiskErrors { lasts, .. }
            | Fault::Stranger { lasts }
            | Fault::MasterDiskFull { lasts }
            | Fault::MasterSyncFails { lasts }
            | Fault::Lag { lasts, .. } => *lasts,
            Fault::RotDisk { .. } | Fault::RotMemory { .. } | Fault::RotEveryCopy { .. } => {
                Duration::ZERO
            }
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillNode { node, down_for } => {
                write!(f, "kill node{node}, restart after {down_for:?}")
            }
            Fault::KillMaster {
                down_for,
                journal: JournalFault::Kill,
            } => {
                write!(f, "kill the master, restart it after {down_for:?}")
            }
            Fault::KillMaster {
                down_for,
                journal: JournalFault::PowerLoss,
            } => write!(
                f,
                "power loss at the master mid-write (unsynced journal bytes torn or lost), \
                 restart it after {down_for:?}"
            ),
            Fault::KillMaster {
                down_for,
                journal: JournalFault::FlipSynced { pick },
            } => write!(
                f,
                "kill the master and flip a bit in a synced journal record (pick {pick:#x}), \
                 restart it after {down_for:?}"
            ),
            Fault::MasterDiskFull { lasts } => {
                write!(f, "fill the master's state directory for {lasts:?}")
            }
            Fault::MasterSyncFails { lasts } => {
                write!(
                    f,
                    "fail every sync of the master's state directory for {lasts:?}"
                )
            }
            Fault::CrashClient {
                client,
                mid_write,
                down_for,
            } => write!(
                f,
                "crash client{client}{}, restart after {down_for:?}",
                if *mid_write {
                    " between PutStart and PutEnd"
                } else {
                    ""
                }
            ),
            Fault::Partition {
                from,
                to,
                both_ways,
                lasts,
            } => write!(
                f,
                "cut {from} {} {to} for {lasts:?}",
                if *both_ways { "<->" } else { "->" }
            ),
            Fault::Isolate { member, lasts } => write!(f, "isolate {member} for {lasts:?}"),
            Fault::Noise {
                loss,
                duplicate,
                corrupt,
                max_delay,
                lasts,
            } => write!(
                f,
                "noise for {lasts:?}: loss {loss:.3}, duplicate {duplicate:.3}, corrupt {corrupt:.3}, delay up to {max_delay:?}"
            ),
            Fault::PauseNode { node, lasts } => write!(f, "pause node{node} for {lasts:?}"),
            Fault::Lag {
                from,
                to,
                by,
                lasts,
            } => write!(f, "lag {from} -> {to} by {by:?} for {lasts:?}"),
            Fault::DiskErrors { node, rate, lasts } => {
                write!(
                    f,
                    "node{node}'s disk fails {rate:.2} of operations for {lasts:?}"
                )
            }
            Fault::RotDisk { node, pick } => {
                write!(f, "flip a bit on node{node}'s disk ({pick:#x})")
            }
            Fault::RotMemory { node, pick } => {
                write!(
                    f,
                    "flip a bit of a value in node{node}'s memory ({pick:#x})"
                )
            }
            Fault::RotEveryCopy { node, pick } => {
                write!(
                    f,
                    "flip a bit of every copy of a value on node{node}, memory and disk ({pick:#x})"
                )
            }
            Fault::Stranger { lasts } => {
                write!(
                    f,
                    "a stranger without the token knocks on every port for {lasts:?}"
                )
            }
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
    fn generate(seed: u64) -> Option<DiskPlan> {
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
    fn faults(seed: u64, nodes: usize, horizon: Duration) -> Vec<(Duration, Fault)> {
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
    /// Whether two masters run as a group on a simulated etcd (TCP runs that kill the
    /// master): the kill takes the leader, and the standby must take over with every
    /// acknowledged change.
    pub master_group: bool,
    /// The software HCA's fault rates (RDMA runs): remote access errors, queue pairs dying
    /// mid-batch, stalled completions.
    pub rdma_faults: FaultRates,
}

fn between(rng: &mut Rng, lo: Duration, hi: Duration) -> Duration {
    let span = (hi - lo).as_millis() as usize + 1;
    lo + Duration::from_millis(rng.below(span) as u64)
}

fn chance(rng: &mut Rng, p: f64) -> bool {
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
        // Its own stream too.
        let mut blocks = Rng::seeded(seed ^ 0xB10C_5E7E);
        let block_size =
            chance(&mut blocks, 0.5).then(|| [4 << 10, 16 << 10, 32 << 10][blocks.below(3)]);
        let client_rot = disk.is_some() && chance(&mut Rng::seeded(seed ^ 0xC11E_0B17), 0.4);
        let mut master_state = faults
            .iter()
            .any(|(_, f)| matches!(f, Fault::KillMaster { .. }));
        // Its own stream: half the TCP runs that kill the master run a group instead.
        let master_group = master_state
            && transport == Transport::Tcp
            && chance(&mut Rng::seeded(seed ^ 0x6A0C_E7CD), 0.5);
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
