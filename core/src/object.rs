//! One object's metadata: its replicas, its lease, its pins, and who is writing it.
//!
//! The rules that decide what may happen to an object (may it be read, evicted, overwritten in
//! place?) live here as small predicates so every operation asks the same question the same way.

use smallvec::SmallVec;

use crate::ids::{ClientId, SegmentId, TaskId, WriteId};
use crate::time::Millis;

/// Whether a replica's bytes may be read.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq, Eq))]
#[repr(u8)]
pub enum ReplicaStatus {
    /// Space is allocated and a writer is filling it; never served to readers.
    Processing,
    /// The bytes are the object's value; readable.
    Complete,
}

/// Where one replica of an object lives, as handed to clients: the segment, the absolute
/// address within the node's registered memory, and the length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub struct ReplicaDescriptor {
    /// The segment holding the replica; resolve its endpoint with `Master::segment_info`.
    pub segment: SegmentId,
    /// Absolute address of the first byte (segment base + offset).
    pub addr: u64,
    /// Length of the value in bytes.
    pub len: u64,
    /// Whether the bytes are readable yet.
    pub status: ReplicaStatus,
}

/// A replica as the master tracks it: a block of one segment's allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Replica {
    /// Offset of the block within its segment.
    pub offset: u64,
    /// The segment's slot in the segment table.
    pub segment: u32,
    /// The allocator handle that frees the block.
    pub alloc: u32,
    /// Processing or complete.
    pub status: ReplicaStatus,
}

impl Replica {
    pub(crate) fn is_complete(&self) -> bool {
        self.status == ReplicaStatus::Complete
    }
}

/// Which eviction pass may take an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum EvictionClass {
    /// Lease expired, not soft-pinned: evicted first.
    Unpinned,
    /// Lease expired but soft-pinned: evicted only when nothing unpinned is left, if allowed.
    SoftPinned,
}

/// An object's metadata.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Object {
    pub key: Box<str>,
    /// Value length in bytes; every replica holds exactly this many.
    pub size: u64,
    pub replicas: SmallVec<[Replica; 1]>,
    /// Readers that got descriptors before this instant may still be reading. Also the LRU
    /// position: a read sets it to `now + lease_ttl`, a completed write to `now`.
    pub lease_expiry: Millis,
    /// Soft pin TTL; zero means not soft-pinned.
    pub soft_pin_ttl: Millis,
    /// The soft pin lapses (until the next access) at this instant.
    pub soft_pin_expiry: Millis,
    /// The client of the current (or last) put/upsert.
    pub writer: ClientId,
    /// The current (or last) put/upsert.
    pub write_id: WriteId,
    /// When the current (or last) put/upsert started.
    pub put_start: Millis,
    /// A running copy or move.
    pub task: Option<TaskId>,
    /// Held reads (replica refcount): block upsert, removal and eviction.
    pub holds: u32,
    /// A put or upsert is in progress: its replicas are PROCESSING.
    pub writing: bool,
    pub hard_pinned: bool,
}

impl Object {
    /// Whether a reader can be served: some replica is complete.
    pub(crate) fn has_complete_replica(&self) -> bool {
        self.replicas.iter().any(Replica::is_complete)
    }

    /// Whether some reader may still be reading under a lease.
    pub(crate) fn lease_active(&self, now: Millis) -> bool {
        now < self.lease_expiry
    }

    /// Whether the soft pin currently protects the object.
    pub(crate) fn soft_pinned(&self, now: Millis) -> bool {
        self.soft_pin_ttl > Millis::ZERO && now < self.soft_pin_expiry
    }

    /// Records a read at `now`: extends the lease and refreshes the soft pin.
    pub(crate) fn grant_lease(&mut self, now: Millis, lease_ttl: Millis) {
        self.lease_expiry = self.lease_expiry.max(now + lease_ttl);
        self.refresh_soft_pin(now);
    }

    pub(crate) fn refresh_soft_pin(&mut self, now: Millis) {
        if self.soft_pin_ttl > Millis::ZERO {
            self.soft_pin_expiry = now + self.soft_pin_ttl;
        }
    }

    /// Whether anything keeps the object's current replicas in place: a write in progress, a
    /// held read, or a replication task. (Leases are separate: they allow replacing the
    /// buffers but not overwriting them.)
    pub(crate) fn pinned_in_place(&self) -> bool {
        self.writing || self.holds > 0 || self.task.is_some()
    }

    /// Which eviction pass may take the object at `now`, if any. Hard-pinned, leased, held,
    /// replicating and in-progress objects are never evicted.
    pub(crate) fn eviction_class(&self, now: Millis) -> Option<EvictionClass> {
        if self.hard_pinned
            || self.pinned_in_place()
            || self.lease_active(now)
            || !self.has_complete_replica()
        {
            return None;
        }
        Some(if self.soft_pinned(now) {
            EvictionClass::SoftPinned
        } else {
            EvictionClass::Unpinned
        })
    }

    /// Whether the object has a replica on segment slot `segment`.
    pub(crate) fn has_replica_on(&self, segment: u32) -> bool {
        self.replicas.iter().any(|r| r.segment == segment)
    }
}
