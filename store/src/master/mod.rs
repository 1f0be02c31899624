//! The master service: the core's `Master` behind a lock, a timer that runs `tick`, and RPC
//! serving. All policy is in the core; this adds only time, locking and logging.

pub mod journal;
pub mod kv_events;
pub mod latest;
pub mod seq_waiters;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::invariants::{Auditor, ReuseCounts, Violation};
use mooring_core::{Error, ErrorCode, Event, Master, MasterConfig, Result, Stats};
use mooring_proto::auth::{Credential, Gate, Plane};
use mooring_proto::dispatch;
use mooring_proto::journal::{request_payload, tick_payload};
use mooring_proto::state_dir::StateDir;
use mooring_proto::transport::{Answer, RpcHandler};
use mooring_proto::wire::{BatchPutStart, Follow, MasterRequest, MasterResponse, PutStart, Reply};
use mooring_transport_tcp::limits::ConnectionLimits;
use mooring_transport_tcp::spawn_rpc_server_with_limits;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::ha::ship::{InSyncRecord, Shipping, serve_follow};
use crate::ops::metrics::MasterMetrics;
use journal::Journal;
use kv_events::KvEventFeed;

/// How often the timer checks whether `tick` is due. Deadlines in the core are in
/// milliseconds; this bounds how late a duty (eviction, expiry) runs.
const TICK_RESOLUTION: Duration = Duration::from_millis(10);

/// The master's state, shared by the RPC connections and the timer.
pub struct MasterService {
    master: Mutex<Master>,
    clock: Clock,
    /// Checks every call's decisions as it is made (full scans; tests and the simulation turn
    /// it on): eviction order, timeouts, block reuse.
    audit: Mutex<Option<Auditor>>,
    /// Every event with when it happened, while someone keeps them ([`MasterService::keep_events`]).
    kept_events: Mutex<Option<Vec<(tokio::time::Instant, Event)>>>,
    /// RPC counts and latencies, for the metrics endpoint.
    metrics: MasterMetrics,
    /// Where every input is journaled, if the master keeps its state on disk.
    journal: Option<Journal>,
    /// Standbys the journal is shipped to, once this master leads a group.
    shipping: std::sync::OnceLock<Arc<Shipping>>,
    /// The KV-event feed, once asked for ([`MasterService::publish_kv_events`]).
    kv_events: std::sync::OnceLock<KvEventFeed>,
}

impl MasterService {
    /// A service around a fresh master.
    pub fn new(config: MasterConfig) -> Result<Arc<MasterService>> {
        Ok(MasterService::around(
            Master::new(config)?,
            Clock::new(),
            None,
        ))
    }

    /// A service around the master kept in `dir` (see [`crate::master::journal`]): recovered from its
    /// snapshot and journals, with `config` in force, every object freshly leased, and every
    /// input from now on journaled (a snapshot after `snapshot_after` journal bytes or more:
    /// see [`crate::master::journal`]).
    pub fn persistent(
        dir: &std::path::Path,
        config: MasterConfig,
        snapshot_after: u64,
    ) -> Result<Arc<MasterService>> {
        let dir: Arc<dyn StateDir> = Arc::new(mooring_disk::PosixStateDir::new(dir));
        MasterService::persistent_in(dir, config, snapshot_after)
    }

    /// [`MasterService::persistent`] on any state directory (the simulation's disk, say).
    pub fn persistent_in(
        dir: Arc<dyn StateDir>,
        config: MasterConfig,
        snapshot_after: u64,
    ) -> Result<Arc<MasterService>> {
        let started = std::time::Instant::now();
        let mut recovered = journal::recover(&*dir, config)?;
        if recovered.replayed > 0 {
            crate::coverage::hit(crate::coverage::Path::MASTER_RECOVERED);
        }
        let clock = Clock::resuming(recovered.master.now());
        let now = clock.now();
        recovered.master.resume(now);
        let journal = Journal::start(dir.clone(), &recovered, now, snapshot_after)?;
        let master = recovered.master;
        let stats = master.stats();
        info!(
            dir = %dir.location(),
            objects = stats.objects,
            segments = stats.segments,
            replayed = recovered.replayed,
            took_ms = started.elapsed().as_millis() as u64,
            "master state recovered"
        );
        Ok(MasterService::around(master, clock, Some(journal)))
    }

