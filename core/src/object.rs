//! One object's metadata: its replicas, its lease, its pins, and who is writing it.
//!
//! The rules that decide what may happen to an object (may it be read, evicted, overwritten in
//! place?) live here as small predicates so every operation asks the same question the same way.

use smallvec::SmallVec;

use crate::allocator::Allocation;
use crate::ids::{ClientId, SegmentId, TaskId, WriteId};
use crate::soft_pin::{Pins, SoftPin};
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
/// address within the node's registered memory (for a disk replica, the write id of the copy
/// instead), and the length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub struct ReplicaDescriptor {
    /// The segment holding the replica; resolve its endpoint with `Master::segment_info`.
    pub segment: SegmentId,
    /// Memory: absolute address of the first byte (segment base + offset). Disk: the write
    /// id of the copy, which the node checks before serving it.
    pub addr: u64,
    /// Length of the value in bytes.
    pub len: u64,
    /// Whether the bytes are readable yet.
    pub status: ReplicaStatus,
    /// Memory (read `addr` with a one-sided read) or the node's disk (ask the node to stage
    /// it first, naming the write id in `addr`).
    pub medium: Medium,
}

/// Where a replica's bytes live.
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
pub enum Medium {
    /// In the segment's registered memory.
    Memory,
    /// On the SSD of the node that owns the segment (a LOCAL_DISK replica).
    Disk,
}

/// Where an object stands with the SSD tier.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[repr(u8)]
pub(crate) enum OffloadMark {
    /// Not queued for offload.
    #[default]
    None,
    /// Queued (or handed to its node) for writing to disk; eviction passes it over.
    Queued,
    /// Its node failed to write it, or evicted its copy from disk: evicted without
    /// offloading from now on (offloading it again would only churn the disk).
    Failed,
}

/// The top bit of `Object::task_id` says the write in progress is a prefetch (the object's
/// 128 bytes have no room for another field; task ids never come near it).
const PREFETCH_BIT: u64 = 1 << 63;

/// `Object::disk` when the object has no disk replica.
pub(crate) const NO_DISK: u32 = u32::MAX;

/// A replica as the master tracks it: a block of one segment's allocator. 16 bytes, so one
/// replica fits inline in the object's hot cache line.
#[derive(Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Replica {
    /// Offset of the block within its segment (below 2^56), with the COMPLETE flag in the top
    /// bit.
    offset_status: u64,
    /// The segment's slot in the segment table.
    pub segment: u32,
    /// The allocator handle that frees the block.
    pub alloc: u32,
}

const COMPLETE_BIT: u64 = 1 << 63;

impl Replica {
    /// A freshly allocated replica, PROCESSING.
    pub(crate) fn processing(segment: u32, allocation: Allocation) -> Replica {
        debug_assert!(allocation.offset < COMPLETE_BIT);
        Replica {
            offset_status: allocation.offset,
            segment,
            alloc: allocation.node,
        }
    }

    /// Offset of the block within its segment.
    pub(crate) fn offset(&self) -> u64 {
        self.offset_status & !COMPLETE_BIT
    }

    pub(crate) fn status(&self) -> ReplicaStatus {
        if self.offset_status & COMPLETE_BIT != 0 {
            ReplicaStatus::Complete
        } else {
            ReplicaStatus::Processing
        }
    }

