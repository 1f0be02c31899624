//! The data plane over TCP: one-sided reads and writes of segment memory, emulated by a small
//! data server on each node.
//!
//! The node's [`TcpDataServer`] copies between the socket and segment memory directly (bulk
//! bytes are read from the socket into the segment and written from it, never staged). The
//! client side, [`TcpDataPlane`], batches every range for one node into one request, stripes
//! large transfers over several connections in parallel, and short-circuits to a `memcpy` when
//! the segment lives in the caller's own process ([`LocalSegments`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use mooring_core::{Checksum, Error, ErrorCode, Result};
use mooring_proto::auth::{Credential, Gate, Plane};
use mooring_proto::buggify::{self, Site};
use mooring_proto::serve::{DataService, Ranges, Served};
use mooring_proto::summing::{STEP, Summing};
use mooring_proto::trace::TraceId;
use mooring_proto::transport::{
    BoxFuture, DataPlane, DataServer, LandedPiece, NodeAddr, ReadOp, SegmentMemory, WriteOp,
    checksums_of,
};
use mooring_proto::wire::{DataReply, DataRequest, DataResponse};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::framed::{Framed, PACE_CAP, ReadError};
use crate::handshake::ConnectionClock;
use crate::lanes::{ReadPiece, SplitBuf, WritePiece, chunk_ops, ranges_of, split_lanes};
use crate::limits::{ConnectionLimits, IDLE_TIMEOUT};
use crate::peer_clock::PeerClock;
use mooring_proto::refusals;

use crate::handshake;

/// Segments served from this process, so transfers to them are a `memcpy`. Share one between
/// the data servers and data planes of one process; never across simulated nodes.
#[derive(Default)]
pub struct LocalSegments {
    segments: RwLock<HashMap<(Arc<str>, u64), SegmentMemory>>,
}

impl LocalSegments {
    fn get(&self, node: &NodeAddr) -> Option<SegmentMemory> {
        self.segments
            .read()
            .expect("local segments lock")
            .get(&(node.endpoint.clone(), node.key))
            .cloned()
    }
}

/// A node's data server: serves one-sided transfers to the segments it exports.
pub struct TcpDataServer {
    endpoint: Arc<str>,
    service: DataService,
    local: Arc<LocalSegments>,
    accept: Mutex<Option<JoinHandle<()>>>,
    spin: Duration,
    /// Checks that each connection's peer holds this cluster's data-plane key.
    gate: Gate,
    /// Connections open now, capped in total, in their handshake and per identity.
    limits: Arc<ConnectionLimits>,
}

/// A dropped server releases its port at once: the accept loop holds only a weak reference,
/// so without this it would keep listening until the next connection arrived, and a node
/// restarting in the same process could not bind again.
impl Drop for TcpDataServer {
    fn drop(&mut self) {
        if let Some(task) = self.accept.get_mut().map(Option::take).ok().flatten() {
            task.abort();
        }
    }
}

