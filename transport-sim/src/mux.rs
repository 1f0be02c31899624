//! A caller's endpoint: sends requests and routes each reply to the call waiting for it.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::net::Endpoint;
use madsim::rand::Rng;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::datagram::{TAG_REPLY, TAG_REQUEST, check};
use crate::net::SimNet;

type Pending = Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>;

/// Why a call got no reply.
#[derive(Debug)]
pub(crate) enum CallError {
    /// Nothing came back in time (lost, partitioned, or the peer is down).
    Timeout,
}

/// One endpoint per caller, shared by its control and data planes.
pub(crate) struct Mux {
    net: Arc<SimNet>,
    endpoint: Endpoint,
    addr: SocketAddr,
    /// High half of every request id: distinguishes this endpoint's incarnation, so a
    /// restarted caller's fresh ids are not taken for duplicates of its predecessor's.
    session: u64,
    next: AtomicU32,
    pending: Arc<Pending>,
    receiver: JoinHandle<()>,
}

impl Mux {
    /// Binds a fresh endpoint on `ip` (the current simulated node's address).
    pub(crate) async fn bind(net: Arc<SimNet>, ip: IpAddr) -> io::Result<Arc<Mux>> {
        let endpoint = Endpoint::bind(SocketAddr::new(ip, 0)).await?;
        let addr = endpoint.local_addr()?;
        let pending: Arc<Pending> = Arc::default();
        let receiver = tokio::spawn(route_replies(
            endpoint.clone(),
            pending.clone(),
            net.clone(),
        ));
        let session = u64::from(madsim::rand::thread_rng().r#gen::<u32>() | 1);
        Ok(Arc::new(Mux {
            net,
            endpoint,
            addr,
            session,
            next: AtomicU32::new(1),
            pending,
            receiver,
        }))
    }

    /// A request id no other call of this or an earlier incarnation used.
    pub(crate) fn next_id(&self) -> u64 {
        (self.session << 32) | u64::from(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Sends `datagram` (whose request id is `id`) to `to` and waits up to `timeout` for the
    /// reply.
    pub(crate) async fn call(
        &self,
        to: SocketAddr,
        id: u64,
        datagram: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id, tx);
        self.net
            .send(&self.endpoint, self.addr, to, TAG_REQUEST, datagram);
        let reply = tokio::time::timeout(timeout, rx).await;
        self.lock().remove(&id);
        match reply {
            Ok(Ok(reply)) => Ok(reply),
            _ => Err(CallError::Timeout),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Vec<u8>>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.receiver.abort();
    }
}

/// Hands every intact reply to its waiting call; drops corrupt ones and late ones.
async fn route_replies(endpoint: Endpoint, pending: Arc<Pending>, net: Arc<SimNet>) {
    loop {
        let Ok((payload, from)) = endpoint.recv_from_raw(TAG_REPLY).await else {
            return;
        };
        let Ok(datagram) = payload.downcast::<Vec<u8>>() else {
            continue;
        };
        let id = match check(&datagram) {
            Ok((header, _)) => header.request_id,
            Err(e) => {
                debug!(%from, "dropping a corrupt reply: {e}");
                net.count_refused();
                continue;
            }
        };
        let waiter = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        match waiter {
            Some(tx) => {
                let _ = tx.send(*datagram);
            }
            None => debug!(%from, id, "dropping a reply nobody waits for (late or duplicate)"),
        }
    }
}
