//! The accept loop the control-plane servers share (the master's RPC server, a peer's
//! service): each connection admitted within the connection limits, proven by the handshake
//! behind the gate, then handed to its server with the member it proved.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use mooring_proto::auth::{Gate, Peer};
use mooring_proto::refusals;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::framed::{Framed, PACE_CAP};
use crate::handshake;
use crate::limits::ConnectionLimits;

/// Accepts on `listener` until the task is aborted; aborting it also closes every connection
/// it accepted (a server that stops falls silent, as a process that ends does). Each
/// connection busy-polls up to `spin` (following its peer's pace), and once its peer proves
/// itself, runs `serve(connection, member, when its answer arrived, peer address)`; the
/// connection's slot in `limits` is held until `serve` returns. `server` names it in
/// refusals.
pub(crate) fn spawn_accepting<F, Fut>(
    listener: TcpListener,
    gate: Arc<Gate>,
    limits: Arc<ConnectionLimits>,
    spin: Duration,
    server: &'static str,
    serve: F,
) -> JoinHandle<()>
where
    F: Fn(Framed, Peer, Instant, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    tokio::spawn(async move {
        let mut connections = Connections(Vec::new());
        loop {
            let (stream, address) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let mut handshaking = match limits.admit(address.ip()) {
                Ok(handshaking) => handshaking,
                Err(why) => {
                    refusals::refused(&address.to_string(), &format!("{server}: {why}"));
                    continue;
                }
            };
            let (serve, gate) = (serve.clone(), gate.clone());
            connections.0.retain(|task| !task.is_finished());
            connections.0.push(tokio::spawn(async move {
                let address = address.to_string();
                let mut conn = Framed::new(stream, spin).follow_pace(spin * PACE_CAP);
                let proven = tokio::select! {
                    proven = handshake::server(&mut conn, &gate) => proven,
                    () = handshaking.dismissed() => Err(crate::limits::DISMISSED.to_string()),
                };
                let admitted = proven.and_then(|(member, answered)| {
                    let admitted = handshaking.authenticated(member.client)?;
                    Ok((member, answered, admitted))
                });
                match admitted {
                    Ok((member, answered, _admitted)) => {
                        serve(conn, member, answered, address).await
                    }
                    Err(e) => refusals::refused(&address, &e),
                }
            }));
        }
    })
}

/// The connection tasks of one accept loop, aborted with it.
struct Connections(Vec<JoinHandle<()>>);

impl Drop for Connections {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
