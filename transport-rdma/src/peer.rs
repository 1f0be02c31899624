//! Queue pairs to one peer, pooled: several per peer so a large transfer can stripe over them
//! and concurrent transfers do not queue behind each other. A queue pair is connected by
//! exchanging endpoints through a [`Handshake`] (the node's authenticated data-server
//! connection); one that failed is reset and connected afresh before its next use.

use std::sync::{Arc, Mutex};

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::transport::BoxFuture;
use tokio::sync::Notify;

use crate::verbs::{QpEndpoint, QpState, Verbs};

/// How a client reaches a peer's side of a queue pair: sends this side's endpoint (and the
/// peer's queue pair it replaces, if any) and gets the peer's.
pub trait Handshake: Send + Sync {
    /// Asks the peer for a queue pair connected to `local`; the peer may drop `replaces`.
    fn connect(
        &self,
        local: QpEndpoint,
        replaces: Option<u32>,
    ) -> BoxFuture<'_, Result<QpEndpoint>>;
}

/// A queue pair of the pool.
#[derive(Debug)]
pub(crate) struct QueuePair {
    pub(crate) qpn: u32,
    /// The peer's queue pair it is connected to, once connected.
    pub(crate) remote: Option<u32>,
    /// It failed (or a transfer on it was abandoned): reset and reconnect before use.
    pub(crate) broken: bool,
}

/// The queue pairs to one peer.
pub struct Peer<V: Verbs> {
    verbs: Arc<V>,
    handshake: Arc<dyn Handshake>,
    depth: u32,
    limit: usize,
    pool: Mutex<PoolState>,
    returned: Notify,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<QueuePair>,
    created: usize,
}

impl<V: Verbs> Peer<V> {
    /// A pool of at most `limit` queue pairs of `depth` send slots each, connected through
    /// `handshake`.
    pub fn new(verbs: Arc<V>, handshake: Arc<dyn Handshake>, depth: u32, limit: usize) -> Self {
        Peer {
            verbs,
            handshake,
            depth,
            limit: limit.max(1),
            pool: Mutex::new(PoolState::default()),
            returned: Notify::new(),
        }
    }

    /// The device the pool's queue pairs live on.
    pub fn verbs(&self) -> &Arc<V> {
        &self.verbs
    }

    /// How many queue pairs exist now (idle or in use).
    pub fn queue_pairs(&self) -> usize {
        self.lock().created
    }

    /// Takes up to `want` connected queue pairs (at least one), creating them up to the limit
    /// and waiting for one to come back when all are in use. They return to the pool when
    /// the lease drops, however the transfer ends (a dropped future included).
    pub(crate) async fn take(&self, want: usize) -> Result<Lease<'_, V>> {
        loop {
            let mut lease = Lease {
                peer: self,
                qps: Vec::new(),
            };
            let to_create = {
                let mut pool = self.lock();
                let n = want.min(pool.idle.len());
                let at = pool.idle.len() - n;
                lease.qps = pool.idle.split_off(at);
                let to_create = (want - lease.qps.len()).min(self.limit - pool.created);
                pool.created += to_create;
                to_create
            };
            for made in 0..to_create {
                match self.create() {
                    Ok(qp) => lease.qps.push(qp),
                    Err(e) => {
                        self.lock().created -= to_create - made;
                        return Err(e);
                    }
                }
            }
            if lease.qps.is_empty() {
                let returned = self.returned.notified();
                drop(lease);
                returned.await;
                continue;
            }
            for qp in &mut lease.qps {
                if qp.remote.is_none() || qp.broken {
                    // Broken until connected, in case this future is dropped part way.
                    qp.broken = true;
                    self.connect(qp).await?;
                }
            }
            return Ok(lease);
        }
    }

    fn create(&self) -> Result<QueuePair> {
        let qpn = self
            .verbs
            .create_qp(self.depth)
            .map_err(|e| transfer_error(format!("cannot create a queue pair: {e}")))?;
        Ok(QueuePair {
            qpn,
            remote: None,
            broken: false,
        })
    }

    /// Resets `qp` and connects it to a fresh queue pair on the peer.
    async fn connect(&self, qp: &mut QueuePair) -> Result<()> {
        let verbs = &self.verbs;
        let step = |state, remote: Option<&QpEndpoint>| {
            verbs
                .modify_qp(qp.qpn, state, remote)
                .map_err(|e| transfer_error(format!("queue pair {}: {e}", qp.qpn)))
        };
        step(QpState::Reset, None)?;
        step(QpState::Init, None)?;
        let local = verbs
            .endpoint(qp.qpn)
            .map_err(|e| transfer_error(e.to_string()))?;
        let remote = self.handshake.connect(local, qp.remote).await?;
        step(QpState::ReadyToReceive, Some(&remote))?;
        step(QpState::ReadyToSend, None)?;
        qp.remote = Some(remote.qpn);
        qp.broken = false;
        tracing::debug!(
            qpn = qp.qpn,
            remote_qpn = remote.qpn,
            "queue pair connected"
        );
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<V: Verbs> Drop for Peer<V> {
    fn drop(&mut self) {
        for qp in self.lock().idle.drain(..) {
            self.verbs.destroy_qp(qp.qpn);
        }
    }
}

/// Queue pairs taken from a [`Peer`] for one transfer; they go back when this drops.
pub(crate) struct Lease<'a, V: Verbs> {
    peer: &'a Peer<V>,
    pub(crate) qps: Vec<QueuePair>,
}

impl<V: Verbs> Drop for Lease<'_, V> {
    fn drop(&mut self) {
        if self.qps.is_empty() {
            return;
        }
        self.peer.lock().idle.append(&mut self.qps);
        // Wake every waiter, and leave a permit for one that is about to wait.
        self.peer.returned.notify_waiters();
        self.peer.returned.notify_one();
    }
}

/// A `TRANSFER_FAIL` error saying `message`.
pub(crate) fn transfer_error(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::TRANSFER_FAIL, message)
}
