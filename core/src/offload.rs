//! The SSD tier's policy (docs/ssd-tier.md, docs/prefetch.md): which objects go to a node's
//! disk and when, the LOCAL_DISK replicas readers are handed, what nodes tell the master about
//! their disks, and prefetching a disk-only object back into memory.
//!
//! # Which objects, and when
//!
//! A node announces its disk by calling [`Master::disk_sync`] for one of its segments; from
//! then on that segment has an *offload queue*. Objects enter it two ways:
//!
//! - **on eviction** (`offload_on_evict`, default on): an eviction pass that picks an object
//!   with no disk copy whose memory replica sits on a segment with a disk queues it instead of
//!   dropping it. A later pass, after the node reported the copy, drops only its memory
//!   replicas: the object lives on as a disk-only object. An object whose offload failed, or
//!   whose queue is full, is evicted as before.
//! - **write-through** (`offload_write_through`, default off): every completed write is queued.
//!
//! Each sync hands the node up to `want` *orders* from its queue: key, write id, the replica's
//! address, and a lease. The node copies the bytes out of its segment within the lease (so
//! they cannot be replaced meanwhile: leased bytes are never overwritten in place or reused),
//! writes them to disk, and reports them in its next sync. The master then records the disk
//! copy, but only if the object still holds that write: a value replaced in the meantime
//! makes the report stale, and the file is scheduled for deletion instead.
//!
//! # Deletions are versioned tombstones
//!
//! When the master drops a disk copy the node still holds (the object was removed or got a
//! new value, or a report was stale), it records a tombstone `(key, write)` under the
//! segment's *name*, which a restarted node mounts again. Tombstones go to the node with every
//! sync until it confirms the deletion. A node deletes a file only if it holds that write, so
//! a later copy of the key is never deleted by an older tombstone, and its recovery never
//! re-registers a value the master has deleted.
//!
//! # The disk tells the master first
//!
//! A node that evicts from its disk reports the keys (phase one) and deletes the files only
//! after the master acknowledged (phase two), so the master never hands out a disk replica
//! whose file is gone. A node that mounts (first start, restart, or remount after the master
//! forgot it) reports everything intact on its disk as *recovered*: the master adopts those
//! it has no newer value for.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::checksum::Checksum;
use crate::error::{Error, ErrorCode, Result};
use crate::events::Event;
use crate::ids::{ClientId, SegmentId, WriteId};
use crate::master::Master;
use crate::object::{MAX_VALUE_SIZE, MAX_WRITE_ID, NO_DISK, OffloadMark, ReplicaDescriptor};
use crate::put::PutGrant;
use crate::segments::block_len;
use crate::time::Millis;

/// Most objects waiting in one segment's offload queue; beyond it, eviction drops objects
/// without offloading them.
pub const MAX_OFFLOAD_QUEUE: usize = 1 << 16;
/// Most tombstones handed to a node in one sync.
const MAX_DELETES_PER_SYNC: usize = 4096;

/// The offload queues and tombstones of every disk.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Disks {
    /// Segment slot → objects waiting to be offloaded through its node: (object slot, write).
    queues: BTreeMap<u32, VecDeque<(u32, WriteId)>>,
    /// Segment name → disk copies the master dropped and the node has not confirmed deleting.
    tombstones: BTreeMap<Box<str>, BTreeSet<(Box<str>, WriteId)>>,
    /// Key → the disk copy (segment name, write) of an object that went away with its node
    /// and had no other copy: the node may bring it back, unless the key is written again
    /// first (the copy then becomes a tombstone, or it would resurrect an older value).
    ghosts: BTreeMap<Box<str>, (Box<str>, WriteId)>,
    /// Names of segments whose disks this master has synced with. A disk seen for the first
    /// time may hold copies from before this master's time, which it adopts; a disk seen
    /// before holds nothing the master should not already know of (see `disk_copy_recovered`).
    known: BTreeSet<Box<str>>,
}

impl Disks {
    /// Whether the node of the segment in `slot` has a disk.
    pub(crate) fn has_disk(&self, slot: u32) -> bool {
        self.queues.contains_key(&slot)
    }

    /// Every `(object slot, write)` waiting in some offload queue, sorted.
    pub(crate) fn queued_sorted(&self) -> Vec<(u32, WriteId)> {
        let mut queued: Vec<(u32, WriteId)> = self.queues.values().flatten().copied().collect();
        queued.sort_unstable();
        queued
    }

