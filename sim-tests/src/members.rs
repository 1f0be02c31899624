//! The simulated members: each runs the unchanged store code on its own madsim node, over
//! either transport.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mooring::node::disk_tier::{DiskDevice, DiskTierConfig};
use mooring::{
    Client, ClientConfig, Contribution, MasterService, NodeConfig, RunningMaster, SegmentConfig,
    StandaloneNode, random_client_id,
};
use mooring_core::{ClientId, Result};
use mooring_proto::auth::{Claims, Credential, DEFAULT_TENANT, Roles};
use mooring_proto::transport::{ControlPlane, DataPlane, DataServer, RpcHandler};
use mooring_transport_rdma::model::ModelVerbs;
use mooring_transport_rdma::{RdmaClient, RdmaConfig, RdmaDataPlane, RdmaDataServer, RdmaServer};
use mooring_transport_shm::{ShmDataPlane, ShmDataServer};
use mooring_transport_sim::{SimControlPlane, SimDataPlane, SimDataServer, serve_rpc};
use mooring_transport_tcp::{DataPlaneConfig, LocalSegments};
use tracing::{debug, info};

use crate::plan::{Member, Transport};
use crate::workload::Workload;
use crate::world::{DATA_PORT, World, ip, master_addr};

/// How long any one RPC or transfer may take before the caller gives up.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The simulated cluster's token: every TCP connection opens with the real handshake. Only
/// masters hold it; every other member holds a credential issued from it
/// ([`credential_for`]).
pub(crate) fn cluster_token() -> Credential {
    Credential::from_secret([0x5A; 32])
}

/// The credential the member at `at` holds over TCP, named after its address: a node's
/// (and its repair agent's) `node,client`; the final checker's `client,admin` (it removes
/// everything); another client's `client`, and `node` too when it contributes memory. So
/// every honest call of a TCP seed passes the master's role checks, and a check that refuses
/// honest work fails the seed.
pub(crate) fn credential_for(at: IpAddr, contributes: bool) -> Credential {
    let octets = match at {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(_) => unreachable!("the simulation's addresses are IPv4"),
    };
    let roles = match octets[2] {
        1 => Roles::NODE.union(Roles::CLIENT),
        3 => Roles::CLIENT.union(Roles::ADMIN),
        _ if contributes => Roles::NODE.union(Roles::CLIENT),
        _ => Roles::CLIENT,
    };
    cluster_token()
        .issue(Claims {
            name: format!("m{}-{}-{}", octets[1], octets[2], octets[3]),
            tenant: DEFAULT_TENANT.into(),
            roles,
            serial: u64::from(u32::from_be_bytes(octets)),
            expires: 0,
        })
        .expect("the cluster token issues")
}

pub(crate) fn io_error(what: &str, e: std::io::Error) -> mooring_core::Error {
    mooring_core::Error::new(
        mooring_core::ErrorCode::INTERNAL_ERROR,
        format!("{what}: {e}"),
    )
}

/// The master's node: serves until killed.
pub async fn master(world: Arc<World>) {
    let config = world.plan.master.clone();
    // In runs that kill it, the master keeps its state and each start recovers it; small
    // snapshots, so runs cross journal generations.
    let service = if world.plan.master_state {
        // A start that finds its disk full or failing fails; the supervisor starts it again.
        loop {
            match world.start_persistent_master(config.clone()) {
                Ok(service) => break service,
                Err(e) if World::start_may_retry(&e) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("the simulated master starts: {e}"),
            }
        }
    } else {
        MasterService::new(config).expect("the simulated master starts")
    };
    match world.plan.transport {
        Transport::Tcp => {
            let running =
                RunningMaster::serve(&master_addr().to_string(), service, Some(cluster_token()))
                    .await
                    .expect("the simulated master starts");
            running.service.audit();
            running.service.keep_events();
            world.set_master(running.service.clone());
            std::future::pending::<()>().await;
            drop(running);
        }
        Transport::Sim | Transport::Rdma | Transport::Shm => {
            service.audit();
            service.keep_events();
            let _timer = service.spawn_timer();
            let handler: Arc<dyn RpcHandler> = service.clone();
            let _server = serve_rpc(world.net.clone(), master_addr(), handler)
                .await
                .expect("the simulated master binds");
            world.set_master(service);
            std::future::pending::<()>().await;
        }
    }
}

