//! The plane traits: the control plane (RPC to the master, and the master's side that answers),
//! the data plane (batched one-sided transfers), and the data server a node exports memory
//! through, with what it plugs in (a disk tier, RDMA, same-host memory).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use mooring_core::{Checksum, Error, ErrorCode, Result};

use super::memory::SegmentMemory;
use crate::wire::{
    Call, DataReply, DataRequest, MasterRequest, MasterResponse, QpAddress, Reply, ShmOffer,
    StagedSlot,
};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a segment's bytes are reached: the node's data-plane endpoint and the segment's
/// access key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddr {
    /// Transport-specific address of the node's data plane.
    pub endpoint: Arc<str>,
    /// The segment's access key on the data server (a per-mount token).
    pub key: u64,
    /// The segment's RDMA remote key, when the node serves RDMA too (queue pairs are set up
    /// through the data server at `endpoint`).
    pub rdma_key: Option<u32>,
}

/// Read `dest.len()` bytes at remote address `addr` into `dest`.
#[derive(Debug)]
pub struct ReadOp<'a> {
    /// Remote address (as in a replica descriptor).
    pub addr: u64,
    /// Where the bytes go.
    pub dest: &'a mut [u8],
}

/// Write `src` to remote address `addr`.
#[derive(Debug)]
pub struct WriteOp<'a> {
    /// Remote address (as in a replica descriptor).
    pub addr: u64,
    /// The bytes.
    pub src: &'a [u8],
}

/// Request/response RPC to the master.
pub trait ControlPlane: Send + Sync {
    /// Sends `request` and waits for the reply (or a transport error, `RPC_FAIL`). Callers
    /// use the typed [`call`](#method.call), which checks the reply's kind.
    fn send(&self, request: MasterRequest) -> BoxFuture<'_, Result<Reply>>;
}

impl dyn ControlPlane {
    /// Sends `request` and returns the reply it names; a reply of another kind (a confused or
    /// lying master) is an `INTERNAL_ERROR`.
    pub async fn call<C: Call>(&self, request: C) -> Result<C::Reply> {
        reply_to::<C>(self.send(request.into()).await?)
    }
}

/// `reply` as the answer to a `C`, or an `INTERNAL_ERROR` if it answers another request (a
/// confused or lying master).
pub fn reply_to<C: Call>(reply: Reply) -> Result<C::Reply> {
    C::from_reply(reply).map_err(|other| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!(
                "the master answered {} with a reply to another request: {other:?}",
                C::NAME
            ),
        )
    })
}

/// The master's side of the control plane: answers requests as they arrive. Every control
/// plane server (TCP, the simulation) serves one of these.
pub trait RpcHandler: Send + Sync + 'static {
    /// Answers one request.
    fn handle(&self, request: MasterRequest) -> MasterResponse;

    /// Answers one request, saying when the answer may leave: a master that keeps a journal
    /// holds back an answer that acknowledges a change until the change is on disk. Servers
    /// call this; the default answers at once.
    fn answer(&self, request: MasterRequest) -> Answer {
        Answer::Now(self.handle(request))
    }
}

/// An answer, now or once what it acknowledges is durable.
pub enum Answer {
    /// Send this at once.
    Now(MasterResponse),
    /// Send what this resolves to (the same answer, or an error if the change could not be
    /// made durable).
    WhenDurable(BoxFuture<'static, MasterResponse>),
}

/// A piece of a transfer operation's bytes that landed (a read) or went out (a write):
/// which operation (its index in the request), where in the remote segment the piece starts,
/// its length and its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LandedPiece {
    /// Index of the operation in the read's `ops`.
    pub op: usize,
    /// Remote address of the piece's first byte.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// The checksum of its bytes.
    pub checksum: Checksum,
}

/// The checksum of each of `ops` transfer operations, from the pieces of them that moved (in
/// any order; an operation with no piece moved no bytes).
pub fn checksums_of(ops: usize, mut pieces: Vec<LandedPiece>) -> Vec<Checksum> {
    pieces.sort_unstable_by_key(|p| (p.op, p.addr));
    let mut sums = vec![Checksum::EMPTY; ops];
    for p in pieces {
        sums[p.op] = sums[p.op].then(p.checksum, p.len);
    }
    sums
}

