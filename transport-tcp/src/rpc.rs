//! The control plane over TCP: a pooled request/response client and a frame-serving server.
//!
//! A call takes an idle connection from the pool (or opens one), writes the request and reads
//! the response in the calling task, so a round trip costs two syscalls on each side and no
//! task hand-offs. Connections that fail or time out are dropped, never reused. The server
//! serves each connection in its own task, one request at a time; clients get concurrency from
//! several connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mooring_core::{ClientId, Error, ErrorCode, Result};
use mooring_proto::auth::{Credential, Gate, Peer, Plane, Roles};
use mooring_proto::buggify;
use mooring_proto::serve::SenderClock;
use mooring_proto::trace::TraceId;
use mooring_proto::transport::{Answer, BoxFuture, ControlPlane, RpcHandler};
use mooring_proto::wire::{ControlRequest, MasterRequest, MasterResponse, Reply, STANDBY_REFUSAL};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::accept::spawn_accepting;
use crate::framed::{Framed, ReadError};
use crate::handshake::ConnectionClock;
use crate::limits::{ConnectionLimits, IDLE_TIMEOUT};
use crate::peer_clock::PeerClock;
use mooring_proto::refusals;

use crate::handshake;

/// Most idle connections kept per peer.
const MAX_IDLE: usize = 64;
/// A pooled connection idle longer than this is checked for a closed peer before use.
pub(crate) const RECHECK: Duration = Duration::from_millis(1);

/// While every master is unreachable or refuses as a standby (a leader is being elected),
/// a call tries them all again after this.
const ELECTION_RETRY: Duration = Duration::from_millis(100);

/// Finds a group's masters, the leader first (for a control plane given no fixed addresses:
/// `etcd://`).
pub type Discover = Arc<dyn Fn() -> BoxFuture<'static, Result<Vec<String>>> + Send + Sync>;

/// A pooled RPC client to the master: one address, or a group's (`A,B,C`, or found through
/// a [`Discover`]), of which it talks to whichever leads.
pub struct TcpControlPlane {
    /// Every master's address, as given (or where they are found).
    addr: String,
    addrs: std::sync::RwLock<Vec<String>>,
    /// Finds the masters again when none of `addrs` leads.
    discover: Option<Discover>,
    /// The index in `addrs` of the master calls go to.
    current: AtomicUsize,
    /// Pooled connections to `addrs[current]`, with when each was last used.
    idle: std::sync::Mutex<Vec<(ControlConn, Instant)>>,
    timeout: Duration,
    spin: Duration,
    token: Option<Credential>,
    client: ClientId,
}

impl TcpControlPlane {
    /// A client for the master at `addr` speaking for `client`, proving it holds `token` on
    /// every connection (the master then refuses requests that name another client); every
    /// call fails with `RPC_FAIL` if no reply comes within `timeout`. While waiting for a
    /// reply it busy-polls for up to `spin` first. `addr` may list a group's masters
    /// (`A,B,C`): a request none of them could be reached for, or a standby refused, goes to
    /// the next, until one leads or the timeout passes. A request sent that got no reply is
    /// never sent again (it may have been applied).
    pub fn new(
        addr: impl Into<String>,
        timeout: Duration,
        spin: Duration,
        token: Option<Credential>,
        client: ClientId,
    ) -> Arc<TcpControlPlane> {
        let addr = addr.into();
        let addrs = addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        TcpControlPlane::build(addr, addrs, None, timeout, spin, token, client)
    }

