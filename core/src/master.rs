//! The master: the whole metadata state and the driver-facing loop (`tick`, `next_deadline`,
//! events). The operations live in their own modules as further `impl Master` blocks:
//! `membership` (clients, segments), `put`, `upsert`, `reads`, `holds`, `remove`,
//! `replication`, `eviction`, `zombies`, `snapshot`.
//!
//! # Driving it
//!
//! The master is a plain value. A driver (the async master service, a simulation, a test)
//! calls operations with the current time, then asks [`Master::next_deadline`] when to call
//! [`Master::tick`] next, and drains [`Master::drain_events`] to log what happened. Calling
//! `tick` early or late is harmless; calling it late only delays cleanup. `now` may be passed
//! non-monotonically: the master never lets its clock go backwards.

use crate::clients::Clients;
use crate::config::MasterConfig;
use crate::discard::{DiscardReason, Discarded, DiscardedBlock};
use crate::error::Result;
use crate::events::{DiscardCause, Event, EventQueue};
use crate::holds::Holds;
use crate::ids::{SegmentId, WriteId};
use crate::key_events::KeyChanges;
use crate::object::{Object, Replica};
use crate::objects::ObjectTable;
use crate::offload::Disks;
use crate::quota::Unfinished;
use crate::replication::Tasks;
use crate::rng::Rng;
use crate::segments::{SegmentInfo, Segments, block_len};
use crate::time::Millis;
use crate::zombies::WriteDeadlines;

/// Counters and small scalars that are part of the state.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Counters {
    pub next_write: u64,
    pub next_hold: u64,
    pub next_task: u64,
    /// Objects with a put or upsert in progress.
    pub writing_objects: u64,
    /// When the last watermark-driven eviction pass ran.
    pub last_eviction_pass: Millis,
    pub evicted_objects: u64,
    pub evicted_bytes: u64,
    pub discarded_writes: u64,
    pub lost_objects: u64,
    /// Objects with a disk copy.
    pub disk_replicas: u64,
    /// Disk copies recorded (offloaded or recovered).
    pub disk_copies_recorded: u64,
    /// Evictions that left a disk copy.
    pub evicted_to_disk: u64,
    /// Prefetches started, and prefetches that found no memory.
    pub prefetches: u64,
    pub prefetch_failures: u64,
    pub upserts: UpsertCounts,
    /// Reads (replica lists and held reads) by the tier that could serve them.
    pub reads: ReadCounts,
}

/// Reads asked for, by where the value was: memory, only a node's disk, or nowhere.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct ReadCounts {
    /// A complete memory replica was listed (a memory hit).
    pub memory: u64,
    /// Only a disk copy was listed (a disk hit: the reader stages it).
    pub disk: u64,
    /// No such object (a miss).
    pub misses: u64,
}

/// Upserts started, by case (see `upsert` and docs/upsert.md).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct UpsertCounts {
    /// Case A: the key was missing (or its write was preempted), so a new object.
    pub created: u64,
    /// Case B: same size, nobody reading, overwritten in place.
    pub in_place: u64,
    /// Case B with readers inside their lease: same size, written to fresh buffers.
    pub copied: u64,
    /// Case C: a new size (or a value only on disk), written to fresh buffers.
    pub resized: u64,
}

/// A snapshot of the master's gauges and counters.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct Stats {
    /// Objects in the table (complete or being written).
    pub objects: u64,
    /// Objects with a put or upsert in progress.
    pub writing: u64,
    /// Mounted segments.
    pub segments: u64,
    /// Live clients (heard from within the client TTL, and not gone with a goodbye).
    pub clients: u64,
    /// Total usable segment bytes.
    pub capacity: u64,
    /// Allocated bytes, including discarded blocks not yet released.
    pub used: u64,
    /// Discarded blocks waiting for release.
    pub discarded_blocks: u64,
    /// Held reads outstanding.
    pub holds: u64,
    /// Copy and move tasks running.
    pub tasks: u64,
    /// Objects evicted since start.
    pub evicted_objects: u64,
    /// Bytes evicted since start.
    pub evicted_bytes: u64,
    /// Writes discarded (timed out, preempted, writer dead) since start.
    pub discarded_writes: u64,
    /// Objects lost with their last segment since start.
    pub lost_objects: u64,
    /// Events dropped because the driver did not drain them.
    pub events_dropped: u64,
    /// Objects with a copy on a node's disk.
    pub disk_replicas: u64,
    /// Disk copies the master dropped that their nodes have not yet deleted.
    pub disk_tombstones: u64,
    /// Disk copies recorded since start (offloaded, or recovered after a restart).
    pub disk_copies_recorded: u64,
    /// Of `evicted_objects`, those that live on in a disk copy (the rest were dropped).
    pub evicted_to_disk: u64,
    /// Prefetches (docs/prefetch.md) started since start.
    pub prefetches: u64,
    /// Prefetches that found no memory to promote into, since start.
    pub prefetch_failures: u64,
    /// Upserts started since start, by case.
    pub upserts: UpsertCounts,
    /// Reads since start, by the tier that could serve them.
    pub reads: ReadCounts,
    /// Objects waiting for replicas lost with a segment (see `Master::take_repairs`).
    pub repairs_waiting: u64,
    /// Of `tasks`, the repair copies nodes are carrying out (background work, never done
    /// while a replica stays unreadable).
    pub repairs_running: u64,
}