    /// Whether `key` has a ghost.
    pub(crate) fn has_ghost(&self, key: &str) -> bool {
        self.ghosts.contains_key(key)
    }

    /// Whether the disk of the segment named `name` is to delete its copy `(key, write)`.
    pub(crate) fn is_tombstoned(&self, name: &str, key: &str, write: WriteId) -> bool {
        self.tombstones
            .get(name)
            .is_some_and(|t| t.contains(&(key.into(), write)))
    }

    /// Tombstones outstanding, over all disks.
    pub(crate) fn tombstone_count(&self) -> usize {
        self.tombstones.values().map(BTreeSet::len).sum()
    }
}

/// What a node tells the master about its disk in one sync.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct DiskReport {
    /// Orders completed: the value of this write is on disk.
    pub offloaded: Vec<(String, WriteId)>,
    /// Orders that failed (disk error, full disk, lease ran out before the copy).
    pub failed: Vec<(String, WriteId)>,
    /// Copies the node is about to delete to make room (phase one of disk eviction): the
    /// node deletes the files only after this sync is acknowledged.
    pub evicted: Vec<(String, WriteId)>,
    /// Tombstones carried out: these files are gone.
    pub deleted: Vec<(String, WriteId)>,
    /// Intact copies found on disk: `(key, write, size, checksum of the value)`. Sent after
    /// every mount.
    pub recovered: Vec<(String, WriteId, u64, Checksum)>,
    /// Most new orders the node will take now.
    pub want: u32,
}

/// One object for a node to copy from its segment to its disk.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct OffloadOrder {
    /// The key.
    pub key: String,
    /// The write whose value this is; store it with the copy.
    pub write: WriteId,
    /// Address of the value in the node's segment.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// The value's checksum: check the bytes copied out against it (a damaged memory copy
    /// must not become a disk copy; report the order failed), and keep it with the copy.
    pub checksum: Checksum,
}

/// The master's answer to a disk sync.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct DiskSyncAck {
    /// Copy these to disk. Each carries a lease: the node must have copied the bytes out of
    /// its segment within `lease_ttl` of sending the sync, or report the order failed.
    pub offload: Vec<OffloadOrder>,
    /// Delete these copies, if the node holds exactly that write of the key (tombstones).
    pub delete: Vec<(String, WriteId)>,
    /// The lease on the orders.
    pub lease_ttl: Millis,
}

/// A prefetch the caller should carry out: read `source` (the node's disk copy) and write it
/// to the grant's replica, then end the write with `put_end` (or revoke it).
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct PrefetchGrant {
    /// Where to write the value in memory, and the write to end.
    pub grant: PutGrant,
    /// The disk replica to read it from.
    pub source: ReplicaDescriptor,
    /// The value's checksum: check the bytes read from disk against it, and end the write
    /// with it.
    pub checksum: Checksum,
}

