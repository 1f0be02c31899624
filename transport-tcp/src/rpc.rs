//! The control plane over TCP: a pooled request/response client and a frame-serving server.
//!
//! A call takes an idle connection from the pool (or opens one), writes the request and reads
//! the response in the calling task, so a round trip costs two syscalls on each side and no
//! task hand-offs. Connections that fail or time out are dropped, never reused. The server
//! serves each connection in its own task, one request at a time; clients get concurrency from
//! several connections.

use std::sync::Arc;
use std::time::Duration;

use mooring_core::{ClientId, Error, ErrorCode, Result};
use mooring_proto::auth::ClusterToken;
use mooring_proto::trace::TraceId;
use mooring_proto::transport::{Answer, BoxFuture, ControlPlane, RpcHandler};
use mooring_proto::wire::{MasterRequest, MasterResponse, Reply};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::framed::{Framed, ReadError};
use crate::limits::{ConnectionLimits, IDLE_TIMEOUT};
use crate::{handshake, refusals};

/// Most idle connections kept per peer.
const MAX_IDLE: usize = 64;
/// A pooled connection idle longer than this is checked for a closed peer before use.
pub(crate) const RECHECK: Duration = Duration::from_millis(1);

/// A pooled RPC client to one master.
pub struct TcpControlPlane {
    addr: String,
    /// Pooled connections, with when each was last used.
    idle: std::sync::Mutex<Vec<(Framed, Instant)>>,
    timeout: Duration,
    spin: Duration,
    token: Option<ClusterToken>,
    client: ClientId,
}

impl TcpControlPlane {
    /// A client for the master at `addr` speaking for `client`, proving it holds `token` on
    /// every connection (the master then refuses requests that name another client); every
    /// call fails with `RPC_FAIL` if no reply comes within `timeout`. While waiting for a
    /// reply it busy-polls for up to `spin` first.
    pub fn new(
        addr: impl Into<String>,
        timeout: Duration,
        spin: Duration,
        token: Option<ClusterToken>,
        client: ClientId,
    ) -> Arc<TcpControlPlane> {
        Arc::new(TcpControlPlane {
            addr: addr.into(),
            idle: std::sync::Mutex::new(Vec::new()),
            timeout,
            spin,
            token,
            client,
        })
    }

    /// A new connection to the master, past the handshake.
    async fn open(&self) -> Result<Framed> {
        let mut conn = Framed::connect(&self.addr, self.spin).await.map_err(|e| {
            Error::new(
                ErrorCode::RPC_FAIL,
                format!("cannot connect to the master at {}: {e}", self.addr),
            )
        })?;
        handshake::client(&mut conn, self.token.as_ref(), self.client.0)
            .await
            .map_err(|e| {
                Error::new(ErrorCode::RPC_FAIL, format!("master at {}: {e}", self.addr))
            })?;
        Ok(conn)
    }

    /// The master's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn round_trip(&self, request: &MasterRequest) -> Result<Reply> {
        let pooled = {
            let mut idle = self.idle.lock().expect("pool lock");
            // The master closes connections idle for IDLE_TIMEOUT: never race it. The newest
            // is on top; below a stale one, all are stale.
            loop {
                match idle.pop() {
                    // A master that restarted closed its end: skip what it left behind (a
                    // connection in use within the last millisecond is not worth the look).
                    Some((conn, used)) if used.elapsed() > RECHECK && conn.peer_gone() => continue,
                    Some((conn, used)) if used.elapsed() < IDLE_TIMEOUT / 2 => break Some(conn),
                    Some(_) => {
                        idle.clear();
                        break None;
                    }
                    None => break None,
                }
            }
        };
        let mut conn = match pooled {
            Some(conn) => conn,
            None => self.open().await?,
        };
        let id = TraceId::current().0;
        let fail = |what: String| {
            Error::new(
                ErrorCode::RPC_FAIL,
                format!("master at {}: {what}", self.addr),
            )
        };
        conn.write_message(id, request, &[])
            .await
            .map_err(|e| fail(format!("send failed: {e}")))?;
        let (reply_id, response) = conn
            .read_message::<MasterResponse>()
            .await
            .map_err(|e| fail(format!("no reply: {e}")))?;
        if reply_id != id {
            return Err(fail(format!("reply {reply_id} to request {id}")));
        }
        let mut idle = self.idle.lock().expect("pool lock");
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now()));
        }
        response
    }
}

