//! A client's side: segments of same-host nodes mapped into this process, read and written
//! by memcpy; everything else through the wrapped transport.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mooring_core::client::FenceRule;
use mooring_core::{Checksum, Error, ErrorCode, Result};
use mooring_proto::buggify::{self, Site};
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

/// How a client presents a node's ticket and receives the segment's descriptor: on the
/// node's Unix socket in production ([`ShmDataPlane::new`]); by a direct call in the
/// simulation, which runs every node in one process (`mooring-transport-sim`).
pub trait Handoff: Send + Sync + 'static {
    /// Whether the socket with this id is served by this very process (a client then reaches
    /// the node's memory through the wrapped transport instead of mapping it twice).
    fn in_this_process(&self, socket: &[u8; 16]) -> bool;

    /// Presents `offer`'s ticket to the node that made it; the node's reply and the
    /// descriptor that came with it, or why the node could not be asked.
    fn exchange(&self, offer: &ShmOffer) -> std::result::Result<(Reply, Option<OwnedFd>), String>;
}

/// The handoff on a node's abstract Unix socket, with the descriptor as `SCM_RIGHTS`.
struct SocketHandoff;

impl Handoff for SocketHandoff {
    fn in_this_process(&self, socket: &[u8; 16]) -> bool {
        crate::server::in_this_process(socket)
    }

    fn exchange(&self, offer: &ShmOffer) -> std::result::Result<(Reply, Option<OwnedFd>), String> {
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
        handoff::recv_reply(&stream)
    }
}

/// A client's data plane that maps the segments of nodes on its own host.
pub struct ShmDataPlane {
    via: Arc<dyn DataPlane>,
    required: bool,
    host: [u8; 16],
    handoff: Arc<dyn Handoff>,
    /// By node endpoint and segment key; key `None` marks a node that is not reachable by
    /// shared memory at all.
    routes: Mutex<HashMap<RouteId, Entry>>,
}

impl ShmDataPlane {
    /// Shared memory to same-host nodes, everything else through `via`. With `required`, a
    /// node that cannot be reached by shared memory is an error rather than reached through
    /// `via`.
    pub fn new(via: Arc<dyn DataPlane>, required: bool) -> Result<ShmDataPlane> {
        Ok(ShmDataPlane::with_handoff(
            via,
            required,
            crate::host_id()?,
            Arc::new(SocketHandoff),
        ))
    }

    /// As [`ShmDataPlane::new`], for a client on `host` that receives segments through
    /// `handoff`.
    pub fn with_handoff(
        via: Arc<dyn DataPlane>,
        required: bool,
        host: [u8; 16],
        handoff: Arc<dyn Handoff>,
    ) -> ShmDataPlane {
        // Large copies share their pieces with the helper thread: start it before the first.
        mooring_proto::helper::start_helper();
        ShmDataPlane {
            via,
            required,
            host,
            handoff,
            routes: Mutex::new(HashMap::new()),
        }
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
            // The segment first: a mapping made is the answer, whatever else is known.
            for id in [
                (node.endpoint.clone(), Some(node.key)),
                (node.endpoint.clone(), None),
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
                if let Route::Elsewhere(why) = &route {
                    debug!(node = %node.endpoint, "not through shared memory: {why}");
                }
                // Required, a failure is an error either way: asking again costs only the
                // attach, and a refusal that passes (too many clients attaching at once) does
                // not fail the transfers after it.
                let failed = matches!(route, Route::Elsewhere(_));
                if !(failed && self.required) {
                    self.remember(id, route.clone(), now);
                }
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
            Route::Elsewhere(_) => Ok(None),
        }
    }

    fn remember(&self, id: RouteId, route: Route, now: Instant) {
        let mut routes = self.routes();
        // Attaches run concurrently: one that failed (its handoff refused) must not replace
        // the mapping another one made.
        let mapped = |e: &Entry| matches!(e.route, Route::Mapped(..));
        if !matches!(route, Route::Mapped(..)) && routes.get(&id).is_some_and(mapped) {
            return;
        }
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
        if self.handoff.in_this_process(&offer.socket) {
            return (whole_node, Route::Own);
        }
        // A refused handoff says nothing about the node's other segments, or about the next
        // attach (the node turns clients away while too many attach at once).
        match redeem_off_runtime(self.handoff.clone(), offer).await {
            Ok(route) => (segment, route),
            Err(why) => (segment, elsewhere(why)),
        }
    }
}

