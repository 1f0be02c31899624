//! One object's metadata: its replicas, its lease, its pins, and who is writing it.
//!
//! The rules that decide what may happen to an object (may it be read, evicted, overwritten in
//! place?) live here as small predicates so every operation asks the same question the same way.

use std::num::NonZeroU64;

use crate::ids::{SegmentId, TaskId, WriteId};
use crate::key_arena::KeyRef;
use crate::replicas::Replicas;
use crate::soft_pin::{Pins, SoftPin};
use crate::time::Millis;
use crate::writers::WriterRef;

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

/// The top bit of the task id an object keeps says the write in progress is a prefetch (task
/// ids never come near it).
const PREFETCH_BIT: u64 = 1 << 63;

/// `Object::disk` when the object has no disk replica.
pub(crate) const NO_DISK: u32 = u32::MAX;

/// A replica as the master tracks it: a block of one segment's allocator, whose length follows
/// from the object's size (`segments::block_len`). 16 bytes, so one replica fits inline in the
/// object's hot cache line. The offset and status word is stored bit-inverted and so is never
/// zero (offsets are below 2^56), which lets a replica list share these 16 bytes (see
/// `crate::replicas`).
#[derive(Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[repr(C)]
pub(crate) struct Replica {
    /// The segment's slot in the segment table.
    pub segment: u32,
    /// Offset of the block within its segment (below 2^56), with the COMPLETE flag in the top
    /// bit, all bits inverted.
    inverted_offset_status: NonZeroU64,
}

const COMPLETE_BIT: u64 = 1 << 63;

impl Replica {
    /// A freshly allocated replica, PROCESSING, of the block at `offset`.
    pub(crate) fn processing(segment: u32, offset: u64) -> Replica {
        debug_assert!(offset < 1 << 56);
        Replica {
            segment,
            inverted_offset_status: NonZeroU64::new(!offset).expect("offsets are below 2^56"),
        }
    }

    fn offset_status(&self) -> u64 {
        !self.inverted_offset_status.get()
    }

    fn set_offset_status(&mut self, word: u64) {
        self.inverted_offset_status = NonZeroU64::new(!word).expect("offsets are below 2^56");
    }

    /// Offset of the block within its segment.
    pub(crate) fn offset(&self) -> u64 {
        self.offset_status() & !COMPLETE_BIT
    }

    pub(crate) fn status(&self) -> ReplicaStatus {
        if self.offset_status() & COMPLETE_BIT != 0 {
            ReplicaStatus::Complete
        } else {
            ReplicaStatus::Processing
        }
    }

