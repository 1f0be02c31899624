//! The master service: the core's `Master` behind a lock, a timer that runs `tick`, and RPC
//! serving. All policy is in the core; this adds only time, locking and logging.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::{Error, ErrorCode, Event, Master, MasterConfig, Result, Stats};
use mooring_proto::auth::ClusterToken;
use mooring_proto::dispatch;
use mooring_proto::transport::RpcHandler;
use mooring_proto::wire::{MasterRequest, MasterResponse};
use mooring_transport_tcp::spawn_rpc_server;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::clock::Clock;

/// How often the timer checks whether `tick` is due. Deadlines in the core are in
/// milliseconds; this bounds how late a duty (eviction, expiry) runs.
const TICK_RESOLUTION: Duration = Duration::from_millis(10);

/// The master's state, shared by the RPC connections and the timer.
pub struct MasterService {
    master: Mutex<Master>,
    clock: Clock,
}

impl MasterService {
    /// A service around a fresh master.
    pub fn new(config: MasterConfig) -> Result<Arc<MasterService>> {
        Ok(Arc::new(MasterService {
            master: Mutex::new(Master::new(config)?),
            clock: Clock::new(),
        }))
    }

    /// Runs `f` on the master at the current time, then logs what it did on its own.
    pub fn with_master<T>(&self, f: impl FnOnce(&mut Master, mooring_core::Millis) -> T) -> T {
        let mut master = self.master.lock().expect("master lock");
        let result = f(&mut master, self.clock.now());
        let events = master.drain_events();
        drop(master);
        log_events(events);
        result
    }

    /// Gauges and counters.
    pub fn stats(&self) -> Stats {
        self.with_master(|m, _| m.stats())
    }

    /// Runs `tick` whenever it is due, until the task is aborted.
    pub fn spawn_timer(self: &Arc<Self>) -> JoinHandle<()> {
        let service = Arc::clone(self);
        let resolution = crate::buggify::period(crate::buggify::Site::MASTER_TICK, TICK_RESOLUTION);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(resolution).await;
                service.with_master(|m, now| {
                    if m.next_deadline().is_some_and(|d| d <= now) {
                        m.tick(now);
                    }
                });
            }
        })
    }
}

impl RpcHandler for MasterService {
    fn handle(&self, request: MasterRequest) -> MasterResponse {
        // Every request and answer, for replaying a failure (RUST_LOG=mooring::master_service=trace).
        let logged = tracing::enabled!(tracing::Level::TRACE).then(|| format!("{request:?}"));
        let response = self.with_master(|m, now| dispatch::handle(m, request, now));
        if let Some(request) = logged {
            tracing::trace!(%request, ?response, "handled");
        }
        response
    }
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
        }
    }
}

/// A running master: its address and the tasks serving it.
pub struct RunningMaster {
    /// The service state.
    pub service: Arc<MasterService>,
    /// Where it listens.
    pub addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningMaster {
    /// Binds `listen` and serves peers that prove they hold `token`.
    pub async fn start(
        listen: &str,
        config: MasterConfig,
        token: Option<ClusterToken>,
    ) -> Result<RunningMaster> {
        let service = MasterService::new(config)?;
        let listener = TcpListener::bind(listen).await.map_err(|e| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("master cannot listen on {listen}: {e}"),
            )
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
        let tasks = vec![
            spawn_rpc_server(
                listener,
                service.clone(),
                crate::tuning::server_spin(),
                token,
            ),
            service.spawn_timer(),
        ];
        info!(%addr, "master listening");
        Ok(RunningMaster {
            service,
            addr,
            tasks,
        })
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