impl TcpDataServer {
    /// Listens on `bind` and serves transfers to peers that prove they hold `token`. Clients
    /// are told to connect to `advertise` (default: the bound address). Keys are derived from
    /// `key_seed`, so distinct nodes and restarts should use distinct (random) seeds.
    /// Connections busy-poll for up to `spin` for their next request before parking.
    pub async fn start(
        bind: &str,
        advertise: Option<String>,
        local: Arc<LocalSegments>,
        key_seed: u64,
        spin: Duration,
        token: Option<Credential>,
    ) -> Result<Arc<TcpDataServer>> {
        let listener = TcpListener::bind(bind).await.map_err(|e| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("cannot listen on {bind} for data transfers: {e}"),
            )
        })?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
        let server = Arc::new(TcpDataServer {
            endpoint: advertise.unwrap_or_else(|| bound.to_string()).into(),
            service: DataService::new(key_seed),
            local,
            accept: Mutex::new(None),
            spin,
            gate: Gate::new(token, Plane::Data)
                .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, e))?,
            limits: ConnectionLimits::standard(),
        });
        let weak = Arc::downgrade(&server);
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        warn!("data accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Some(server) = weak.upgrade() else { return };
                let mut handshaking = match server.limits.admit(peer.ip()) {
                    Ok(handshaking) => handshaking,
                    Err(why) => {
                        refusals::refused(&peer.to_string(), &format!("data server: {why}"));
                        continue;
                    }
                };
                tokio::spawn(async move {
                    let peer = peer.to_string();
                    let mut conn =
                        Framed::new(stream, server.spin).follow_pace(server.spin * PACE_CAP);
                    let identity = tokio::select! {
                        identity = handshake::server(&mut conn, &server.gate) => identity,
                        () = handshaking.dismissed() => Err(crate::limits::DISMISSED.to_string()),
                    };
                    // An open connection must not keep the server (its listener, its port)
                    // alive once its owner drops it: it holds the server only per request.
                    let serving = Arc::downgrade(&server);
                    drop(server);
                    match identity.and_then(|(peer, _)| handshaking.authenticated(peer.client)) {
                        Ok(_admitted) => {
                            TcpDataServer::serve_connection(&serving, conn, &peer).await
                        }
                        Err(e) => refusals::refused(&peer, &e),
                    }
                });
            }
        });
        *server.accept.lock().expect("accept lock") = Some(task);
        Ok(server)
    }

    /// Where clients connect.
    pub fn endpoint(&self) -> &Arc<str> {
        &self.endpoint
    }

    /// Stops accepting connections and serving every exported segment.
    pub fn shutdown(&self) {
        if let Some(task) = self.accept.lock().expect("accept lock").take() {
            task.abort();
        }
        for key in self.service.keys() {
            self.unexport(key);
        }
    }

    async fn serve_connection(server: &Weak<TcpDataServer>, mut conn: Framed, peer: &str) {
        let mut clock = PeerClock::new();
        loop {
            let next = tokio::time::timeout(IDLE_TIMEOUT, conn.read_message::<DataRequest>());
            let Ok(next) = next.await else {
                debug!(peer, "closing a data connection idle for {IDLE_TIMEOUT:?}");
                return;
            };
            let (id, request) = match next {
                Ok(message) => message,
                Err(ReadError::Closed) => return,
                Err(ReadError::Io(e)) => {
                    debug!(peer, "data connection ended: {e}");
                    return;
                }
                Err(ReadError::Frame(e)) => {
                    refusals::refused(peer, &format!("closing the data connection: {e}"));
                    return;
                }
            };
            // The write's local deadline bounds how long its bulk bytes may take to arrive.
            let deadline = match &request {
                DataRequest::Write {
                    sent_at_us,
                    valid_for_us,
                    ..
                } => clock.deadline(*sent_at_us, *valid_for_us),
                _ => far_future(),
            };
            // The request's id is its operation's trace id (see `mooring_proto::trace`).
            let served = {
                let _span = tracing::debug_span!("request", trace = %TraceId(id)).entered();
                debug!(
                    peer,
                    request = request.name(),
                    bytes = request.bulk_len().unwrap_or(0),
                    "data request"
                );
                let Some(server) = server.upgrade() else {
                    debug!(peer, "the data server stopped; closing its connection");
                    return;
                };
                server.service.serve(request, &mut clock)
            };
            let keep_going = match served {
                Served::Answer(response) => conn
                    .write_message::<DataResponse>(id, &response, &[])
                    .await
                    .is_ok(),
                Served::Later(staging) => conn
                    .write_message::<DataResponse>(id, &staging.await, &[])
                    .await
                    .is_ok(),
                Served::Read(source) if source.unaligned() => conn
                    .write_message_copied::<DataResponse>(
                        id,
                        &Ok(DataReply::Done),
                        &source.read_slices(),
                    )
                    .await
                    .is_ok(),
                Served::Read(source) => conn
                    .write_message::<DataResponse>(id, &Ok(DataReply::Done), &source.read_slices())
                    .await
                    .is_ok(),
                Served::Write(target) => receive_write(&mut conn, id, target, deadline, peer).await,
                Served::RefuseWrite(e) => {
                    // The bulk bytes that follow cannot be skipped safely: answer, then close.
                    refusals::refused(peer, &format!("refusing a write: {e}"));
                    let _ = conn.write_message::<DataResponse>(id, &Err(e), &[]).await;
                    false
                }
            };
            if !keep_going {
                return;
            }
        }
    }
}