/// A storage node's process: joins (retrying while the master is unreachable), then serves
/// until killed. Every start is a new process: fresh memory, a fresh client id.
pub async fn storage_node(world: Arc<World>, i: usize) {
    let name = format!("node{i}");
    loop {
        match start_node(&world, i, &name).await {
            Ok(node) => {
                info!(%name, "storage node up");
                world.set_node(i, node.node().clone());
                // As `mooring node` does: a client of its own copies back replicas other
                // nodes lost (dies with the node).
                let _repairs = match connect(&world, ip(Member::Node(i)), None).await {
                    Ok(repairer) => Some(repairer.spawn_repairs(200)),
                    Err(e) => {
                        debug!(%name, "no repair agent: {e}");
                        None
                    }
                };
                std::future::pending::<()>().await;
                drop(node);
            }
            Err(e) => {
                debug!(%name, "storage node failed to start, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn start_node(world: &Arc<World>, i: usize, name: &str) -> Result<StandaloneNode> {
    let credential = credential_for(ip(Member::Node(i)), true);
    let id = ClientId(credential.client_id(random_client_id().0));
    let disk = world.plan.disk.as_ref().map(|d| DiskTierConfig {
        device: Some(DiskDevice(world.disks[i].clone())),
        backend: d.backend,
        capacity: d.capacity,
        eviction: d.eviction,
        group_keys: d.group_keys,
        staging: d.staging,
        slot_ttl: d.slot_ttl,
        sync_interval: d.sync_interval,
        batch: 8,
        watch: Some(crate::recovery::watch(Arc::downgrade(world), i)),
        ..DiskTierConfig::new(name)
    });
    let config = NodeConfig {
        name: Some(name.to_string()),
        size: world.plan.shape.node_bytes,
        prefault: false,
        shared: world.plan.transport == Transport::Shm,
        shm_group: None,
        disk,
    };
    let member = Member::Node(i);
    match world.plan.transport {
        Transport::Tcp => {
            let segment = SegmentConfig {
                node: config,
                listen: format!("{}:{DATA_PORT}", ip(member)),
                advertise: None,
                rdma_devices: None,
            };
            StandaloneNode::start(
                &world.master_target(),
                Some(id),
                &segment,
                Arc::new(LocalSegments::default()),
                Some(credential),
            )
            .await
        }
        Transport::Sim | Transport::Rdma | Transport::Shm => {
            let (control, contribution) = sim_member(world, ip(member), id, Some(config)).await?;
            let contribution = contribution.expect("asked for a contribution");
            StandaloneNode::with_transport(id, control, contribution).await
        }
    }
}

/// Control plane and (optionally) a contribution over transport-sim for a member at `at`.
async fn sim_member(
    world: &World,
    at: IpAddr,
    id: ClientId,
    segment: Option<NodeConfig>,
) -> Result<(Arc<dyn ControlPlane>, Option<Contribution>)> {
    let net = world.net.clone();
    let control: Arc<dyn ControlPlane> =
        SimControlPlane::group(net.clone(), at, world.master_addrs(), CALL_TIMEOUT)
            .await
            .map_err(|e| io_error("binding a control endpoint", e))?;
    let contribution = match segment {
        Some(config) => {
            let bind = std::net::SocketAddr::new(at, DATA_PORT);
            let seed = id.0 as u64 ^ (id.0 >> 64) as u64;
            let sim_server = SimDataServer::start(net, bind, seed)
                .await
                .map_err(|e| io_error("binding the data server", e))?;
            let endpoint = sim_server.endpoint().to_string();
            let server: Arc<dyn DataServer> = match world.plan.transport {
                // The member's own RDMA device (its host's NIC), for this incarnation.
                Transport::Rdma => Arc::new(RdmaDataServer::new(
                    sim_server,
                    Arc::new(RdmaServer::new(Arc::new(rdma_device(world, at)), 64)),
                )),
                // Offered to clients on the member's host too.
                Transport::Shm => Arc::new(ShmDataServer::new(
                    sim_server,
                    world.sockets.serve(host_of(at)),
                )),
                Transport::Tcp | Transport::Sim => sim_server,
            };
            Some(Contribution {
                config,
                default_name: endpoint,
                server,
            })
        }
        None => None,
    };
    Ok((control, contribution))
}

/// Connects a client at address `at`, contributing a segment named `segment` if given.
pub async fn connect(world: &World, at: IpAddr, segment: Option<String>) -> Result<Client> {
    let credential = credential_for(at, segment.is_some());
    let id = ClientId(credential.client_id(random_client_id().0));
    let segment = segment.map(|name| NodeConfig {
        name: Some(name),
        size: world.plan.shape.client_bytes,
        prefault: false,
        shared: world.plan.transport == Transport::Shm,
        shm_group: None,
        disk: None,
    });
    match world.plan.transport {
        Transport::Tcp => {
            let mut config = ClientConfig::new(world.master_target());
            config.id = Some(id);
            config.rpc_timeout = CALL_TIMEOUT;
            config.token = Some(credential);
            config.data = DataPlaneConfig {
                timeout: CALL_TIMEOUT,
                spin: Duration::ZERO,
                stripes: 2,
                ..DataPlaneConfig::default()
            };
            config.segment = segment.map(|node| SegmentConfig {
                node,
                listen: format!("{at}:{DATA_PORT}"),
                advertise: None,
                rdma_devices: None,
            });
            Client::connect(config).await
        }
        Transport::Sim | Transport::Rdma | Transport::Shm => {
            let (control, contribution) = sim_member(world, at, id, segment).await?;
            let mut data: Arc<dyn DataPlane> =
                SimDataPlane::new(world.net.clone(), at, CALL_TIMEOUT)
                    .await
                    .map_err(|e| io_error("binding a data endpoint", e))?;
            if world.plan.transport == Transport::Rdma {
                let config = RdmaConfig {
                    timeout: CALL_TIMEOUT,
                    ..RdmaConfig::default()
                };
                let client = RdmaClient::new(Arc::new(rdma_device(world, at)), config);
                // Every node serves RDMA: bulk bytes never fall back to datagrams.
                data = Arc::new(RdmaDataPlane::new(client, data, true));
            }
            if world.plan.transport == Transport::Shm {
                // Nodes on other hosts through datagrams.
                data = Arc::new(ShmDataPlane::with_handoff(
                    data,
                    false,
                    host_of(at),
                    world.sockets.handoff(),
                ));
            }
            Client::with_transport(id, control, data, contribution).await
        }
    }
}

/// The host of the member at `at` in shm runs: two hosts, by the parity of the address's
/// last byte (node `i` shares a host with client `j` when `i` and `j` are both even or both
/// odd).
fn host_of(at: IpAddr) -> [u8; 16] {
    let last = match at {
        IpAddr::V4(v4) => v4.octets()[3],
        IpAddr::V6(v6) => v6.octets()[15],
    };
    [last % 2; 16]
}

/// A device on the run's fabric for the member at `at` (named by its address, so the
/// fabric's partitions follow the network's).
fn rdma_device(world: &World, at: IpAddr) -> ModelVerbs {
    // Small messages, so values split and stripe over queue pairs as large ones do on a NIC.
    world
        .fabric
        .device(&at.to_string(), ModelVerbs::caps(64 << 10))
}

/// A client's process: connects, works through its share of the operations, leaves.
/// A restarted client is a new process (a new id) that carries on with what is left.
pub async fn client(world: Arc<World>, j: usize) {
    let member = Member::Client(j);
    let incarnation = world.incarnations[j].fetch_add(1, Ordering::Relaxed);
    let contributes = j < world.plan.shape.contributing;
    let client = loop {
        if world.budgets[j].load(Ordering::Relaxed) == 0 {
            world.finished[j].store(true, Ordering::Relaxed);
            return;
        }
        let segment = contributes.then(|| member.to_string());
        match connect(&world, ip(member), segment).await {
            Ok(client) => break client,
            Err(e) => {
                debug!(%member, "cannot connect yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // Several operations in flight on one client, each stream taking from the client's budget.
    let streams = (0..world.plan.streams).map(|stream| {
        let mut workload = Workload::new(world.clone(), client.clone(), j, incarnation, stream);
        let world = world.clone();
        async move {
            while world.take_op(j) {
                workload.step().await;
            }
        }
    });
    futures_util::future::join_all(streams).await;
    if let Err(e) = client.close().await {
        debug!(%member, "leaving: {e}");
    }
    world.finished[j].store(true, Ordering::Relaxed);
}