    pub(crate) fn set_status(&mut self, status: ReplicaStatus) {
        let offset = self.offset();
        match status {
            ReplicaStatus::Complete => self.set_offset_status(offset | COMPLETE_BIT),
            ReplicaStatus::Processing => self.set_offset_status(offset),
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.offset_status() & COMPLETE_BIT != 0
    }

    pub(crate) fn is_processing(&self) -> bool {
        !self.is_complete()
    }
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Replica(seg {} @{} {:?})",
            self.segment,
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

/// The largest value an object holds: 2^40 - 1 bytes (a terabyte), so its size packs into 40
/// bits beside the writer.
pub const MAX_VALUE_SIZE: u64 = (1 << 40) - 1;

/// How many distinct clients objects can name as their writer at once: 2^24, so a writer
/// reference packs into 24 bits beside the size.
pub(crate) const MAX_WRITERS: usize = 1 << 24;

/// Write ids stay below 2^56 (a million writes a second for two thousand years), so the
/// top byte of the word that holds one is free for the object's flags.
const WRITE_ID_BITS: u32 = 56;
/// The highest write id an object can hold; a node's report of a higher one is damaged.
pub(crate) const MAX_WRITE_ID: WriteId = WriteId(WRITE_ID_MASK);
const SIZE_BITS: u32 = 40;
const SIZE_MASK: u64 = (1 << SIZE_BITS) - 1;
const WRITE_ID_MASK: u64 = (1 << WRITE_ID_BITS) - 1;
const WRITING_FLAG: u64 = 1 << 56;
const HARD_PINNED_FLAG: u64 = 1 << 57;
const LEASED_FLAG: u64 = 1 << 58;
/// Two bits: the [`OffloadMark`] (0 none, 1 queued, 2 failed; 3 is never stored).
const OFFLOAD_SHIFT: u32 = 59;
const OFFLOAD_MASK: u64 = 0b11 << OFFLOAD_SHIFT;

/// An object's metadata, in one 64-byte cache line: its key (by reference into the object
/// table's key arena), replicas, size, lease, state flags, LRU position, writer and write id.
/// The scalar fields are packed in pairs: the size with the writer, the write id with the
/// flags (read them through their accessors). What only some objects need
/// at a time (a write's start, a task, a soft pin, held reads, a disk copy) lives in
/// [`ObjectExtra`], boxed and present only while one of them is set: at a hundred million
/// objects every byte here is 100 MB.
#[derive(Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[repr(C, align(64))]
pub(crate) struct Object {
    /// The key, in the object table's [`crate::key_arena::KeyArena`].
    pub key: KeyRef,
    pub replicas: Replicas,
    /// The value's length in bytes (the low 40 bits; every replica holds exactly this many)
    /// and the client of the current (or last) put/upsert (the high 24 bits), interned in the
    /// object table's [`crate::writers::Writers`], which alone changes it.
    size_writer: u64,
    /// Readers that got descriptors before this instant may still be reading.
    pub lease_expiry: Millis,
    /// The last access, write or read: the LRU position eviction and offload order by. A
    /// block just written must rank as recent as one just read, so it is not the lease.
    pub last_access: Millis,
    /// The current (or last) put/upsert's write id (the low 56 bits) and the flags (the top
    /// byte): a write in progress (its replicas are PROCESSING; see [`Object::start_write`]),
    /// hard-pinned, leased since written, and the offload mark.
    write_flags: u64,
    /// The fields few objects need at once; none while all are at rest.
    extra: Option<Box<ObjectExtra>>,
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No key: where the arena keeps it is no part of the object's state (the table
        // prints the key itself).
        f.debug_struct("Object")
            .field("replicas", &self.replicas)
            .field("size", &self.size())
            .field("writer", &self.writer())
            .field("write_id", &self.write_id())
            .field("lease_expiry", &self.lease_expiry)
            .field("last_access", &self.last_access)
            .field("writing", &self.writing())
            .field("hard_pinned", &self.hard_pinned())
            .field("leased", &self.leased())
            .field("offload", &self.offload())
            .field("extra", &self.extra)
            .finish()
    }
}

/// An object's fields that are at rest (zero, or none) for most objects most of the time.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
struct ObjectExtra {
    /// When the put/upsert in progress started; zero when none is.
    put_start: Millis,
    /// The soft pin lapses (until the next access) at this instant; zero when not soft-pinned.
    soft_pin_expiry: Millis,
    /// The running copy or move's id, or 0 (task ids start at 1), and in its top bit whether
    /// the write in progress is a prefetch; see [`Object::task`] and [`Object::prefetch`].
    task_id: u64,
    /// Held reads (replica refcount): block upsert, removal and eviction.
    holds: u32,
    /// The segment slot whose node holds a complete copy on disk, plus one; zero for none.
    /// The disk copy is of the current value: a new value drops it (see `offload`).
    disk_plus_one: u32,
    /// Soft pin TTL in milliseconds; zero means not soft-pinned.
    soft_pin_ttl_ms: u32,
}

impl Object {
    /// A new object of `size` bytes with no replicas, written by `writer`'s `write_id`; not
    /// writing, pinned or leased. Only the object table makes one: it holds the reference.
    pub(crate) fn new(key: KeyRef, size: u64, writer: WriterRef, write_id: WriteId) -> Object {
        let mut object = Object {
            key,
            replicas: Replicas::default(),
            size_writer: 0,
            lease_expiry: Millis::ZERO,
            last_access: Millis::ZERO,
            write_flags: 0,
            extra: None,
        };
        object.set_size(size);
        object.set_writer(writer);
        object.set_write_id(write_id);
        object
    }