    fn around(mut master: Master, clock: Clock, journal: Option<Journal>) -> Arc<MasterService> {
        // What recovery replayed is not news: subscribers of a new master start afresh (a
        // new epoch) from the keys they list.
        master.drain_key_changes();
        Arc::new(MasterService {
            master: Mutex::new(master),
            clock,
            audit: Mutex::new(None),
            kept_events: Mutex::new(None),
            metrics: MasterMetrics::default(),
            journal,
            shipping: std::sync::OnceLock::new(),
            kv_events: std::sync::OnceLock::new(),
        })
    }

    /// Keeps the latest `kept` key changes from now on and serves them at `/kv_events` on
    /// the metrics address ([`kv_events`]). Asking again changes nothing.
    pub fn publish_kv_events(&self, kept: usize) {
        self.kv_events.get_or_init(|| KvEventFeed::new(kept));
    }

    /// The answer to a `/kv_events` request.
    fn kv_events_page(
        &self,
        request: &crate::ops::http::Request<'_>,
    ) -> crate::ops::http::Response {
        match self.kv_events.get() {
            Some(feed) => feed.page(request),
            None => crate::ops::http::Response::error(
                404,
                "KV events are off: start the master with --kv-events (see mooring master --help)",
            ),
        }
    }

    /// Checks from now on, after every call, the decisions it made ([`Auditor`]): nothing
    /// evictable is left that ranks before what went, leases and pins stay within their TTLs,
    /// no released block is reused before its due time, and each turn of the timer leaves
    /// nothing overdue.
    pub fn audit(&self) {
        self.audit
            .lock()
            .expect("audit lock")
            .get_or_insert_with(Auditor::new);
    }

    /// Keeps every event the master emits from now on, for [`MasterService::take_events`]
    /// (the simulation judges each lost or evicted object by them).
    pub fn keep_events(&self) {
        self.kept_events
            .lock()
            .expect("kept events lock")
            .get_or_insert_with(Vec::new);
    }

