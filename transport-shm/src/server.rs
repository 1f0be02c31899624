//! A node's side: the segments it offers in shared memory, the tickets it has handed out, and
//! the Unix socket on which clients redeem them.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::refusals;
use mooring_proto::serve::{DataCounts, DataService};
use mooring_proto::transport::{DataServer, NodeAddr, SegmentMemory, ShmAcceptor};
use mooring_proto::wire::ShmOffer;
use tracing::{debug, info};

use crate::handoff::{self, Reply};
use crate::memory::{clear_export_key, set_export_key, shared};
use crate::peers::{AllowedPeers, SlotsPerUser, peer_cred};

/// How long a ticket may wait to be redeemed.
pub const TICKET_TTL: Duration = Duration::from_secs(10);
/// Tickets outstanding at most; beyond it the oldest are forgotten.
const MAX_TICKETS: usize = 1024;
/// Clients served at once; more are refused at once (each is served in well under a
/// millisecond, so this only bites a flood).
const MAX_HANDOFFS: usize = 8;
/// Clients of one user served at once: one allowed user's flood leaves the others room.
const MAX_HANDOFFS_PER_USER: usize = MAX_HANDOFFS / 2;
/// How long a client may take to send its ticket or receive its reply.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(1);

/// The sockets of the shared-memory servers in this process: a client offered one of them
/// reaches the segment through its own process's memory instead of mapping it twice.
static IN_THIS_PROCESS: Mutex<Vec<[u8; 16]>> = Mutex::new(Vec::new());

/// Whether the socket named by `id` is served by this process.
pub(crate) fn in_this_process(id: &[u8; 16]) -> bool {
    lock(&IN_THIS_PROCESS).contains(id)
}

/// The abstract socket name a node with `id` listens on.
fn socket_name(id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("mooring-shm-{hex}")
}

/// The address of the socket an offer names (its `socket` field), and the name for messages.
pub fn socket_address(id: &[u8; 16]) -> Result<(SocketAddr, String)> {
    let name = socket_name(id);
    let address = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("abstract socket {name}: {e}"),
        )
    })?;
    Ok((address, name))
}

/// A node's shared-memory offers and the socket serving them. Stops listening when dropped.
pub struct ShmServer {
    state: Arc<State>,
    host: [u8; 16],
    socket: [u8; 16],
    listener: Option<JoinHandle<()>>,
}

struct State {
    /// Segments in shared memory, by their data-server key.
    exports: Mutex<HashMap<u64, SegmentMemory>>,
    tickets: Mutex<Tickets>,
    stopping: AtomicBool,
    handoffs: AtomicUsize,
    /// Who may connect.
    allowed: AllowedPeers,
    handoffs_per_user: SlotsPerUser,
}

impl State {
    fn new(allowed: AllowedPeers) -> State {
        State {
            exports: Mutex::default(),
            tickets: Mutex::default(),
            stopping: AtomicBool::new(false),
            handoffs: AtomicUsize::new(0),
            allowed,
            handoffs_per_user: SlotsPerUser::new(MAX_HANDOFFS_PER_USER),
        }
    }
}

#[derive(Default)]
struct Tickets {
    /// What each ticket is for, when it was issued, and the proof its offer carried.
    issued: HashMap<[u8; 16], (u64, Instant, [u8; 16])>,
}

impl Tickets {
    /// A fresh ticket for `key`, and the proof the reply to it will carry.
    fn issue(&mut self, key: u64, now: Instant) -> ([u8; 16], [u8; 16]) {
        self.issued
            .retain(|_, (_, at, _)| now.duration_since(*at) < TICKET_TTL);
        if self.issued.len() >= MAX_TICKETS {
            let oldest = self
                .issued
                .iter()
                .min_by_key(|(_, (_, at, _))| *at)
                .map(|(t, _)| *t)
                .expect("at the limit, so not empty");
            self.issued.remove(&oldest);
        }
        let (ticket, proof) = (random(), random());
        self.issued.insert(ticket, (key, now, proof));
        (ticket, proof)
    }

    /// The key `ticket` is for and its proof, if it was issued and has not expired or been
    /// redeemed.
    fn redeem(&mut self, ticket: &[u8; 16], now: Instant) -> Option<(u64, [u8; 16])> {
        let (key, at, proof) = self.issued.remove(ticket)?;
        (now.duration_since(at) < TICKET_TTL).then_some((key, proof))
    }
}

