//! Running one peer world under madsim.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::net::NetSim;
use madsim::rand::Rng as _;
use madsim::runtime::{Handle, NodeHandle, Runtime};
use mooring::node::disk_tier::DiskDevice;
use mooring::peer::{PeerConfig, PeerCounts, PeerDiskConfig, PeerGuest, PeerNode};
use mooring_transport_sim::disk::{DiskFaults, SimDisk};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::history::{History, SETTLE, value_for};
use super::{PeerFault, PeerPlan, PeerReport};

/// The port every peer listens on.
const PORT: u16 = 7100;
/// Each peer's pool: small, so values leave memory for the disk tier and reads promote them
/// back (a value leaves only once its copy is complete, so no read misses for it).
const POOL: u64 = 128 << 10;
/// Each peer's disk tier: large enough that no copy is deleted to make room.
const DISK: u64 = 64 << 20;
/// How long a client waits for a peer.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// From this many peers on, membership greets every two seconds and declares a peer dead
/// after eight: every peer greets every other, and at 64 peers the default pace costs the
/// simulator more than the run is worth.
const LARGE: usize = 32;

/// How long after a fault reads are excused, for a world of `peers`.
fn settle(peers: usize) -> Duration {
    match peers >= LARGE {
        true => Duration::from_secs(16),
        false => SETTLE,
    }
}

fn peer_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 1, (i / 200) as u8, (i % 200) as u8 + 1))
}

fn peer_addr(i: usize) -> String {
    format!("{}:{PORT}", peer_ip(i))
}

/// What the supervisor, the clients and the peers share.
struct Shared {
    history: Mutex<History>,
    /// The counts of every peer ever started (a restart adds one). Only the counts: a
    /// killed peer's memory and sockets must go with it.
    started: Mutex<Vec<Arc<PeerCounts>>>,
    /// How many peer addresses exist (clients choose among them, live or not).
    addresses: Mutex<usize>,
    /// One signal per peer address: the peer there says goodbye and leaves.
    leave: Mutex<Vec<Arc<Notify>>>,
    /// One disk per peer address; it outlives a restart, as a real disk does.
    disks: Mutex<Vec<Arc<SimDisk>>>,
    seed: u64,
    start: Instant,
}

impl Shared {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The leave signal of peer address `i` (made on first use).
    fn leave_signal(&self, i: usize) -> Arc<Notify> {
        let mut signals = self.leave.lock().unwrap_or_else(|e| e.into_inner());
        while signals.len() <= i {
            signals.push(Arc::new(Notify::new()));
        }
        signals[i].clone()
    }

