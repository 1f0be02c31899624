//! The control plane over the simulated network.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::transport::{Answer, BoxFuture, ControlPlane, RpcHandler};
use mooring_proto::wire::{ControlRequest, MasterRequest, MasterResponse, Reply};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::datagram::{decode, encode};
use crate::mux::Mux;
use crate::net::SimNet;
use crate::server::{Handled, spawn_server};

/// RPC to the master over the simulated network. A lost request or reply is a timeout
/// (`RPC_FAIL`); nothing is retried, as over a broken TCP connection.
pub struct SimControlPlane {
    mux: Arc<Mux>,
    master: SocketAddr,
    timeout: Duration,
    /// Requests' send times are measured from here.
    origin: Instant,
}

impl SimControlPlane {
    /// A control plane from the current node (address `ip`) to the master at `master`.
    pub async fn new(
        net: Arc<SimNet>,
        ip: IpAddr,
        master: SocketAddr,
        timeout: Duration,
    ) -> io::Result<Arc<SimControlPlane>> {
        Ok(Arc::new(SimControlPlane {
            mux: Mux::bind(net, ip).await?,
            master,
            timeout,
            origin: Instant::now(),
        }))
    }
}

impl ControlPlane for SimControlPlane {
    fn send(&self, request: MasterRequest) -> BoxFuture<'_, Result<Reply>> {
        Box::pin(async move {
            let id = self.mux.next_id();
            let fail = |what: String| {
                Error::new(
                    ErrorCode::RPC_FAIL,
                    format!("master at {}: {what}", self.master),
                )
            };
            let request = ControlRequest {
                sent_at_us: self.origin.elapsed().as_micros() as u64,
                valid_for_us: self.timeout.as_micros() as u64,
                request,
            };
            let reply = self
                .mux
                .call(self.master, id, encode(id, &request, &[]), self.timeout)
                .await
                .map_err(|_| fail(format!("no reply within {:?}", self.timeout)))?;
            let (_, response, _) =
                decode::<MasterResponse>(&reply).map_err(|e| fail(format!("bad reply: {e}")))?;
            response
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
