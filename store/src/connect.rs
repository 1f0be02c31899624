//! Connecting over TCP: clients (optionally contributing a segment) and standalone nodes.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mooring_core::transport::{ControlPlane, DataPlane, DataServer};
use mooring_core::wire::{MasterRequest, Reply};
use mooring_core::{ClientId, Result};
use mooring_transport_tcp::{
    DataPlaneConfig, LocalSegments, TcpControlPlane, TcpDataPlane, TcpDataServer,
};
use tokio::task::JoinHandle;

use crate::client::{Client, heartbeat_interval};
use crate::node::{Node, NodeConfig, spawn_heartbeat, unexpected};

/// Where and how a contributed segment is served.
#[derive(Clone, Debug)]
pub struct SegmentConfig {
    /// The segment.
    pub node: NodeConfig,
    /// Address the data server binds.
    pub listen: String,
    /// Address clients are told to connect to (default: the bound address).
    pub advertise: Option<String>,
}

/// How to connect a client.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The master's address.
    pub master: String,
    /// This client's id (default: random).
    pub id: Option<ClientId>,
    /// Time allowed for one RPC to the master.
    pub rpc_timeout: Duration,
    /// Data-plane behaviour.
    pub data: DataPlaneConfig,
    /// Memory this client contributes, if any.
    pub segment: Option<SegmentConfig>,
}

impl ClientConfig {
    /// A pure client of the master at `master`.
    pub fn new(master: impl Into<String>) -> ClientConfig {
        ClientConfig {
            master: master.into(),
            id: None,
            rpc_timeout: Duration::from_secs(10),
            data: DataPlaneConfig {
                spin: crate::tuning::client_spin(),
                stripes: crate::tuning::stripes(),
                ..DataPlaneConfig::default()
            },
            segment: None,
        }
    }

    /// Contributing a `size`-byte segment served on `listen`.
    pub fn contributing(mut self, size: u64, listen: impl Into<String>) -> ClientConfig {
        self.segment = Some(SegmentConfig {
            node: NodeConfig {
                name: None,
                size,
                prefault: true,
            },
            listen: listen.into(),
            advertise: None,
        });
        self
    }
}

/// A fresh random client id.
pub fn random_client_id() -> ClientId {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let state = RandomState::new();
    ClientId((u128::from(state.hash_one(n)) << 64) | u128::from(state.hash_one(!n)))
}

/// The TCP transports of one process member, sharing its local-segment registry.
struct Transports {
    control: Arc<TcpControlPlane>,
    data: Arc<TcpDataPlane>,
    local: Arc<LocalSegments>,
}

fn transports(config: &ClientConfig, local: Arc<LocalSegments>) -> Transports {
    Transports {
        control: TcpControlPlane::new(
            config.master.clone(),
            config.rpc_timeout,
            crate::tuning::client_spin(),
        ),
        data: TcpDataPlane::new(local.clone(), config.data.clone()),
        local,
    }
}

async fn start_node(
    id: ClientId,
    segment: &SegmentConfig,
    control: Arc<dyn ControlPlane>,
    local: Arc<LocalSegments>,
) -> Result<Node> {
    let server = TcpDataServer::start(
        &segment.listen,
        segment.advertise.clone(),
        local,
        id.0 as u64 ^ (id.0 >> 64) as u64,
        crate::tuning::server_spin(),
    )
    .await?;
    let default_name = server.endpoint().to_string();
    let server: Arc<dyn DataServer> = server;
    Node::start(id, &segment.node, control, server, &default_name).await
}

impl Client {
    /// Connects to the master over TCP (and mounts this client's segment, if it contributes
    /// one).
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        Client::connect_with(config, Arc::new(LocalSegments::default())).await
    }

    /// [`Client::connect`] sharing `local` with other members of this process, so transfers
    /// to their segments are a `memcpy`.
    pub async fn connect_with(config: ClientConfig, local: Arc<LocalSegments>) -> Result<Client> {
        let id = config.id.unwrap_or_else(random_client_id);
        let t = transports(&config, local);
        let control: Arc<dyn ControlPlane> = t.control;
        let data: Arc<dyn DataPlane> = t.data;
        let node = match &config.segment {
            Some(segment) => Some(start_node(id, segment, control.clone(), t.local).await?),
            None => None,
        };
        Client::with_transport(id, control, data, node).await
    }
}

/// A standalone storage node: a segment kept mounted by its own heartbeat.
pub struct StandaloneNode {
    /// The segment.
    pub node: Node,
    heartbeat: JoinHandle<()>,
    lease: Duration,
}

impl StandaloneNode {
    /// Starts serving `segment` to the master at `master`.
    pub async fn start(
        master: &str,
        id: Option<ClientId>,
        segment: &SegmentConfig,
        local: Arc<LocalSegments>,
    ) -> Result<StandaloneNode> {
        let id = id.unwrap_or_else(random_client_id);
        let control: Arc<dyn ControlPlane> = TcpControlPlane::new(
            master,
            Duration::from_secs(10),
            crate::tuning::client_spin(),
        );
        let info = match control.call(MasterRequest::Hello { client: id }).await? {
            Reply::Hello(info) => info,
            other => return Err(unexpected(&other)),
        };
        let node = start_node(id, segment, control.clone(), local).await?;
        let heartbeat = spawn_heartbeat(id, control, heartbeat_interval(&info), Some(node.clone()));
        Ok(StandaloneNode {
            node,
            heartbeat,
            lease: Duration::from_millis(info.lease_ttl.as_millis()),
        })
    }

    /// Unmounts cleanly: stops heartbeating, unmounts, serves readers for a lease, stops.
    pub async fn shutdown(self) -> Result<()> {
        self.heartbeat.abort();
        self.node.shutdown(self.lease).await
    }
}