/// [`redeem`] on the blocking pool: the exchange waits on the node's socket (up to its
/// timeouts), and the transfers of other callers go on meanwhile. The simulation's handoff is
/// a direct call that never waits (and madsim has no blocking pool).
async fn redeem_off_runtime(
    handoff: Arc<dyn Handoff>,
    offer: ShmOffer,
) -> std::result::Result<Route, String> {
    #[cfg(not(madsim))]
    return tokio::task::spawn_blocking(move || redeem(handoff.as_ref(), &offer))
        .await
        .unwrap_or_else(|e| Err(format!("the handoff stopped: {e}")));
    #[cfg(madsim)]
    redeem(handoff.as_ref(), &offer)
}

/// Presents `offer`'s ticket through `handoff` and maps what comes back.
fn redeem(handoff: &dyn Handoff, offer: &ShmOffer) -> std::result::Result<Route, String> {
    match handoff.exchange(offer)? {
        // Memory without the offer's proof comes from a process that did not make the
        // offer (one that took the socket's name after the node went): never map it.
        (Reply::Granted { proof, .. }, _) if proof != offer.proof => Err(
            "the process on the node's socket could not prove it made the offer (the node \
             may have exited and another process taken its socket name)"
                .into(),
        ),
        (Reply::Granted { base, len, .. }, Some(fd)) => {
            let len =
                usize::try_from(len).map_err(|_| "a segment larger than memory".to_string())?;
            let memory = map_received(fd, len).map_err(|e| e.to_string())?;
            debug!(len, "mapped a same-host segment");
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

/// Whether the node still exports `memory` under the key `node` names. After a remount (the
/// master forgot the node and may give the segment's ranges to new writers) the old key
/// names nothing, over shared memory as over every other transport.
fn still_exported(memory: &SegmentMemory, node: &NodeAddr) -> Result<()> {
    if crate::memory::export_key(memory) == Some(node.key) {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::TRANSFER_FAIL,
        format!(
            "node {} no longer exports this segment under key {:#x} (it unmounted or \
             remounted it); ask the master where the object is now",
            node.endpoint, node.key
        ),
    ))
}

/// The error for a write whose window passed before all its bytes were written.
fn window_passed() -> Error {
    Error::new(
        ErrorCode::TRANSFER_FAIL,
        "the write's window passed before it was written; the rest was not written (the \
         master may have given the ranges to another writer)",
    )
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
            still_exported(&memory, node)?;
            // Each value is summed as it is copied, in one pass that runs at the speed of the
            // copy alone (`SegmentMemory::copy_out_summed`).
            let sums = ops
                .into_iter()
                .map(|op| {
                    let len = op.dest.len() as u64;
                    let at = local(&memory, base, op.addr, len, node)?;
                    memory
                        .copy_out_summed(at, op.dest)
                        .ok_or_else(|| outside(node, op.addr, len))
                })
                .collect::<Result<Vec<Checksum>>>()?;
            // Bytes copied while the node remounted may be another mount's. The fence keeps
            // the copy's loads before the key's second load (on CPUs that reorder loads).
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            still_exported(&memory, node)?;
            Ok(sums)
        })
    }

    fn write<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<WriteOp<'a>>,
        valid_for: Duration,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            // No node checks a same-host copy's arrival: the writer keeps the fence's spare
            // quarter itself (nothing can stop a memcpy once it runs; a copy that lands late is
            // refused by the reader's checksum, never returned).
            let started = Instant::now();
            let usable = FenceRule::self_checked_validity(valid_for.as_micros() as u64);
            let deadline = started + Duration::from_micros(usable);
            let Some((memory, base)) = self.mapping(node).await? else {
                buggify::hold(Site::SHM_WRITER_FALLBACK).await;
                // Finding out took part of the window (an attach that went unanswered while
                // this process stood still): the other transport gets what is left of it, not
                // the whole window again from now, or bytes could land after the master gave
                // the ranges to another writer.
                let left = valid_for.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(window_passed());
                }
                return self.via.write(node, ops, left).await;
            };
            let targets = ops
                .iter()
                .map(|op| local(&memory, base, op.addr, op.src.len() as u64, node))
                .collect::<Result<Vec<u64>>>()?;
            let mut sums = Vec::with_capacity(ops.len());
            for (op, at) in ops.iter().zip(targets) {
                let mut sum = Checksum::EMPTY;
                for (j, piece) in op.src.chunks(WRITE_STEP).enumerate() {
                    // A writer descheduled here (the simulation holds it) must still stop at
                    // its window.
                    buggify::hold(Site::SHM_WRITER_MID_COPY).await;
                    // The writer's fence: no byte lands after the window the master granted
                    // (it may give these ranges to another writer then).
                    if Instant::now() >= deadline {
                        return Err(window_passed());
                    }
                    still_exported(&memory, node)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SharedMemory, ShmServer};
    use mooring_proto::transport::ShmAcceptor;

    /// A node's data server as far as attaching goes: answers `ShmAttach` with an offer.
    struct Attach(Arc<ShmServer>);

    impl DataPlane for Attach {
        fn read<'a>(
            &'a self,
            _: &'a NodeAddr,
            _: Vec<ReadOp<'a>>,
        ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
            Box::pin(async { panic!("every transfer goes through shared memory") })
        }

        fn write<'a>(
            &'a self,
            _: &'a NodeAddr,
            _: Vec<WriteOp<'a>>,
            _: Duration,
        ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
            Box::pin(async { panic!("every transfer goes through shared memory") })
        }

        fn request<'a>(
            &'a self,
            _: &'a NodeAddr,
            request: DataRequest,
        ) -> BoxFuture<'a, Result<DataReply>> {
            let DataRequest::ShmAttach { key } = request else {
                panic!("only attaches are asked for: {request:?}");
            };
            Box::pin(async move { self.0.offer(key).map(DataReply::ShmOffer) })
        }
    }

    /// The handoff as a call to the node's server, as in the simulation; the first
    /// `refusals` exchanges are refused, as a node turns clients away while too many attach
    /// at once. With a `gate`, the node answers only once the gate opens (or refuses after
    /// 2 s), as a node slow to answer.
    struct Direct {
        server: Arc<ShmServer>,
        refusals: std::sync::atomic::AtomicUsize,
        gate: Option<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>,
    }

    impl Direct {
        fn new(server: Arc<ShmServer>) -> Direct {
            Direct::refusing_first(server, 0)
        }

        fn refusing_first(server: Arc<ShmServer>, refusals: usize) -> Direct {
            Direct {
                server,
                refusals: refusals.into(),
                gate: None,
            }
        }

        fn answering_when(server: Arc<ShmServer>, gate: std::sync::mpsc::Receiver<()>) -> Direct {
            Direct {
                gate: Some(gate.into()),
                ..Direct::new(server)
            }
        }
    }

    impl Handoff for Direct {
        fn in_this_process(&self, _: &[u8; 16]) -> bool {
            false
        }

        fn exchange(
            &self,
            offer: &ShmOffer,
        ) -> std::result::Result<(Reply, Option<OwnedFd>), String> {
            use std::sync::atomic::Ordering::SeqCst;
            if let Some(gate) = &self.gate {
                let open = gate.lock().unwrap().recv_timeout(Duration::from_secs(2));
                open.map_err(|_| "no answer on the node's socket".to_string())?;
            }
            if self
                .refusals
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err("the node closed the connection (too many clients)".into());
            }
            Ok(self
                .server
                .hand_over(&handoff::encode_request(&offer.ticket)))
        }
    }

    #[tokio::test]
    async fn a_mapping_stops_working_when_the_node_remounts_its_segment() {
        let server = ShmServer::unlistened([3; 16]);
        let memory = SharedMemory::new(1 << 16, false).unwrap().into_segment();
        let shm = ShmDataPlane::with_handoff(
            Arc::new(Attach(server.clone())),
            true,
            [3; 16],
            Arc::new(Direct::new(server.clone())),
        );
        let mount = |key| NodeAddr {
            endpoint: "node".into(),
            key,
            rdma_key: None,
        };
        let (first, second) = (mount(0x11), mount(0x13));
        let at = memory.base() + 512;
        let write = |node, bytes: &'static [u8]| {
            shm.write(
                node,
                vec![WriteOp {
                    addr: at,
                    src: bytes,
                }],
                Duration::from_secs(5),
            )
        };
        let mut back = [0u8; 5];
        server.add(first.key, memory.clone());
        write(&first, b"first").await.unwrap();

        // The master forgot the node, which exports its memory anew: the first mount's key
        // reaches nothing, though this client still maps the memory.
        server.add(second.key, memory.clone());
        server.remove(first.key);
        let err = write(&first, b"stale").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::TRANSFER_FAIL);
        assert!(err.to_string().contains("no longer exports"), "{err}");
        let read = shm
            .read(
                &first,
                vec![ReadOp {
                    addr: at,
                    dest: &mut back,
                }],
            )
            .await;
        assert!(read.is_err(), "a read through the first mount's key");
        let mut landed = [0u8; 5];
        assert!(memory.copy_out(at, &mut landed));
        assert_eq!(&landed, b"first", "the stale write copied nothing");

        write(&second, b"again").await.unwrap();
        let sums = shm
            .read(
                &second,
                vec![ReadOp {
                    addr: at,
                    dest: &mut back,
                }],
            )
            .await
            .unwrap();
        assert_eq!((&back, sums), (b"again", vec![Checksum::of(b"again")]));
        server.remove(second.key);
        assert!(write(&second, b"gone!").await.is_err(), "unexported");
    }

    /// A node on host `host` serving a 64 KiB segment under `key`, and a client that requires
    /// shared memory and attaches through the handoff `handoff` makes for that node.
    fn node_and_client(
        host: [u8; 16],
        key: u64,
        handoff: impl FnOnce(&Arc<ShmServer>) -> Arc<dyn Handoff>,
    ) -> (ShmDataPlane, NodeAddr, SegmentMemory) {
        let server = ShmServer::unlistened(host);
        let memory = SharedMemory::new(1 << 16, false).unwrap().into_segment();
        let shm = ShmDataPlane::with_handoff(
            Arc::new(Attach(server.clone())),
            true,
            host,
            handoff(&server),
        );
        let node = NodeAddr {
            endpoint: "node".into(),
            key,
            rdma_key: None,
        };
        server.add(key, memory.clone());
        (shm, node, memory)
    }

    /// Writes `value` 64 bytes into `memory`'s segment on `node`.
    async fn write_at_64(
        shm: &ShmDataPlane,
        node: &NodeAddr,
        memory: &SegmentMemory,
        value: &[u8],
    ) -> Result<Vec<Checksum>> {
        let op = WriteOp {
            addr: memory.base() + 64,
            src: value,
        };
        shm.write(node, vec![op], Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn a_refused_handoff_does_not_fail_the_transfers_after_it() {
        let (shm, node, memory) = node_and_client([4; 16], 0x21, |server| {
            Arc::new(Direct::refusing_first(server.clone(), 1))
        });
        let refused = write_at_64(&shm, &node, &memory, b"value")
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("too many clients"),
            "{refused}"
        );
        write_at_64(&shm, &node, &memory, b"value")
            .await
            .expect("the next transfer attaches again");
        let mut landed = [0u8; 5];
        assert!(memory.copy_out(memory.base() + 64, &mut landed));
        assert_eq!(&landed, b"value");
    }

    #[test]
    fn an_attach_that_failed_does_not_replace_a_mapping_made_beside_it() {
        let server = ShmServer::unlistened([5; 16]);
        let shm = ShmDataPlane::with_handoff(
            Arc::new(Attach(server.clone())),
            false,
            [5; 16],
            Arc::new(Direct::new(server)),
        );
        let id: RouteId = ("node".into(), Some(7));
        let memory = SharedMemory::new(4096, false).unwrap().into_segment();
        let now = Instant::now();
        shm.remember(id.clone(), Route::Mapped(memory, 0), now);
        shm.remember(id.clone(), Route::Elsewhere("refused".into()), now);
        assert!(matches!(shm.routes()[&id].route, Route::Mapped(..)));
    }

    /// A process that took the node's socket name: it answers with memory of its own, but
    /// cannot know the proof the node put in its offer.
    struct Squatter;

    impl Handoff for Squatter {
        fn in_this_process(&self, _: &[u8; 16]) -> bool {
            false
        }

        fn exchange(
            &self,
            offer: &ShmOffer,
        ) -> std::result::Result<(Reply, Option<OwnedFd>), String> {
            let own = SharedMemory::new(1 << 16, false).unwrap();
            let fd = own.fd().try_clone_to_owned().unwrap();
            let mut guess = offer.ticket;
            guess[0] ^= 1;
            let granted = Reply::Granted {
                base: own.into_segment().base(),
                len: 1 << 16,
                proof: guess,
            };
            Ok((granted, Some(fd)))
        }
    }

    /// On a runtime with one thread, the task that lets the node answer runs while the
    /// attach waits for that answer: the handoff's wait does not hold the runtime's thread
    /// (when it did, the answer came only after the handoff had given up).
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_handoff_leaves_the_runtime_to_other_tasks() {
        let (go, wait) = std::sync::mpsc::channel();
        let (shm, node, memory) = node_and_client([7; 16], 0x41, |server| {
            Arc::new(Direct::answering_when(server.clone(), wait))
        });
        let answer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            go.send(()).unwrap();
        });
        write_at_64(&shm, &node, &memory, b"value")
            .await
            .expect("the node answered while the attach waited");
        answer.await.unwrap();
        let mut landed = [0u8; 5];
        assert!(memory.copy_out(memory.base() + 64, &mut landed));
        assert_eq!(&landed, b"value");
    }

    #[tokio::test]
    async fn memory_from_a_process_that_cannot_prove_it_made_the_offer_is_not_mapped() {
        let (shm, node, memory) = node_and_client([6; 16], 0x31, |_| Arc::new(Squatter));
        let written = write_at_64(&shm, &node, &memory, b"secret").await;
        let refused = written.unwrap_err();
        assert!(refused.to_string().contains("could not prove"), "{refused}");
        assert!(shm.routes().is_empty(), "nothing mapped or remembered");
    }
}
