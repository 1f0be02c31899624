//! Peer mode over TCP: each peer serves [`PeerRequest`]s and calls other peers' services
//! through pooled connections ([`PeerLinks`]).
//!
//! Every connection opens with the cluster handshake. A peer then names itself with a
//! greeting ([`PeerRequest::Hello`]) before its first directory message: a connection's
//! directory messages are taken as its greeter's, and a member credential may greet only as
//! the name it was issued for, so a peer cannot speak for another. A client with no pool of
//! its own never greets: it may look up, read, write through and remove.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::peer::membership::MemberInfo;
use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::auth::{Credential, Gate, Peer, Plane, Roles};
use mooring_proto::refusals;
use mooring_proto::transport::BoxFuture;
use mooring_proto::wire::{PeerReply, PeerRequest, PeerResponse};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::accept::spawn_accepting;
use crate::framed::{Framed, ReadError};
use crate::handshake;
use crate::limits::{ConnectionLimits, IDLE_TIMEOUT};

/// Most idle connections kept per peer.
const MAX_IDLE: usize = 16;

/// Who is calling on one connection: what its handshake proved and, once it greeted, the
/// peer name it speaks as.
#[derive(Clone, Debug)]
pub struct PeerCaller {
    /// What the handshake proved.
    pub member: Peer,
    /// The name it greeted as (`None`: a client, or a peer that has not greeted yet).
    pub name: Option<Box<str>>,
}

impl PeerCaller {
    /// Whether the caller may act as a peer (publish, greet, promote).
    pub fn is_peer(&self) -> bool {
        self.member.roles.contains(Roles::NODE)
    }

    /// Binds the connection to peer `name`, if its credential allows: a member credential
    /// only to its own name; the cluster secret (or no token) to any.
    pub fn greet_as(&mut self, name: &str) -> Result<()> {
        if !self.is_peer() {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!(
                    "{} greeted as a peer, but its credential has no node role: \
                     issue it one with the node role to run a peer",
                    self.member.name
                ),
            ));
        }
        if self.member.credential.is_some() && self.member.name != name {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!(
                    "the credential of {:?} greeted as peer {name:?}: a peer's name must be \
                     its credential's (issue the credential for the peer's address)",
                    self.member.name
                ),
            ));
        }
        if self.name.as_deref().is_some_and(|bound| bound != name) {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!(
                    "a connection greeted as {:?} cannot greet as {name:?}",
                    self.name
                ),
            ));
        }
        self.name = Some(name.into());
        Ok(())
    }
}

/// A peer's request handling, as its TCP server calls it.
pub trait PeerService: Send + Sync + 'static {
    /// Answers `request` from `caller` (a greeting binds the caller's name).
    fn answer<'a>(
        &'a self,
        caller: &'a mut PeerCaller,
        request: PeerRequest,
    ) -> BoxFuture<'a, PeerResponse>;
}

/// Serves `service` on every connection `listener` accepts that passes `gate`'s handshake,
/// within `limits`, until the task is aborted.
pub fn spawn_peer_server(
    listener: TcpListener,
    service: Arc<dyn PeerService>,
    gate: Arc<Gate>,
    limits: Arc<ConnectionLimits>,
) -> JoinHandle<()> {
    let served = gate.clone();
    spawn_accepting(
        listener,
        gate,
        limits,
        Duration::ZERO,
        "peer",
        move |mut conn, member, _, address| {
            let (service, gate) = (service.clone(), served.clone());
            async move {
                let mut caller = PeerCaller { member, name: None };
                serve(&mut conn, &*service, &gate, &mut caller, &address).await
            }
        },
    )
}

/// Answers one connection's requests, one at a time, until it closes, idles out, or its
/// credential lapses.
async fn serve(
    conn: &mut Framed,
    service: &dyn PeerService,
    gate: &Gate,
    caller: &mut PeerCaller,
    address: &str,
) {
    loop {
        let next = tokio::time::timeout(IDLE_TIMEOUT, conn.read_message::<PeerRequest>());
        let (id, request) = match next.await {
            Err(_) | Ok(Err(ReadError::Closed)) => return,
            Ok(Ok(message)) => message,
            Ok(Err(ReadError::Io(e))) => {
                debug!(peer = address, "connection ended: {e}");
                return;
            }
            Ok(Err(ReadError::Frame(e))) => {
                refusals::refused(address, &format!("closing the connection: {e}"));
                return;
            }
        };
        let lapsed = gate
            .still_valid(&caller.member, handshake::unix_now())
            .err();
        let response = match &lapsed {
            Some(why) => {
                refusals::refused(address, why);
                Err(Error::new(ErrorCode::ILLEGAL_CLIENT, why.clone()))
            }
            None => service.answer(caller, request).await,
        };
        if let Err(e) = conn.write_message(id, &response, &[]).await {
            debug!(peer = address, "reply failed: {e}");
            return;
        }
        if lapsed.is_some() {
            return;
        }
    }
}