    /// The disk of peer address `i` (made on first use).
    fn disk(&self, i: usize) -> Arc<SimDisk> {
        let mut disks = self.disks.lock().unwrap_or_else(|e| e.into_inner());
        while disks.len() <= i {
            let seed = self.seed ^ 0x9EE2_D15C ^ (disks.len() as u64) << 40;
            disks.push(Arc::new(SimDisk::new(seed)));
        }
        disks[i].clone()
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs `plan` to completion. Call it on a thread of its own (the simulator seeds
/// per-thread state from the seed).
pub fn run(plan: PeerPlan) -> PeerReport {
    let mut runtime = Runtime::with_seed_and_config(plan.seed, madsim::Config::default());
    runtime.set_time_limit(Duration::from_secs(1800));
    runtime.block_on(supervise(plan))
}

fn start_peer(
    handle: &Handle,
    shared: &Arc<Shared>,
    i: usize,
    seeds: Vec<String>,
    large: bool,
) -> NodeHandle {
    let shared = shared.clone();
    handle
        .create_node()
        .name(format!("peer{i}"))
        .ip(peer_ip(i))
        .init(move || {
            let (shared, seeds) = (shared.clone(), seeds.clone());
            let leave = shared.leave_signal(i);
            async move {
                let mut config = PeerConfig::new(peer_addr(i), seeds, POOL);
                config.timeout = CALL_TIMEOUT;
                config.disk = Some(PeerDiskConfig {
                    dir: "peer-disk".into(),
                    capacity: DISK,
                    device: Some(DiskDevice(shared.disk(i))),
                });
                if large {
                    config.greet_every = Duration::from_secs(2);
                    config.membership.dead_after = mooring_core::Millis(8_000);
                }
                match PeerNode::start(config, None).await {
                    Ok(peer) => {
                        if peer.disk_capacity() == 0 {
                            let now = shared.now();
                            shared.history().started_without_disk(i, now);
                        }
                        shared
                            .started
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(peer.counts());
                        leave.notified().await;
                        peer.leave().await;
                    }
                    Err(e) => shared
                        .history()
                        .violations
                        .push(format!("peer {i} did not start: {e}")),
                }
                std::future::pending::<()>().await;
            }
        })
        .build()
}

async fn supervise(plan: PeerPlan) -> PeerReport {
    let handle = Handle::current();
    let shared = Arc::new(Shared {
        history: Mutex::new(History::new(settle(plan.peers))),
        started: Mutex::new(Vec::new()),
        addresses: Mutex::new(plan.peers),
        leave: Mutex::new(Vec::new()),
        disks: Mutex::new(Vec::new()),
        seed: plan.seed,
        start: Instant::now(),
    });
    let seeds: Vec<String> = (0..plan.peers.min(3)).map(peer_addr).collect();
    let large = plan.peers >= LARGE;
    let mut nodes: Vec<NodeHandle> = (0..plan.peers)
        .map(|i| start_peer(&handle, &shared, i, seeds.clone(), large))
        .collect();
    let mut alive = vec![true; plan.peers];
    // The cluster forms before the clients start: ring changes after this are the faults'.
    tokio::time::sleep(settle(plan.peers) / 3).await;
    let formed: u64 = counts(&shared, |p| p.ring_changes.load(relaxed()));
    let clients: Vec<_> = (0..plan.clients)
        .map(|j| {
            let node = handle
                .create_node()
                .name(format!("client{j}"))
                .ip(IpAddr::V4(Ipv4Addr::new(10, 2, 0, j as u8 + 1)))
                .build();
            node.spawn(client(shared.clone(), plan.clone()))
        })
        .collect();

    let mut report = PeerReport {
        seed: plan.seed,
        peers: plan.peers,
        ..PeerReport::default()
    };
    let mut rng = madsim::rand::thread_rng();
    for &(at, fault) in &plan.faults {
        let due = Duration::from_millis(at);
        let now = shared.now();
        if due > now {
            tokio::time::sleep(due - now).await;
        }
        let live: Vec<usize> = (0..alive.len()).filter(|&i| alive[i]).collect();
        let now = shared.now();
        match fault {
            PeerFault::Kill | PeerFault::Restart if live.len() > 2 => {
                let victim = live[rng.gen_range(0..live.len())];
                tracing::info!(?fault, victim, "peer world fault");
                shared.history().kill(victim, now);
                if fault == PeerFault::Kill {
                    handle.kill(nodes[victim].id());
                    alive[victim] = false;
                    report.kills += 1;
                } else {
                    // madsim's restart alone keeps the old incarnation's sockets bound.
                    handle.kill(nodes[victim].id());
                    handle.restart(nodes[victim].id());
                    report.restarts += 1;
                }
            }
            PeerFault::Kill | PeerFault::Restart => {}
            PeerFault::Leave if live.len() > 2 => {
                let victim = live[rng.gen_range(0..live.len())];
                tracing::info!(victim, "peer world fault: a peer leaves");
                shared.history().kill(victim, now);
                // Its goodbyes go out, then the process ends, as `mooring peer` does on
                // SIGTERM (a goodbye that has not arrived by then is lost with it).
                shared.leave_signal(victim).notify_one();
                tokio::time::sleep(Duration::from_millis(300)).await;
                handle.kill(nodes[victim].id());
                alive[victim] = false;
                report.leaves += 1;
            }
            PeerFault::Leave => {}
            PeerFault::Join => {
                let i = nodes.len();
                let everyone: Vec<String> = (0..i).map(peer_addr).collect();
                nodes.push(start_peer(&handle, &shared, i, everyone, large));
                alive.push(true);
                *shared.addresses.lock().unwrap_or_else(|e| e.into_inner()) = nodes.len();
                shared.history().disturb(now);
                report.joins += 1;
            }
            PeerFault::Partition(ms) if live.len() >= 2 => {
                let a = live[rng.gen_range(0..live.len())];
                let b = live[(live.iter().position(|&p| p == a).unwrap_or(0) + 1) % live.len()];
                let (a, b) = (nodes[a].id(), nodes[b].id());
                let net = NetSim::current();
                net.clog_link(a, b);
                net.clog_link(b, a);
                shared.history().disturb(now);
                report.partitions += 1;
                let healer = shared.clone();
                madsim::task::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    let net = NetSim::current();
                    net.unclog_link(a, b);
                    net.unclog_link(b, a);
                    let now = healer.now();
                    healer.history().disturb(now);
                });
            }
            PeerFault::Partition(_) => {}
            PeerFault::DiskErrors(ms) if !live.is_empty() => {
                let victim = live[rng.gen_range(0..live.len())];
                tracing::info!(victim, ms, "peer world fault: a failing disk");
                let disk = shared.disk(victim);
                disk.set_faults(DiskFaults {
                    read_error: 0.3,
                    write_error: 0.3,
                    ..DiskFaults::default()
                });
                shared.history().disturb(now);
                report.disk_errors += 1;
                let healer = shared.clone();
                madsim::task::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    disk.set_faults(DiskFaults::default());
                    let now = healer.now();
                    healer.history().may_have_lost(victim, now);
                });
            }
            PeerFault::DiskErrors(_) => {}
        }
    }
    for client in clients {
        if let Ok(done) = client.await {
            report.ops += done;
        }
    }
    // Everything heals (partitions end within 5 s), then settles: the final sweep holds
    // every key to its last completed change, through every live peer.
    tokio::time::sleep(Duration::from_secs(5) + settle(plan.peers)).await;
    let checker = handle
        .create_node()
        .name("checker")
        .ip(IpAddr::V4(Ipv4Addr::new(10, 2, 1, 1)))
        .build();
    let live: Vec<usize> = (0..alive.len()).filter(|&i| alive[i]).collect();
    let swept = checker
        .spawn(sweep(shared.clone(), live))
        .await
        .unwrap_or(0);

    let history = shared.history();
    report.violations = history.violations.clone();
    report.strict_reads = history.strict_reads;
    report.swept = swept;
    report.fingerprint = history.fingerprint() ^ shared.now().as_nanos() as u64;
    drop(history);
    report.ring_changes =
        counts(&shared, |p| p.ring_changes.load(relaxed())).saturating_sub(formed);
    report.stale = counts(&shared, |p| p.stale.load(relaxed()));
    report.republishes = counts(&shared, |p| p.republishes.load(relaxed()));
    report.promotes = counts(&shared, |p| p.promotes.load(relaxed()));
    report
}