    /// Refuses packed words no object of this build would hold: an offload mark out of range
    /// (a damaged snapshot).
    pub(crate) fn check_packed(&self) -> Result<(), String> {
        if self.write_flags & OFFLOAD_MASK == OFFLOAD_MASK {
            return Err(format!("an object with an invalid offload mark: {self:?}"));
        }
        Ok(())
    }

    /// The value's length in bytes; every replica holds exactly this many.
    pub(crate) fn size(&self) -> u64 {
        self.size_writer & SIZE_MASK
    }

    /// Gives the object a value of `size` bytes, at most [`MAX_VALUE_SIZE`] (checked where a
    /// request names a size); the object table's to call, as it counts tenants' bytes.
    pub(crate) fn set_size(&mut self, size: u64) {
        debug_assert!(size <= MAX_VALUE_SIZE, "value size {size} checked too late");
        self.size_writer = (self.size_writer & !SIZE_MASK) | (size & SIZE_MASK);
    }

    /// The current (or last) put/upsert.
    pub(crate) fn write_id(&self) -> WriteId {
        WriteId(self.write_flags & WRITE_ID_MASK)
    }

    /// Names the put/upsert now writing the object.
    pub(crate) fn set_write_id(&mut self, write: WriteId) {
        debug_assert!(write.0 <= WRITE_ID_MASK, "write ids stay below 2^56");
        self.write_flags = (self.write_flags & !WRITE_ID_MASK) | (write.0 & WRITE_ID_MASK);
    }

    fn flag(&self, flag: u64) -> bool {
        self.write_flags & flag != 0
    }

    fn set_flag(&mut self, flag: u64, on: bool) {
        if on {
            self.write_flags |= flag;
        } else {
            self.write_flags &= !flag;
        }
    }

    /// Whether the object is hard-pinned: never evicted.
    pub(crate) fn hard_pinned(&self) -> bool {
        self.flag(HARD_PINNED_FLAG)
    }

    /// Whether a reader was granted a lease on the current replicas (since they were written).
    pub(crate) fn leased(&self) -> bool {
        self.flag(LEASED_FLAG)
    }

    /// Forgets the leases granted on earlier replicas (a new value was written).
    pub(crate) fn clear_leased(&mut self) {
        self.set_flag(LEASED_FLAG, false);
    }

    /// Offload progress (see `offload`); read by every eviction pass.
    pub(crate) fn offload(&self) -> OffloadMark {
        match (self.write_flags & OFFLOAD_MASK) >> OFFLOAD_SHIFT {
            0 => OffloadMark::None,
            1 => OffloadMark::Queued,
            _ => OffloadMark::Failed,
        }
    }

    /// Records offload progress.
    pub(crate) fn set_offload(&mut self, mark: OffloadMark) {
        let code = match mark {
            OffloadMark::None => 0,
            OffloadMark::Queued => 1,
            OffloadMark::Failed => 2,
        };
        self.write_flags = (self.write_flags & !OFFLOAD_MASK) | (code << OFFLOAD_SHIFT);
    }

    /// The rarely set fields, read; all at rest when the object has none.
    fn extra(&self) -> &ObjectExtra {
        static AT_REST: ObjectExtra = ObjectExtra {
            put_start: Millis::ZERO,
            soft_pin_expiry: Millis::ZERO,
            task_id: 0,
            holds: 0,
            disk_plus_one: 0,
            soft_pin_ttl_ms: 0,
        };
        self.extra.as_deref().unwrap_or(&AT_REST)
    }

    /// Changes the rarely set fields, then lets them go if all are at rest again.
    /// A change that leaves them at rest allocates nothing.
    fn change_extra<T>(&mut self, change: impl FnOnce(&mut ObjectExtra) -> T) -> T {
        let Some(boxed) = &mut self.extra else {
            let mut extra = ObjectExtra::default();
            let out = change(&mut extra);
            if extra != ObjectExtra::default() {
                self.extra = Some(Box::new(extra));
            }
            return out;
        };
        let out = change(boxed);
        if **boxed == ObjectExtra::default() {
            self.extra = None;
        }
        out
    }