/// Pooled connections to other peers' services. A link of a peer greets on every new
/// connection, so what it sends there is taken as its own; a client's never greets.
pub struct PeerLinks {
    me: Option<MemberInfo>,
    token: Option<Credential>,
    client: u128,
    timeout: Duration,
    idle: Mutex<HashMap<Box<str>, Vec<Framed>>>,
}

impl PeerLinks {
    /// Links for peer `me` (`None`: a client with no pool), proving `token` as client id
    /// `client`; a call without an answer within `timeout` fails with `RPC_FAIL`.
    pub fn new(
        me: Option<MemberInfo>,
        token: Option<Credential>,
        client: u128,
        timeout: Duration,
    ) -> Arc<PeerLinks> {
        Arc::new(PeerLinks {
            me,
            token,
            client,
            timeout,
            idle: Mutex::new(HashMap::new()),
        })
    }

    /// Sends `request` to the peer at `to` and waits for its answer. A connection that fails
    /// or times out is dropped, never reused.
    pub async fn call(&self, to: &str, request: &PeerRequest) -> Result<PeerReply> {
        let exchange = async {
            let pooled = self
                .idle
                .lock()
                .expect("peer link lock")
                .get_mut(to)
                .and_then(Vec::pop);
            let mut conn = match pooled {
                Some(conn) if !conn.peer_gone() => conn,
                _ => self.open(to).await?,
            };
            let reply = exchange(&mut conn, request)
                .await
                .map_err(|e| Error::new(ErrorCode::RPC_FAIL, format!("peer {to}: {e}")))?;
            let mut idle = self.idle.lock().expect("peer link lock");
            let kept = idle.entry(to.into()).or_default();
            if kept.len() < MAX_IDLE {
                kept.push(conn);
            }
            reply
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(reply) => reply,
            Err(_) => Err(Error::new(
                ErrorCode::RPC_FAIL,
                format!("peer {to} did not answer within {:?}", self.timeout),
            )),
        }
    }

    /// Drops the idle connections to `peer` (it died or restarted).
    pub fn forget(&self, peer: &str) {
        self.idle.lock().expect("peer link lock").remove(peer);
    }

    async fn open(&self, to: &str) -> Result<Framed> {
        let mut conn = Framed::connect(to, Duration::ZERO).await.map_err(|e| {
            Error::new(
                ErrorCode::RPC_FAIL,
                format!("cannot connect to peer {to}: {e}"),
            )
        })?;
        handshake::client(&mut conn, self.token.as_ref(), Plane::Control, self.client)
            .await
            .map_err(|e| Error::new(ErrorCode::RPC_FAIL, format!("peer {to}: {e}")))?;
        if let Some(me) = &self.me {
            let hello = PeerRequest::Hello {
                me: me.clone(),
                known: Vec::new(),
            };
            exchange(&mut conn, &hello)
                .await
                .map_err(|e| Error::new(ErrorCode::RPC_FAIL, format!("peer {to}: {e}")))??;
        }
        Ok(conn)
    }
}

/// One request and its answer on `conn`.
async fn exchange(
    conn: &mut Framed,
    request: &PeerRequest,
) -> std::result::Result<PeerResponse, String> {
    conn.write_message(1, request, &[])
        .await
        .map_err(|e| format!("send failed: {e}"))?;
    match conn.read_message::<PeerResponse>().await {
        Ok((_, response)) => Ok(response),
        Err(ReadError::Closed) => Err("closed the connection".into()),
        Err(ReadError::Io(e)) => Err(format!("receive failed: {e}")),
        Err(ReadError::Frame(e)) => Err(format!("bad reply: {e}")),
    }
}