    /// The events kept since the last call, each with when it happened.
    pub fn take_events(&self) -> Vec<(tokio::time::Instant, Event)> {
        self.kept_events
            .lock()
            .expect("kept events lock")
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The first violation the audit found, if any.
    pub fn audit_failure(&self) -> Option<Violation> {
        self.audit
            .lock()
            .expect("audit lock")
            .as_ref()
            .and_then(|a| a.first_violation().cloned())
    }

    /// What the audit's block-reuse ledger has checked (zeros when not auditing).
    pub fn audit_reuse_counts(&self) -> ReuseCounts {
        self.audit
            .lock()
            .expect("audit lock")
            .as_ref()
            .map(Auditor::reuse_counts)
            .unwrap_or_default()
    }

    /// Runs the audit's after-timer check on `master` (see [`Auditor::after_timer`]).
    fn audit_timer(&self, master: &Master) {
        if let Some(auditor) = self.audit.lock().expect("audit lock").as_mut()
            && let Err(violation) = auditor.after_timer(master)
        {
            warn!("{violation}");
        }
    }

    /// Runs `f` on the master without changing it: for audits and reports, which the audit
    /// and the event log need not see.
    pub fn inspect<T>(&self, f: impl FnOnce(&Master) -> T) -> T {
        f(&self.master.lock().expect("master lock"))
    }

    /// Runs `f` on the master at the current time, then logs what it did on its own.
    pub fn with_master<T>(&self, f: impl FnOnce(&mut Master, mooring_core::Millis) -> T) -> T {
        self.with_master_protecting(&[], f)
    }

    /// [`MasterService::with_master`] for a call that shields `protected` keys from its own
    /// eviction.
    fn with_master_protecting<T>(
        &self,
        protected: &[&str],
        f: impl FnOnce(&mut Master, mooring_core::Millis) -> T,
    ) -> T {
        let mut master = self.master.lock().expect("master lock");
        let result = f(&mut master, self.clock.now());
        let events = master.drain_events();
        let key_changes = master.drain_key_changes();
        if let Some(auditor) = self.audit.lock().expect("audit lock").as_mut()
            && let Err(violation) = auditor.after_call(&master, &events, &key_changes, protected)
        {
            warn!("{violation}");
        }
        drop(master);
        if let Some(feed) = self.kv_events.get() {
            feed.record(key_changes);
        }
        if let Some(kept) = self.kept_events.lock().expect("kept events lock").as_mut() {
            let now = tokio::time::Instant::now();
            kept.extend(events.iter().map(|e| (now, e.clone())));
        }
        log_events(events);
        result
    }

    /// Ships the journal to standby masters from now on: answers that acknowledge a change
    /// wait until every in-sync standby holds it (see [`crate::ha`]). Needs a journal.
    pub fn start_shipping(
        &self,
        me: String,
        record: Arc<dyn InSyncRecord>,
        timeout: Duration,
    ) -> Result<Arc<Shipping>> {
        let journal = self.journal.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                "standby masters follow a journal: start the master with --state-dir",
            )
        })?;
        let shipping = Shipping::start(me, journal, record, timeout);
        self.shipping
            .set(shipping.clone())
            .map_err(|_| Error::new(ErrorCode::INTERNAL_ERROR, "shipping started twice"))?;
        Ok(shipping)
    }

    /// A standby's request for the next bytes of the journal.
    fn follow(&self, request: Follow) -> Answer {
        let (Some(journal), Some(shipping)) = (&self.journal, self.shipping.get()) else {
            return Answer::Now(self.handle(request.into()));
        };
        let shipping = shipping.clone();
        let dir = journal.dir().clone();
        let syncs = journal.syncs();
        let ends = journal.completed_ends();
        Answer::WhenDurable(Box::pin(async move {
            serve_follow(shipping, dir, syncs, move |g| ends.get(g), request)
                .await
                .map(Reply::Follow)
        }))
    }

    /// What the journal has written, if the master keeps one.
    pub fn journal_counts(&self) -> Option<journal::JournalCounts> {
        self.journal.as_ref().map(Journal::counts)
    }

    /// Gauges and counters.
    pub fn stats(&self) -> Stats {
        self.inspect(Master::stats)
    }

    /// Runs `tick` whenever it is due, until the task is aborted.
    pub fn spawn_timer(self: &Arc<Self>) -> JoinHandle<()> {
        let service = Arc::clone(self);
        let resolution = crate::buggify::period(crate::buggify::Site::MASTER_TICK, TICK_RESOLUTION);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(resolution).await;
                if let Some(journal) = &service.journal {
                    journal.retry_if_full();
                }
                service.with_master(|m, now| {
                    if m.next_deadline().is_some_and(|d| d <= now) {
                        if let Some(journal) = &service.journal {
                            journal.append(now, &tick_payload(), m);
                        }
                        m.tick(now);
                    }
                    service.audit_timer(m);
                });
            }
        })
    }
}

impl RpcHandler for MasterService {
    fn handle(&self, request: MasterRequest) -> MasterResponse {
        self.serve(request).0
    }

    fn answer(&self, request: MasterRequest) -> Answer {
        let request = match request {
            MasterRequest::Follow(follow) => return self.follow(follow),
            request => request,
        };
        match self.serve(request) {
            (response, Some(seq)) => {
                let durable = match self.shipping.get() {
                    Some(shipping) => shipping.replicated(seq),
                    None => Box::pin(
                        self.journal
                            .as_ref()
                            .expect("a sequence number comes from the journal")
                            .durable(seq),
                    ),
                };
                Answer::WhenDurable(Box::pin(async move {
                    durable.await?;
                    response
                }))
            }
            (response, None) => Answer::Now(response),
        }
    }
}