/// A reader's destination off this alignment asks for its bytes copied, not lent (see
/// `unaligned` in [`DataRequest::Read`]).
const CACHE_LINE: usize = 64;

/// Bytes of a write received between checks of its deadline and of its segment's export.
const WRITE_STEP: usize = 256 << 10;

/// Reads a write's bulk bytes straight from the socket into the segment, within `deadline`
/// and while the segment is still exported under the request's key, and answers. Both are
/// checked before every [`WRITE_STEP`] bytes: a write that trickles in must not land after
/// its deadline, nor after a remount (the master may by then have given its ranges to
/// another writer). False if the connection must close.
async fn receive_write(
    conn: &mut Framed,
    id: u64,
    mut target: Ranges,
    deadline: Instant,
    peer: &str,
) -> bool {
    let exported = target.exported();
    for dest in target.write_slices() {
        for step in dest.chunks_mut(WRITE_STEP) {
            // Bytes held up here (the simulation holds the task, and may remount the segment
            // meanwhile) are checked below like any others.
            buggify::hold(Site::NODE_MID_WRITE).await;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let stop = if remaining.is_zero() {
                Some("still arriving at its deadline")
            } else if !exported.still() {
                Some("still arriving after its segment was unexported (unmounted or remounted)")
            } else {
                None
            };
            if let Some(why) = stop {
                refusals::refused(peer, &format!("write {why}; closing the connection"));
                return false;
            }
            match tokio::time::timeout(remaining, conn.read_exact(step)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    debug!(peer, "write aborted: {e}");
                    return false;
                }
                Err(_) => {
                    warn!(
                        peer,
                        "write still arriving at its deadline; closing the connection"
                    );
                    return false;
                }
            }
        }
    }
    conn.write_message::<DataResponse>(id, &Ok(DataReply::Done), &[])
        .await
        .is_ok()
}

impl DataServer for TcpDataServer {
    fn service(&self) -> &DataService {
        &self.service
    }

    fn export(&self, memory: SegmentMemory) -> Result<NodeAddr> {
        let addr = self.service.export(&self.endpoint, memory.clone());
        self.local
            .segments
            .write()
            .expect("local segments lock")
            .insert((self.endpoint.clone(), addr.key), memory);
        Ok(addr)
    }

    fn unexport(&self, key: u64) {
        self.service.unexport(key);
        self.local
            .segments
            .write()
            .expect("local segments lock")
            .remove(&(self.endpoint.clone(), key));
    }

    fn counts(&self) -> mooring_proto::serve::DataCounts {
        mooring_proto::serve::DataCounts {
            connections: self.limits.open() as u64,
            ..self.service.counts()
        }
    }
}

/// How the client side of the data plane behaves.
#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    /// Connections one large transfer is striped over.
    pub stripes: usize,
    /// Transfers smaller than this use one connection.
    pub stripe_threshold: u64,
    /// Base time allowed for a transfer...
    pub timeout: Duration,
    /// ...plus this long per MiB moved.
    pub timeout_per_mib: Duration,
    /// Whether transfers to segments in this process are done by `memcpy`.
    pub local_memcpy: bool,
    /// How long to busy-poll for a node's answer before parking.
    pub spin: Duration,
    /// Largest transfer one request carries; bigger transfers are pipelined as several.
    pub request_bulk: u64,
    /// The cluster token every connection proves (see [`crate::handshake`]).
    pub token: Option<Credential>,
    /// The identity every connection names in its handshake (the client id; 0: none):
    /// servers cap connections per identity.
    pub identity: u128,
}

impl Default for DataPlaneConfig {
    fn default() -> DataPlaneConfig {
        DataPlaneConfig {
            stripes: 4,
            stripe_threshold: 512 * 1024,
            timeout: Duration::from_secs(5),
            timeout_per_mib: Duration::from_millis(20),
            local_memcpy: true,
            spin: Duration::from_micros(50),
            request_bulk: 1 << 20,
            token: None,
            identity: 0,
        }
    }
}

/// The client side of the data plane.
pub struct TcpDataPlane {
    idle: Mutex<HashMap<Arc<str>, Vec<DataConn>>>,
    local: Arc<LocalSegments>,
    config: DataPlaneConfig,
}