impl ControlPlane for TcpControlPlane {
    fn send(&self, request: MasterRequest) -> BoxFuture<'_, Result<Reply>> {
        Box::pin(async move {
            match tokio::time::timeout(self.timeout, self.round_trip(&request)).await {
                Ok(result) => result,
                Err(_) => Err(Error::new(
                    ErrorCode::RPC_FAIL,
                    format!(
                        "master at {} did not answer within {:?}",
                        self.addr, self.timeout
                    ),
                )),
            }
        })
    }
}

/// Serves `handler` on every connection `listener` accepts whose peer proves it holds `token`,
/// until the task is aborted. Each connection busy-polls for up to `spin` for its next request
/// before parking (a client making back-to-back calls is answered without an epoll wake-up).
pub fn spawn_rpc_server(
    listener: TcpListener,
    handler: Arc<dyn RpcHandler>,
    spin: Duration,
    token: Option<ClusterToken>,
) -> JoinHandle<()> {
    spawn_rpc_server_with_limits(listener, handler, spin, token, ConnectionLimits::standard())
}

/// [`spawn_rpc_server`] with the connection caps `limits`.
pub fn spawn_rpc_server_with_limits(
    listener: TcpListener,
    handler: Arc<dyn RpcHandler>,
    spin: Duration,
    token: Option<ClusterToken>,
    limits: Arc<ConnectionLimits>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let handshaking = match limits.admit() {
                Ok(handshaking) => handshaking,
                Err(why) => {
                    refusals::refused(&peer.to_string(), &format!("master: {why}"));
                    continue;
                }
            };
            let (handler, token) = (handler.clone(), token.clone());
            tokio::spawn(async move {
                let peer = peer.to_string();
                let mut conn = Framed::new(stream, spin);
                let client = handshake::server(&mut conn, token.as_ref()).await;
                match client.and_then(|id| Ok((id, handshaking.authenticated(id)?))) {
                    Ok((client, _admitted)) => {
                        serve_connection(conn, &*handler, &peer, ClientId(client)).await
                    }
                    Err(e) => refusals::refused(&peer, &e),
                }
            });
        }
    })
}

/// Serves one connection that speaks for client `bound`: a request naming another client is
/// refused (no peer may act as another's id: end its writes, unmount its segments).
async fn serve_connection(mut conn: Framed, handler: &dyn RpcHandler, peer: &str, bound: ClientId) {
    loop {
        let next = tokio::time::timeout(IDLE_TIMEOUT, conn.read_message::<MasterRequest>());
        let Ok(next) = next.await else {
            debug!(
                peer,
                "closing a control connection idle for {IDLE_TIMEOUT:?}"
            );
            return;
        };
        let (id, request) = match next {
            Ok(message) => message,
            Err(ReadError::Closed) => return,
            Err(ReadError::Io(e)) => {
                debug!(peer, "connection ended: {e}");
                return;
            }
            Err(ReadError::Frame(e)) => {
                refusals::refused(peer, &format!("closing the connection: {e}"));
                return;
            }
        };
        // The request's id is its operation's trace id: the handler's lines carry it.
        let span = tracing::debug_span!("request", trace = %TraceId(id));
        let response = span.in_scope(|| match request.client() {
            Some(named) if named != bound => {
                refusals::refused(
                    peer,
                    &format!(
                        "{} names {named:?} on a connection of {bound:?}",
                        request.name()
                    ),
                );
                Answer::Now(Err(Error::new(
                    ErrorCode::ILLEGAL_CLIENT,
                    format!("this connection speaks for {bound:?}; it cannot act as {named:?}"),
                )))
            }
            _ => {
                if request.is_admin() {
                    info!(peer, client = ?bound, request = request.name(), "admin request");
                }
                handler.answer(request)
            }
        });
        let response = match response {
            Answer::Now(response) => response,
            Answer::WhenDurable(durable) => durable.await,
        };
        if let Err(e) = conn.write_message(id, &response, &[]).await {
            debug!(peer, "reply failed: {e}");
            return;
        }
    }
}