impl Master {
    /// A node's disk conversation for its segment `segment` (see the module docs): applies
    /// `report`, then hands out up to `report.want` offload orders and the outstanding
    /// tombstones. The first sync announces that the segment's node has a disk.
    pub fn disk_sync(
        &mut self,
        client: ClientId,
        segment: SegmentId,
        report: DiskReport,
        now: Millis,
    ) -> Result<DiskSyncAck> {
        let now = self.advance(now);
        self.touch(client, now);
        let seg = self.segments.slot_by_id(segment).ok_or_else(|| {
            Error::new(
                ErrorCode::SEGMENT_NOT_FOUND,
                format!("{segment} is not mounted; mount it before syncing its disk"),
            )
        })?;
        let owner = self.segments.at(seg).owner;
        if owner != client {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!("{segment} belongs to client {owner}"),
            ));
        }
        let name: Box<str> = self.segments.at(seg).name.clone();
        self.disks.queues.entry(seg).or_default();
        if let Some(tombs) = self.disks.tombstones.get_mut(&name) {
            for (key, write) in &report.deleted {
                tombs.remove(&(key.as_str().into(), *write));
            }
            if tombs.is_empty() {
                self.disks.tombstones.remove(&name);
            }
        }
        for (key, write) in &report.evicted {
            self.disk_copy_evicted(seg, key, *write);
        }
        for (key, write) in &report.offloaded {
            self.disk_copy_written(seg, &name, key, *write);
        }
        for (key, write) in &report.failed {
            if let Some(slot) = self.current_write(key, *write) {
                self.objects.at_mut(slot).set_offload(OffloadMark::Failed);
            }
        }
        let first_sync = self.disks.known.insert(name.clone());
        for (key, write, size, checksum) in &report.recovered {
            let copy = (key.as_str(), *write, *size, *checksum);
            self.disk_copy_recovered(client, seg, &name, copy, first_sync);
        }
        let offload = self.issue_orders(seg, report.want as usize, now);
        let delete = self
            .disks
            .tombstones
            .get(&name)
            .map(|t| {
                t.iter()
                    .take(MAX_DELETES_PER_SYNC)
                    .map(|(k, w)| (k.to_string(), *w))
                    .collect()
            })
            .unwrap_or_default();
        Ok(DiskSyncAck {
            offload,
            delete,
            lease_ttl: self.config.lease_ttl,
        })
    }

    /// `exist(key, prefetch=true)` (docs/prefetch.md): whether `key` exists and, if its only
    /// complete copy is on disk with no memory replica being written, a memory replica to
    /// promote it into (preferring the segments in `preferred`, evicting as a put would). A
    /// failed allocation still answers `true` (the object exists); it is reported as
    /// [`Event::PrefetchFailed`] and counted.
    pub fn exist_prefetch(
        &mut self,
        client: ClientId,
        key: &str,
        preferred: &[String],
        now: Millis,
    ) -> Result<(bool, Option<PrefetchGrant>)> {
        if !self.exist(key, now)? {
            return Ok((false, None));
        }
        let now = self.now;
        self.touch(client, now);
        let slot = self.objects.find(key).expect("exist found it");
        let object = self.objects.at(slot);
        if object.has_complete_replica()
            || object.writing()
            || !object.has_disk_replica()
            || object.holds() > 0
            || object.task().is_some()
        {
            return Ok((true, None));
        }
        if let Err(e) = self.check_writer_room(client) {
            self.counters.prefetch_failures += 1;
            self.events.push(Event::PrefetchFailed {
                key: key.into(),
                error: e,
            });
            return Ok((true, None));
        }
        let (size, disk, write) = (object.size(), object.disk(), object.write_id());
        let placed = match self.place_or_evict(size, 1, preferred, &[], now) {
            Ok(placed) => placed,
            Err(e) => {
                self.counters.prefetch_failures += 1;
                self.events.push(Event::PrefetchFailed {
                    key: key.into(),
                    error: e,
                });
                return Ok((true, None));
            }
        };
        // The same write id: the value is the one on disk, so the disk copy stays valid.
        let object = self.objects.at_mut(slot);
        object.replicas = placed.into_iter().collect();
        object.start_write(now);
        object.set_prefetch(true);
        self.objects.set_writer(slot, client);
        self.track_write(slot);
        self.counters.prefetches += 1;
        Ok((
            true,
            Some(PrefetchGrant {
                grant: self.grant(slot),
                source: self.segments.describe_disk(disk, write, size),
                checksum: self.objects.checksum(slot),
            }),
        ))
    }

    /// Queues the object in `slot` for offload through the node of a segment holding a
    /// complete replica of it, if any has a disk. Returns whether it is (now or already)
    /// queued.
    pub(crate) fn queue_offload(&mut self, slot: u32) -> bool {
        let object = self.objects.at(slot);
        match object.offload() {
            OffloadMark::Queued => return true,
            OffloadMark::Failed => return false,
            OffloadMark::None => {}
        }
        if object.has_disk_replica() || object.writing() {
            return false;
        }
        if !self.tenant_allows_disk_copy(slot) {
            return false;
        }
        let object = self.objects.at(slot);
        let write = object.write_id();
        let Some(segment) = object
            .replicas
            .iter()
            .filter(|r| r.is_complete())
            .map(|r| r.segment)
            .find(|s| self.disks.has_disk(*s))
        else {
            return false;
        };
        let queue = self.disks.queues.get_mut(&segment).expect("has_disk");
        if queue.len() >= MAX_OFFLOAD_QUEUE {
            return false;
        }
        queue.push_back((slot, write));
        self.objects.at_mut(slot).set_offload(OffloadMark::Queued);
        true
    }

    /// Whether eviction should queue the object in `slot` for offload rather than drop it.
    pub(crate) fn offload_before_evicting(&mut self, slot: u32) -> bool {
        self.config.offload_on_evict && self.queue_offload(slot)
    }

    /// Records that the node of segment `disk` holds the current value of `slot` on disk.
    pub(crate) fn set_disk_copy(&mut self, slot: u32, disk: u32) {
        let object = self.objects.at_mut(slot);
        let gained = object.disk() == NO_DISK;
        if gained {
            self.counters.disk_replicas += 1;
        }
        self.counters.disk_copies_recorded += 1;
        object.set_disk(disk);
        object.set_offload(OffloadMark::None);
        if gained {
            self.objects.count_disk_copy(slot, true);
        }
    }

    /// Forgets the disk copy of `slot` without deleting it (its node went away: a restart
    /// re-registers it).
    pub(crate) fn clear_disk_copy(&mut self, slot: u32) {
        let object = self.objects.at_mut(slot);
        if object.disk() != NO_DISK {
            object.set_disk(NO_DISK);
            self.counters.disk_replicas -= 1;
            self.objects.count_disk_copy(slot, false);
        }
    }

    /// Whether the tenant of the object in `slot` may keep its value on disk too (its disk
    /// quota, if it has one).
    fn tenant_allows_disk_copy(&self, slot: u32) -> bool {
        let object = self.objects.at(slot);
        let tenant = crate::tenant::tenant_of(self.objects.key_of(object));
        self.config
            .tenant_quotas
            .iter()
            .find(|q| q.tenant == tenant)
            .is_none_or(|q| q.allows_on_disk(self.objects.tenants().of(tenant), object.size()))
    }

    /// The object in `slot` is about to get a new value or go away: its disk copy, if any, is
    /// dropped and scheduled for deletion, and any pending offload of the old value is void.
    pub(crate) fn retire_disk_copy(&mut self, slot: u32) {
        let object = self.objects.at_mut(slot);
        object.set_offload(OffloadMark::None);
        let (disk, write) = (object.disk(), object.write_id());
        if disk == NO_DISK {
            return;
        }
        let entry = (self.objects.key(slot).into(), write);
        self.clear_disk_copy(slot);
        let name = self.segments.at(disk).name.clone();
        self.disks.tombstones.entry(name).or_default().insert(entry);
    }

    /// The segment in `seg` is going away: its queue goes with it, and objects waiting in it
    /// may be queued elsewhere later. Disk copies on it are forgotten by the caller.
    pub(crate) fn forget_disk(&mut self, seg: u32) {
        for (slot, write) in self.disks.queues.remove(&seg).unwrap_or_default() {
            if let Some(object) = self.objects.get_mut(slot)
                && object.write_id() == write
                && object.offload() == OffloadMark::Queued
            {
                object.set_offload(OffloadMark::None);
            }
        }
    }

    /// The slot of `key` if it currently holds `write`.
    fn current_write(&self, key: &str, write: WriteId) -> Option<u32> {
        self.objects
            .find(key)
            .filter(|&slot| self.objects.at(slot).write_id() == write)
    }

    /// The node of segment `name` went away holding the disk copy `(key, write)`. If the
    /// object went with it (`vanished`), the node may bring it back (a ghost); otherwise the
    /// object lives on in memory and may change before the node returns, so the copy is
    /// deleted when it does (a tombstone).
    pub(crate) fn disk_copy_departed(
        &mut self,
        name: &str,
        key: &str,
        write: WriteId,
        vanished: bool,
    ) {
        if !vanished {
            self.tombstone(name, key, write);
            return;
        }
        self.bury_ghost(key);
        self.disks.ghosts.insert(key.into(), (name.into(), write));
    }

    /// `key` is written again: a ghost copy of it would be an older value, so it is deleted
    /// when its node returns.
    pub(crate) fn bury_ghost(&mut self, key: &str) {
        if let Some((name, write)) = self.disks.ghosts.remove(key) {
            self.tombstone(&name, key, write);
        }
    }

    fn tombstone(&mut self, name: &str, key: &str, write: WriteId) {
        self.disks
            .tombstones
            .entry(name.into())
            .or_default()
            .insert((key.into(), write));
    }

    /// Phase one of a node's disk eviction: the copy is going away.
    fn disk_copy_evicted(&mut self, seg: u32, key: &str, write: WriteId) {
        let Some(slot) = self.current_write(key, write) else {
            return;
        };
        let object = self.objects.at(slot);
        if object.disk() != seg {
            return;
        }
        self.clear_disk_copy(slot);
        // The disk chose to drop it: offloading it again would evict another copy.
        self.objects.at_mut(slot).set_offload(OffloadMark::Failed);
        if !self.objects.at(slot).is_readable() {
            // Its disk copy was readable: the value is gone unless a prefetch brings it back.
            self.value_removed(slot);
        }
        let object = self.objects.at(slot);
        // As when a segment goes (see `membership`): copy targets alone are not a value, and
        // the copy feeding them is gone.
        if !object.writing() && !object.is_readable() {
            if let Some(task) = object.task() {
                self.abandon_task(task, crate::replication::Finish::ObjectLost);
            }
            let key = self.objects.key(slot).into();
            let object = self.remove_object(slot);
            self.counters.evicted_objects += 1;
            self.events.push(Event::Evicted {
                key,
                soft_pinned: false,
                bytes: 0,
                contiguous: false,
                kept_on_disk: false,
                last_access: object.last_access,
            });
        } else if !object.is_readable() {
            // A prefetch in progress keeps the object, and readers find nothing until it
            // ends: say so now, as when the copy leaves with its node.
            self.events.push(Event::ReadableCopyLost {
                key: self.objects.key(slot).into(),
                segment: self.segments.at(seg).id,
            });
        }
    }

    /// An order was carried out.
    fn disk_copy_written(&mut self, seg: u32, name: &str, key: &str, write: WriteId) {
        if self.disks.is_tombstoned(name, key, write) {
            // Condemned already: a report from before the node's remount (an order of the
            // segment's earlier mount, whose copies were tombstoned when it went), which the
            // node is about to delete.
            return;
        }
        match self.current_write(key, write) {
            // Copies ordered before the tenant reached its disk quota may land after: past
            // it, one is deleted, and its value is not offloaded again.
            Some(slot)
                if self.objects.at(slot).disk() == NO_DISK
                    && !self.tenant_allows_disk_copy(slot) =>
            {
                self.objects.at_mut(slot).set_offload(OffloadMark::Failed);
                self.tombstone(name, key, write);
            }
            Some(slot) if self.objects.at(slot).disk() == NO_DISK => self.set_disk_copy(slot, seg),
            Some(slot) if self.objects.at(slot).disk() == seg => {}
            // Stale (the value changed or went away), or already on another disk.
            _ => self.tombstone(name, key, write),
        }
    }

    /// A copy `(key, write, size)` found on the disk of segment `seg` (named `name`) after a
    /// mount. It is adopted if it is the object's current value, or the value of an object
    /// that went away with this node (a ghost), or, on the first sync this master has with
    /// the disk (`first_sync`), any copy of a key that has no value now. Anything else is
    /// older than what the master knows (written, or removed, since) or was never reported,
    /// and is deleted.
    fn disk_copy_recovered(
        &mut self,
        client: ClientId,
        seg: u32,
        name: &str,
        (key, write, size, checksum): (&str, WriteId, u64, Checksum),
        first_sync: bool,
    ) {
        if self.disks.is_tombstoned(name, key, write) {
            return;
        }
        if self.check_key(key).is_err()
            || size == 0
            || size > MAX_VALUE_SIZE
            || write > MAX_WRITE_ID
        {
            self.tombstone(name, key, write);
            return;
        }
        match self.objects.find(key) {
            None => {
                let ghost = self.disks.ghosts.get(key).cloned();
                let adopt = match &ghost {
                    Some((ghost_name, ghost_write)) => {
                        (ghost_name.as_ref(), *ghost_write) == (name, write)
                            || (first_sync && write > *ghost_write)
                    }
                    None => first_sync,
                };
                if !adopt {
                    self.tombstone(name, key, write);
                    return;
                }
                if !self.objects.has_writer_room(client) {
                    // Not adopted while objects name as many writers as they can: the copy
                    // stays on disk for now (a later sync that may not adopt it tombstones it).
                    return;
                }
                self.bury_ghost_unless(key, name, write);
                let slot = self.objects.insert(key, size, client, write);
                self.objects.set_checksum(slot, checksum);
                // Its old incarnation may have been held when it went away: the same slot and
                // write must not make those holds count against the new object.
                self.detach_holds(slot, write);
                self.set_disk_copy(slot, seg);
                self.value_stored(slot);
                // Write ids stay unique: later writes get higher ones.
                self.counters.next_write = self.counters.next_write.max(write.0);
            }
            Some(slot) => {
                let object = self.objects.at(slot);
                // A copy of the current value that does not match its checksum is damaged.
                let intact = self.objects.checksum(slot) == checksum;
                if object.write_id() == write
                    && object.size() == size
                    && object.disk() == NO_DISK
                    && intact
                {
                    let was_readable = object.is_readable();
                    self.set_disk_copy(slot, seg);
                    if !was_readable {
                        // A prefetch had lost its only readable copy: the value is back.
                        self.value_stored(slot);
                    }
                } else if !(object.write_id() == write && object.disk() == seg) {
                    self.tombstone(name, key, write);
                }
            }
        }
    }

    /// Drops `key`'s ghost: forgotten if it is the copy `(name, write)` being adopted,
    /// otherwise tombstoned (another copy wins).
    fn bury_ghost_unless(&mut self, key: &str, name: &str, write: WriteId) {
        match self.disks.ghosts.get(key) {
            Some((n, w)) if (n.as_ref(), *w) == (name, write) => {
                self.disks.ghosts.remove(key);
            }
            Some(_) => self.bury_ghost(key),
            None => {}
        }
    }

    /// Offload ahead: if segment `seg` is more than `offload_ahead_watermark` full, makes sure
    /// its least recently used objects holding the bytes above that mark have disk copies,
    /// queueing up to `count` that lack one, so eviction later finds copies to drop rather
    /// than values. Only the bytes above the mark: a disk smaller than memory would otherwise
    /// churn, evicting copies to make room for ones never needed. Paced by the node, which
    /// asks for orders only as fast as it writes them. Costs a scan of the table per call.
    fn offload_ahead(&mut self, seg: u32, count: usize, now: Millis) {
        let segment = self.segments.at(seg);
        let mark =
            (self.config.offload_ahead_watermark * segment.allocator.capacity() as f64) as u64;
        let above = segment.allocator.used_bytes().saturating_sub(mark);
        if above == 0 {
            return;
        }
        // Every object eviction could take from the segment: (LRU position, slot, bytes,
        // has a copy or one on the way).
        let mut candidates: Vec<(Millis, u32, u64, bool)> = self
            .objects
            .iter()
            .filter(|(_, o)| {
                !o.writing()
                    && o.eviction_class(now).is_some()
                    && o.replicas
                        .iter()
                        .any(|r| r.segment == seg && r.is_complete())
            })
            .map(|(slot, o)| {
                let covered = o.has_disk_replica() || o.offload() != OffloadMark::None;
                (o.last_access, slot, block_len(o.size()), covered)
            })
            .collect();
        candidates.sort_unstable();
        let mut bytes = 0;
        let mut queued = 0;
        for (_, slot, len, covered) in candidates {
            if bytes >= above || queued >= count {
                break;
            }
            bytes += len;
            if !covered && self.queue_offload(slot) {
                queued += 1;
            }
        }
    }

    /// Pops up to `want` valid entries off segment `seg`'s queue as orders, each with a lease.
    fn issue_orders(&mut self, seg: u32, want: usize, now: Millis) -> Vec<OffloadOrder> {
        let queued = self.disks.queues.get(&seg).map_or(0, VecDeque::len);
        if queued < want {
            self.offload_ahead(seg, want - queued, now);
        }
        let lease_ttl = self.config.lease_ttl;
        let mut orders = Vec::new();
        while orders.len() < want {
            let Some((slot, write)) = self.disks.queues.get_mut(&seg).and_then(|q| q.pop_front())
            else {
                break;
            };
            let Some(object) = self.objects.get_mut(slot) else {
                continue;
            };
            if object.write_id() != write || object.offload() != OffloadMark::Queued {
                continue;
            }
            object.set_offload(OffloadMark::None);
            let Some(replica) = object
                .replicas
                .iter()
                .find(|r| r.segment == seg && r.is_complete())
                .copied()
            else {
                continue;
            };
            if object.writing() || object.disk() != NO_DISK {
                continue;
            }
            // The node has yet to delete an earlier copy of this very write: it may delete
            // the new one with it. The object may be queued again later.
            let name = &self.segments.at(seg).name;
            if self
                .disks
                .is_tombstoned(name, self.objects.key(slot), write)
            {
                continue;
            }
            let object = self.objects.at_mut(slot);
            object.grant_lease(now, lease_ttl);
            let object = self.objects.at(slot);
            orders.push(OffloadOrder {
                key: self.objects.key_of(object).to_string(),
                write,
                addr: self.segments.describe(&replica, object.size()).addr,
                size: object.size(),
                checksum: self.objects.checksum(slot),
            });
        }
        orders
    }
}