/// A client's data connection, with what it knows about the path to the node.
struct DataConn {
    framed: Framed,
    /// Its clock: time zero at the probe, whose round trip bounds the delay of the message
    /// the node measured the clock offset from (see [`PeerClock`]).
    clock: ConnectionClock,
    /// When it was last checked back into the pool.
    last_used: Instant,
}

/// Most idle connections kept per node.
const MAX_IDLE_PER_NODE: usize = 32;

/// One lane of a (possibly striped) transfer: ranges and their local buffers.
enum Lane<'a> {
    Read(Vec<(u64, ReadPiece<'a>)>),
    Write(Vec<(u64, WritePiece<'a>)>),
}

impl TcpDataPlane {
    /// A data plane that recognises this process's segments through `local`.
    pub fn new(local: Arc<LocalSegments>, config: DataPlaneConfig) -> Arc<TcpDataPlane> {
        Arc::new(TcpDataPlane {
            idle: Mutex::new(HashMap::new()),
            local,
            config,
        })
    }

    fn local_segment(&self, node: &NodeAddr) -> Option<SegmentMemory> {
        self.config
            .local_memcpy
            .then(|| self.local.get(node))
            .flatten()
    }

    fn lanes_for(&self, total: u64) -> usize {
        if total < self.config.stripe_threshold || self.config.stripes <= 1 {
            1
        } else {
            let by_size = total.div_ceil(self.config.stripe_threshold / 2).max(1) as usize;
            self.config.stripes.min(by_size)
        }
    }

    async fn checkout(&self, node: &NodeAddr) -> Result<DataConn> {
        let pooled = self
            .idle
            .lock()
            .expect("pool lock")
            .get_mut(&node.endpoint)
            .and_then(|conns| {
                // The node closes connections idle for IDLE_TIMEOUT: never race it. The newest
                // is on top; below a stale one, all are stale.
                loop {
                    let conn = conns.pop()?;
                    let idle = conn.last_used.elapsed();
                    if idle >= IDLE_TIMEOUT / 2 {
                        conns.clear();
                        return None;
                    }
                    // A node that restarted closed its end: skip what it left behind.
                    if idle <= crate::rpc::RECHECK || !conn.framed.peer_gone() {
                        return Some(conn);
                    }
                }
            });
        if let Some(conn) = pooled {
            return Ok(conn);
        }
        let fail = |what: String| {
            Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("cannot reach node {}: {what}", node.endpoint),
            )
        };
        let mut framed = Framed::connect(&node.endpoint, self.config.spin)
            .await
            .map_err(|e| fail(e.to_string()))?;
        handshake::client(
            &mut framed,
            self.config.token.as_ref(),
            Plane::Data,
            self.config.identity,
        )
        .await
        .map_err(fail)?;
        let opened = Instant::now();
        let id = TraceId::current().0;
        framed
            .write_message(id, &DataRequest::Probe { sent_at_us: 0 }, &[])
            .await
            .map_err(|e| fail(format!("probe not sent: {e}")))?;
        match framed.read_message::<DataResponse>().await {
            Ok((reply, Ok(_))) if reply == id => {}
            Ok((_, Err(e))) => return Err(e),
            Ok((reply, Ok(_))) => return Err(fail(format!("probe answered as {reply}"))),
            Err(e) => return Err(fail(format!("probe unanswered: {e}"))),
        }
        Ok(DataConn {
            framed,
            clock: ConnectionClock {
                origin: opened,
                rtt: opened.elapsed(),
            },
            last_used: Instant::now(),
        })
    }

    /// Passes `result` on; a transfer that broke on its connection (the node restarted, or
    /// the network reset it) drops every idle connection to that node too: they were opened
    /// to the same incarnation, so the next transfer opens a fresh one instead of failing
    /// once per stale connection.
    fn unless_broken<T>(&self, node: &NodeAddr, result: Result<T>) -> Result<T> {
        if let Err(e) = &result
            && e.code == ErrorCode::TRANSFER_FAIL
        {
            self.idle.lock().expect("pool lock").remove(&node.endpoint);
        }
        result
    }

    fn checkin(&self, node: &NodeAddr, mut conn: DataConn) {
        conn.last_used = Instant::now();
        let mut idle = self.idle.lock().expect("pool lock");
        let conns = idle.entry(node.endpoint.clone()).or_default();
        if conns.len() < MAX_IDLE_PER_NODE {
            conns.push(conn);
        }
    }

    /// Sends one small request on a pooled connection and returns the node's reply.
    async fn call(&self, node: &NodeAddr, request: DataRequest) -> Result<DataReply> {
        let fail = |what: String| {
            Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("request to node {}: {what}", node.endpoint),
            )
        };
        let exchange = async {
            let mut data_conn = self.checkout(node).await?;
            let id = TraceId::current().0;
            data_conn
                .framed
                .write_message(id, &request, &[])
                .await
                .map_err(|e| fail(format!("send failed: {e}")))?;
            let (reply_id, result) = data_conn
                .framed
                .read_message::<DataResponse>()
                .await
                .map_err(|e| fail(format!("no reply: {e}")))?;
            if reply_id != id {
                return Err(fail(format!("reply {reply_id} out of order")));
            }
            self.checkin(node, data_conn);
            result
        };
        match tokio::time::timeout(self.config.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(fail(format!("timed out after {:?}", self.config.timeout))),
        }
    }

    /// Runs one lane; writes must have landed by `deadline` (see [`DataPlane::write`]).
    /// Runs one lane; a read lane returns the pieces that landed, with their checksums.
    async fn run_lane(
        &self,
        node: &NodeAddr,
        lane: Lane<'_>,
        deadline: Instant,
    ) -> Result<Vec<LandedPiece>> {
        let bytes: usize = match &lane {
            Lane::Read(ops) => ops.iter().map(|o| o.1.size()).sum(),
            Lane::Write(ops) => ops.iter().map(|o| o.1.size()).sum(),
        };
        let budget = self.config.timeout + self.config.timeout_per_mib * (bytes >> 20) as u32;
        let fail = |what: String| {
            Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("transfer with node {}: {what}", node.endpoint),
            )
        };
        // Requests of at most `request_bulk` bytes each, pipelined on one connection: the node
        // never idles between them, and no single response outgrows the socket buffers.
        let transfer = async {
            let mut data_conn = self.checkout(node).await?;
            let conn = &mut data_conn.framed;
            let request_bulk = self.config.request_bulk.max(1) as usize;
            let landed = match lane {
                Lane::Write(ops) => {
                    let chunks = chunk_ops(ops, request_bulk);
                    // Every chunk carries the operation's id; replies come back in order.
                    let id = TraceId::current().0;
                    // The helper sums the pieces while they go out.
                    let mut sums = Summing::new();
                    for (addr, piece) in chunks.iter().flatten() {
                        sums.add_all(piece.op, *addr, piece.src);
                    }
                    for chunk in chunks.iter() {
                        let Some((sent_at_us, valid_for_us)) = data_conn.clock.stamp(deadline)
                        else {
                            return Err(fail("passed the writer's deadline".into()));
                        };
                        let request = DataRequest::Write {
                            key: node.key,
                            ranges: ranges_of(chunk),
                            sent_at_us,
                            valid_for_us,
                        };
                        let bulk: Vec<&[u8]> = chunk.iter().map(|o| o.1.src).collect();
                        conn.write_message(id, &request, &bulk)
                            .await
                            .map_err(|e| fail(format!("send failed: {e}")))?;
                    }
                    for _ in 0..chunks.len() {
                        let (reply_id, result) = conn
                            .read_message::<DataResponse>()
                            .await
                            .map_err(|e| fail(format!("no reply: {e}")))?;
                        if reply_id != id {
                            return Err(fail(format!("reply {reply_id} out of order")));
                        }
                        // A refused write closes the connection on the node's side.
                        result?;
                    }
                    sums.finish()
                }
                Lane::Read(ops) => {
                    let mut chunks = chunk_ops(ops, request_bulk);
                    // Every chunk carries the operation's id; replies come back in order.
                    let id = TraceId::current().0;
                    for chunk in chunks.iter() {
                        let request = DataRequest::Read {
                            key: node.key,
                            ranges: ranges_of(chunk),
                            unaligned: chunk.iter().any(|(_, piece)| {
                                !(piece.dest.as_ptr() as usize).is_multiple_of(CACHE_LINE)
                            }),
                        };
                        conn.write_message(id, &request, &[])
                            .await
                            .map_err(|e| fail(format!("send failed: {e}")))?;
                    }
                    // Each step is summed by the helper while the next one lands.
                    let mut sums = Summing::new();
                    for chunk in chunks.iter_mut() {
                        let (reply_id, result) = conn
                            .read_message::<DataResponse>()
                            .await
                            .map_err(|e| fail(format!("no reply: {e}")))?;
                        if reply_id != id {
                            return Err(fail(format!("reply {reply_id} out of order")));
                        }
                        result?;
                        for (addr, piece) in chunk.iter_mut() {
                            let mut at = *addr;
                            for step in piece.dest.chunks_mut(STEP) {
                                conn.read_exact(step)
                                    .await
                                    .map_err(|e| fail(format!("receive failed: {e}")))?;
                                let len = step.len() as u64;
                                sums.add(piece.op, at, step);
                                at += len;
                            }
                        }
                    }
                    sums.finish()
                }
            };
            self.checkin(node, data_conn);
            Ok(landed)
        };
        match tokio::time::timeout(budget, transfer).await {
            Ok(result) => result,
            Err(_) => Err(fail(format!("timed out after {budget:?}"))),
        }
    }
}

