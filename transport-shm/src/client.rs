//! A client's side: segments of same-host nodes mapped into this process, read and written
//! by memcpy; everything else through the wrapped transport.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mooring_core::{Checksum, Error, ErrorCode, Result};
use mooring_proto::transport::{BoxFuture, DataPlane, NodeAddr, ReadOp, SegmentMemory, WriteOp};
use mooring_proto::wire::{DataReply, DataRequest, ShmOffer};
use tracing::debug;

use crate::handoff::{self, Reply};
use crate::memory::map_received;
use crate::server::socket_address;

/// Segments (and nodes) remembered at most; beyond it the least recently used go.
const MAX_ENTRIES: usize = 256;
/// A mapping unused this long is dropped (a node that died or remounted would otherwise keep
/// its memory alive in this process).
const IDLE: Duration = Duration::from_secs(30);
/// A node found unreachable by shared memory is asked again after this long.
const RETRY: Duration = Duration::from_secs(30);
/// Bytes copied between checks of a write's deadline.
const WRITE_STEP: usize = 1 << 20;

/// How a segment is reached.
#[derive(Clone)]
enum Route {
    /// Mapped here: the mapping, and the node's address of its first byte.
    Mapped(SegmentMemory, u64),
    /// The node runs in this process: through the wrapped transport, which copies to and
    /// from it directly.
    Own,
    /// Through the wrapped transport, and why (for `--transport shm`'s error).
    Elsewhere(Arc<str>),
}

/// A node endpoint and one of its segment keys (`None`: the whole node).
type RouteId = (Arc<str>, Option<u64>);

struct Entry {
    route: Route,
    used: Instant,
    made: Instant,
}

/// A client's data plane that maps the segments of nodes on its own host.
pub struct ShmDataPlane {
    via: Arc<dyn DataPlane>,
    required: bool,
    host: [u8; 16],
    /// By node endpoint and segment key; key `None` marks a node that is not reachable by
    /// shared memory at all.
    routes: Mutex<HashMap<RouteId, Entry>>,
}

impl ShmDataPlane {
    /// Shared memory to same-host nodes, everything else through `via`. With `required`, a
    /// node that cannot be reached by shared memory is an error rather than reached through
    /// `via`.
    pub fn new(via: Arc<dyn DataPlane>, required: bool) -> Result<ShmDataPlane> {
        // Batches sum on the helper thread: start it before the first one.
        mooring_proto::summing::start_helper();
        Ok(ShmDataPlane {
            via,
            required,
            host: crate::host_id()?,
            routes: Mutex::new(HashMap::new()),
        })
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<RouteId, Entry>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mapping of `node`'s segment, or `None` to use the wrapped transport.
    async fn mapping(&self, node: &NodeAddr) -> Result<Option<(SegmentMemory, u64)>> {
        let now = Instant::now();
        let known = {
            let mut routes = self.routes();
            let mut known = None;
            for id in [
                (node.endpoint.clone(), None),
                (node.endpoint.clone(), Some(node.key)),
            ] {
                if let Some(entry) = routes.get_mut(&id) {
                    if !matches!(entry.route, Route::Mapped(..))
                        && now.duration_since(entry.made) >= RETRY
                    {
                        routes.remove(&id);
                        continue;
                    }
                    entry.used = now;
                    known = Some(entry.route.clone());
                    break;
                }
            }
            known
        };
        let route = match known {
            Some(route) => route,
            None => {
                let (id, route) = self.attach(node).await;
                self.remember(id, route.clone(), now);
                route
            }
        };
        match route {
            Route::Mapped(memory, base) => Ok(Some((memory, base))),
            Route::Own => Ok(None),
            Route::Elsewhere(why) if self.required => Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!(
                    "node {} cannot be reached through shared memory ({why}), and this client \
                     requires it: use --transport auto to reach it over the network",
                    node.endpoint
                ),
            )),
            Route::Elsewhere(why) => {
                debug!(node = %node.endpoint, "not through shared memory: {why}");
                Ok(None)
            }
        }
    }

    fn remember(&self, id: RouteId, route: Route, now: Instant) {
        let mut routes = self.routes();
        routes.retain(|_, e| {
            !(matches!(e.route, Route::Mapped(..)) && now.duration_since(e.used) >= IDLE)
        });
        if routes.len() >= MAX_ENTRIES {
            let stalest = routes
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(id, _)| id.clone())
                .expect("at the limit, so not empty");
            routes.remove(&stalest);
        }
        routes.insert(
            id,
            Entry {
                route,
                used: now,
                made: now,
            },
        );
    }

    /// Asks `node` for its segment; says how to reach it and whether that holds for the
    /// segment or the whole node.
    async fn attach(&self, node: &NodeAddr) -> (RouteId, Route) {
        let whole_node = (node.endpoint.clone(), None);
        let segment = (node.endpoint.clone(), Some(node.key));
        let elsewhere = |why: String| Route::Elsewhere(why.into());
        let offer = match self
            .via
            .request(node, DataRequest::ShmAttach { key: node.key })
            .await
            .and_then(|reply: DataReply| reply.into_shm_offer(&node.endpoint))
        {
            Ok(offer) => offer,
            // A node without shm, or a segment it does not share (asked again after a while).
            Err(e) => return (segment, elsewhere(e.to_string())),
        };
        if offer.host != self.host {
            return (
                whole_node,
                elsewhere("the node runs on another host".into()),
            );
        }
        if crate::server::in_this_process(&offer.socket) {
            return (whole_node, Route::Own);
        }
        match redeem(&offer) {
            Ok(route) => (segment, route),
            Err(why) => (whole_node, elsewhere(why)),
        }
    }
}