impl MasterService {
    /// Applies `request` (journaling it first, if the master keeps a journal) and answers;
    /// with the journal record to wait for if the answer acknowledges a change or reports
    /// state that must not go back.
    fn serve(&self, request: MasterRequest) -> (MasterResponse, Option<u64>) {
        // Every request and answer, for replaying a failure (RUST_LOG=mooring::master=trace).
        let logged = tracing::enabled!(tracing::Level::TRACE).then(|| format!("{request:?}"));
        // An upsert shields the object it replaces while it makes room for the new value.
        let protected: Vec<String> = match &request {
            MasterRequest::PutStart(PutStart {
                key, upsert: true, ..
            }) => vec![key.clone()],
            MasterRequest::BatchPutStart(BatchPutStart {
                items,
                upsert: true,
                ..
            }) => items.iter().map(|(key, _)| key.clone()).collect(),
            _ => Vec::new(),
        };
        let protected: Vec<&str> = protected.iter().map(String::as_str).collect();
        let kind = request.name();
        let started = std::time::Instant::now();
        let needs_durability = request.needs_durability();
        let waits = needs_durability || request.reports_settled_state();
        if let Some(refused) = self
            .journal
            .as_ref()
            .and_then(|journal| journal.refusal(needs_durability))
        {
            self.metrics
                .record(kind, Err(refused.code), started.elapsed());
            if let Some(suppressed) = FULL_REFUSALS.admit() {
                warn!(request = kind, suppressed, "refused: {refused}");
            }
            return (Err(refused), None);
        }
        let (payload, request) = match &self.journal {
            Some(_) => {
                let (payload, request) = request_payload(request);
                (Some(payload), request)
            }
            None => (None, request),
        };
        let (response, seq) = self.with_master_protecting(&protected, |m, now| {
            let seq = match (&self.journal, &payload) {
                (Some(journal), Some(payload)) => Some(journal.append(now, payload, m)),
                _ => None,
            };
            (dispatch::handle(m, request, now), seq)
        });
        let elapsed = started.elapsed();
        let outcome = response.as_ref().map(|_| ()).map_err(|e| e.code);
        self.metrics.record(kind, outcome, elapsed);
        debug!(
            request = kind,
            ?outcome,
            elapsed_us = elapsed.as_micros() as u64,
            "served"
        );
        if let Some(request) = logged {
            tracing::trace!(%request, ?response, "handled");
        }
        (response, seq.filter(|_| waits))
    }
}

/// Refusals for want of room in the state directory: logged at most ten a second.
static FULL_REFUSALS: mooring_proto::refusals::LogBudget =
    mooring_proto::refusals::LogBudget::new();

/// The metrics pages of `service` (see [`crate::ops::metrics::handler`]), counting the
/// connections `connections` reports; `in_group` for a master leading a group.
pub fn metrics_pages(
    service: &Arc<MasterService>,
    connections: Arc<dyn Fn() -> usize + Send + Sync>,
    in_group: bool,
) -> crate::ops::http::Handler {
    let read = {
        let service = service.clone();
        Arc::new(move || service.with_master(|m, now| (m.report(now), m.segments())))
    };
    let journaled = service.clone();
    let pages = crate::ops::metrics::handler(
        service.metrics.clone(),
        read,
        connections,
        Arc::new(move || journaled.journal_counts()),
        in_group,
    );
    let feed = service.clone();
    Arc::new(move |request| match request.path {
        "/kv_events" => feed.kv_events_page(request),
        _ => pages(request),
    })
}