    /// The current (or last) put/upsert's client, as the object table's writers know it.
    pub(crate) fn writer(&self) -> WriterRef {
        WriterRef((self.size_writer >> SIZE_BITS) as u32)
    }

    /// Names another writer; the object table's to call, as it keeps the references.
    pub(crate) fn set_writer(&mut self, writer: WriterRef) {
        debug_assert!(
            (writer.0 as usize) < MAX_WRITERS,
            "writer {writer:?} out of range"
        );
        self.size_writer = (self.size_writer & SIZE_MASK) | (u64::from(writer.0) << SIZE_BITS);
    }

    /// Whether a put or upsert is in progress.
    pub(crate) fn writing(&self) -> bool {
        self.flag(WRITING_FLAG)
    }

    /// A put or upsert started at `now`.
    pub(crate) fn start_write(&mut self, now: Millis) {
        self.set_flag(WRITING_FLAG, true);
        self.change_extra(|e| e.put_start = now);
    }

    /// The put or upsert in progress ended (completed, aborted or discarded); it is no longer
    /// a prefetch.
    pub(crate) fn end_write(&mut self) {
        self.set_flag(WRITING_FLAG, false);
        self.change_extra(|e| {
            e.put_start = Millis::ZERO;
            e.task_id &= !PREFETCH_BIT;
        });
    }

    /// When the put or upsert in progress started (meaningless when none is).
    pub(crate) fn put_start(&self) -> Millis {
        self.extra().put_start
    }

    /// The soft pin lapses (until the next access) at this instant.
    pub(crate) fn soft_pin_expiry(&self) -> Millis {
        self.extra().soft_pin_expiry
    }

    /// Held reads on the current replicas.
    pub(crate) fn holds(&self) -> u32 {
        self.extra().holds
    }

    /// One more held read.
    pub(crate) fn add_hold(&mut self) {
        self.change_extra(|e| e.holds += 1);
    }

    /// One held read fewer.
    pub(crate) fn drop_hold(&mut self) {
        self.change_extra(|e| e.holds -= 1);
    }

    /// The segment slot whose node holds the value on disk, or [`NO_DISK`].
    pub(crate) fn disk(&self) -> u32 {
        self.extra().disk_plus_one.wrapping_sub(1)
    }

    /// Records the segment slot holding the value on disk ([`NO_DISK`] for none).
    pub(crate) fn set_disk(&mut self, segment: u32) {
        self.change_extra(|e| e.disk_plus_one = segment.wrapping_add(1));
    }

    /// Moves every instant the object keeps through `shift` (a restore onto a new clock).
    pub(crate) fn shift_times(&mut self, shift: impl Fn(Millis) -> Millis) {
        self.lease_expiry = shift(self.lease_expiry);
        self.last_access = shift(self.last_access);
        // Only the instants that mean something are moved: a field at rest stays at rest.
        if self.writing() {
            let start = shift(self.put_start());
            self.change_extra(|e| e.put_start = start);
        }
        if self.soft_pin_ttl() > Millis::ZERO {
            let expiry = shift(self.soft_pin_expiry());
            self.change_extra(|e| e.soft_pin_expiry = expiry);
        }
    }

    /// Heap bytes the object keeps besides its key: a list of several replicas, and the
    /// rarely set fields while any is.
    pub(crate) fn heap_bytes(&self) -> usize {
        let list = match &self.replicas {
            Replicas::Many(Some(list)) => {
                size_of::<Vec<Replica>>() + list.capacity() * size_of::<Replica>()
            }
            _ => 0,
        };
        list + self.extra.as_ref().map_or(0, |_| size_of::<ObjectExtra>())
    }

    /// Whether some memory replica is complete.
    pub(crate) fn has_complete_replica(&self) -> bool {
        self.replicas.iter().any(Replica::is_complete)
    }