    pub(crate) fn set_status(&mut self, status: ReplicaStatus) {
        match status {
            ReplicaStatus::Complete => self.offset_status |= COMPLETE_BIT,
            ReplicaStatus::Processing => self.offset_status &= !COMPLETE_BIT,
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.offset_status & COMPLETE_BIT != 0
    }

    pub(crate) fn is_processing(&self) -> bool {
        !self.is_complete()
    }
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Replica(seg {} node {} @{} {:?})",
            self.segment,
            self.alloc,
            self.offset(),
            self.status()
        )
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

/// An object's metadata. `repr(C)` and cache-line aligned so that everything a read touches
/// (key, replicas, size, lease, soft-pin TTL, state flags) sits in the first 64 bytes: a
/// lookup among a million objects then costs one cache miss for the object, not two.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[repr(C, align(64))]
pub(crate) struct Object {
    // ---- hot: read on every lookup ----
    pub key: Box<str>,
    pub replicas: SmallVec<[Replica; 1]>,
    /// Value length in bytes; every replica holds exactly this many.
    pub size: u64,
    /// Readers that got descriptors before this instant may still be reading.
    pub lease_expiry: Millis,
    /// Soft pin TTL in milliseconds; zero means not soft-pinned.
    pub soft_pin_ttl_ms: u32,
    /// A put or upsert is in progress: its replicas are PROCESSING.
    pub writing: bool,
    pub hard_pinned: bool,
    /// A reader was granted a lease on the current replicas (since they were written).
    pub leased: bool,
    /// Offload progress (see `offload`); read by every eviction pass, hence hot.
    pub offload: OffloadMark,
    // ---- cold ----
    /// The last access, write or read: the LRU position eviction and offload order by. A
    /// block just written must rank as recent as one just read, so it is not the lease.
    /// (Eviction passes already read this line for holds and tasks; lookups never need it.)
    pub last_access: Millis,
    /// The soft pin lapses (until the next access) at this instant.
    pub soft_pin_expiry: Millis,
    /// The client of the current (or last) put/upsert.
    pub writer: ClientId,
    /// The current (or last) put/upsert.
    pub write_id: WriteId,
    /// When the current (or last) put/upsert started.
    pub put_start: Millis,
    /// The running copy or move's id, or 0 (task ids start at 1), and in its top bit whether
    /// the write in progress is a prefetch; see [`Object::task`] and [`Object::prefetch`].
    pub task_id: u64,
    /// Held reads (replica refcount): block upsert, removal and eviction.
    pub holds: u32,
    /// The segment slot whose node holds a complete copy on disk, or [`NO_DISK`]. The disk
    /// copy is of the current value: a new value drops it (see `offload`).
    pub disk: u32,
}

impl Object {
    /// A new object of `size` bytes with no replicas, written by `writer`'s `write_id`
    /// started at `now`; not writing, pinned or leased.
    pub(crate) fn new(
        key: &str,
        size: u64,
        writer: ClientId,
        write_id: WriteId,
        now: Millis,
    ) -> Object {
        Object {
            key: key.into(),
            replicas: SmallVec::new(),
            size,
            lease_expiry: Millis::ZERO,
            last_access: Millis::ZERO,
            soft_pin_ttl_ms: 0,
            writing: false,
            hard_pinned: false,
            leased: false,
            soft_pin_expiry: Millis::ZERO,
            writer,
            write_id,
            put_start: now,
            task_id: 0,
            holds: 0,
            disk: NO_DISK,
            offload: OffloadMark::None,
        }
    }

    /// Whether some memory replica is complete.
    pub(crate) fn has_complete_replica(&self) -> bool {
        self.replicas.iter().any(Replica::is_complete)
    }

    /// Whether a node holds the value on disk.
    pub(crate) fn has_disk_replica(&self) -> bool {
        self.disk != NO_DISK
    }

    /// Whether a reader can be served: a memory replica is complete, or the value is on disk.
    pub(crate) fn is_readable(&self) -> bool {
        self.has_complete_replica() || self.has_disk_replica()
    }

    /// Whether some reader may still be reading under a lease.
    pub(crate) fn lease_active(&self, now: Millis) -> bool {
        now < self.lease_expiry
    }

    /// Whether the soft pin currently protects the object.
    pub(crate) fn soft_pinned(&self, now: Millis) -> bool {
        self.soft_pin_ttl_ms > 0 && now < self.soft_pin_expiry
    }

    /// The soft-pin TTL (zero: not soft-pinned).
    pub(crate) fn soft_pin_ttl(&self) -> Millis {
        Millis(u64::from(self.soft_pin_ttl_ms))
    }

    /// The pins the object carries.
    pub(crate) fn pins(&self) -> Pins {
        Pins {
            hard: self.hard_pinned,
            soft: SoftPin {
                ttl: self.soft_pin_ttl(),
                expiry: self.soft_pin_expiry,
            },
        }
    }

