//! A peer: one member of a cluster with no master (peer mode; `docs/peer-mode.md`).
//!
//! The peer maps its published pool, exports it on the data plane, serves the peer protocol
//! on its listen address (which is also its name on the ring) and keeps three rounds going:
//! greetings (membership), a periodic re-publish of everything it holds (repairs entries lost
//! with a dead owner), and time for its state (tombstones, freed blocks). Every decision is
//! the core's ([`PeerState`], [`Membership`]); this driver moves bytes and messages.

mod client;
mod disk;
mod guest;
mod ops;
mod service;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use mooring_core::peer::membership::{MemberInfo, Membership, MembershipChange, MembershipConfig};
use mooring_core::peer::state::{DEFAULT_DIRECTORY_REPLICAS, PeerState};
use mooring_core::{Error, ErrorCode, Millis, Result};
use mooring_proto::auth::{Credential, Gate, Plane};
use mooring_proto::transport::{DataPlane, DataServer, SegmentMemory};
use mooring_proto::wire::{PeerReply, PeerRequest};
use mooring_transport_tcp::limits::ConnectionLimits;
use mooring_transport_tcp::{
    DataPlaneConfig, LocalSegments, PeerLinks, TcpDataPlane, TcpDataServer, spawn_peer_server,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::client::connect::{client_id_for, random_client_id};
use crate::clock::Clock;
use crate::node::memory::segment_memory;
use crate::ops::metrics::Latency;
use crate::transports::TransportChoice;

pub use client::PeerClient;
pub use disk::PeerDiskConfig;
pub use guest::{MAX_GUEST_VALUE, PeerGuest};

/// The scheme that names a peer cluster wherever a master address is taken.
pub const PEER_SCHEME: &str = "peer://";

/// The peers a `peer://host:port[,host:port...]` address names, or `None` if `address` names
/// a master.
pub fn peer_addresses(address: &str) -> Option<Vec<String>> {
    let list = address.strip_prefix(PEER_SCHEME)?;
    Some(
        list.split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// Milliseconds since the Unix epoch, by the wall clock.
fn wall_clock_millis() -> Millis {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Millis(since.as_millis() as u64)
}

/// What a peer contributes and how it paces itself.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// Where the peer service listens: `host:port`.
    pub listen: String,
    /// Its name on the ring [default: a member credential's name, else its address].
    pub name: Option<String>,
    /// The address other peers reach it at, if not `listen` (a wildcard or port 0 needs one).
    pub advertise: Option<String>,
    /// Where the data server listens (`host:0`: any port).
    pub data_listen: String,
    /// Peers to greet first.
    pub seeds: Vec<String>,
    /// Bytes of the published pool.
    pub size: u64,
    /// Owners of each directory entry.
    pub directory_replicas: usize,
    /// Share of the directory, relative to a peer of weight 1.
    pub weight: u32,
    /// How often every known peer is greeted.
    pub greet_every: Duration,
    /// How often everything held is re-published to its owners.
    pub republish_every: Duration,
    /// Membership timing.
    pub membership: MembershipConfig,
    /// How long a freed block waits for readers before reuse.
    pub read_grace: Millis,
    /// How long a call to another peer may take.
    pub timeout: Duration,
    /// The disk tier, if any.
    pub disk: Option<PeerDiskConfig>,
    /// Serve the pool in shared memory to peers on this host (of this user), and read theirs
    /// that way: a read between co-located peers is then a memcpy, not a TCP transfer.
    pub shared_memory: bool,
}

impl PeerConfig {
    /// A peer listening on `listen`, greeting `seeds`, with `size` bytes, defaults elsewhere.
    pub fn new(listen: impl Into<String>, seeds: Vec<String>, size: u64) -> PeerConfig {
        let listen = listen.into();
        let host = listen
            .rsplit_once(':')
            .map_or("127.0.0.1", |(host, _)| host);
        PeerConfig {
            data_listen: format!("{host}:0"),
            listen,
            name: None,
            advertise: None,
            seeds,
            size,
            directory_replicas: DEFAULT_DIRECTORY_REPLICAS,
            weight: 1,
            greet_every: Duration::from_millis(500),
            republish_every: Duration::from_secs(5),
            membership: MembershipConfig::default(),
            read_grace: Millis(2_000),
            timeout: Duration::from_secs(5),
            disk: None,
            shared_memory: cfg!(not(madsim)),
        }
    }
}

/// Counts since the peer started, for metrics and tests.
#[derive(Debug, Default)]
pub struct PeerCounts {
    /// Values written into this peer's pool.
    pub puts: AtomicU64,
    /// Reads asked of this peer (its own clients' and guests').
    pub gets: AtomicU64,
    /// Reads that found a value.
    pub hits: AtomicU64,
    /// Entries read that no longer held their write (a stale entry; the next was tried).
    pub stale: AtomicU64,
    /// Re-publish rounds run.
    pub republishes: AtomicU64,
    /// Ring changes seen.
    pub ring_changes: AtomicU64,
    /// Values brought back from this peer's disk into its pool.
    pub promotes: AtomicU64,
    /// How long this peer's own puts took (copy into the pool, publish to the owners).
    pub put_latency: Latency,
    /// How long reads asked of this peer took (lookup at the owners, then the data), hit or
    /// miss.
    pub get_latency: Latency,
}

/// How much a peer's shard and pool hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerSizes {
    /// Directory entries in its shard.
    pub entries: usize,
    /// Values in its pool.
    pub values: usize,
    /// Pool bytes holding values (headers included).
    pub used_bytes: u64,
    /// The pool's size.
    pub pool_bytes: u64,
    /// Reads of its pool served over the network (a co-located peer reading through shared
    /// memory is not counted).
    pub reads_served: u64,
    /// Copies on its disk.
    pub disk_values: usize,
    /// Bytes of copies on its disk (and being written).
    pub disk_bytes: u64,
}

/// A running peer.
#[derive(Clone)]
pub struct PeerNode {
    inner: Arc<Inner>,
}

struct Inner {
    name: Box<str>,
    address: Box<str>,
    state: Mutex<PeerState>,
    membership: Mutex<Membership>,
    memory: SegmentMemory,
    /// The disk tier, if it has one.
    disk: Option<disk::PeerDisk>,
    data: Arc<dyn DataPlane>,
    links: Arc<PeerLinks>,
    clock: Clock,
    counts: Arc<PeerCounts>,
    /// Greeting rounds since another peer first answered (a peer without seeds is ready at
    /// once): clients are served from the second, once the gossip has filled the ring.
    rounds_joined: AtomicU64,
    /// Whether it was started with seeds to join.
    joins: bool,
    /// The data server (kept for as long as the peer runs: dropping it stops it).
    server: Arc<dyn DataServer>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl PeerNode {
    /// Maps the pool, starts serving, and starts greeting the seeds.
    pub async fn start(config: PeerConfig, token: Option<Credential>) -> Result<PeerNode> {
        let listener = TcpListener::bind(&config.listen).await.map_err(|e| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("cannot listen on {} for peers: {e}", config.listen),
            )
        })?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
        let address: Box<str> = match &config.advertise {
            Some(advertise) => advertise.as_str().into(),
            None if bound.ip().is_unspecified() => {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!(
                        "a peer listening on {bound} needs --advertise HOST:PORT: the address \
                         other peers reach it at"
                    ),
                ));
            }
            None => bound.to_string().into(),
        };
        let credential_name = token
            .as_ref()
            .and_then(|t| t.claims())
            .map(|c| c.name.clone());
        let name: Box<str> = match config.name.clone().or(credential_name) {
            Some(name) => name.into(),
            None => address.clone(),
        };
        let (memory, shared) =
            match segment_memory(config.size as usize, false, config.shared_memory) {
                Ok(memory) => (memory, config.shared_memory),
                Err(e) if config.shared_memory => {
                    warn!(
                        "no shared memory for the pool, peers on this host read it over TCP: {e}"
                    );
                    (segment_memory(config.size as usize, false, false)?, false)
                }
                Err(e) => return Err(e),
            };
        let disk = match &config.disk {
            Some(disk) => disk::PeerDisk::open(disk, &memory)
                .await
                .map(|d| (d, disk.capacity)),
            None => None,
        };
        let local = Arc::new(LocalSegments::default());
        let tcp: Arc<dyn DataServer> = TcpDataServer::start(
            &config.data_listen,
            None,
            local.clone(),
            random_client_id().0 as u64,
            crate::tuning::server_spin(),
            token.clone(),
        )
        .await?;
        let server = match shared {
            true => crate::transports::serve_shm(tcp.clone(), None).unwrap_or_else(|e| {
                warn!("peers on this host read this one's pool over TCP: {e}");
                tcp
            }),
            false => tcp,
        };
        let exported = server.export(memory.clone())?;
        let client = client_id_for(token.as_ref());
        let tcp_plane: Arc<dyn DataPlane> = TcpDataPlane::new(
            local,
            DataPlaneConfig {
                token: token.clone(),
                identity: client.0,
                ..Default::default()
            },
        );
        let data = match shared {
            true => crate::transports::same_host(tcp_plane, TransportChoice::Auto)?,
            false => tcp_plane,
        };
        let me = MemberInfo {
            name: name.clone(),
            address: address.clone(),
            data_endpoint: exported.endpoint.to_string().into(),
            data_key: exported.key,
            data_base: memory.base(),
            weight: config.weight.max(1),
        };
        // Stamps (which write is newest) come from this clock, so it reads the wall clock's
        // milliseconds: a restarted or new peer's writes must stamp above those made before
        // it started. It never goes back from there, even if the wall clock does.
        let clock = Clock::resuming(wall_clock_millis());
        let membership = Membership::new(
            me.clone(),
            config.seeds.clone(),
            config.membership,
            clock.now(),
        );
        let state = PeerState::new(
            &name,
            config.size,
            membership.ring().clone(),
            config.directory_replicas,
            config.read_grace,
        )
        .with_disk(disk.as_ref().map_or(0, |(_, capacity)| *capacity));
        let links = PeerLinks::new(Some(me), token.clone(), client.0, config.timeout);
        let peer = PeerNode {
            inner: Arc::new(Inner {
                name: name.clone(),
                address: address.clone(),
                state: Mutex::new(state),
                membership: Mutex::new(membership),
                memory,
                disk: disk.map(|(disk, _)| disk),
                data,
                links,
                clock,
                counts: Arc::default(),
                rounds_joined: AtomicU64::new(0),
                joins: !config.seeds.is_empty(),
                server,
                tasks: Mutex::new(Vec::new()),
            }),
        };
        let gate = Gate::new(token, Plane::Control)
            .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, e))?;
        let serving = spawn_peer_server(
            listener,
            Arc::new(service::Service(peer.clone())),
            Arc::new(gate),
            ConnectionLimits::standard(),
        );
        let rounds = [
            peer.every(config.greet_every, PeerNode::greet_round),
            peer.every(config.republish_every, PeerNode::republish_round),
            peer.every(Duration::from_millis(250), PeerNode::time_round),
        ];
        peer.inner
            .tasks
            .lock()
            .expect("task lock")
            .extend([serving].into_iter().chain(rounds));
        info!(peer = %name, %address, bytes = config.size, seeds = ?config.seeds, "peer started");
        Ok(peer)
    }

    /// The peer's name on the ring.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The address it is reached at.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// Where member `name` is reached, if it is a member now.
    fn address_of(&self, name: &str) -> Option<Box<str>> {
        let membership = self.inner.membership.lock().expect("membership lock");
        membership.address_of(name).map(Into::into)
    }

    /// Bytes of its disk tier (0: it has none, or its directory could not be used).
    pub fn disk_capacity(&self) -> u64 {
        let state = self.inner.state.lock().expect("peer state lock");
        state.pool().disk().capacity()
    }

    /// The counts since it started (they outlive the peer).
    pub fn counts(&self) -> Arc<PeerCounts> {
        self.inner.counts.clone()
    }

    /// The members of its ring, by name.
    pub fn members(&self) -> Vec<String> {
        let membership = self.inner.membership.lock().expect("membership lock");
        let ring = membership.ring();
        ring.members().iter().map(|m| m.name.to_string()).collect()
    }

    /// How much its shard and pool hold now.
    pub fn sizes(&self) -> PeerSizes {
        let state = self.inner.state.lock().expect("peer state lock");
        PeerSizes {
            entries: state.shard().len(),
            values: state.pool().len(),
            used_bytes: state.pool().used_bytes(),
            pool_bytes: self.inner.memory.len() as u64,
            reads_served: self.inner.server.counts().reads,
            disk_values: state.pool().disk().usage().0,
            disk_bytes: state.pool().disk().usage().1,
        }
    }

    /// Serves `/metrics` (Prometheus text), `/stats.json` and the dashboard (`/`) on
    /// `listen`, the figures behind `bearer` if given, for as long as the peer runs; returns
    /// the address bound.
    pub async fn serve_metrics(
        &self,
        listen: &str,
        bearer: Option<String>,
    ) -> Result<std::net::SocketAddr> {
        let peer = self.clone();
        let handler: crate::ops::http::Handler = Arc::new(move |request| match request.path {
            "/metrics" => crate::ops::http::Response::ok(
                "text/plain; version=0.0.4; charset=utf-8",
                crate::ops::metrics::peer_text(&peer),
            ),
            "/stats.json" => crate::ops::http::Response::ok(
                "application/json",
                crate::ops::metrics::peer_stats_json(&peer).to_string(),
            ),
            "/" | "/index.html" => {
                let page = crate::ops::metrics::PEER_DASHBOARD.as_str();
                crate::ops::http::Response::ok("text/html; charset=utf-8", page)
            }
            _ => crate::ops::http::Response::error(
                404,
                "no such page: try /metrics, /stats.json or / (the dashboard)",
            ),
        });
        let public = crate::ops::metrics::PUBLIC_PATHS;
        let (addr, task) = crate::ops::http::serve(listen, handler, bearer, public).await?;
        self.inner.tasks.lock().expect("task lock").push(task);
        Ok(addr)
    }

    /// Leaves the cluster: stops its rounds and serving, then tells every member it is going,
    /// so their rings drop it at once (a peer that only stops is dropped after its silence,
    /// and until then readers and removals may be sent to it). Its data is gone with it.
    pub async fn leave(&self) {
        let members: Vec<Box<str>> = {
            let membership = self.inner.membership.lock().expect("membership lock");
            let ring = membership.ring();
            ring.members()
                .iter()
                .filter(|m| m.name != self.inner.name)
                .filter_map(|m| membership.address_of(&m.name).map(Into::into))
                .collect()
        };
        self.stop();
        let goodbyes = members
            .iter()
            .map(|to| self.inner.links.call(to, &PeerRequest::Leave));
        for (to, answer) in members.iter().zip(join_all(goodbyes).await) {
            if let Err(e) = answer {
                debug!(peer = %to, "a goodbye was not heard (it notices the silence): {e}");
            }
        }
        info!(peer = %self.inner.name, told = members.len(), "peer left the cluster");
    }

    /// Stops serving and every round, without a word. Its data is gone with it (other
    /// peers notice it silent, and drop its entries).
    pub fn stop(&self) {
        for task in self.inner.tasks.lock().expect("task lock").drain(..) {
            task.abort();
        }
    }

    /// Runs `round` every `period` until the peer stops.
    fn every<F, Fut>(&self, period: Duration, round: F) -> JoinHandle<()>
    where
        F: Fn(PeerNode) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let peer = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                round(peer.clone()).await;
            }
        })
    }

    /// Greets every peer it knows of (all at once), then checks who fell silent.
    async fn greet_round(self) {
        let (to_greet, hello) = {
            let membership = self.inner.membership.lock().expect("membership lock");
            let hello = PeerRequest::Hello {
                me: membership.me().clone(),
                known: membership.gossip().iter().map(|n| n.to_string()).collect(),
            };
            (membership.to_greet(), hello)
        };
        let calls = to_greet.iter().map(|to| self.inner.links.call(to, &hello));
        let answers = join_all(calls).await;
        for (to, answer) in to_greet.iter().zip(answers) {
            match answer {
                Ok(PeerReply::Welcome { me, known }) if me.address == *to => {
                    let change = self.heard_from(me, known);
                    self.apply(change).await;
                }
                Ok(other) => debug!(peer = %to, "a greeting answered with {other:?}"),
                Err(e) => debug!(peer = %to, "greeting failed: {e}"),
            }
        }
        let now = self.inner.clock.now();
        let (change, members) = {
            let mut membership = self.inner.membership.lock().expect("membership lock");
            (membership.tick(now), membership.ring().members().len())
        };
        if members > 1 || self.inner.rounds_joined.load(Ordering::Relaxed) > 0 {
            self.inner.rounds_joined.fetch_add(1, Ordering::Relaxed);
        }
        self.apply(change).await;
    }

    /// Whether the peer serves clients: it has no seeds, or has heard from the cluster and
    /// greeted everyone it learned of since.
    pub fn is_ready(&self) -> bool {
        !self.inner.joins || self.inner.rounds_joined.load(Ordering::Relaxed) >= 2
    }

    /// Peer `info` greeted or answered, knowing of `known`.
    fn heard_from(&self, info: MemberInfo, known: Vec<String>) -> MembershipChange {
        let now = self.inner.clock.now();
        let mut membership = self.inner.membership.lock().expect("membership lock");
        membership.heard_from(info, known, now)
    }

    /// Applies a membership change: a lost peer's entries go, and a new ring re-publishes.
    async fn apply(&self, change: MembershipChange) {
        if change.ring.is_none() && change.lost.is_empty() {
            return;
        }
        let now = self.inner.clock.now();
        let out = {
            let mut state = self.inner.state.lock().expect("peer state lock");
            for lost in &change.lost {
                let dropped = state.peer_lost(&lost.name, now);
                info!(peer = %self.inner.name, lost = %lost.name, dropped, "peer lost");
            }
            match change.ring {
                Some(ring) => {
                    info!(
                        peer = %self.inner.name,
                        joined = ?change.joined,
                        members = ring.members().len(),
                        "ring changed"
                    );
                    self.inner
                        .counts
                        .ring_changes
                        .fetch_add(1, Ordering::Relaxed);
                    state.ring_changed(ring, now)
                }
                None => Vec::new(),
            }
        };
        for lost in &change.lost {
            self.inner.links.forget(&lost.address);
        }
        self.deliver(out).await;
    }

    /// Re-publishes everything held to its owners.
    async fn republish_round(self) {
        let out = self
            .inner
            .state
            .lock()
            .expect("peer state lock")
            .republish();
        self.inner
            .counts
            .republishes
            .fetch_add(1, Ordering::Relaxed);
        self.deliver(out).await;
    }

    async fn time_round(self) {
        let now = self.inner.clock.now();
        self.inner.state.lock().expect("peer state lock").tick(now);
    }
}
