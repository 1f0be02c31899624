//! The control plane over the simulated network.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::transport::{Answer, BoxFuture, ControlPlane, RpcHandler};
use mooring_proto::wire::{ControlRequest, MasterRequest, MasterResponse, Reply, STANDBY_REFUSAL};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::datagram::{decode, encode};
use crate::mux::Mux;
use crate::net::SimNet;
use crate::server::{Handled, spawn_server};

/// RPC to the master over the simulated network. A lost request or reply is a timeout
/// (`RPC_FAIL`); nothing is retried, as over a broken TCP connection. Given a group's masters,
/// it talks to whichever leads: a standby's refusal (which applied nothing) sends the request
/// on to the next master within the call's time; a call that timed out fails, and the next
/// call starts at the next master (the one that went silent may be dead).
pub struct SimControlPlane {
    mux: Arc<Mux>,
    masters: Vec<SocketAddr>,
    /// The index in `masters` of the master calls go to.
    current: AtomicUsize,
    timeout: Duration,
    /// Requests' send times are measured from here.
    origin: Instant,
}

/// While every master refuses as a standby (a leader is being elected), a call tries them
/// all again after this.
const ELECTION_RETRY: Duration = Duration::from_millis(100);

impl SimControlPlane {
    /// A control plane from the current node (address `ip`) to the master at `master`.
    pub async fn new(
        net: Arc<SimNet>,
        ip: IpAddr,
        master: SocketAddr,
        timeout: Duration,
    ) -> io::Result<Arc<SimControlPlane>> {
        SimControlPlane::group(net, ip, vec![master], timeout).await
    }

    /// A control plane from the current node (address `ip`) to a group of `masters`, of
    /// which it talks to whichever leads.
    pub async fn group(
        net: Arc<SimNet>,
        ip: IpAddr,
        masters: Vec<SocketAddr>,
        timeout: Duration,
    ) -> io::Result<Arc<SimControlPlane>> {
        assert!(!masters.is_empty(), "a control plane needs a master");
        Ok(Arc::new(SimControlPlane {
            mux: Mux::bind(net, ip).await?,
            masters,
            current: AtomicUsize::new(0),
            timeout,
            origin: Instant::now(),
        }))
    }

    /// Goes on from master `index` to the next (unless another call did already).
    fn move_on(&self, index: usize) {
        let next = (index + 1) % self.masters.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// One round trip to master `index`, waiting until `deadline`.
    async fn round_trip(
        &self,
        index: usize,
        request: MasterRequest,
        deadline: Instant,
    ) -> Result<MasterResponse> {
        let master = self.masters[index];
        let id = self.mux.next_id();
        let fail =
            |what: String| Error::new(ErrorCode::RPC_FAIL, format!("master at {master}: {what}"));
        let left = deadline.saturating_duration_since(Instant::now());
        let request = ControlRequest {
            sent_at_us: self.origin.elapsed().as_micros() as u64,
            valid_for_us: left.as_micros() as u64,
            request,
        };
        let reply = self
            .mux
            .call(master, id, encode(id, &request, &[]), left)
            .await
            .map_err(|_| fail(format!("no reply within {:?}", self.timeout)))?;
        let (_, response, _) =
            decode::<MasterResponse>(&reply).map_err(|e| fail(format!("bad reply: {e}")))?;
        Ok(response)
    }
}

/// Whether `response` is a refusal from a master that does not lead (nothing was applied).
fn standby_refusal(response: &MasterResponse) -> bool {
    response.as_ref().is_err_and(|e| {
        e.code == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
            && e.detail
                .as_deref()
                .is_some_and(|d| d.starts_with(STANDBY_REFUSAL))
    })
}

impl ControlPlane for SimControlPlane {
    fn send(&self, request: MasterRequest) -> BoxFuture<'_, Result<Reply>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.timeout;
            if self.masters.len() == 1 {
                return self.round_trip(0, request, deadline).await?;
            }
            let mut tried = 0;
            loop {
                let index = self.current.load(Ordering::Relaxed);
                let response = match self.round_trip(index, request.clone(), deadline).await {
                    Ok(response) => response,
                    Err(silent) => {
                        self.move_on(index);
                        return Err(silent);
                    }
                };
                if !standby_refusal(&response) {
                    return response;
                }
                self.move_on(index);
                tried += 1;
                if tried % self.masters.len() == 0 {
                    // None leads yet: wait for the election, within the call's time.
                    let pause =
                        ELECTION_RETRY.min(deadline.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(pause).await;
                }
                if Instant::now() >= deadline {
                    return response;
                }
            }
        })
    }
}

/// Serves `handler` on `bind` (on the current node) until the task is aborted. A request's
/// validity goes unchecked: the simulated network delays a datagram by at most its noise's
/// largest delay (under 100 ms), well within every call's timeout, and a cut drops
/// datagrams rather than holding them (a stalled TCP stream is what delivers requests late;
/// see `mooring_transport_tcp`).
pub async fn serve_rpc(
    net: Arc<SimNet>,
    bind: SocketAddr,
    handler: Arc<dyn RpcHandler>,
) -> io::Result<JoinHandle<()>> {
    spawn_server(
        net,
        bind,
        Box::new(
            move |datagram, from| match decode::<ControlRequest>(datagram) {
                Ok((id, sent, _)) => {
                    match handler.answer(sent.request) {
                        Answer::Now(response) => Handled::Now(Some(encode(id, &response, &[]))),
                        Answer::WhenDurable(durable) => Handled::Later(Box::pin(async move {
                            Some(encode(id, &durable.await, &[]))
                        })),
                    }
                }
                Err(e) => {
                    warn!(%from, "refusing a request: {e}");
                    Handled::Now(None)
                }
            },
        ),
    )
    .await
}
