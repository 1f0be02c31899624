//! A group master's process: it serves through its role handler (over either transport),
//! takes part in the group on the simulated etcd (following, campaigning, leading) until
//! killed, and tells the world each time it begins leading and each answer it gives as
//! leader.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mooring::MasterService;
use mooring::ha::RoleHandler;
use mooring::ha::etcd::{DialLeader, GroupConfig};
use mooring_proto::transport::{Answer, ControlPlane, RpcHandler};
use mooring_proto::wire::{MasterRequest, MasterResponse};
use mooring_transport_sim::SimControlPlane;
use mooring_transport_sim::state_dir::SimStateDir;
use mooring_transport_tcp::limits::ConnectionLimits;
use tracing::info;

use crate::members::{CALL_TIMEOUT, cluster_token, io_error};
use crate::plan::Transport;
use crate::world::{World, etcd_addr, group_master_addr};

/// Master `k` of a group. Each start is a new process with the directory the last
/// incarnation left.
pub async fn group_master(world: Arc<World>, k: usize) {
    let handler = Arc::new(RoleHandler::default());
    world.set_group_handler(k, handler.clone());
    let addr = group_master_addr(k);
    let watched: Arc<dyn RpcHandler> = Arc::new(Watched {
        world: world.clone(),
        master: k,
        role: handler.clone(),
    });
    // Kept while the process lives (madsim ends the tasks when it kills the node).
    let _serving = match world.plan.transport {
        Transport::Tcp => {
            let limits = ConnectionLimits::standard();
            let gate = mooring::master::control_gate(Some(cluster_token())).expect("the secret");
            mooring::master::serve_rpc(&addr.to_string(), watched, gate, limits)
                .await
                .map(|(_, task)| task)
        }
        Transport::Sim | Transport::Rdma | Transport::Shm => {
            mooring_transport_sim::serve_rpc(world.net.clone(), addr, watched)
                .await
                .map_err(|e| io_error("binding the master", e))
        }
    }
    .expect("the simulated master binds");
    let w = world.clone();
    let config = GroupConfig {
        endpoints: vec![etcd_addr().to_string()],
        cluster: "sim".into(),
        advertise: addr.to_string(),
        // madsim's etcd expires leases on whole-second ticks, so up to a second sooner than
        // their TTL: the leaders must stop that much earlier (the supervisor checks that no
        // two masters ever grant at once).
        lease_ttl: Duration::from_secs(3),
        lease_margin: Duration::from_millis(1250),
        standby_timeout: Duration::from_secs(1),
        state_dir: Arc::new(SimStateDir::new(world.group_disk(k))),
        master: world.plan.master.clone(),
        snapshot_after: 16 << 10,
        token: Some(cluster_token()),
        on_lead: Some(Arc::new(move |service: &Arc<MasterService>| {
            info!(master = k, "leads the group");
            service.audit();
            service.keep_events();
            w.set_leader(k, service.clone());
        })),
        dial: world
            .plan
            .transport
            .datagrams()
            .then(|| dial_over_datagrams(&world, addr)),
    };
    if let Err(e) = mooring::ha::etcd::run(config, handler).await {
        info!(master = k, "left the group: {e}");
    }
}

/// How a standby at `me` follows the leader over the simulated network's datagrams, so the
/// network's faults reach log shipping too.
fn dial_over_datagrams(world: &Arc<World>, me: SocketAddr) -> DialLeader {
    let net = world.net.clone();
    Arc::new(move |leader: String| {
        let net = net.clone();
        Box::pin(async move {
            let leader: SocketAddr = leader.parse().map_err(|e| {
                mooring_core::Error::new(
                    mooring_core::ErrorCode::INVALID_PARAMS,
                    format!("the leader's address {leader:?}: {e}"),
                )
            })?;
            // A follow waits up to half a second for news before answering.
            let control = SimControlPlane::new(net, me.ip(), leader, CALL_TIMEOUT * 2)
                .await
                .map_err(|e| io_error("binding a control endpoint", e))?;
            Ok(control as Arc<dyn ControlPlane>)
        })
    })
}

/// A group master's role handler, noting each answer it gives as leader.
struct Watched {
    world: Arc<World>,
    master: usize,
    role: Arc<RoleHandler>,
}

impl Watched {
    fn note(&self) {
        // Nothing runs between this look and the answer (one simulated thread, no await).
        if self.role.grants() {
            self.world.answered_as_leader(self.master);
        }
    }
}

impl RpcHandler for Watched {
    fn handle(&self, request: MasterRequest) -> MasterResponse {
        self.note();
        self.role.handle(request)
    }

    fn answer(&self, request: MasterRequest) -> Answer {
        self.note();
        self.role.answer(request)
    }
}