/// Batched one-sided transfers to and from nodes' segments.
pub trait DataPlane: Send + Sync {
    /// Performs every read against `node`; fails (`TRANSFER_FAIL`) if any fails. Returns the
    /// checksum of the bytes each operation read, in order, computed as they landed (so the
    /// pass over them overlaps the rest of the transfer instead of following it), for the
    /// caller to check against the value's.
    fn read<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<ReadOp<'a>>,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>>;
    /// Performs every write against `node`; fails (`TRANSFER_FAIL`) if any fails. No byte
    /// may land in the segment later than `valid_for` from now (the writer's fence: after it
    /// the master may give the ranges to another writer), even if the network delays it: a
    /// transport whose deliveries can be late must make the node refuse them. Returns the
    /// checksum of the bytes each operation sent, in order, computed as they went out (so
    /// the pass over them overlaps the transfer): the value's checksum for the master.
    fn write<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<WriteOp<'a>>,
        valid_for: Duration,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>>;
    /// Sends `request`, which moves no bulk bytes (stage, unstage), to `node` and returns the
    /// node's reply.
    fn request<'a>(
        &'a self,
        node: &'a NodeAddr,
        request: DataRequest,
    ) -> BoxFuture<'a, Result<DataReply>>;
    /// Asks `node` to load the disk copy of `object` (write `write`, `size` bytes) into its
    /// staging buffer. Read it from the returned slot (at `NodeAddr { key: slot.key, .. }`),
    /// then [`DataPlane::unstage`] it.
    fn stage<'a>(
        &'a self,
        node: &'a NodeAddr,
        object: &'a str,
        write: u64,
        size: u64,
    ) -> BoxFuture<'a, Result<StagedSlot>> {
        Box::pin(async move {
            let request = DataRequest::Stage {
                object: object.to_string(),
                size,
                write,
            };
            self.request(node, request)
                .await?
                .into_staged(&node.endpoint)
        })
    }
    /// Frees a staging slot on `node`.
    fn unstage<'a>(&'a self, node: &'a NodeAddr, slot: u64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.request(node, DataRequest::Unstage { slot })
                .await
                .map(|_| ())
        })
    }
}

/// A node's disk tier as its data server sees it: loads disk copies into the staging buffer
/// for readers, and frees the slots.
pub trait Stager: Send + Sync + 'static {
    /// Stages the disk copy of `object`'s write `write`, which the master says is `size`
    /// bytes.
    fn stage(&self, object: String, write: u64, size: u64) -> BoxFuture<'_, Result<StagedSlot>>;
    /// Frees a slot; unknown slots (already reclaimed) are fine.
    fn unstage(&self, slot: u64);
}

/// A node's RDMA side as its data server sees it: connects queue pairs for clients that ask
/// over the (authenticated) data-server connection.
pub trait RdmaAcceptor: Send + Sync + 'static {
    /// Connects a new queue pair to `client` and returns its address; drops `replaces` if
    /// it is one this node accepted for the same client port.
    fn accept(&self, client: QpAddress, replaces: Option<u32>) -> Result<QpAddress>;
}

/// A node's same-host side as its data server sees it: hands clients on the node's host a
/// ticket for a segment's memory, asked over the (authenticated) data-server connection.
pub trait ShmAcceptor: Send + Sync + 'static {
    /// A ticket for the segment exported under `key`, or why there is none (the segment is
    /// not in shared memory, or the key is unknown).
    fn offer(&self, key: u64) -> Result<ShmOffer>;
}

/// Makes segment memory reachable for one-sided transfers. Each transport writes what differs
/// (how a segment is exported, and the service it answers through); the rest is the shared
/// [`DataService`](crate::serve::DataService)'s.
pub trait DataServer: Send + Sync {
    /// The service that answers this server's requests: the one it owns, or the one of the
    /// server it wraps.
    fn service(&self) -> &crate::serve::DataService;
    /// Exports `memory`; returns the address and key to advertise in the segment's spec.
    fn export(&self, memory: SegmentMemory) -> Result<NodeAddr>;
    /// Stops serving the segment with `key`; later transfers to it fail.
    fn unexport(&self, key: u64);

    /// Answers readers' stage requests from `stager` (a node with a disk tier).
    fn serve_disk(&self, stager: Arc<dyn Stager>) -> Result<()> {
        self.service().serve_disk(stager);
        Ok(())
    }
    /// Until [`DataServer::serve_disk`], answers readers' stage requests with "starting,
    /// retry shortly" (a node whose disk tier is recovering after a restart).
    fn disk_starting(&self) {
        self.service().disk_starting();
    }
    /// Answers clients' requests for RDMA queue pairs through `acceptor` (a node that serves
    /// RDMA).
    fn serve_rdma(&self, acceptor: Arc<dyn RdmaAcceptor>) {
        self.service().serve_rdma(acceptor);
    }
    /// Answers clients' requests to map segments from the same host through `acceptor` (a
    /// node that serves shm).
    fn serve_shm(&self, acceptor: Arc<dyn ShmAcceptor>) {
        self.service().serve_shm(acceptor);
    }

    /// What this server has served since it started.
    fn counts(&self) -> crate::serve::DataCounts {
        self.service().counts()
    }
}