/// A deadline that never matters (reads have none).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

fn first_error(results: Vec<Result<Vec<LandedPiece>>>) -> Result<Vec<LandedPiece>> {
    let lanes: Vec<Vec<LandedPiece>> = results.into_iter().collect::<Result<_>>()?;
    Ok(lanes.into_iter().flatten().collect())
}

impl DataPlane for TcpDataPlane {
    fn read<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<ReadOp<'a>>,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            if let Some(segment) = self.local_segment(node) {
                // In this process: each value is summed as it is copied.
                return ops
                    .into_iter()
                    .map(|op| {
                        let len = op.dest.len();
                        segment.copy_out_summed(op.addr, op.dest).ok_or_else(|| {
                            Error::new(
                                ErrorCode::INVALID_PARAMS,
                                format!("read {:#x}+{len} outside the segment", op.addr),
                            )
                        })
                    })
                    .collect();
            }
            let count = ops.len();
            let ops: Vec<(u64, ReadPiece<'_>)> = ops
                .into_iter()
                .enumerate()
                .map(|(op, o)| (o.addr, ReadPiece { op, dest: o.dest }))
                .collect();
            let total: usize = ops.iter().map(|o| o.1.size()).sum();
            let lanes = self.lanes_for(total as u64);
            let runs = split_lanes(ops, lanes)
                .into_iter()
                .map(|lane| self.run_lane(node, Lane::Read(lane), far_future()));
            let landed = self.unless_broken(node, first_error(join_all(runs).await))?;
            Ok(checksums_of(count, landed))
        })
    }

    fn write<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<WriteOp<'a>>,
        valid_for: Duration,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            let deadline = Instant::now() + valid_for.min(Duration::from_secs(86_400));
            if let Some(segment) = self.local_segment(node) {
                // In this process: each value is summed as it is copied.
                return ops
                    .into_iter()
                    .map(|op| {
                        segment.copy_in_summed(op.addr, op.src).ok_or_else(|| {
                            Error::new(
                                ErrorCode::INVALID_PARAMS,
                                format!(
                                    "write {:#x}+{} outside the segment",
                                    op.addr,
                                    op.src.len()
                                ),
                            )
                        })
                    })
                    .collect();
            }
            let count = ops.len();
            let ops: Vec<(u64, WritePiece<'_>)> = ops
                .into_iter()
                .enumerate()
                .map(|(op, o)| (o.addr, WritePiece { op, src: o.src }))
                .collect();
            let total: usize = ops.iter().map(|o| o.1.size()).sum();
            let lanes = self.lanes_for(total as u64);
            let runs = split_lanes(ops, lanes)
                .into_iter()
                .map(|lane| self.run_lane(node, Lane::Write(lane), deadline));
            let sent = self.unless_broken(node, first_error(join_all(runs).await))?;
            Ok(checksums_of(count, sent))
        })
    }

    fn request<'a>(
        &'a self,
        node: &'a NodeAddr,
        request: DataRequest,
    ) -> BoxFuture<'a, Result<DataReply>> {
        Box::pin(self.call(node, request))
    }
}
