//! A master in a group elected through etcd: its lease, its campaign, following the leader
//! while it does not lead, and leading while it does (see [`crate::ha`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ElectionClient, KvClient, LeaderKey, ResignOptions, Txn, TxnOp,
};
use mooring_core::leadership::LeaderLease;
use mooring_core::{Error, ErrorCode, MasterConfig, Millis, Result};
use mooring_proto::auth::Credential;
use mooring_proto::state_dir::StateDir;
use mooring_proto::transport::{BoxFuture, ControlPlane};
use mooring_transport_tcp::TcpControlPlane;
use tracing::{debug, info, warn};

use super::RoleHandler;
use super::ship::InSyncRecord;
use super::standby::{self, Copier};
use crate::master::MasterService;

/// Called with a master's service when it starts leading, before it serves (the simulation
/// audits it).
pub type OnLead = Arc<dyn Fn(&Arc<MasterService>) + Send + Sync>;

/// Opens a control plane to the leader at an address it advertised, for following it. Left
/// unset, a standby follows over TCP; the simulation's datagram worlds give their own.
pub type DialLeader =
    Arc<dyn Fn(String) -> BoxFuture<'static, Result<Arc<dyn ControlPlane>>> + Send + Sync>;

/// How a master takes part in a group.
#[derive(Clone)]
pub struct GroupConfig {
    /// etcd's client URLs.
    pub endpoints: Vec<String>,
    /// Masters of one cluster share this name (several clusters may share an etcd).
    pub cluster: String,
    /// The address clients, nodes and other masters reach this master at.
    pub advertise: String,
    /// The lease etcd expires a silent master's office after: a dead leader is replaced
    /// after about this long.
    pub lease_ttl: Duration,
    /// How much sooner than `lease_ttl` after a renewal etcd might expire the lease (clocks
    /// running at different rates; a lessor that expires on coarse ticks): a leader stops
    /// granting this long before the TTL, counted from when it sent its last confirmed
    /// renewal. [`GroupConfig::margin_for`] gives the production value.
    pub lease_margin: Duration,
    /// How long an in-sync standby may hold back acknowledgements before the leader goes on
    /// without it (it may not take over until it catches up again).
    pub standby_timeout: Duration,
    /// This master's state directory: its own journal when it leads, the copy of the
    /// leader's otherwise.
    pub state_dir: Arc<dyn StateDir>,
    /// The master's settings when it leads.
    pub master: MasterConfig,
    /// Journal bytes between snapshots.
    pub snapshot_after: u64,
    /// The cluster token, for following the leader.
    pub token: Option<Credential>,
    /// Called when this master starts leading.
    pub on_lead: Option<OnLead>,
    /// How to reach the leader to follow it (TCP when unset).
    pub dial: Option<DialLeader>,
}

impl GroupConfig {
    /// The margin for a lease of `ttl` on a real etcd, which expires a lease no sooner than
    /// its TTL after the renewal it received: a quarter of the TTL, for clocks running at
    /// slightly different rates.
    pub fn margin_for(ttl: Duration) -> Duration {
        ttl / 4
    }
}

fn etcd_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        format!("etcd: {what}: {e}"),
    )
}

/// The keys a group uses in etcd.
struct Keys {
    election: String,
    in_sync: String,
}

impl Keys {
    fn of(cluster: &str) -> Keys {
        Keys {
            election: format!("/mooring/{cluster}/leader"),
            in_sync: format!("/mooring/{cluster}/in-sync"),
        }
    }
}