fn log_events(events: Vec<Event>) {
    for event in events {
        match event {
            Event::Evicted {
                key,
                soft_pinned,
                bytes,
                contiguous,
                kept_on_disk,
                ..
            } => debug!(%key, soft_pinned, bytes, contiguous, kept_on_disk, "evicted"),
            Event::PrefetchFailed { key, error } => {
                info!(%key, "prefetch found no memory; reads stay on disk: {error}")
            }
            Event::WriteDiscarded {
                key, write, cause, ..
            } => {
                info!(%key, %write, ?cause, "discarded an unfinished write")
            }
            Event::ObjectLost { key, segment } => {
                debug!(%key, %segment, "object lost with its last segment")
            }
            Event::ReadableCopyLost { key, segment } => {
                info!(%key, %segment, "a prefetch's disk copy went with its segment; the value is back only if the prefetch completes")
            }
            Event::SegmentUnmounted {
                segment,
                name,
                replicas_dropped,
                objects_lost,
            } => {
                if objects_lost > 0 {
                    warn!(%segment, %name, replicas_dropped, objects_lost, "segment unmounted; objects with no other replica are gone")
                } else {
                    info!(%segment, %name, replicas_dropped, "segment unmounted")
                }
            }
            Event::ClientExpired { client } => info!(%client, "client expired"),
            // Every CLI call ends with one: routine.
            Event::ClientLeft { client } => debug!(%client, "client left"),
        }
    }
}

/// The gate a master's RPC port keeps: it must hold the cluster token itself (or none).
pub fn control_gate(token: Option<Credential>) -> Result<Arc<Gate>> {
    Gate::new(token, Plane::Control)
        .map(Arc::new)
        .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, e))
}

/// Binds `listen` and serves `handler` to peers that pass `gate`, within `limits`; returns the
/// bound address and the serving task.
pub async fn serve_rpc(
    listen: &str,
    handler: Arc<dyn RpcHandler>,
    gate: Arc<Gate>,
    limits: Arc<ConnectionLimits>,
) -> Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(listen).await.map_err(|e| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("master cannot listen on {listen}: {e}"),
        )
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
    let server = spawn_rpc_server_with_limits(
        listener,
        handler,
        crate::tuning::server_spin(),
        gate,
        limits,
    );
    Ok((addr, server))
}

/// A running master: its address and the tasks serving it.
pub struct RunningMaster {
    /// The service state.
    pub service: Arc<MasterService>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its RPC connections, counted against their caps.
    limits: Arc<ConnectionLimits>,
    /// Who may connect (its revocation list can change while it runs).
    pub gate: Arc<Gate>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningMaster {
    /// Binds `listen` and serves peers that prove they hold `token`.
    pub async fn start(
        listen: &str,
        config: MasterConfig,
        token: Option<Credential>,
    ) -> Result<RunningMaster> {
        RunningMaster::serve(listen, MasterService::new(config)?, token).await
    }

    /// Binds `listen` and serves `service` to peers that prove they hold `token`.
    pub async fn serve(
        listen: &str,
        service: Arc<MasterService>,
        token: Option<Credential>,
    ) -> Result<RunningMaster> {
        let limits = ConnectionLimits::standard();
        let gate = control_gate(token)?;
        let (addr, server) =
            serve_rpc(listen, service.clone(), gate.clone(), limits.clone()).await?;
        let tasks = vec![server, service.spawn_timer()];
        info!(%addr, "master listening");
        Ok(RunningMaster {
            service,
            addr,
            limits,
            gate,
            tasks,
        })
    }

    /// Serves the master's metrics over HTTP on `listen` (`/metrics` for Prometheus,
    /// `/stats.json`), requiring `bearer` of every request if given; returns the bound address.
    pub async fn serve_metrics(
        &mut self,
        listen: &str,
        bearer: Option<String>,
    ) -> Result<SocketAddr> {
        let limits = self.limits.clone();
        let handler = metrics_pages(&self.service, Arc::new(move || limits.open()), false);
        let (addr, task) =
            crate::ops::http::serve(listen, handler, bearer, crate::ops::metrics::PUBLIC_PATHS)
                .await?;
        self.tasks.push(task);
        Ok(addr)
    }

    /// Stops serving.
    pub fn shutdown(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for RunningMaster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