/// Presents `offer`'s ticket on the node's socket and maps what comes back.
fn redeem(offer: &ShmOffer) -> std::result::Result<Route, String> {
    let (address, name) = socket_address(&offer.socket).map_err(|e| e.to_string())?;
    // Another network namespace (a container) does not see the socket: that is a node on
    // this host this client cannot share memory with.
    let stream = UnixStream::connect_addr(&address)
        .map_err(|e| format!("cannot reach the node's socket {name}: {e}"))?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    use std::io::Write;
    (&stream)
        .write_all(&handoff::encode_request(&offer.ticket))
        .map_err(|e| format!("sending the ticket: {e}"))?;
    match handoff::recv_reply(&stream)? {
        (Reply::Granted { base, len }, Some(fd)) => {
            let len =
                usize::try_from(len).map_err(|_| "a segment larger than memory".to_string())?;
            let memory = map_received(fd, len).map_err(|e| e.to_string())?;
            debug!(socket = %name, len, "mapped a same-host segment");
            Ok(Route::Mapped(memory, base))
        }
        (Reply::Granted { .. }, None) => {
            Err("the node granted a segment but sent no descriptor".into())
        }
        (Reply::Refused(why), _) => Err(format!("the node refused the ticket: {why}")),
    }
}

/// The local address of `len` bytes at the node's address `addr` in `memory` (mapped from a
/// segment whose first byte the node addresses as `base`), if the range lies inside.
fn local(memory: &SegmentMemory, base: u64, addr: u64, len: u64, node: &NodeAddr) -> Result<u64> {
    addr.checked_sub(base)
        .and_then(|offset| offset.checked_add(memory.base()))
        .filter(|&at| memory.range(at, len).is_some())
        .ok_or_else(|| outside(node, addr, len))
}

/// The error for `len` bytes at the node's address `addr` outside its segment.
fn outside(node: &NodeAddr, addr: u64, len: u64) -> Error {
    Error::new(
        ErrorCode::INVALID_PARAMS,
        format!(
            "range {addr:#x}+{len} lies outside node {}'s segment",
            node.endpoint
        ),
    )
}

impl DataPlane for ShmDataPlane {
    fn read<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<ReadOp<'a>>,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            let Some((memory, base)) = self.mapping(node).await? else {
                return self.via.read(node, ops).await;
            };
            // Each value is summed as it is copied, in one pass that runs at the speed of the
            // copy alone (`SegmentMemory::copy_out_summed`).
            ops.into_iter()
                .map(|op| {
                    let len = op.dest.len() as u64;
                    let at = local(&memory, base, op.addr, len, node)?;
                    memory
                        .copy_out_summed(at, op.dest)
                        .ok_or_else(|| outside(node, op.addr, len))
                })
                .collect()
        })
    }

    fn write<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<WriteOp<'a>>,
        valid_for: Duration,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            // A quarter of the window to spare, as RDMA writes keep: a copy that begins just
            // before the deadline lands after it only if this thread stalls for that long
            // between the check and the copy (nothing can stop a memcpy once it runs; a copy
            // that lands late is refused by the reader's checksum, never returned).
            let deadline = Instant::now() + (valid_for - valid_for / 4);
            let Some((memory, base)) = self.mapping(node).await? else {
                return self.via.write(node, ops, valid_for).await;
            };
            let targets = ops
                .iter()
                .map(|op| local(&memory, base, op.addr, op.src.len() as u64, node))
                .collect::<Result<Vec<u64>>>()?;
            let mut sums = Vec::with_capacity(ops.len());
            for (op, at) in ops.iter().zip(targets) {
                let mut sum = Checksum::EMPTY;
                for (j, piece) in op.src.chunks(WRITE_STEP).enumerate() {
                    // The writer's fence: no byte lands after the window the master granted
                    // (it may give these ranges to another writer then).
                    if Instant::now() >= deadline {
                        return Err(Error::new(
                            ErrorCode::TRANSFER_FAIL,
                            "the write's window passed while copying; the rest was not \
                             written (the master may have given the ranges to another writer)",
                        ));
                    }
                    let piece_sum = memory
                        .copy_in_summed(at + (j * WRITE_STEP) as u64, piece)
                        .ok_or_else(|| outside(node, op.addr, piece.len() as u64))?;
                    sum = sum.then(piece_sum, piece.len() as u64);
                }
                sums.push(sum);
            }
            Ok(sums)
        })
    }

    fn request<'a>(
        &'a self,
        node: &'a NodeAddr,
        request: DataRequest,
    ) -> BoxFuture<'a, Result<DataReply>> {
        self.via.request(node, request)
    }
}
