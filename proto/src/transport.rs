//! The transport seam: what services need from a network, as traits every transport (TCP,
//! RDMA, the simulation) implements.
//!
//! Two planes. The control plane is request/response RPC to the master. The data plane is
//! one-sided: a client reads or writes byte ranges of a node's registered segment memory,
//! batched, without the node's application code taking part (RDMA READ/WRITE verbs; over TCP a
//! small data server on the node copies between socket and memory; in the caller's own process
//! a memcpy). Nodes make memory reachable with a [`DataServer`].
//!
//! The traits are object-safe (futures are boxed) so services hold `Arc<dyn ...>` and stay
//! transport-agnostic.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use mooring_core::{Checksum, Error, ErrorCode, Result};
// The export table's lock and key counter: loom's under `--cfg mooring_loom`.
use crate::sync::{AtomicBool, AtomicU64, Ordering, RwLock};
use crate::wire::{
    Call, DataReply, DataRequest, MAX_DATA_REQUEST, MasterRequest, MasterResponse, QpAddress,
    Range, Reply, ShmOffer, StagedSlot,
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
        let reply = self.send(request.into()).await?;
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

/// Keeps a segment's memory mapped: the memory stays valid while any clone of its owner lives.
// std's `Arc` even under `--cfg mooring_loom`: owners are made by unsized coercion
// (`Arc<Mapping>` to `Arc<dyn Any>`), which loom's `Arc` cannot do. The loom tests still check
// that a resolved region keeps its owner alive across a concurrent unexport.
pub type MemoryOwner = Arc<dyn std::any::Any + Send + Sync>;

/// A node's registered memory: raw bytes, kept alive by an owner handle that every holder
/// (the node, a data server, an in-flight transfer) clones, so the memory is unmapped only
/// after the last transfer touching it has finished.
///
/// Remote peers read and write it concurrently with the node, as RDMA NICs do; the master's
/// protocol guarantees no two transfers touch the same bytes while one of them writes.
#[derive(Clone)]
pub struct SegmentMemory {
    ptr: NonNull<u8>,
    len: usize,
    owner: MemoryOwner,
}

impl std::fmt::Debug for SegmentMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SegmentMemory({:#x}, {} bytes)", self.base(), self.len)
    }
}

// SAFETY: the bytes are owned by `_owner` (Send + Sync) and live as long as it does; access
// discipline is the protocol's (see the type docs), as for DMA buffers.
unsafe impl Send for SegmentMemory {}
// SAFETY: as above.
unsafe impl Sync for SegmentMemory {}

impl SegmentMemory {
    /// Wraps `len` bytes at `ptr`, kept alive by `owner`.
    ///
    /// # Safety
    /// The bytes must stay allocated for as long as `owner` (or any clone) lives.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize, owner: MemoryOwner) -> SegmentMemory {
        SegmentMemory { ptr, len, owner }
    }

    /// The address clients use for the first byte (the node's virtual address).
    pub fn base(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// What keeps the memory mapped (a transport that needs more than the bytes, such as the
    /// descriptor of a shared mapping, finds it here).
    pub fn owner(&self) -> &MemoryOwner {
        &self.owner
    }

    /// Whether the segment is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pointer to `len` bytes at remote address `addr`, if the range lies inside.
    pub fn range(&self, addr: u64, len: u64) -> Option<NonNull<u8>> {
        let offset = addr.checked_sub(self.base())?;
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: offset <= len of the allocation, checked above.
        Some(unsafe { self.ptr.add(offset as usize) })
    }

    /// Copies `dest.len()` bytes at remote address `addr` into `dest` (a local read).
    /// Returns false if the range lies outside the segment.
    pub fn copy_out(&self, addr: u64, dest: &mut [u8]) -> bool {
        match self.range(addr, dest.len() as u64) {
            Some(src) => {
                // SAFETY: `src` points at `dest.len()` valid bytes (checked by `range`); the
                // regions cannot overlap (`dest` is caller memory outside the segment, or a
                // disjoint part of it per the protocol).
                unsafe { std::ptr::copy(src.as_ptr(), dest.as_mut_ptr(), dest.len()) };
                true
            }
            None => false,
        }
    }

    /// Copies `dest.len()` bytes at remote address `addr` into `dest` (a local read) and
    /// returns the checksum of what `dest` received, summed in the same pass over the bytes
    /// (`mooring_crc::copy_append`). None if the range lies outside the segment.
    pub fn copy_out_summed(&self, addr: u64, dest: &mut [u8]) -> Option<Checksum> {
        let src = self.range(addr, dest.len() as u64)?;
        // SAFETY: as for `copy_out`; others writing `src` meanwhile is allowed (the checksum
        // is then of what landed, and the reader's check refuses it).
        Some(Checksum(unsafe {
            mooring_crc::copy_append(
                0,
                src.as_ptr(),
                dest.as_mut_ptr(),
                dest.len(),
                mooring_crc::Own::Destination,
            )
        }))
    }

    /// Copies `src` to remote address `addr` (a local write) and returns the checksum of
    /// `src`, summed in the same pass. Summed from `src`, not from the segment: another
    /// writer (a late one, through shared memory) may write the same bytes meanwhile, and
    /// the checksum the master records must then refuse what landed, not vouch for it.
    /// None if the range lies outside the segment.
    pub fn copy_in_summed(&self, addr: u64, src: &[u8]) -> Option<Checksum> {
        let dest = self.range(addr, src.len() as u64)?;
        // SAFETY: as for `copy_in`; `src` is the caller's and nobody writes it meanwhile.
        Some(Checksum(unsafe {
            mooring_crc::copy_append(
                0,
                src.as_ptr(),
                dest.as_ptr(),
                src.len(),
                mooring_crc::Own::Source,
            )
        }))
    }

    /// Copies `src` to remote address `addr` (a local write). Returns false if the range lies
    /// outside the segment.
    pub fn copy_in(&self, addr: u64, src: &[u8]) -> bool {
        match self.range(addr, src.len() as u64) {
            Some(dest) => {
                // SAFETY: as for `copy_out`, with the roles swapped.
                unsafe { std::ptr::copy(src.as_ptr(), dest.as_ptr(), src.len()) };
                true
            }
            None => false,
        }
    }
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

/// The segments a data server exports, by access key: what every transport's data server
/// consults to turn a request's `(key, ranges)` into memory. A key names one export of one
/// segment; a remount exports under a fresh key, so descriptors from an earlier mount stop
/// working.
pub struct ExportTable {
    regions: RwLock<BTreeMap<u64, (SegmentMemory, Exported)>>,
    key_seed: u64,
    next_key: AtomicU64,
}

/// Whether one export is still in force: a transfer that runs long (a write trickling in over
/// a slow link) checks it as it goes, since once the segment is unexported (a remount) the
/// master may give its ranges to other writers.
#[derive(Clone)]
pub struct Exported(Arc<AtomicBool>);

impl Exported {
    /// Whether the export is still in force.
    pub fn still(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl ExportTable {
    /// An empty table. Keys are derived from `key_seed`: give distinct servers (and restarts
    /// of one) distinct seeds.
    pub fn new(key_seed: u64) -> ExportTable {
        ExportTable {
            regions: RwLock::new(BTreeMap::new()),
            key_seed,
            next_key: AtomicU64::new(1),
        }
    }

    /// Exports `memory` under a fresh key.
    pub fn export(&self, memory: SegmentMemory) -> u64 {
        let n = self.next_key.fetch_add(1, Ordering::Relaxed);
        let key = mix(self.key_seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
        let exported = Exported(Arc::new(AtomicBool::new(true)));
        self.regions
            .write()
            .expect("export table lock")
            .insert(key, (memory, exported));
        key
    }

    /// Stops exporting `key`; returns its memory if it was exported. Transfers under way
    /// see it through their [`Exported`].
    pub fn unexport(&self, key: u64) -> Option<SegmentMemory> {
        let (memory, exported) = self
            .regions
            .write()
            .expect("export table lock")
            .remove(&key)?;
        exported.0.store(false, Ordering::Release);
        Some(memory)
    }

    /// Every exported key.
    pub fn keys(&self) -> Vec<u64> {
        self.regions
            .read()
            .expect("export table lock")
            .keys()
            .copied()
            .collect()
    }

    /// The memory of `key` if every range lies inside it and the total is one request's
    /// worth at most.
    pub fn resolve(&self, key: u64, ranges: &[Range]) -> Result<SegmentMemory> {
        self.resolve_watched(key, ranges).map(|(memory, _)| memory)
    }

    /// As [`ExportTable::resolve`], with what tells whether the export is still in force.
    pub fn resolve_watched(&self, key: u64, ranges: &[Range]) -> Result<(SegmentMemory, Exported)> {
        let mut total: u64 = 0;
        for r in ranges {
            total = total
                .checked_add(r.len)
                .filter(|&t| t <= MAX_DATA_REQUEST)
                .ok_or_else(|| {
                    Error::new(
                        ErrorCode::INVALID_PARAMS,
                        "transfer larger than one request may move",
                    )
                })?;
        }
        let region = self
            .regions
            .read()
            .expect("export table lock")
            .get(&key)
            .cloned()
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::REPLICA_IS_GONE,
                    format!("segment key {key:#x} is not served here (unmounted or remounted)"),
                )
            })?;
        for r in ranges {
            if region.0.range(r.addr, r.len).is_none() {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("range {:#x}+{} lies outside the segment", r.addr, r.len),
                ));
            }
        }
        Ok(region)
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        mooring_loom,
        ignore = "loom's lock only works inside loom::model: tests/loom.rs"
    )]
    fn exports_resolve_only_live_keys_and_ranges_inside() {
        let owner = Arc::new(std::sync::Mutex::new(vec![0u8; 4096]));
        let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
        let memory = unsafe { SegmentMemory::new(ptr, 4096, owner.clone()) };
        let base = memory.base();
        let table = ExportTable::new(42);
        let first = table.export(memory.clone());
        let second = table.export(memory);
        assert_ne!(first, second, "every export gets a fresh key");
        let inside = [Range {
            addr: base,
            len: 4096,
        }];
        assert!(table.resolve(first, &inside).is_ok());
        let outside = [Range {
            addr: base + 1,
            len: 4096,
        }];
        let err = table.resolve(first, &outside).unwrap_err();
        assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
        let huge = [
            Range {
                addr: base,
                len: u64::MAX,
            },
            Range { addr: base, len: 2 },
        ];
        assert_eq!(
            table.resolve(first, &huge).unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        let (_, exported) = table.resolve_watched(first, &inside).unwrap();
        assert!(exported.still());
        assert!(table.unexport(first).is_some());
        assert!(!exported.still(), "a transfer under way sees the unexport");
        assert_eq!(
            table.resolve(first, &inside).unwrap_err().code,
            ErrorCode::REPLICA_IS_GONE
        );
        assert_eq!(table.keys(), vec![second]);
        let other = ExportTable::new(43);
        assert_ne!(other.export(table.unexport(second).unwrap()), first);
    }

    #[test]
    fn ranges_stay_inside_the_segment() {
        let owner = Arc::new(std::sync::Mutex::new(vec![0u8; 4096]));
        let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
        let memory = unsafe { SegmentMemory::new(ptr, 4096, owner.clone()) };
        let base = memory.base();
        assert!(memory.range(base, 4096).is_some());
        assert!(memory.range(base + 4095, 1).is_some());
        assert!(memory.range(base + 4095, 2).is_none());
        assert!(memory.range(base - 1, 1).is_none());
        assert!(memory.range(base + 10, u64::MAX).is_none());
        assert!(memory.range(u64::MAX, 1).is_none());
        assert!(memory.copy_in(base + 100, b"hello"));
        let mut out = [0u8; 5];
        assert!(memory.copy_out(base + 100, &mut out));
        assert_eq!(&out, b"hello");
        assert!(!memory.copy_out(base + 4093, &mut out));
    }

    #[test]
    fn summed_copies_give_the_checksum_of_what_moved() {
        let owner = Arc::new(std::sync::Mutex::new(vec![0u8; 64 << 10]));
        let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
        let memory = unsafe { SegmentMemory::new(ptr, 64 << 10, owner.clone()) };
        let base = memory.base();
        let value: Vec<u8> = (0..40_000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        assert_eq!(
            memory.copy_in_summed(base + 3, &value),
            Some(Checksum::of(&value))
        );
        let mut out = vec![0u8; value.len()];
        assert_eq!(
            memory.copy_out_summed(base + 3, &mut out),
            Some(Checksum::of(&value))
        );
        assert_eq!(out, value);
        assert_eq!(memory.copy_in_summed(base + (40 << 10), &value), None);
        assert_eq!(memory.copy_out_summed(base + (40 << 10), &mut out), None);
    }
}