/// The master's metadata state machine. See the module docs for how to drive it.
#[derive(Clone)]
pub struct Master {
    pub(crate) config: MasterConfig,
    pub(crate) now: Millis,
    pub(crate) rng: Rng,
    pub(crate) segments: Segments,
    pub(crate) objects: ObjectTable,
    pub(crate) clients: Clients,
    pub(crate) writes: WriteDeadlines,
    pub(crate) discarded: Discarded,
    pub(crate) holds: Holds,
    pub(crate) tasks: Tasks,
    pub(crate) disks: Disks,
    pub(crate) counters: Counters,
    pub(crate) events: EventQueue,
    /// Keys' values coming and going, for KV events (see `key_events`).
    pub(crate) key_changes: KeyChanges,
    /// Whether key changes go unreported for now (see [`Master::pause_key_changes`]).
    pub(crate) key_changes_paused: bool,
    /// Unfinished puts per member (derived from `objects`; see `quota`).
    pub(crate) unfinished: Unfinished,
}

impl Master {
    /// A master with no segments, clients or objects.
    pub fn new(config: MasterConfig) -> Result<Master> {
        config.validate()?;
        Ok(Master {
            rng: Rng::seeded(config.seed),
            objects: ObjectTable::new(config.seed),
            now: Millis::ZERO,
            segments: Segments::new(),
            clients: Clients::default(),
            writes: WriteDeadlines::default(),
            discarded: Discarded::default(),
            holds: Holds::default(),
            tasks: Tasks::default(),
            disks: Disks::default(),
            counters: Counters::default(),
            events: EventQueue::default(),
            key_changes: KeyChanges::default(),
            key_changes_paused: false,
            unfinished: Unfinished::default(),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MasterConfig {
        &self.config
    }

    /// The latest time the master has seen.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Moves the master's clock to `now` unless it is already later; returns the clock.
    pub(crate) fn advance(&mut self, now: Millis) -> Millis {
        self.now = self.now.max(now);
        self.now
    }

    /// Runs every timed duty that is due: expires silent clients, discards writes past the
    /// discard timeout, revokes stale copy tasks, releases discarded blocks whose delay is
    /// over, and evicts if memory is above the high watermark.
    pub fn tick(&mut self, now: Millis) {
        let now = self.advance(now);
        self.expire_clients(now);
        self.discard_expired_writes(now);
        self.expire_tasks(now);
        self.release_due_blocks(now);
        self.evict_if_over_watermark(now);
    }

    /// When `tick` next has work to do, if ever. Ask again after every call: operations can
    /// bring the deadline closer.
    pub fn next_deadline(&self) -> Option<Millis> {
        let eviction = self
            .over_watermark()
            .then(|| self.counters.last_eviction_pass + self.config.eviction_retry_interval);
        [
            self.writes.next_deadline(),
            self.discarded.next_release(),
            self.clients.next_expiry(self.config.client_ttl),
            self.tasks
                .next_deadline(self.config.put_start_discard_timeout),
            eviction,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Takes the events recorded since the last call, oldest first.
    pub fn drain_events(&mut self) -> Vec<Event> {
        self.events.drain().collect()
    }

    /// Brings what work on `keys` reads into the processor's caches, changing nothing: a
    /// replay that looks ahead calls it for the keys of its next records, so that their
    /// lookups' cache misses overlap instead of queuing one behind another. Returns how many
    /// of the keys are present.
    pub fn warm<K: AsRef<str>>(&self, keys: &[K]) -> usize {
        self.objects.warm(keys)
    }

    /// Gauges and counters.
    pub fn stats(&self) -> Stats {
        Stats {
            objects: self.objects.len() as u64,
            writing: self.counters.writing_objects,
            segments: self.segments.mounted.len() as u64,
            clients: self.clients.present() as u64,
            capacity: self.segments.capacity(),
            used: self.segments.used(),
            discarded_blocks: self.discarded.len() as u64,
            holds: self.holds.len() as u64,
            tasks: self.tasks.len() as u64,
            evicted_objects: self.counters.evicted_objects,
            evicted_bytes: self.counters.evicted_bytes,
            discarded_writes: self.counters.discarded_writes,
            lost_objects: self.counters.lost_objects,
            events_dropped: self.events.dropped(),
            disk_replicas: self.counters.disk_replicas,
            disk_copies_recorded: self.counters.disk_copies_recorded,
            evicted_to_disk: self.counters.evicted_to_disk,
            disk_tombstones: self.disks.tombstone_count() as u64,
            prefetches: self.counters.prefetches,
            prefetch_failures: self.counters.prefetch_failures,
            upserts: self.counters.upserts,
            reads: self.counters.reads,
            repairs_waiting: self.tasks.repairs.len() as u64,
            repairs_running: self
                .tasks
                .iter()
                .filter(|(_, t)| t.repair.is_some())
                .count() as u64,
        }
    }

    /// Heap bytes of the metadata: object table, key index, allocator bookkeeping. Key bytes
    /// are not included.
    pub fn metadata_heap_bytes(&self) -> usize {
        self.objects.heap_bytes() + self.segments.heap_bytes()
    }

    /// What the master knows about a mounted segment: clients resolve a descriptor's segment
    /// id to the node's endpoint with this.
    pub fn segment_info(&self, id: SegmentId) -> Option<SegmentInfo> {
        self.segments
            .slot_by_id(id)
            .map(|slot| self.segments.at(slot).info())
    }

    /// Every mounted segment, in mount-slot order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.segments.iter().map(|(_, s)| s.info()).collect()
    }

    pub(crate) fn next_write_id(&mut self) -> WriteId {
        self.counters.next_write += 1;
        WriteId(self.counters.next_write)
    }

    /// Frees the block of a replica of a `size`-byte value now, or parks it in the discarded
    /// list until `release_at`.
    pub(crate) fn release_block(
        &mut self,
        replica: &Replica,
        size: u64,
        release_at: Millis,
        reason: DiscardReason,
    ) {
        if release_at <= self.now {
            let freed = self.segments.free(replica, size);
            debug_assert!(freed, "released a block that was not live");
        } else {
            self.discarded.push(
                release_at,
                DiscardedBlock {
                    segment: replica.segment,
                    offset: replica.offset(),
                    len: block_len(size),
                    reason,
                },
            );
        }
    }

    /// Releases the blocks of replicas of a `size`-byte value that readers may have seen, at
    /// `readers_done_at` (see `Object::readers_done_at`), so a reader inside its lease never
    /// sees the bytes change.
    pub(crate) fn release_read_blocks(
        &mut self,
        replicas: &[Replica],
        size: u64,
        readers_done_at: Millis,
    ) {
        let release_at = readers_done_at;
        for replica in replicas {
            self.release_block(replica, size, release_at, DiscardReason::Superseded);
        }
    }

    /// Frees the discarded blocks whose delay is over.
    pub(crate) fn release_due_blocks(&mut self, now: Millis) {
        for block in self.discarded.take_due(now) {
            let freed = self
                .segments
                .free_block(block.segment, block.offset, block.len);
            debug_assert!(freed, "discarded block was not live");
        }
    }

    /// Frees discarded blocks early to relieve memory pressure: only those whose writer is
    /// known dead (a live writer may still be writing into them; readers' blocks wait out
    /// their short lease). Returns how many were freed.
    pub(crate) fn release_blocks_under_pressure(&mut self) -> usize {
        let clients = &self.clients;
        let early = self.discarded.take_early(|b| match b.reason {
            DiscardReason::Preempted { writer } => !clients.is_live(writer),
            DiscardReason::Superseded => false,
        });
        for block in &early {
            let freed = self
                .segments
                .free_block(block.segment, block.offset, block.len);
            debug_assert!(freed, "discarded block was not live");
        }
        early.len()
    }

    /// Removes an object from the table, keeping the writing and disk counts right. The caller
    /// has already disposed of its replicas' blocks (and retired its disk copy if the node
    /// should delete it). Returns the object (take its key first where it is needed).
    pub(crate) fn remove_object(&mut self, slot: u32) -> Object {
        let object = self.objects.remove(slot);
        if object.writing() {
            self.write_ended(slot);
        }
        if object.has_disk_replica() {
            self.counters.disk_replicas -= 1;
        }
        object
    }

    /// Abandons the put or upsert in progress on `slot`: its PROCESSING replicas go to the
    /// discarded list until its writer's last byte can have landed (the write fence's bound,
    /// a write window and the late-landing bound after the write started, well before
    /// `put_start_release_timeout`), and the object goes away if no complete replica (in
    /// memory or on disk) is left. Returns whether the object was removed.
    pub(crate) fn discard_write(&mut self, slot: u32, cause: DiscardCause) -> bool {
        let fence = self.config.fence_rule();
        let reason = DiscardReason::Preempted {
            writer: self.objects.writer(slot),
        };
        let object = self.objects.at_mut(slot);
        debug_assert!(object.writing());
        let release_at = fence.writes_land_by(object.put_start(), object.size());
        object.end_write();
        let (processing, kept): (Vec<Replica>, Vec<Replica>) =
            object.replicas.iter().partition(|r| r.is_processing());
        object.replicas = kept.into_iter().collect();
        let (write, size) = (object.write_id(), object.size());
        let removed = object.replicas.is_empty() && !object.has_disk_replica();
        self.write_ended(slot);
        self.counters.discarded_writes += 1;
        for replica in &processing {
            self.release_block(replica, size, release_at, reason);
        }
        let key = self.objects.key(slot).into();
        if removed {
            self.objects.remove(slot);
        }
        self.events.push(Event::WriteDiscarded {
            key,
            write,
            cause,
            object_removed: removed,
        });
        removed
    }
}
