//! The fault plan: everything a run will do to the cluster, expanded from the seed before the
//! run starts and printed with it, so a failure report says exactly what happened.

use std::fmt;
use std::time::Duration;

use mooring_core::rng::Rng;
use mooring_core::{MasterConfig, Millis};

/// Which transport carries the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// transport-tcp over madsim's simulated TCP: faults stall streams.
    Tcp,
    /// transport-sim datagrams: faults drop, delay, duplicate and corrupt messages.
    Sim,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Sim => "sim",
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
}

impl Fault {
    /// How long the fault holds before it heals on its own.
    pub fn lasts(&self) -> Duration {
        match self {
            Fault::KillNode { down_for, .. } | Fault::CrashClient { down_for, .. } => *down_for,
            Fault::Partition { lasts, .. }
            | Fault::Isolate { lasts, .. }
            | Fault::Noise { lasts, .. }
            | Fault::PauseNode { lasts, .. } => *lasts,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillNode { node, down_for } => {
                write!(f, "kill node{node}, restart after {down_for:?}")
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
    /// The master's policy (timeouts shrunk to simulation scale).
    pub master: MasterConfig,
    /// Faults in order of their start (offset from the start of the workload).
    pub faults: Vec<(Duration, Fault)>,
    /// The cluster and the work.
    pub shape: Shape,
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
    pub fn generate(seed: u64, transport: Option<Transport>, shape: Shape) -> Plan {
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
        let master = MasterConfig {
            seed,
            lease_ttl: millis(lease),
            put_start_discard_timeout: millis(discard),
            put_start_release_timeout: millis(release),
            client_ttl: millis(client_ttl),
            eviction_high_watermark: 0.9,
            eviction_ratio: 0.1,
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
            faults.sort_by_key(|(at, _)| *at);
        }
        // Drawn from its own stream, so adding it left every other choice of a seed unchanged.
        let slow_readers = chance(&mut Rng::seeded(seed ^ 0x5105_7EAD_E125), 0.5);
        Plan {
            seed,
            transport,
            buggify,
            slow_readers,
            master,
            faults,
            shape,
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
                    Transport::Sim => (
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
            "MADSIM_TEST_SEED={} scripts/sim.sh replay  # transport {}",
            self.seed, self.transport
        )
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.master;
        writeln!(
            f,
            "seed {} on {}: {} nodes, {} clients ({} contributing), {} ops over {} keys, buggify {}{}",
            self.seed,
            self.transport,
            self.shape.nodes,
            self.shape.clients,
            self.shape.contributing,
            self.shape.ops,
            self.shape.keys,
            if self.buggify { "on" } else { "off" },
            if self.slow_readers {
                ", slow readers"
            } else {
                ""
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