/// Takes part in the group until the process ends: follows the leader, campaigns when this
/// master may lead, leads while elected. Serving is `handler`'s (already listening).
pub async fn run(config: GroupConfig, handler: Arc<RoleHandler>) -> Result<()> {
    let client = Client::connect(&config.endpoints, None)
        .await
        .map_err(|e| {
            etcd_error(
                &format!(
                    "cannot reach {} (start etcd, or fix --etcd)",
                    config.endpoints.join(",")
                ),
                e,
            )
        })?;
    info!(endpoints = ?config.endpoints, cluster = %config.cluster, "joined the master group");
    loop {
        if let Err(e) = with_lease(&config, &client, &handler).await {
            warn!("{e}; trying again");
        }
        if let Some(service) = handler.stand_by(None) {
            super::retire(service).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One lease's life: granted, kept alive, and everything done under it; returns when it is
/// lost.
async fn with_lease(
    config: &GroupConfig,
    client: &Client,
    handler: &Arc<RoleHandler>,
) -> Result<()> {
    let mut leases = client.lease_client();
    let ttl_secs = config.lease_ttl.as_secs().max(1) as i64;
    let sent = handler.now();
    let granted = leases
        .grant(ttl_secs, None)
        .await
        .map_err(|e| etcd_error("cannot grant a lease", e))?;
    let id = granted.id();
    let ttl = Millis::from_secs(ttl_secs as u64);
    let margin = Millis(config.lease_margin.as_millis() as u64);
    let lease = Arc::new(Mutex::new(LeaderLease::granted(ttl, margin, sent)));
    let (mut keeper, mut stream) = leases
        .keep_alive(id)
        .await
        .map_err(|e| etcd_error("cannot keep the lease alive", e))?;
    let renewing = {
        let (lease, handler) = (lease.clone(), handler.clone());
        async move {
            let every = Duration::from_millis((ttl.0 / 5).max(100));
            loop {
                let sent = handler.now();
                if let Err(e) = keeper.keep_alive().await {
                    return etcd_error("lease renewal failed", e);
                }
                match tokio::time::timeout(every * 2, stream.message()).await {
                    Ok(Ok(Some(reply))) if reply.ttl() > 0 => lease
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .renewed(sent),
                    Ok(Ok(_)) => return etcd_error("lease", "expired"),
                    Ok(Err(e)) => return etcd_error("lease renewal failed", e),
                    Err(_) => debug!("a lease renewal went unanswered"),
                }
                tokio::time::sleep(every).await;
            }
        }
    };
    // Follows until elected, then leads for one term: a deposed leader's lease ends with it.
    let member = async {
        let mut copy: Option<(Vec<u8>, Copier)> = None;
        let won = tokio::select! {
            // In order, not at random: the simulation replays a seed exactly.
            biased;
            won = campaign(config, client, id) => won?,
            failed = follow(config, client, handler, &mut copy) => return failed.map(|()| None),
        };
        drop(copy);
        lead(config, client, handler, &lease, won).await.map(Some)
    };
    let outcome = tokio::select! {
        // In order, not at random: the simulation replays a seed exactly.
        biased;
        lost = renewing => Err(lost),
        ended = member => ended,
    };
    // Ending the lease gives up the office at once (a resignation could not reach an etcd this
    // master lost): a standby may take over while a deposed leader waits out the requests
    // still in flight, none of which can be acknowledged any more. Waiting first kept the
    // office, renewed, for as long as the wait took (seed 13216).
    let _ = client.lease_client().revoke(id).await;
    match outcome? {
        Some(Deposed { why, service }) => {
            if let Some(service) = service {
                super::retire(service).await;
            }
            Err(etcd_error("no longer leading", why))
        }
        None => Ok(()),
    }
}

/// How a term ended: why, and the service it led with, to retire once the office is given up.
struct Deposed {
    why: String,
    service: Option<Arc<MasterService>>,
}

/// Waits until this master may lead and is elected: it campaigns only while it is in the
/// in-sync set (or none is recorded yet: a new group).
async fn campaign(config: &GroupConfig, client: &Client, lease: i64) -> Result<LeaderKey> {
    let keys = Keys::of(&config.cluster);
    let mut kv = client.kv_client();
    loop {
        let incarnation = standby::incarnation(&*config.state_dir)?;
        let me = format!("{}#{incarnation}", config.advertise);
        match in_sync(&mut kv, &keys).await? {
            Some(members) if !members.contains(&me) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            _ => {}
        }
        let mut election = client.election_client();
        let won = election
            .campaign(keys.election.clone(), config.advertise.clone(), lease)
            .await
            .map_err(|e| etcd_error("campaign failed", e))?;
        let Some(key) = won.leader().cloned() else {
            return Err(etcd_error("campaign", "won without a leader key"));
        };
        // Only the leader changes the in-sync set, and this master leads now: check again,
        // with the copy as it is now (following may have started it afresh meanwhile).
        let me = format!(
            "{}#{}",
            config.advertise,
            standby::incarnation(&*config.state_dir)?
        );
        let members = in_sync(&mut kv, &keys).await?;
        if members.as_ref().is_some_and(|m| !m.contains(&me)) {
            info!(
                %me,
                ?members,
                "elected, but no longer in sync with the last leader: stepping back"
            );
            let _ = election
                .resign(Some(ResignOptions::new().with_leader(key)))
                .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        return Ok(key);
    }
}

/// The recorded in-sync set, if any.
async fn in_sync(kv: &mut KvClient, keys: &Keys) -> Result<Option<Vec<String>>> {
    let got = kv
        .get(keys.in_sync.clone(), None)
        .await
        .map_err(|e| etcd_error("cannot read the in-sync set", e))?;
    Ok(got.kvs().first().map(|entry| {
        String::from_utf8_lossy(entry.value())
            .lines()
            .map(str::to_string)
            .collect()
    }))
}

/// The elected leader's address and election key, if there is one.
async fn leader(election: &mut ElectionClient, keys: &Keys) -> Option<(String, Vec<u8>)> {
    match election.leader(keys.election.clone()).await {
        Ok(found) => found.kv().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.key().to_vec(),
            )
        }),
        // etcd answers "no leader" with an error.
        Err(e) => {
            debug!("no leader: {e}");
            None
        }
    }
}

/// Follows whichever master leads, copying its state files; a new leader's copy starts
/// from scratch. Returns only on a failure to keep the copy.
async fn follow(
    config: &GroupConfig,
    client: &Client,
    handler: &RoleHandler,
    copy: &mut Option<(Vec<u8>, Copier)>,
) -> Result<()> {
    let keys = Keys::of(&config.cluster);
    let mut election = client.election_client();
    loop {
        let Some((address, key)) = leader(&mut election, &keys).await else {
            let _ = handler.stand_by(None);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if address == config.advertise {
            // This master's own office from before a restart: wait for it to lapse.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let _ = handler.stand_by(Some(address.clone()));
        if copy.as_ref().is_none_or(|(following, _)| *following != key) {
            info!(leader = %address, "following the leader");
            *copy = Some((
                key.clone(),
                Copier::fresh(config.state_dir.clone(), &config.advertise)?,
            ));
        }
        let (_, copier) = copy.as_mut().expect("set above");
        let control: Arc<dyn ControlPlane> = match &config.dial {
            Some(dial) => match dial(address.clone()).await {
                Ok(control) => control,
                Err(e) => {
                    debug!(leader = %address, "cannot reach the leader: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            None => TcpControlPlane::new(
                address.clone(),
                Duration::from_secs(5),
                Duration::ZERO,
                config.token.clone(),
                crate::client::connect::random_client_id(),
            ),
        };
        loop {
            match copier
                .step(control.as_ref() as &(dyn ControlPlane + 'static))
                .await
            {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::FILE_WRITE_FAIL => return Err(e),
                Err(e) => {
                    debug!(leader = %address, "following paused: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    break;
                }
            }
        }
    }
}

/// Leads: records itself as the only in-sync master, recovers the state it holds, serves
/// while its lease holds, and ships its journal to the standbys. Returns when deposed, with
/// the service to retire once the lease (and with it the office) has ended.
async fn lead(
    config: &GroupConfig,
    client: &Client,
    handler: &Arc<RoleHandler>,
    lease: &Arc<Mutex<LeaderLease>>,
    key: LeaderKey,
) -> Result<Deposed> {
    let keys = Keys::of(&config.cluster);
    let incarnation = standby::incarnation(&*config.state_dir)?;
    let me = format!("{}#{incarnation}", config.advertise);
    let record = Arc::new(EtcdInSync {
        kv: client.kv_client(),
        keys,
        leader_key: key.key().to_vec(),
        advertise: config.advertise.clone(),
    });
    record.record(vec![me.clone()]).await?;
    let started = std::time::Instant::now();
    let service = MasterService::persistent_in(
        config.state_dir.clone(),
        config.master.clone(),
        config.snapshot_after,
    )?;
    let shipping = service.start_shipping(me, record, config.standby_timeout)?;
    if service.stats().segments > 0 {
        crate::coverage::hit(crate::coverage::Path::STANDBY_TOOK_OVER);
    }
    if let Some(on_lead) = &config.on_lead {
        on_lead(&service);
    }
    // Stops with the term however it ends: a lost lease drops this future midway.
    let timer = AbortOnDrop(service.spawn_timer());
    handler.lead(service, lease.clone());
    info!(
        advertise = %config.advertise,
        recovered_ms = started.elapsed().as_millis() as u64,
        "leading the master group"
    );
    let lapsed = async {
        loop {
            let until = lease
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .valid_until();
            let now = handler.now();
            if now >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(until.since(now).0.clamp(10, 200))).await;
        }
    };
    let why = tokio::select! {
        // In order, not at random: the simulation replays a seed exactly.
        biased;
        why = shipping.deposed() => why,
        () = lapsed => "its lease lapsed (etcd unreachable?)".to_string(),
    };
    warn!("no longer leading: {why}; following the new leader from scratch");
    drop(timer);
    // Acknowledge nothing more and leave the in-sync set alone (the standby only fell behind
    // because this master stopped answering it: seed 13216), and refuse every request.
    shipping.stop(format!("no longer leading: {why}"));
    let service = handler.stand_by(None);
    drop(key);
    Ok(Deposed { why, service })
}

/// A task that is aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The in-sync set in etcd, written only while this master's election key is there.
struct EtcdInSync {
    kv: KvClient,
    keys: Keys,
    leader_key: Vec<u8>,
    advertise: String,
}

impl InSyncRecord for EtcdInSync {
    fn record(&self, members: Vec<String>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let txn = Txn::new()
                .when([Compare::value(
                    self.leader_key.clone(),
                    CompareOp::Equal,
                    self.advertise.clone(),
                )])
                .and_then([TxnOp::put(
                    self.keys.in_sync.clone(),
                    members.join("\n"),
                    None,
                )]);
            let done = self
                .kv
                .clone()
                .txn(txn)
                .await
                .map_err(|e| etcd_error("cannot record the in-sync masters", e))?;
            if done.succeeded() {
                Ok(())
            } else {
                Err(etcd_error(
                    "cannot record the in-sync masters",
                    "this master no longer leads",
                ))
            }
        })
    }
}
