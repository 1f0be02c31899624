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

use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::Result;
use crate::wire::{MasterRequest, Reply};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a segment's bytes are reached: the node's data-plane endpoint and the segment's
/// access key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddr {
    /// Transport-specific address of the node's data plane.
    pub endpoint: Arc<str>,
    /// The segment's access key (RDMA rkey, or the data server's per-mount token).
    pub key: u64,
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
    /// Sends `request` and waits for the reply (or a transport error, `RPC_FAIL`).
    fn call(&self, request: MasterRequest) -> BoxFuture<'_, Result<Reply>>;
}

/// Batched one-sided transfers to and from nodes' segments.
pub trait DataPlane: Send + Sync {
    /// Performs every read against `node`; fails (`TRANSFER_FAIL`) if any fails.
    fn read<'a>(&'a self, node: &'a NodeAddr, ops: Vec<ReadOp<'a>>) -> BoxFuture<'a, Result<()>>;
    /// Performs every write against `node`; fails (`TRANSFER_FAIL`) if any fails.
    fn write<'a>(&'a self, node: &'a NodeAddr, ops: Vec<WriteOp<'a>>) -> BoxFuture<'a, Result<()>>;
}

/// A node's registered memory: raw bytes the node owns and keeps mapped while exported.
///
/// Remote peers read and write it concurrently with the node, as RDMA NICs do; the master's
/// protocol guarantees no two transfers touch the same bytes while one of them writes.
#[derive(Clone, Copy, Debug)]
pub struct SegmentMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the memory is plain bytes owned by the node for as long as it is exported; access
// discipline is the protocol's (see the type docs), as for DMA buffers.
unsafe impl Send for SegmentMemory {}
// SAFETY: as above.
unsafe impl Sync for SegmentMemory {}

impl SegmentMemory {
    /// Wraps `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The bytes must stay allocated and not be freed or remapped while any transport holds
    /// this value (the node unexports before unmapping).
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> SegmentMemory {
        SegmentMemory { ptr, len }
    }

    /// The address clients use for the first byte (the node's virtual address).
    pub fn base(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
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
}

/// Makes segment memory reachable for one-sided transfers.
pub trait DataServer: Send + Sync {
    /// Exports `memory`; returns the address and key to advertise in the segment's spec.
    fn export(&self, memory: SegmentMemory) -> Result<NodeAddr>;
    /// Stops serving the segment with `key`; later transfers to it fail.
    fn unexport(&self, key: u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_stay_inside_the_segment() {
        let mut bytes = vec![0u8; 4096];
        let memory = unsafe { SegmentMemory::new(NonNull::new(bytes.as_mut_ptr()).unwrap(), 4096) };
        let base = memory.base();
        assert!(memory.range(base, 4096).is_some());
        assert!(memory.range(base + 4095, 1).is_some());
        assert!(memory.range(base + 4095, 2).is_none());
        assert!(memory.range(base - 1, 1).is_none());
        assert!(memory.range(base + 10, u64::MAX).is_none());
        assert!(memory.range(u64::MAX, 1).is_none());
    }
}