    /// Like [`TcpControlPlane::new`], for a group whose masters `discover` finds (`where` says
    /// where, for messages): it is asked before the first call, and again whenever none of
    /// the masters it named leads. A first call that cannot find any fails at once.
    pub fn discovered(
        r#where: impl Into<String>,
        discover: Discover,
        timeout: Duration,
        spin: Duration,
        token: Option<Credential>,
        client: ClientId,
    ) -> Arc<TcpControlPlane> {
        let r#where = r#where.into();
        let discover = Some(discover);
        TcpControlPlane::build(r#where, Vec::new(), discover, timeout, spin, token, client)
    }

    fn build(
        addr: String,
        addrs: Vec<String>,
        discover: Option<Discover>,
        timeout: Duration,
        spin: Duration,
        token: Option<Credential>,
        client: ClientId,
    ) -> Arc<TcpControlPlane> {
        Arc::new(TcpControlPlane {
            addr,
            addrs: std::sync::RwLock::new(addrs),
            discover,
            current: AtomicUsize::new(0),
            idle: std::sync::Mutex::new(Vec::new()),
            timeout,
            spin,
            token,
            client,
        })
    }

    /// Master `index`'s address.
    fn addr_at(&self, index: usize) -> String {
        let addrs = self.addrs.read().expect("address lock");
        addrs.get(index).unwrap_or(&self.addr).clone()
    }

    /// How many masters calls may go to.
    fn masters(&self) -> usize {
        self.addrs.read().expect("address lock").len()
    }

    /// Asks the discovery for the masters; true if it named some. A list that differs from
    /// the last starts over at its first (the leader).
    async fn rediscover(&self, refused: &std::sync::Mutex<Option<Error>>) -> Result<bool> {
        let Some(discover) = &self.discover else {
            return Ok(true);
        };
        let found = match discover().await {
            Ok(found) => found,
            // Never found any: say so now rather than at the timeout.
            Err(e) if self.masters() == 0 => return Err(e),
            Err(e) => {
                debug!(masters = %self.addr, "cannot find the masters again: {e}");
                *refused.lock().expect("refusal lock") = Some(e);
                return Ok(false);
            }
        };
        if found.is_empty() {
            return Ok(false);
        }
        let mut addrs = self.addrs.write().expect("address lock");
        if *addrs != found {
            debug!(masters = ?found, "found the group's masters at {}", self.addr);
            *addrs = found;
            self.current.store(0, Ordering::Relaxed);
            self.idle.lock().expect("pool lock").clear();
        }
        Ok(true)
    }

    /// A new connection to master `index`, past the handshake.
    async fn open(&self, index: usize) -> Result<ControlConn> {
        let addr = self.addr_at(index);
        let addr = addr.as_str();
        let mut conn = Framed::connect(addr, self.spin).await.map_err(|e| {
            Error::new(
                ErrorCode::RPC_FAIL,
                format!("cannot connect to the master at {addr}: {e}"),
            )
        })?;
        let clock = handshake::client(
            &mut conn,
            self.token.as_ref(),
            Plane::Control,
            self.client.0,
        )
        .await
        .map_err(|e| Error::new(ErrorCode::RPC_FAIL, format!("master at {addr}: {e}")))?;
        Ok(ControlConn {
            framed: conn,
            clock,
        })
    }

    /// The master's address (every master's, for a group).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends `request` to the master that leads: on a connection that cannot be opened, or a
    /// standby's refusal, the next master is tried, and all of them again after a pause. The
    /// last refusal is left in `refused`.
    async fn call_leader(
        &self,
        request: &mut ControlRequest,
        deadline: Instant,
        refused: &std::sync::Mutex<Option<Error>>,
    ) -> Result<Reply> {
        // Found before the first call, and again after every round in which none led.
        let mut find = self.masters() == 0;
        loop {
            if find && !self.rediscover(refused).await? {
                tokio::time::sleep(ELECTION_RETRY).await;
                continue;
            }
            find = self.discover.is_some();
            let masters = self.masters();
            for _ in 0..masters.max(1) {
                let index = self.current.load(Ordering::Relaxed);
                match self.round_trip(index, request, deadline, refused).await {
                    // A standby may lead shortly; another master may lead already.
                    Err(Attempt::Standby(e)) => {
                        self.move_on(index);
                        debug!(masters = %self.addr, "no master leads yet ({e}); trying again");
                        *refused.lock().expect("refusal lock") = Some(e);
                    }
                    Err(Attempt::NotSent(e)) if masters > 1 || self.discover.is_some() => {
                        self.move_on(index);
                        debug!(masters = %self.addr, "{e}; trying the next master");
                    }
                    Err(Attempt::NotSent(e) | Attempt::Failed(e) | Attempt::OutOfTime(e)) => {
                        return Err(e);
                    }
                    Ok(reply) => return reply,
                }
            }
            tokio::time::sleep(ELECTION_RETRY).await;
        }
    }

    /// Goes on from master `index` to the next (unless another call did already).
    fn move_on(&self, index: usize) {
        let next = (index + 1) % self.masters().max(1);
        if self
            .current
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.idle.lock().expect("pool lock").clear();
        }
    }

