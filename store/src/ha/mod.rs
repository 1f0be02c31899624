//! Standby masters: several `mooring master --etcd URL` processes, one leading, the others
//! keeping a synced copy of its state directory and ready to take over.
//!
//! - **Election** (`etcd`): every master holds an etcd lease and campaigns under
//!   `/mooring/<cluster>/leader` when it may lead. The leader serves only while its lease is
//!   surely alive ([`mooring_core::leadership`]): a deposed leader stops granting before etcd
//!   lets a rival win.
//! - **Log shipping** ([`ship`], [`standby`]): standbys fetch the leader's journal and
//!   snapshots with `Follow` requests and sync them into their own state directory before
//!   asking for more; the leader acknowledges a change only once it and every **in-sync**
//!   standby hold it ([`mooring_core::log_shipping`]).
//! - **Who may take over**: the in-sync set is kept in etcd (`/mooring/<cluster>/in-sync`),
//!   changed only by the leader (guarded by its election key): a standby joins after catching
//!   up and is dropped, before anything is acknowledged without it, when it falls behind. Only
//!   a master in that set campaigns, so a new leader holds every acknowledged change; it
//!   recovers from its copy exactly like a restarted master ([`crate::master::journal::recover`]).
//! - **Everyone else** (clients, nodes, other standbys) is given every master's address
//!   (`--master A,B,C`), or where etcd is (`--master etcd://HOST:PORT`, [`discovery`]):
//!   standbys refuse with `UNAVAILABLE_IN_CURRENT_STATUS`, naming the leader, and callers move
//!   on to the next address.

pub mod discovery;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod ship;
pub mod standby;

use std::sync::{Arc, Mutex, RwLock};

use mooring_core::leadership::LeaderLease;
use mooring_core::{Error, ErrorCode};
use mooring_proto::transport::{Answer, RpcHandler};
use mooring_proto::wire::{MasterRequest, MasterResponse};

use mooring_transport_tcp::limits::ConnectionLimits;

use crate::clock::Clock;
use crate::master::MasterService;

/// Waits until nothing but the caller holds `service` (requests it was serving have been
/// answered), then drops it, which writes and closes its journal: only then may another
/// service open the same state directory.
pub async fn retire(service: Arc<MasterService>) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while Arc::strong_count(&service) > 1 {
        if tokio::time::Instant::now() > deadline {
            tracing::error!(
                "a deposed leader's requests still hold its state after 30 s; going on"
            );
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(service);
}

/// etcd's client URLs from `--etcd`: comma- or semicolon-separated, with or without Mooncake's
/// `etcd://` prefix; bare `host:port` entries get `http://`.
pub fn etcd_endpoints(text: &str) -> Result<Vec<String>, String> {
    let text = text.trim();
    let text = text.strip_prefix("etcd://").unwrap_or(text);
    let endpoints: Vec<String> = text
        .split([',', ';'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_string()
            } else {
                format!("http://{e}")
            }
        })
        .collect();
    if endpoints.is_empty() {
        return Err(format!("--etcd {text:?} names no etcd endpoint"));
    }
    Ok(endpoints)
}

/// The address a master listening on `listen` is reached at: `listen` itself, unless it is a
/// wildcard address, which names no host for others to dial.
pub fn advertised(listen: &str) -> Result<String, String> {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(addr) if addr.ip().is_unspecified() => Err(format!(
            "--listen {listen} is a wildcard address: give --advertise HOST:PORT, the address \
             the other masters, nodes and clients reach this master at"
        )),
        _ => Ok(listen.to_string()),
    }
}

/// A group master's RPC port, as [`serve`] bound it.
pub struct Serving {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    /// The task serving it.
    pub task: tokio::task::JoinHandle<()>,
    /// Its connection limits (and count of open connections).
    pub limits: Arc<ConnectionLimits>,
    /// Who may connect (its revocation list can change while it runs).
    pub gate: Arc<mooring_proto::auth::Gate>,
}

/// Binds `listen` and serves `handler` to peers that prove they hold `token` or a member
/// credential issued from it.
pub async fn serve(
    listen: &str,
    handler: Arc<RoleHandler>,
    token: Option<mooring_proto::auth::Credential>,
) -> Result<Serving, Error> {
    let limits = ConnectionLimits::standard();
    let gate = crate::master::control_gate(token)?;
    let (addr, task) =
        crate::master::serve_rpc(listen, handler, gate.clone(), limits.clone()).await?;
    tracing::info!(%addr, "master listening (in a group)");
    Ok(Serving {
        addr,
        task,
        limits,
        gate,
    })
}