fn random() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ShmServer {
    /// Listens on a fresh abstract Unix socket, serving processes of this user only.
    pub fn start() -> Result<Arc<ShmServer>> {
        ShmServer::start_allowing(AllowedPeers::owner_only())
    }

    /// Listens on a fresh abstract Unix socket, serving the users `allowed` names (the
    /// socket has no file permissions: every other local user is refused by the
    /// credentials the kernel reports for it).
    pub fn start_allowing(allowed: AllowedPeers) -> Result<Arc<ShmServer>> {
        let host = crate::host_id()?;
        let socket = random();
        let (address, name) = socket_address(&socket)?;
        let listener = UnixListener::bind_addr(&address).map_err(|e| {
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("cannot listen on the shared-memory socket {name}: {e}"),
            )
        })?;
        info!(socket = %name, "shared-memory socket serves {}", allowed.describe());
        let state = Arc::new(State::new(allowed));
        let serving = state.clone();
        let thread = std::thread::Builder::new()
            .name("mooring-shm".into())
            .spawn(move || accept_loop(listener, serving))
            .map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("cannot start a thread: {e}"),
                )
            })?;
        lock(&IN_THIS_PROCESS).push(socket);
        info!(socket = %name, "serving same-host shared memory");
        Ok(Arc::new(ShmServer {
            state,
            host,
            socket,
            listener: Some(thread),
        }))
    }

    /// A server for a node on `host` that listens on no socket: its tickets are redeemed by
    /// calling [`ShmServer::hand_over`]. For the simulation, which runs every node and
    /// client of a cluster in one process and one thread.
    pub fn unlistened(host: [u8; 16]) -> Arc<ShmServer> {
        Arc::new(ShmServer {
            state: Arc::new(State::new(AllowedPeers::owner_only())),
            host,
            socket: random(),
            listener: None,
        })
    }

    /// The id of the socket this server's offers name.
    pub fn socket(&self) -> [u8; 16] {
        self.socket
    }

    /// Answers a client's handoff request (the bytes it sends on the socket): the reply, and
    /// the segment's descriptor when the ticket is good. The socket's own answer, for a
    /// caller that carries request and descriptor another way.
    pub fn hand_over(&self, request: &[u8]) -> (Reply, Option<OwnedFd>) {
        match answer(&self.state, request) {
            Ok((granted, memory)) => match shared(&memory).map(|m| m.fd().try_clone_to_owned()) {
                Some(Ok(fd)) => (granted, Some(fd)),
                Some(Err(e)) => (
                    Reply::Refused(format!("cannot hand over the segment: {e}")),
                    None,
                ),
                None => (granted, None),
            },
            Err(why) => (Reply::Refused(why), None),
        }
    }

    /// Offers `memory` (if it is shared memory) under the data server's `key`. Clients that
    /// mapped it for an earlier key stop using their mapping now.
    pub fn add(&self, key: u64, memory: SegmentMemory) {
        if shared(&memory).is_some() {
            set_export_key(&memory, key);
            lock(&self.state.exports).insert(key, memory);
        }
    }

    /// Stops offering `key`; tickets for it are no longer honoured, and clients stop using
    /// their mappings for it.
    pub fn remove(&self, key: u64) {
        if let Some(memory) = lock(&self.state.exports).remove(&key) {
            clear_export_key(&memory, key);
        }
        lock(&self.state.tickets)
            .issued
            .retain(|_, (k, _, _)| *k != key);
    }
}

impl ShmAcceptor for ShmServer {
    fn offer(&self, key: u64) -> Result<ShmOffer> {
        if !lock(&self.state.exports).contains_key(&key) {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                format!("segment key {key:#x} is not in shared memory here; use TCP for it"),
            ));
        }
        let (ticket, proof) = lock(&self.state.tickets).issue(key, Instant::now());
        Ok(ShmOffer {
            host: self.host,
            socket: self.socket,
            ticket,
            proof,
        })
    }
}

impl Drop for ShmServer {
    fn drop(&mut self) {
        let Some(thread) = self.listener.take() else {
            return;
        };
        lock(&IN_THIS_PROCESS).retain(|s| *s != self.socket);
        self.state.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        if let Ok((address, _)) = socket_address(&self.socket) {
            let _ = UnixStream::connect_addr(&address);
        }
        let _ = thread.join();
    }
}

fn accept_loop(listener: UnixListener, state: Arc<State>) {
    for stream in listener.incoming() {
        if state.stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                // Out of descriptors or memory, typically: retrying at once would spin.
                refusals::refused("shm socket", &format!("cannot accept a client: {e}"));
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        // Who it is comes first: a user not allowed never holds a slot.
        let uid = match peer_cred(&stream) {
            Ok(peer) if state.allowed.admits(peer) => peer.uid,
            Ok(peer) => {
                refusals::refused(
                    "shm socket",
                    &format!(
                        "a process of uid {} (pid {}) is not allowed: the socket serves {}",
                        peer.uid,
                        peer.pid,
                        state.allowed.describe()
                    ),
                );
                continue;
            }
            Err(e) => {
                refusals::refused("shm socket", &format!("cannot tell who connected: {e}"));
                continue;
            }
        };
        if !state.handoffs_per_user.take(uid) {
            refusals::refused(
                "shm socket",
                &format!("too many clients of uid {uid} at once on the shared-memory socket"),
            );
            continue;
        }
        if state.handoffs.fetch_add(1, Ordering::SeqCst) >= MAX_HANDOFFS {
            state.handoffs.fetch_sub(1, Ordering::SeqCst);
            state.handoffs_per_user.give_back(uid);
            refusals::refused(
                "shm socket",
                "too many clients at once on the shared-memory socket",
            );
            continue;
        }
        let serving = state.clone();
        let spawned = std::thread::Builder::new()
            .name("mooring-shm-handoff".into())
            .spawn(move || {
                hand_off(&stream, &serving);
                serving.handoffs.fetch_sub(1, Ordering::SeqCst);
                serving.handoffs_per_user.give_back(uid);
            });
        if spawned.is_err() {
            state.handoffs.fetch_sub(1, Ordering::SeqCst);
            state.handoffs_per_user.give_back(uid);
        }
    }
}

