//! The simulated network's fault switchboard, shared by every node of one simulation.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use madsim::net::Endpoint;
use madsim::rand::Rng;
use tracing::trace;

/// Message faults, applied to every datagram as it is sent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetFaults {
    /// Chance a datagram is dropped.
    pub loss: f64,
    /// Chance a datagram is delivered twice.
    pub duplicate: f64,
    /// Chance one bit of a datagram is flipped.
    pub corrupt: f64,
    /// Extra delay, uniform in `[0, max_delay]`, per datagram (so datagrams overtake each
    /// other). madsim adds its own link latency on top.
    pub max_delay: Duration,
}

/// What the network did so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams handed to the network.
    pub sent: u64,
    /// Dropped by loss.
    pub lost: u64,
    /// Dropped by a partition.
    pub blocked: u64,
    /// Delivered twice.
    pub duplicated: u64,
    /// Corrupted on the way.
    pub corrupted: u64,
    /// Refused by a receiver (bad frame or checksum).
    pub refused: u64,
    /// Dropped by a receiver as duplicates.
    pub deduplicated: u64,
}

struct State {
    faults: NetFaults,
    /// One-way partitions: datagrams from the first address to the second are dropped.
    blocked: BTreeSet<(IpAddr, IpAddr)>,
    /// Lagging links: datagrams from the first address to the second arrive this much late.
    lagging: BTreeMap<(IpAddr, IpAddr), Duration>,
    stats: NetStats,
}

/// The switchboard: which faults are on, and which links are cut.
pub struct SimNet {
    state: Mutex<State>,
}

impl Default for SimNet {
    fn default() -> SimNet {
        SimNet::new()
    }
}

impl SimNet {
    /// A fault-free network.
    pub fn new() -> SimNet {
        SimNet {
            state: Mutex::new(State {
                faults: NetFaults::default(),
                blocked: BTreeSet::new(),
                lagging: BTreeMap::new(),
                stats: NetStats::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the message faults.
    pub fn set_faults(&self, faults: NetFaults) {
        self.lock().faults = faults;
    }

    /// Cuts the link from `from` to `to` (one way).
    pub fn block(&self, from: IpAddr, to: IpAddr) {
        self.lock().blocked.insert((from, to));
    }

    /// Restores the link from `from` to `to`.
    pub fn unblock(&self, from: IpAddr, to: IpAddr) {
        self.lock().blocked.remove(&(from, to));
    }

    /// Holds every datagram from `from` to `to` for `by` before delivering it (one way), as a
    /// switch buffer or a retransmission backlog would: they arrive late, intact and all.
    pub fn lag(&self, from: IpAddr, to: IpAddr, by: Duration) {
        self.lock().lagging.insert((from, to), by);
    }

    /// Ends the lag from `from` to `to` (datagrams already held still arrive late).
    pub fn unlag(&self, from: IpAddr, to: IpAddr) {
        self.lock().lagging.remove(&(from, to));
    }

    /// Turns every fault off and restores every link.
    pub fn heal(&self) {
        let mut state = self.lock();
        state.faults = NetFaults::default();
        state.blocked.clear();
        state.lagging.clear();
    }

    /// What the network did so far.
    pub fn stats(&self) -> NetStats {
        self.lock().stats.clone()
    }

    pub(crate) fn count_refused(&self) {
        self.lock().stats.refused += 1;
    }

    pub(crate) fn count_deduplicated(&self) {
        self.lock().stats.deduplicated += 1;
    }

    /// Sends `datagram` from `endpoint` (bound at `from`) to `to` with tag `tag`, through the
    /// faults. Never blocks: delivery happens in the background.
    pub(crate) fn send(
        &self,
        endpoint: &Endpoint,
        from: SocketAddr,
        to: SocketAddr,
        tag: u64,
        mut datagram: Vec<u8>,
    ) {
        let mut rng = madsim::rand::thread_rng();
        let copies = {
            let mut state = self.lock();
            state.stats.sent += 1;
            if state.blocked.contains(&(from.ip(), to.ip())) {
                state.stats.blocked += 1;
                trace!(%from, %to, "datagram blocked by a partition");
                return;
            }
            let faults = state.faults.clone();
            let lag = state
                .lagging
                .get(&(from.ip(), to.ip()))
                .copied()
                .unwrap_or_default();
            if rng.gen_bool(faults.loss.clamp(0.0, 1.0)) {
                state.stats.lost += 1;
                return;
            }
            if !datagram.is_empty() && rng.gen_bool(faults.corrupt.clamp(0.0, 1.0)) {
                state.stats.corrupted += 1;
                let at = rng.gen_range(0..datagram.len());
                datagram[at] ^= 1 << rng.gen_range(0..8);
            }
            let copies = if rng.gen_bool(faults.duplicate.clamp(0.0, 1.0)) {
                state.stats.duplicated += 1;
                2
            } else {
                1
            };
            (0..copies)
                .map(|_| {
                    let nanos = faults.max_delay.as_nanos() as u64;
                    lag + Duration::from_nanos(if nanos == 0 {
                        0
                    } else {
                        rng.gen_range(0..=nanos)
                    })
                })
                .collect::<Vec<_>>()
        };
        for (i, delay) in copies.iter().enumerate() {
            let endpoint = endpoint.clone();
            let payload = if i + 1 == copies.len() {
                std::mem::take(&mut datagram)
            } else {
                datagram.clone()
            };
            let delay = *delay;
            tokio::spawn(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                // An unreachable destination (a killed node) drops the datagram, as a real
                // network would.
                let _ = endpoint.send_to_raw(to, tag, Box::new(payload)).await;
            });
        }
    }
}