fn relaxed() -> std::sync::atomic::Ordering {
    std::sync::atomic::Ordering::Relaxed
}

/// A sum over every peer ever started.
fn counts(shared: &Shared, count: impl Fn(&PeerCounts) -> u64) -> u64 {
    let started = shared.started.lock().unwrap_or_else(|e| e.into_inner());
    started.iter().map(|counts| count(counts)).sum()
}

/// One client: `plan.ops` random puts, gets, exists and removes, each through the first peer that
/// answers, starting from a random one. Returns how many it finished.
async fn client(shared: Arc<Shared>, plan: PeerPlan) -> u64 {
    let mut rng = madsim::rand::thread_rng();
    let mut done = 0;
    for _ in 0..plan.ops {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..200))).await;
        let key = rng.gen_range(0..plan.keys);
        let peers = *shared.addresses.lock().unwrap_or_else(|e| e.into_inner());
        let first = rng.gen_range(0..peers);
        let order: Vec<usize> = (0..peers).map(|k| (first + k) % peers).collect();
        let roll = rng.gen_range(0..100);
        let start = shared.now();
        if roll < 45 {
            let (version, index) = shared.history().start_put(key, start);
            let value = value_for(key, version);
            let (ok, via) = through(&order, |guest| {
                let value = value.clone();
                async move { guest.put(&key.to_string(), value).await }
            })
            .await;
            let now = shared.now();
            shared.history().finish(key, index, ok.is_some(), via, now);
        } else if roll < 78 {
            let (read, via) = through(
                &order,
                |guest| async move { guest.get(&key.to_string()).await },
            )
            .await;
            let now = shared.now();
            // A read no peer answered says nothing.
            if let Some(read) = read {
                shared.history().read(key, via, read.as_deref(), start, now);
            }
        } else if roll < 86 {
            let (found, via) = through(&order, |guest| async move {
                guest.exists(&[key.to_string()]).await
            })
            .await;
            let now = shared.now();
            if let Some(found) = found {
                let found = found.first() == Some(&true);
                shared.history().exists(key, via, found, start, now);
            }
        } else {
            let index = shared.history().start_remove(key, start);
            let (ok, via) = through(&order, |guest| async move {
                guest.remove(&key.to_string()).await
            })
            .await;
            let now = shared.now();
            shared.history().finish(key, index, ok.is_some(), via, now);
        }
        done += 1;
    }
    done
}