    /// Whether a node holds the value on disk.
    pub(crate) fn has_disk_replica(&self) -> bool {
        self.disk() != NO_DISK
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
        self.soft_pin_ttl() > Millis::ZERO && now < self.soft_pin_expiry()
    }

    /// The soft-pin TTL (zero: not soft-pinned).
    pub(crate) fn soft_pin_ttl(&self) -> Millis {
        Millis(u64::from(self.extra().soft_pin_ttl_ms))
    }

    /// The pins the object carries.
    pub(crate) fn pins(&self) -> Pins {
        Pins {
            hard: self.hard_pinned(),
            soft: SoftPin {
                ttl: self.soft_pin_ttl(),
                expiry: self.soft_pin_expiry(),
            },
        }
    }

    /// Sets the object's pins.
    pub(crate) fn set_pins(&mut self, pins: Pins) {
        self.set_flag(HARD_PINNED_FLAG, pins.hard);
        let ttl_ms = u32::try_from(pins.soft.ttl.as_millis()).unwrap_or(u32::MAX);
        let expiry = if ttl_ms == 0 {
            Millis::ZERO
        } else {
            pins.soft.expiry
        };
        self.change_extra(|e| {
            e.soft_pin_ttl_ms = ttl_ms;
            e.soft_pin_expiry = expiry;
        });
    }

    /// Records a read at `now`: extends the lease and refreshes the soft pin.
    pub(crate) fn grant_lease(&mut self, now: Millis, lease_ttl: Millis) {
        self.extend_lease(now + lease_ttl);
        self.touch(now);
        self.refresh_soft_pin(now);
    }

    /// Extends the lease to at least `until` without counting an access, so the LRU order
    /// stays (a restore's blanket lease).
    pub(crate) fn extend_lease(&mut self, until: Millis) {
        self.lease_expiry = self.lease_expiry.max(until);
        self.set_flag(LEASED_FLAG, true);
    }