    /// One try at master `index`, valid until `deadline` (the master refuses it later). Once
    /// the request is sent, the last refusal in `refused` no longer describes the call: this
    /// master may lead now and apply it.
    async fn round_trip(
        &self,
        index: usize,
        request: &mut ControlRequest,
        deadline: Instant,
        refused: &std::sync::Mutex<Option<Error>>,
    ) -> std::result::Result<MasterResponse, Attempt> {
        let pooled = {
            let mut idle = self.idle.lock().expect("pool lock");
            // The master closes connections idle for IDLE_TIMEOUT: never race it. The newest
            // is on top; below a stale one, all are stale.
            loop {
                match idle.pop() {
                    // A master that restarted closed its end: skip what it left behind (a
                    // connection in use within the last millisecond is not worth the look).
                    Some((conn, used)) if used.elapsed() > RECHECK && conn.framed.peer_gone() => {
                        continue;
                    }
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
            None => self.open(index).await.map_err(Attempt::NotSent)?,
        };
        let id = TraceId::current().0;
        let fail = |what: String| {
            Attempt::Failed(Error::new(
                ErrorCode::RPC_FAIL,
                format!("master at {}: {what}", self.addr_at(index)),
            ))
        };
        let sent = Instant::now();
        let Some((sent_at_us, valid_for_us)) = conn.clock.stamp(deadline) else {
            return Err(Attempt::OutOfTime(Error::new(
                ErrorCode::RPC_FAIL,
                format!(
                    "master at {}: the call ran out of time before its request could be sent \
                     (the shortest round trip on this connection is {:?}); nothing was applied",
                    self.addr_at(index),
                    conn.clock.rtt
                ),
            )));
        };
        request.sent_at_us = sent_at_us;
        request.valid_for_us = valid_for_us;
        refused.lock().expect("refusal lock").take();
        conn.framed
            .write_message(id, &*request, &[])
            .await
            .map_err(|e| fail(format!("send failed: {e}")))?;
        let (reply_id, response) = conn
            .framed
            .read_message::<MasterResponse>()
            .await
            .map_err(|e| fail(format!("no reply: {e}")))?;
        conn.clock.saw_round_trip(sent.elapsed());
        if reply_id != id {
            return Err(fail(format!("reply {reply_id} to request {id}")));
        }
        if let Err(e) = &response
            && e.code == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
            && e.detail
                .as_deref()
                .is_some_and(|d| d.starts_with(STANDBY_REFUSAL))
        {
            return Err(Attempt::Standby(e.clone()));
        }
        if self.current.load(Ordering::Relaxed) == index {
            let mut idle = self.idle.lock().expect("pool lock");
            if idle.len() < MAX_IDLE {
                idle.push((conn, Instant::now()));
            }
        }
        Ok(response)
    }
}

/// A pooled connection to a master, with the clock its requests are stamped on.
struct ControlConn {
    framed: Framed,
    /// Its origin, and the shortest round trip seen on it so far.
    clock: ConnectionClock,
}

/// How one try at a master ended, when it gave no answer to pass on.
enum Attempt {
    /// No connection: the request was not sent.
    NotSent(Error),
    /// A master that does not lead refused it (and applied nothing).
    Standby(Error),
    /// Sent, but no reply: it may have been applied, so it is not sent again.
    Failed(Error),
    /// Too little of the call's time was left to send it: the master would refuse it.
    OutOfTime(Error),
}

impl ControlPlane for TcpControlPlane {
    fn send(&self, request: MasterRequest) -> BoxFuture<'_, Result<Reply>> {
        Box::pin(async move {
            let refused = std::sync::Mutex::new(None);
            let deadline = Instant::now() + self.timeout;
            // The caller stops waiting then, however many tries it takes.
            buggify::request_sent(TraceId::current().0, deadline);
            // Stamped afresh on each try (see `round_trip`).
            let mut request = ControlRequest {
                sent_at_us: 0,
                valid_for_us: 0,
                request,
            };
            let call = self.call_leader(&mut request, deadline, &refused);
            match tokio::time::timeout(self.timeout, call).await {
                Ok(result) => result,
                // Masters answered, but none led, and no try was in flight when time ran out:
                // nothing was applied, so say why (the refusal names the leader).
                Err(_) if let Some(refusal) = refused.into_inner().expect("refusal lock") => {
                    Err(refusal)
                }
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

/// Serves `handler` on every connection `listener` accepts whose peer proves it holds `token`
/// or a member credential issued from it, until the task is aborted. Each connection
/// busy-polls for up to `spin` for its next request before parking (a client making
/// back-to-back calls is answered without an epoll wake-up). Fails when `token` is a member's
/// credential: only the cluster token verifies others.
pub fn spawn_rpc_server(
    listener: TcpListener,
    handler: Arc<dyn RpcHandler>,
    spin: Duration,
    token: Option<Credential>,
) -> Result<JoinHandle<()>> {
    let gate =
        Gate::new(token, Plane::Control).map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, e))?;
    Ok(spawn_rpc_server_with_limits(
        listener,
        handler,
        spin,
        Arc::new(gate),
        ConnectionLimits::standard(),
    ))
}

/// [`spawn_rpc_server`] behind `gate` (whose revocation list may change while it serves),
/// with the connection caps `limits`.
pub fn spawn_rpc_server_with_limits(
    listener: TcpListener,
    handler: Arc<dyn RpcHandler>,
    spin: Duration,
    gate: Arc<Gate>,
    limits: Arc<ConnectionLimits>,
) -> JoinHandle<()> {
    spawn_accepting(
        listener,
        gate.clone(),
        limits,
        spin,
        "master",
        move |conn, member, answered, address| {
            let (handler, gate) = (handler.clone(), gate.clone());
            async move {
                let clock = PeerClock::from_handshake(answered);
                let connection = Connection {
                    handler: &*handler,
                    gate: &gate,
                    address: &address,
                    member,
                };
                connection.serve(conn, clock).await
            }
        },
    )
}

/// One authenticated control connection: the member it proved to be, behind which gate.
struct Connection<'a> {
    handler: &'a dyn RpcHandler,
    gate: &'a Gate,
    address: &'a str,
    member: Peer,
}

impl Connection<'_> {
    /// Serves requests until the peer leaves. Each is refused if it arrives after its sender
    /// stopped waiting (`clock` turns its validity into a deadline here), once the member's
    /// credential has expired or been revoked (then the connection closes), or if the member
    /// may not make it (`MasterRequest::refusal_for`: another client's id, a role it lacks).
    async fn serve(&self, mut conn: Framed, mut clock: PeerClock) {
        let peer = self.address;
        loop {
            let next = tokio::time::timeout(IDLE_TIMEOUT, conn.read_message::<ControlRequest>());
            let Ok(next) = next.await else {
                debug!(
                    peer,
                    "closing a control connection idle for {IDLE_TIMEOUT:?}"
                );
                return;
            };
            let (id, sent) = match next {
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
            let late = clock.expired(sent.sent_at_us, sent.valid_for_us);
            let lapsed = self
                .gate
                .still_valid(&self.member, handshake::unix_now())
                .err();
            let request = sent.request;
            if !late {
                buggify::request_acted_on(id);
            }
            let response = span.in_scope(|| self.answer(request, late, lapsed.as_deref()));
            let response = match response {
                Answer::Now(response) => response,
                Answer::WhenDurable(durable) => durable.await,
            };
            if let Err(e) = conn.write_message(id, &response, &[]).await {
                debug!(peer, "reply failed: {e}");
                return;
            }
            if lapsed.is_some() {
                return;
            }
        }
    }

    fn answer(&self, request: MasterRequest, late: bool, lapsed: Option<&str>) -> Answer {
        let peer = self.address;
        if late {
            refusals::refused(
                peer,
                &format!(
                    "{} arrived after its sender stopped waiting (delayed in the network); \
                     not applied",
                    request.name()
                ),
            );
            return Answer::Now(Err(Error::new(
                ErrorCode::RPC_FAIL,
                format!(
                    "the {} reached the master after its sender's deadline, so it was not \
                     applied; send it again",
                    request.name()
                ),
            )));
        }
        if let Some(why) = lapsed {
            refusals::refused(peer, why);
            return Answer::Now(Err(Error::new(ErrorCode::ILLEGAL_CLIENT, why)));
        }
        if let Some(refusal) = request.refusal_for(&self.member) {
            refusals::refused(peer, &format!("{}: {refusal}", request.name()));
            return Answer::Now(Err(refusal));
        }
        if request.is_admin() {
            info!(peer, member = %self.member.name, request = request.name(), "admin request");
        }
        let sees_owners = self
            .member
            .roles
            .intersects(Roles::NODE.union(Roles::ADMIN));
        match self.handler.answer(request) {
            Answer::Now(Ok(mut reply)) if !sees_owners => {
                reply.hide_owners(ClientId(self.member.client));
                Answer::Now(Ok(reply))
            }
            answer => answer,
        }
    }
}