    /// Sets the object's pins.
    pub(crate) fn set_pins(&mut self, pins: Pins) {
        self.hard_pinned = pins.hard;
        self.soft_pin_ttl_ms = u32::try_from(pins.soft.ttl.as_millis()).unwrap_or(u32::MAX);
        self.soft_pin_expiry = if pins.soft.ttl == Millis::ZERO {
            Millis::ZERO
        } else {
            pins.soft.expiry
        };
    }

    /// Records a read at `now`: extends the lease and refreshes the soft pin.
    pub(crate) fn grant_lease(&mut self, now: Millis, lease_ttl: Millis) {
        self.lease_expiry = self.lease_expiry.max(now + lease_ttl);
        self.touch(now);
        self.leased = true;
        self.refresh_soft_pin(now);
    }

    /// From when no reader can still be reading the current replicas: the end of the last
    /// lease plus `grace` (for clock-rate drift), or at once if no lease was ever granted on
    /// them.
    pub(crate) fn readers_done_at(&self, grace: Millis) -> Millis {
        if self.leased {
            self.lease_expiry + grace
        } else {
            Millis::ZERO
        }
    }

    /// Records an access (a completed write or a read) at `now` for LRU ordering.
    pub(crate) fn touch(&mut self, now: Millis) {
        self.last_access = self.last_access.max(now);
    }

    pub(crate) fn refresh_soft_pin(&mut self, now: Millis) {
        if self.soft_pin_ttl_ms > 0 {
            self.soft_pin_expiry = now + self.soft_pin_ttl();
        }
    }

    /// Whether anything keeps the object's current replicas in place: a write in progress, a
    /// held read, or a replication task. (Leases are separate: they allow replacing the
    /// buffers but not overwriting them.)
    pub(crate) fn pinned_in_place(&self) -> bool {
        self.writing || self.holds > 0 || self.task().is_some()
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

    /// The running copy or move.
    pub(crate) fn task(&self) -> Option<TaskId> {
        let id = self.task_id & !PREFETCH_BIT;
        (id != 0).then_some(TaskId(id))
    }

    pub(crate) fn set_task(&mut self, task: Option<TaskId>) {
        self.task_id = (self.task_id & PREFETCH_BIT) | task.map_or(0, |t| t.0 & !PREFETCH_BIT);
    }

    /// Whether the write in progress is a prefetch: it copies a value whose checksum the
    /// master already has, so it must end with that checksum, even if the disk copy it was
    /// read from went away meanwhile.
    pub(crate) fn prefetch(&self) -> bool {
        self.task_id & PREFETCH_BIT != 0
    }

    /// Marks (or unmarks) the write in progress as a prefetch.
    pub(crate) fn set_prefetch(&mut self, prefetch: bool) {
        if prefetch {
            self.task_id |= PREFETCH_BIT;
        } else {
            self.task_id &= !PREFETCH_BIT;
        }
    }

    /// Whether the object has a replica on segment slot `segment`.
    pub(crate) fn has_replica_on(&self, segment: u32) -> bool {
        self.replicas.iter().any(|r| r.segment == segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_fields_fit_one_cache_line() {
        assert_eq!(size_of::<Replica>(), 16);
        assert!(std::mem::offset_of!(Object, hard_pinned) < 64);
        assert!(std::mem::offset_of!(Object, leased) < 64);
        assert!(std::mem::offset_of!(Object, offload) < 64);
        assert!(std::mem::offset_of!(Object, last_access) >= 64);
        assert_eq!(size_of::<Object>(), 128);
        assert_eq!(
            size_of::<Option<Object>>(),
            128,
            "the slab pays nothing for Option"
        );
    }

    #[test]
    fn replica_status_bit_round_trips() {
        let mut r = Replica::processing(
            3,
            Allocation {
                offset: (1 << 56) - 64,
                node: 9,
            },
        );
        assert_eq!(r.status(), ReplicaStatus::Processing);
        r.set_status(ReplicaStatus::Complete);
        assert!(r.is_complete());
        assert_eq!(r.offset(), (1 << 56) - 64);
        r.set_status(ReplicaStatus::Processing);
        assert!(r.is_processing());
        assert_eq!((r.segment, r.alloc), (3, 9));
    }
}