    /// From when no reader can still be reading the current replicas: the end of the last
    /// lease plus `grace` (for clock-rate drift), or at once if no lease was ever granted on
    /// them.
    pub(crate) fn readers_done_at(&self, grace: Millis) -> Millis {
        if self.leased() {
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
        let ttl = self.soft_pin_ttl();
        if ttl > Millis::ZERO {
            let expiry = now + ttl;
            self.change_extra(|e| e.soft_pin_expiry = expiry);
        }
    }

    /// Whether anything keeps the object's current replicas in place: a write in progress, a
    /// held read, or a replication task. (Leases are separate: they allow replacing the
    /// buffers but not overwriting them.)
    pub(crate) fn pinned_in_place(&self) -> bool {
        self.writing() || self.holds() > 0 || self.task().is_some()
    }

    /// Which eviction pass may take the object at `now`, if any. Hard-pinned, leased, held,
    /// replicating and in-progress objects are never evicted.
    pub(crate) fn eviction_class(&self, now: Millis) -> Option<EvictionClass> {
        if self.hard_pinned()
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
        let id = self.extra().task_id & !PREFETCH_BIT;
        (id != 0).then_some(TaskId(id))
    }

    pub(crate) fn set_task(&mut self, task: Option<TaskId>) {
        let id = task.map_or(0, |t| t.0 & !PREFETCH_BIT);
        self.change_extra(|e| e.task_id = (e.task_id & PREFETCH_BIT) | id);
    }

    /// Whether the write in progress is a prefetch: it copies a value whose checksum the
    /// master already has, so it must end with that checksum, even if the disk copy it was
    /// read from went away meanwhile.
    pub(crate) fn prefetch(&self) -> bool {
        self.extra().task_id & PREFETCH_BIT != 0
    }

    /// Marks (or unmarks) the write in progress as a prefetch.
    pub(crate) fn set_prefetch(&mut self, prefetch: bool) {
        self.change_extra(|e| {
            if prefetch {
                e.task_id |= PREFETCH_BIT;
            } else {
                e.task_id &= !PREFETCH_BIT;
            }
        });
    }

    /// Whether the object has a replica on segment slot `segment`.
    pub(crate) fn has_replica_on(&self, segment: u32) -> bool {
        self.replicas.iter().any(|r| r.segment == segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key_arena::KeyArena;

    fn key() -> KeyRef {
        KeyArena::default().insert("k")
    }

    #[test]
    fn an_object_is_one_cache_line() {
        assert_eq!(size_of::<Replica>(), 16);
        assert_eq!(size_of::<Object>(), 64);
        assert_eq!(align_of::<Object>(), 64);
        assert_eq!(
            size_of::<Option<Object>>(),
            64,
            "the slab pays nothing for Option"
        );
    }

    #[test]
    fn packed_fields_keep_to_their_bits() {
        let top = WriterRef((MAX_WRITERS - 1) as u32);
        let mut object = Object::new(key(), MAX_VALUE_SIZE, top, WriteId(WRITE_ID_MASK));
        assert_eq!(object.size(), MAX_VALUE_SIZE);
        assert_eq!(object.writer(), top);
        assert_eq!(object.write_id(), WriteId(WRITE_ID_MASK));
        assert!(!object.writing() && !object.hard_pinned() && !object.leased());
        assert_eq!(object.offload(), OffloadMark::None);
        object.start_write(Millis(1));
        object.set_pins(Pins {
            hard: true,
            soft: SoftPin::default(),
        });
        object.grant_lease(Millis(2), Millis(5));
        for mark in [OffloadMark::Queued, OffloadMark::Failed, OffloadMark::None] {
            object.set_offload(mark);
            assert_eq!(object.offload(), mark);
        }
        object.set_offload(OffloadMark::Failed);
        object.set_size(1);
        object.set_writer(WriterRef(0));
        object.set_write_id(WriteId(3));
        assert_eq!(
            (object.size(), object.writer(), object.write_id()),
            (1, WriterRef(0), WriteId(3))
        );
        assert!(object.writing() && object.hard_pinned() && object.leased());
        assert_eq!(object.offload(), OffloadMark::Failed);
        object.end_write();
        object.clear_leased();
        assert!(!object.writing() && object.hard_pinned() && !object.leased());
        assert_eq!((object.size(), object.write_id()), (1, WriteId(3)));
        assert!(object.check_packed().is_ok());
        object.write_flags |= OFFLOAD_MASK;
        assert!(object.check_packed().is_err(), "a mark no build stores");
    }

    #[test]
    fn the_rarely_set_fields_take_no_room_once_at_rest_again() {
        let mut object = Object::new(key(), 10, WriterRef(0), WriteId(1));
        assert!(object.extra.is_none());
        object.start_write(Millis(5));
        object.set_prefetch(true);
        assert!(object.writing() && object.prefetch() && object.put_start() == Millis(5));
        object.end_write();
        assert!(!object.writing() && !object.prefetch() && object.extra.is_none());
        object.add_hold();
        object.add_hold();
        object.set_task(Some(TaskId(7)));
        object.set_disk(0);
        object.set_pins(Pins {
            hard: false,
            soft: SoftPin {
                ttl: Millis(10),
                expiry: Millis(30),
            },
        });
        assert_eq!(
            (object.holds(), object.task(), object.disk()),
            (2, Some(TaskId(7)), 0)
        );
        assert!(object.soft_pinned(Millis(29)) && !object.soft_pinned(Millis(30)));
        object.drop_hold();
        object.drop_hold();
        object.set_task(None);
        object.set_disk(NO_DISK);
        assert!(object.extra.is_some(), "the soft pin is still set");
        object.set_pins(Pins::default());
        assert!(object.extra.is_none() && !object.has_disk_replica());
    }

    #[test]
    fn replica_status_bit_round_trips() {
        let mut r = Replica::processing(3, (1 << 56) - 64);
        assert_eq!(r.status(), ReplicaStatus::Processing);
        r.set_status(ReplicaStatus::Complete);
        assert!(r.is_complete());
        assert_eq!(r.offset(), (1 << 56) - 64);
        r.set_status(ReplicaStatus::Processing);
        assert!(r.is_processing());
        assert_eq!((r.segment, r.offset()), (3, (1 << 56) - 64));
    }
}