/// The metrics pages of a master in a group: the leader's figures while it leads (with
/// `mooring_master_leading 1`); while it stands by, `mooring_master_leading 0` and, in
/// `/stats.json`, the leader it knows of. Scrape every master and keep the leader's figures.
pub fn metrics_pages(
    role: Arc<RoleHandler>,
    limits: Arc<ConnectionLimits>,
) -> crate::ops::http::Handler {
    Arc::new(move |request| {
        let connections = limits.clone();
        let connections = Arc::new(move || connections.open());
        match role.serving() {
            Ok(service) => crate::master::metrics_pages(&service, connections, true)(request),
            Err(_) => match request.path {
                "/metrics" => crate::ops::http::Response::ok(
                    "text/plain; version=0.0.4; charset=utf-8",
                    crate::ops::metrics::render_standby(connections()),
                ),
                "/stats.json" => crate::ops::http::Response::ok(
                    "application/json",
                    serde_json::json!({ "role": "standby", "leader": role.leader() }).to_string(),
                ),
                other => crate::ops::metrics::static_page(other),
            },
        }
    })
}

pub use mooring_proto::wire::STANDBY_REFUSAL;

/// What this master is doing now.
enum Role {
    /// Following (or looking for) a leader.
    Standby { leader: Option<String> },
    /// Leading while its lease holds.
    Leader {
        service: Arc<MasterService>,
        lease: Arc<Mutex<LeaderLease>>,
    },
}

/// The RPC handler of a master in a group: the leader's service while it leads and its lease
/// holds, a refusal naming the leader otherwise.
pub struct RoleHandler {
    role: RwLock<Role>,
    clock: Clock,
}

impl Default for RoleHandler {
    fn default() -> RoleHandler {
        RoleHandler {
            role: RwLock::new(Role::Standby { leader: None }),
            clock: Clock::new(),
        }
    }
}

impl RoleHandler {
    /// Serves `service` while `lease` (on this handler's clock: see [`RoleHandler::now`])
    /// holds.
    pub fn lead(&self, service: Arc<MasterService>, lease: Arc<Mutex<LeaderLease>>) {
        *self.role.write().unwrap_or_else(|e| e.into_inner()) = Role::Leader { service, lease };
    }

    /// Refuses every request, naming `leader` if known; gives back the service it led with.
    pub fn stand_by(&self, leader: Option<String>) -> Option<Arc<MasterService>> {
        let old = std::mem::replace(
            &mut *self.role.write().unwrap_or_else(|e| e.into_inner()),
            Role::Standby { leader },
        );
        match old {
            Role::Leader { service, .. } => Some(service),
            Role::Standby { .. } => None,
        }
    }

    /// The leader this master knows of while it stands by.
    pub fn leader(&self) -> Option<String> {
        match &*self.role.read().unwrap_or_else(|e| e.into_inner()) {
            Role::Standby { leader } => leader.clone(),
            Role::Leader { .. } => None,
        }
    }

    /// The clock leases are measured on.
    pub fn now(&self) -> mooring_core::Millis {
        self.clock.now()
    }

    /// Whether this master grants now: it leads and its lease holds (the simulation checks
    /// that no two masters ever do at once).
    pub fn grants(&self) -> bool {
        self.serving().is_ok()
    }

    /// The service, if this master leads and its lease holds.
    fn serving(&self) -> Result<Arc<MasterService>, Error> {
        match &*self.role.read().unwrap_or_else(|e| e.into_inner()) {
            Role::Leader { service, lease } => {
                if lease
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .valid(self.clock.now())
                {
                    Ok(service.clone())
                } else {
                    Err(Error::new(
                        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                        format!(
                            "{STANDBY_REFUSAL}: its leadership lease lapsed (etcd unreachable?); \
                             another master takes over"
                        ),
                    ))
                }
            }
            Role::Standby { leader } => Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                match leader {
                    Some(leader) => format!("{STANDBY_REFUSAL}: the leader is {leader}"),
                    None => format!("{STANDBY_REFUSAL}: no leader is elected yet; retry shortly"),
                },
            )),
        }
    }
}

impl RpcHandler for RoleHandler {
    fn handle(&self, request: MasterRequest) -> MasterResponse {
        self.serving()?.handle(request)
    }

    fn answer(&self, request: MasterRequest) -> Answer {
        match self.serving() {
            Ok(service) => service.answer(request),
            Err(refused) => Answer::Now(Err(refused)),
        }
    }
}