/// Serves one client: reads its ticket and sends the memory it is for, or why not.
fn hand_off(stream: &UnixStream, state: &State) {
    use std::io::Read;
    let _ = stream.set_read_timeout(Some(HANDOFF_TIMEOUT));
    let _ = stream.set_write_timeout(Some(HANDOFF_TIMEOUT));
    let mut request = [0u8; handoff::REQUEST_LEN];
    if let Err(e) = (&*stream).read_exact(&mut request) {
        refusals::refused(
            "shm socket",
            &format!("no ticket within {HANDOFF_TIMEOUT:?}: {e}"),
        );
        return;
    }
    let sent = match answer(state, &request) {
        Ok((granted, memory)) => {
            handoff::send_reply(stream, &granted, shared(&memory).map(|m| m.fd()))
        }
        Err(why) => handoff::send_reply(stream, &Reply::Refused(why), None),
    };
    match sent {
        Ok(()) => debug!("answered a same-host client"),
        Err(e) => debug!("a same-host client left before its answer: {e}"),
    }
}

/// The answer to a handoff request: the grant and the memory whose descriptor goes with it
/// (only shared memory is offered: [`ShmServer::add`]), or why the request is refused.
fn answer(state: &State, request: &[u8]) -> std::result::Result<(Reply, SegmentMemory), String> {
    let ticket = handoff::decode_request(request).inspect_err(|why| {
        refusals::refused("shm socket", why);
    })?;
    let redeemed = lock(&state.tickets).redeem(&ticket, Instant::now());
    let found =
        redeemed.and_then(|(key, proof)| Some((lock(&state.exports).get(&key).cloned()?, proof)));
    let Some((memory, proof)) = found else {
        refusals::refused(
            "shm socket",
            "a ticket that is unknown, used, expired or for a segment gone",
        );
        return Err(
            "ticket unknown, already used or expired, or its segment is gone: ask the \
                    node for a new one"
                .into(),
        );
    };
    let granted = Reply::Granted {
        base: memory.base(),
        len: memory.len() as u64,
        proof,
    };
    debug!(
        len = memory.len(),
        "handing a segment to a same-host client"
    );
    Ok((granted, memory))
}

/// A node's data server that offers its segments to same-host clients too.
pub struct ShmDataServer {
    inner: Arc<dyn DataServer>,
    shm: Arc<ShmServer>,
}

impl ShmDataServer {
    /// Offers the shared-memory exports of `inner` through `shm`; `inner` answers the
    /// clients' attach requests.
    pub fn new(inner: Arc<dyn DataServer>, shm: Arc<ShmServer>) -> ShmDataServer {
        inner.serve_shm(shm.clone());
        ShmDataServer { inner, shm }
    }
}

impl DataServer for ShmDataServer {
    fn service(&self) -> &DataService {
        self.inner.service()
    }

    fn export(&self, memory: SegmentMemory) -> Result<NodeAddr> {
        let addr = self.inner.export(memory.clone())?;
        self.shm.add(addr.key, memory);
        Ok(addr)
    }

    fn unexport(&self, key: u64) {
        self.shm.remove(key);
        self.inner.unexport(key);
    }

    // The wrapped server's counts (a TCP server's include its connections).
    fn counts(&self) -> DataCounts {
        self.inner.counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_work_once_within_their_time_and_are_bounded() {
        let mut tickets = Tickets::default();
        let t0 = Instant::now();
        let (a, proof) = tickets.issue(1, t0);
        let (b, _) = tickets.issue(2, t0);
        assert_ne!(a, b);
        assert_ne!(a, proof, "the proof is not the ticket");
        assert_eq!(tickets.redeem(&a, t0), Some((1, proof)));
        assert_eq!(tickets.redeem(&a, t0), None, "once only");
        assert_eq!(tickets.redeem(&b, t0 + TICKET_TTL), None, "expired");
        assert_eq!(tickets.redeem(&[0; 16], t0), None);
        for i in 0..MAX_TICKETS + 10 {
            tickets.issue(i as u64, t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(tickets.issued.len(), MAX_TICKETS);
    }
}
