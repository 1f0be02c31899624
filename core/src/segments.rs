//! Segments: the memory storage nodes contribute, each with its own offset allocator.
//!
//! A node mounts `[base, base + size)` of its registered memory under a name. The master carves
//! replicas out of it and never touches the bytes. Sizes are rounded to [`ALLOC_ALIGN`] so
//! every replica starts on a cache-line boundary relative to the segment base.

use std::collections::BTreeMap;

use crate::allocator::{Allocation, MAX_CAPACITY, OffsetAllocator};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{ClientId, SegmentId, WriteId};
use crate::object::{Medium, Replica, ReplicaDescriptor, ReplicaStatus};

/// Replica blocks are multiples of this many bytes and start on such a boundary.
pub const ALLOC_ALIGN: u64 = 64;
/// The smallest segment a node may mount.
pub const MIN_SEGMENT_SIZE: u64 = 4096;

/// The block length that holds a value of `size` bytes.
pub(crate) fn block_len(size: u64) -> u64 {
    size.div_ceil(ALLOC_ALIGN) * ALLOC_ALIGN
}

/// What a node offers when it mounts a segment.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct SegmentSpec {
    /// Unique name (Mooncake uses the node's hostname:port).
    pub name: String,
    /// Address of the first byte in the node's registered memory.
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
    /// Where clients reach the node's data plane (transport-specific address).
    pub endpoint: String,
    /// The data-plane access key clients present (an RDMA rkey, or a per-mount token the
    /// node's data server checks, so a stale descriptor cannot write into a later mount).
    pub key: u64,
    /// The segment's RDMA remote key, when its node also serves RDMA (clients set up queue
    /// pairs through the data server at `endpoint`).
    pub rdma_key: Option<u32>,
}

/// What the master knows about a mounted segment.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct SegmentInfo {
    /// The mount's id.
    pub id: SegmentId,
    /// The mount's name.
    pub name: String,
    /// The client that mounted it.
    pub owner: ClientId,
    /// Address of the first byte.
    pub base: u64,
    /// Usable length (the mounted size rounded down to [`ALLOC_ALIGN`]).
    pub size: u64,
    /// Bytes allocated to replicas (including ones waiting out a release delay).
    pub used: u64,
    /// The node's data-plane address.
    pub endpoint: String,
    /// The data-plane access key.
    pub key: u64,
    /// The RDMA remote key, when the node serves RDMA.
    pub rdma_key: Option<u32>,
}

/// A mounted segment.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Segment {
    pub id: SegmentId,
    pub name: Box<str>,
    pub owner: ClientId,
    pub base: u64,
    pub endpoint: Box<str>,
    pub key: u64,
    pub rdma_key: Option<u32>,
    pub allocator: OffsetAllocator,
}

impl Segment {
    /// Whether `spec` describes this very mount (a retried mount request).
    pub(crate) fn matches(&self, spec: &SegmentSpec) -> bool {
        self.base == spec.base
            && self.allocator.capacity() == spec.size / ALLOC_ALIGN * ALLOC_ALIGN
            && *self.endpoint == *spec.endpoint
            && self.key == spec.key
            && self.rdma_key == spec.rdma_key
    }

    pub(crate) fn info(&self) -> SegmentInfo {
        SegmentInfo {
            id: self.id,
            name: self.name.to_string(),
            owner: self.owner,
            base: self.base,
            size: self.allocator.capacity(),
            used: self.allocator.used_bytes(),
            endpoint: self.endpoint.to_string(),
            key: self.key,
            rdma_key: self.rdma_key,
        }
    }
}

/// All mounted segments.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Segments {
    slots: Vec<Option<Segment>>,
    free_slots: Vec<u32>,
    /// Live slots, ascending: the candidates for placement.
    pub(crate) mounted: Vec<u32>,
    by_name: BTreeMap<Box<str>, u32>,
    by_id: BTreeMap<SegmentId, u32>,
    next_id: u64,
    capacity: u64,
    used: u64,
}

