//! Connecting over TCP: clients, optionally contributing a segment (a standalone node
//! connects the same way: `crate::node::standalone`).

use std::sync::Arc;
use std::time::Duration;

use mooring_core::{ClientId, Error, ErrorCode, Result};
use mooring_proto::auth::Credential;

use mooring_transport_tcp::{
    DataPlaneConfig, LocalSegments, TcpControlPlane, TcpDataPlane, TcpDataServer,
};

use crate::buggify::{self, Site};
use crate::client::Client;
use crate::client::presence::Contribution;
use crate::node::NodeConfig;

/// Where and how a contributed segment is served.
#[derive(Clone, Debug)]
pub struct SegmentConfig {
    /// The segment.
    pub node: NodeConfig,
    /// Address the data server binds.
    pub listen: String,
    /// Address clients are told to connect to (default: the bound address).
    pub advertise: Option<String>,
    /// Serve RDMA too, on the first of these devices that exists (empty: any device);
    /// `None`: TCP only.
    pub rdma_devices: Option<Vec<String>>,
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
    /// The cluster token; when `None`, the file `MOORING_TOKEN_FILE` names, if set.
    pub token: Option<Credential>,
    /// How to reach nodes (`auto`: RDMA where a node serves it and this process has a
    /// device, else TCP).
    pub transport: crate::transports::TransportChoice,
    /// RDMA devices to try, in order (empty: any device).
    pub rdma_devices: Vec<String>,
    /// The tenant whose keys the client reads and writes (`None`: its credential's, or the
    /// default tenant). A member credential of another tenant is refused.
    pub tenant: Option<String>,
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
            token: None,
            transport: crate::transports::TransportChoice::Auto,
            rdma_devices: Vec::new(),
            tenant: None,
        }
    }

    /// Contributing a `size`-byte segment served on `listen`.
    pub fn contributing(mut self, size: u64, listen: impl Into<String>) -> ClientConfig {
        self.segment = Some(SegmentConfig {
            node: NodeConfig {
                name: None,
                size,
                prefault: true,
                shared: false,
                shm_group: None,
                disk: None,
            },
            listen: listen.into(),
            advertise: None,
            rdma_devices: None,
        });
        self
    }
}

/// A fresh random client id (in simulation builds, drawn from the run's seeded generator, so
/// a seed replays with the same ids).
pub fn random_client_id() -> ClientId {
    #[cfg(madsim)]
    return ClientId(madsim::rand::random::<u128>());
    #[cfg(not(madsim))]
    {
        use std::collections::hash_map::RandomState;
        use std::hash::BuildHasher;
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let state = RandomState::new();
        ClientId((u128::from(state.hash_one(n)) << 64) | u128::from(state.hash_one(!n)))
    }
}

/// A fresh client id for a holder of `token`: a member credential's ids carry its tag in the
/// high half, and the master refuses any other id from it.
pub fn client_id_for(token: Option<&Credential>) -> ClientId {
    let random = random_client_id();
    token.map_or(random, |token| ClientId(token.client_id(random.0)))
}

/// The TCP transports of one process member, sharing its local-segment registry.
struct Transports {
    control: Arc<TcpControlPlane>,
    data: Arc<TcpDataPlane>,
    local: Arc<LocalSegments>,
}

/// A control plane to the master at `master`: one address, a group's (`A,B,C`), or where
/// etcd finds the group's masters (`etcd://HOST:PORT[/CLUSTER]`, see
/// [`crate::ha::discovery`]); calls time out after `timeout`.
pub fn control_plane(
    master: &str,
    timeout: Duration,
    token: Option<Credential>,
    id: ClientId,
) -> Result<Arc<TcpControlPlane>> {
    let spin = crate::tuning::client_spin();
    Ok(match crate::ha::discovery::EtcdMasters::parse(master)? {
        Some(etcd) => {
            let label = etcd.to_string();
            let etcd = Arc::new(etcd);
            let discover: mooring_transport_tcp::Discover = Arc::new(move || {
                let etcd = etcd.clone();
                Box::pin(async move { etcd.masters().await })
            });
            TcpControlPlane::discovered(label, discover, timeout, spin, token, id)
        }
        None => TcpControlPlane::new(master, timeout, spin, token, id),
    })
}

fn transports(
    config: &ClientConfig,
    id: ClientId,
    token: Option<Credential>,
    local: Arc<LocalSegments>,
) -> Result<Transports> {
    Ok(Transports {
        control: control_plane(
            &config.master,
            buggify::timeout(Site::CLIENT_RPC_TIMEOUT, config.rpc_timeout),
            token.clone(),
            id,
        )?,
        data: TcpDataPlane::new(
            local.clone(),
            DataPlaneConfig {
                token,
                identity: id.0,
                ..config.data.clone()
            },
        ),
        local,
    })
}

/// Starts a data server for `segment` and describes the contribution.
pub(crate) async fn contribution(
    segment: &SegmentConfig,
    token: Option<Credential>,
    local: Arc<LocalSegments>,
) -> Result<Contribution> {
    // Data-plane keys derive from a fresh random seed, not from anything a peer can see.
    let key_seed = random_client_id().0 as u64;
    let server = TcpDataServer::start(
        &segment.listen,
        segment.advertise.clone(),
        local,
        key_seed,
        crate::tuning::server_spin(),
        token,
    )
    .await?;
    let default_name = server.endpoint().to_string();
    let server: Arc<dyn mooring_proto::transport::DataServer> = match &segment.rdma_devices {
        Some(devices) => crate::transports::serve_rdma(server, devices, segment.node.size)?,
        None => server,
    };
    let server = match segment.node.shared {
        true => crate::transports::serve_shm(server, segment.node.shm_group)?,
        false => server,
    };
    Ok(Contribution {
        config: segment.node.clone(),
        server,
        default_name,
    })
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
        if crate::peer::peer_addresses(&config.master).is_some() {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                format!(
                    "{} names a peer cluster, and this client needs a master: a peer cluster \
                     serves the CLI's put, get and rm, and mooring.store",
                    config.master
                ),
            ));
        }
        let token = match &config.token {
            Some(token) => Some(token.clone()),
            None => crate::token::resolve(None)?,
        };
        let id = config.id.unwrap_or_else(|| client_id_for(token.as_ref()));
        let tenant = tenant_for(config.tenant.as_deref(), token.as_ref())?;
        let t = transports(&config, id, token.clone(), local)?;
        let contribution = match &config.segment {
            Some(segment) => Some(contribution(segment, token, t.local).await?),
            None => None,
        };
        let data =
            crate::transports::client_data_plane(t.data, config.transport, &config.rdma_devices)?;
        Client::in_tenant(&tenant, id, t.control, data, contribution).await
    }
}

/// The tenant a client acts in: the one asked for, which a member credential must belong to;
/// else the credential's; else the default tenant.
pub fn tenant_for(asked: Option<&str>, token: Option<&Credential>) -> Result<String> {
    let held = token
        .and_then(Credential::claims)
        .map(|c| c.tenant.as_str());
    match (asked, held) {
        (Some(asked), Some(held)) if asked != held => Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "this process's credential belongs to tenant {held:?}, not {asked:?}: issue it a \
                 credential for {asked:?} (`mooring token issue --tenant {asked}`) or leave the \
                 tenant unset"
            ),
        )),
        (Some(asked), _) => Ok(asked.to_string()),
        (None, Some(held)) => Ok(held.to_string()),
        (None, None) => Ok(mooring_core::tenant::DEFAULT_TENANT.to_string()),
    }
}