/// Runs `call` through each peer of `order` until one answers: its answer and index.
async fn through<T, F, Fut>(order: &[usize], call: F) -> (Option<T>, usize)
where
    F: Fn(PeerGuest) -> Fut,
    Fut: std::future::Future<Output = mooring_core::Result<T>>,
{
    for &peer in order {
        let guest = PeerGuest::new(vec![peer_addr(peer)], None, CALL_TIMEOUT).expect("a peer");
        if let Ok(answer) = call(guest).await {
            return (Some(answer), peer);
        }
    }
    (None, order.first().copied().unwrap_or(0))
}

/// Reads every key through every live peer, judging each read; returns the keys swept.
async fn sweep(shared: Arc<Shared>, live: Vec<usize>) -> u64 {
    let keys = shared.history().keys();
    for &key in &keys {
        for &peer in &live {
            let guest = PeerGuest::new(vec![peer_addr(peer)], None, CALL_TIMEOUT).expect("a peer");
            let start = shared.now();
            match guest.get(&key.to_string()).await {
                Ok(read) => {
                    let now = shared.now();
                    shared
                        .history()
                        .read(key, peer, read.as_deref(), start, now);
                    // Settled, the directory agrees with the data: an entry left for a
                    // value no longer held (a removal or drop some owner missed) is a key
                    // that exists but cannot be read.
                    match guest.exists(&[key.to_string()]).await {
                        Ok(found) if found == [read.is_some()] => {}
                        Ok(found) => shared.history().violations.push(format!(
                            "after healing, live peer {peer} says key {key} exists: {found:?}, \
                             but reads {:?}",
                            read.as_ref().map(Vec::len)
                        )),
                        Err(e) => shared.history().violations.push(format!(
                            "after healing, live peer {peer} could not answer exists for key \
                             {key}: {e}"
                        )),
                    }
                }
                Err(e) => shared.history().violations.push(format!(
                    "after healing, live peer {peer} could not answer a read of key {key}: {e}"
                )),
            }
        }
    }
    keys.len() as u64
}