impl Segments {
    pub(crate) fn new() -> Segments {
        Segments {
            slots: Vec::new(),
            free_slots: Vec::new(),
            mounted: Vec::new(),
            by_name: BTreeMap::new(),
            by_id: BTreeMap::new(),
            next_id: 1,
            capacity: 0,
            used: 0,
        }
    }

    /// Total usable bytes over all segments.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes allocated over all segments.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Mounts a segment for `owner`. Mounting the same name again with the same spec and owner
    /// is a no-op that returns the existing id (an RPC retry); anything else under a mounted
    /// name is refused.
    pub(crate) fn mount(&mut self, owner: ClientId, spec: &SegmentSpec) -> Result<SegmentId> {
        let size = spec.size / ALLOC_ALIGN * ALLOC_ALIGN;
        if spec.name.is_empty() || spec.name.len() > 1024 {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "segment name must be 1 to 1024 bytes",
            ));
        }
        if !(MIN_SEGMENT_SIZE..=MAX_CAPACITY).contains(&size) {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "segment {:?} size {} must be between {MIN_SEGMENT_SIZE} and {MAX_CAPACITY} bytes",
                    spec.name, spec.size
                ),
            ));
        }
        if spec.base.checked_add(spec.size).is_none() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("segment {:?} base + size overflows", spec.name),
            ));
        }
        if let Some(&slot) = self.by_name.get(spec.name.as_str()) {
            let existing = self.at(slot);
            if existing.owner == owner && existing.matches(spec) {
                return Ok(existing.id);
            }
            return Err(Error::new(
                ErrorCode::SEGMENT_ALREADY_EXISTS,
                format!(
                    "segment {:?} is already mounted as {}",
                    spec.name, existing.id
                ),
            ));
        }
        let id = SegmentId(self.next_id);
        self.next_id += 1;
        let segment = Segment {
            id,
            name: spec.name.clone().into_boxed_str(),
            owner,
            base: spec.base,
            endpoint: spec.endpoint.clone().into_boxed_str(),
            key: spec.key,
            rdma_key: spec.rdma_key,
            allocator: OffsetAllocator::new(size),
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(segment);
                slot
            }
            None => {
                self.slots.push(Some(segment));
                (self.slots.len() - 1) as u32
            }
        };
        let at = self.mounted.partition_point(|&s| s < slot);
        self.mounted.insert(at, slot);
        self.by_name
            .insert(spec.name.clone().into_boxed_str(), slot);
        self.by_id.insert(id, slot);
        self.capacity += size;
        Ok(id)
    }

    /// Forgets the segment in `slot`. The caller must already have dropped every replica and
    /// discarded block that points into it.
    pub(crate) fn remove(&mut self, slot: u32) -> Segment {
        let segment = self.slots[slot as usize]
            .take()
            .expect("removing a live segment");
        self.mounted.retain(|&s| s != slot);
        self.by_name.remove(&segment.name);
        self.by_id.remove(&segment.id);
        self.free_slots.push(slot);
        self.capacity -= segment.allocator.capacity();
        self.used -= segment.allocator.used_bytes();
        segment
    }

    pub(crate) fn slot_by_name(&self, name: &str) -> Option<u32> {
        self.by_name.get(name).copied()
    }

    pub(crate) fn slot_by_id(&self, id: SegmentId) -> Option<u32> {
        self.by_id.get(&id).copied()
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&Segment> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    /// The segment in a slot known to be live.
    pub(crate) fn at(&self, slot: u32) -> &Segment {
        self.slots[slot as usize].as_ref().expect("live segment")
    }

    /// Live segments in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Segment)> {
        self.mounted.iter().map(|&slot| (slot, self.at(slot)))
    }

    /// Allocates a block for a `size`-byte value on the segment in `slot`: a new PROCESSING
    /// replica.
    pub(crate) fn allocate_on(&mut self, slot: u32, size: u64) -> Option<Replica> {
        let len = block_len(size);
        let segment = self.slots[slot as usize].as_mut()?;
        let allocation = segment.allocator.allocate(len)?;
        self.used += len;
        Some(Replica::processing(slot, allocation.offset))
    }

    /// Frees the block of `replica`, which holds a `size`-byte value. Returns false if it was
    /// not live (which the invariant checker reports).
    pub(crate) fn free(&mut self, replica: &Replica, size: u64) -> bool {
        self.free_block(replica.segment, replica.offset(), block_len(size))
    }

    /// Frees `len` bytes at `offset` of the segment in `slot`. Returns false if they were not
    /// all allocated.
    pub(crate) fn free_block(&mut self, slot: u32, offset: u64, len: u64) -> bool {
        let Some(segment) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
            return false;
        };
        let freed = segment.allocator.free(Allocation { offset, len });
        if freed {
            self.used -= len;
        }
        freed
    }

    /// Free bytes on the segment in `slot`.
    pub(crate) fn free_bytes(&self, slot: u32) -> u64 {
        self.at(slot).allocator.free_bytes()
    }

    /// The client-facing view of a replica.
    pub(crate) fn describe(&self, replica: &Replica, len: u64) -> ReplicaDescriptor {
        let segment = self.at(replica.segment);
        ReplicaDescriptor {
            segment: segment.id,
            addr: segment.base + replica.offset(),
            len,
            status: replica.status(),
            medium: Medium::Memory,
        }
    }

    /// The client-facing view of a disk replica of write `write`, held by the node of the
    /// segment in `slot`.
    pub(crate) fn describe_disk(&self, slot: u32, write: WriteId, len: u64) -> ReplicaDescriptor {
        ReplicaDescriptor {
            segment: self.at(slot).id,
            addr: write.0,
            len,
            status: ReplicaStatus::Complete,
            medium: Medium::Disk,
        }
    }

    /// Heap bytes of all allocators' bookkeeping.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.iter().map(|(_, s)| s.allocator.heap_bytes()).sum()
    }

    /// Checks every allocator, the indexes and the byte counters; returns each segment's
    /// allocated space as maximal runs `(slot, offset, len)`, in slot and address order. Never
    /// panics, whatever the state.
    pub(crate) fn check(&self) -> Result<Vec<(u32, u64, u64)>, String> {
        let mut blocks = Vec::new();
        let (mut capacity, mut used) = (0u64, 0u64);
        if !self.mounted.windows(2).all(|w| w[0] < w[1]) {
            return Err("mounted list is not strictly ascending".into());
        }
        let live = self.slots.iter().filter(|s| s.is_some()).count();
        if live != self.mounted.len() || self.free_slots.len() + live != self.slots.len() {
            return Err("segment slots, mounted list and free list disagree".into());
        }
        for &slot in &self.mounted {
            let segment = self
                .get(slot)
                .ok_or_else(|| format!("mounted slot {slot} is empty"))?;
            let live = segment
                .allocator
                .check()
                .map_err(|e| format!("segment {:?}: {e}", segment.name))?;
            capacity = capacity.saturating_add(segment.allocator.capacity());
            used = used.saturating_add(segment.allocator.used_bytes());
            blocks.extend(live.into_iter().map(|(off, len)| (slot, off, len)));
            if self.by_name.get(&segment.name) != Some(&slot)
                || self.by_id.get(&segment.id) != Some(&slot)
            {
                return Err(format!(
                    "segment {:?} is not indexed by name and id",
                    segment.name
                ));
            }
            if segment.id.0 >= self.next_id {
                return Err(format!(
                    "segment id {} not below next id {}",
                    segment.id, self.next_id
                ));
            }
        }
        if capacity != self.capacity || used != self.used {
            return Err(format!(
                "segment totals: capacity {} (counted {capacity}), used {} (counted {used})",
                self.capacity, self.used
            ));
        }
        if self.by_name.len() != self.mounted.len() || self.by_id.len() != self.mounted.len() {
            return Err("segment indexes list unmounted segments".into());
        }
        Ok(blocks)
    }
}
