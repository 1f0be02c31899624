//! The reference model: a deliberately simple picture of what the master should hold, kept in
//! plain maps, against which every result and every event the master reports is judged.
//!
//! The model does not re-implement allocation; it accepts the master's placement and checks
//! that it is legal (in bounds, on distinct mounted segments, overlapping nothing live or still
//! reserved). Everything else (error codes, leases, pins, preemption, expiry, eviction
//! eligibility and order) it predicts or judges exactly.

// Plain data mirrored from the master; the fields are named after what they mirror.
#![allow(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{ClientId, SegmentId, TaskId, WriteId};
use crate::segments::block_len;
use crate::time::Millis;

/// A mounted segment as the model sees it.
#[derive(Clone, Debug)]
pub struct MSegment {
    pub id: SegmentId,
    pub owner: ClientId,
    pub base: u64,
    pub capacity: u64,
}

/// A replica as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MReplica {
    pub segment: SegmentId,
    pub addr: u64,
    pub complete: bool,
}

/// A write in progress.
#[derive(Clone, Copy, Debug)]
pub struct MWrite {
    pub client: ClientId,
    pub write_id: WriteId,
    pub version: u64,
    pub start: Millis,
}

/// An object as the model sees it.
#[derive(Clone, Debug)]
pub struct MObject {
    pub size: u64,
    pub replicas: Vec<MReplica>,
    pub writing: Option<MWrite>,
    /// The client and write of the last put/upsert (for End/Revoke checks).
    pub writer: ClientId,
    pub write_id: WriteId,
    /// The readable version (None while a write is in progress).
    pub version: Option<u64>,
    pub lease_expiry: Millis,
    /// The last completed write or read: the LRU position.
    pub last_access: Millis,
    pub soft_ttl: Millis,
    pub soft_expiry: Millis,
    pub hard: bool,
    pub holds: u32,
    pub task: Option<TaskId>,
    /// A reader got a lease on the current replicas.
    pub leased: bool,
    /// The segment whose node holds the current value on disk (the master's disk replica).
    pub disk: Option<SegmentId>,
    /// Its node failed to offload it, or evicted its disk copy: never queued again.
    pub offload_failed: bool,
    /// The master may have queued it for offload (silently, during an eviction pass or a
    /// disk sync): eviction passes it over, so the eviction order checks excuse it.
    pub maybe_queued: bool,
}

impl MObject {
    pub fn lease_active(&self, now: Millis) -> bool {
        now < self.lease_expiry
    }

    pub fn soft_pinned(&self, now: Millis) -> bool {
        self.soft_ttl > Millis::ZERO && now < self.soft_expiry
    }

    pub fn has_complete(&self) -> bool {
        self.replicas.iter().any(|r| r.complete)
    }

    /// Whether a reader is served: a complete memory replica, or the disk copy.
    pub fn readable(&self) -> bool {
        self.has_complete() || self.disk.is_some()
    }

    /// A fresh object with nothing in memory yet.
    pub fn new(size: u64, writer: ClientId, write_id: WriteId) -> MObject {
        MObject {
            size,
            replicas: Vec::new(),
            writing: None,
            writer,
            write_id,
            version: None,
            lease_expiry: Millis::ZERO,
            last_access: Millis::ZERO,
            soft_ttl: Millis::ZERO,
            soft_expiry: Millis::ZERO,
            hard: false,
            holds: 0,
            task: None,
            leased: false,
            disk: None,
            offload_failed: false,
            maybe_queued: false,
        }
    }

    /// Eviction tier at `now`: None if not a candidate, Some(false) unpinned, Some(true)
    /// soft-pinned.
    pub fn eviction_tier(&self, now: Millis) -> Option<bool> {
        if self.hard
            || self.writing.is_some()
            || self.holds > 0
            || self.task.is_some()
            || self.lease_active(now)
            || !self.has_complete()
        {
            None
        } else {
            Some(self.soft_pinned(now))
        }
    }

    pub fn grant_lease(&mut self, now: Millis, ttl: Millis) {
        self.lease_expiry = self.lease_expiry.max(now + ttl);
        self.last_access = self.last_access.max(now);
        self.leased = true;
        self.refresh_soft(now);
    }

    /// When no reader can still be reading the current replicas.
    pub fn readers_done_at(&self, grace: Millis) -> Millis {
        if self.leased {
            self.lease_expiry + grace
        } else {
            Millis::ZERO
        }
    }

    pub fn refresh_soft(&mut self, now: Millis) {
        if self.soft_ttl > Millis::ZERO {
            self.soft_expiry = now + self.soft_ttl;
        }
    }
}

/// A block no object owns that may not be reused yet.
#[derive(Clone, Copy, Debug)]
pub struct Reserved {
    pub segment: SegmentId,
    pub addr: u64,
    pub len: u64,
    pub release_at: Millis,
    /// A writer that may still write into it (early release is allowed once it is dead).
    pub writer: Option<ClientId>,
}

/// A running copy or move.
#[derive(Clone, Debug)]
pub struct MTask {
    pub client: ClientId,
    pub key: String,
    pub write_id: WriteId,
    /// For a move: the source segment.
    pub move_source: Option<SegmentId>,
    pub started: Millis,
}

/// A held read.
#[derive(Clone, Debug)]
pub struct MHold {
    pub client: ClientId,
    pub key: String,
    pub write_id: WriteId,
}

/// The model state.
#[derive(Default)]
pub struct Model {
    pub clients: BTreeMap<ClientId, Millis>,
    /// Live clients told they are registered (by a heartbeat or a mount).
    pub announced: std::collections::BTreeSet<ClientId>,
    /// Live clients that said goodbye and have not been heard from since: they hold nothing
    /// and expire quietly.
    pub left: BTreeSet<ClientId>,
    pub segments: BTreeMap<String, MSegment>,
    pub objects: BTreeMap<String, MObject>,
    pub reserved: Vec<Reserved>,
    pub tasks: BTreeMap<TaskId, MTask>,
    pub holds: BTreeMap<crate::ids::HoldId, MHold>,
    /// Disk copies the master dropped and their nodes have not confirmed deleting, by
    /// segment name (the master's tombstones).
    pub tombstones: BTreeMap<String, BTreeSet<(String, WriteId)>>,
    /// Key -> the disk copy of an object that went away with its node: (segment name, write,
    /// version, size). The node may bring it back.
    pub ghosts: BTreeMap<String, (String, WriteId, u64, u64)>,
    /// Segment names whose disks the master has synced with.
    pub known_disks: BTreeSet<String>,
    /// Mounted segments whose node announced a disk (they have an offload queue).
    pub disk_segments: BTreeSet<SegmentId>,
}

impl Model {
    pub fn touch(&mut self, client: ClientId, now: Millis) {
        self.clients.insert(client, now);
        self.left.remove(&client);
    }

    /// A heartbeat or mount: returns whether the client had not been told it is registered.
    pub fn announce(&mut self, client: ClientId, now: Millis) -> bool {
        self.clients.insert(client, now);
        self.left.remove(&client);
        self.announced.insert(client)
    }

    /// The master drops the disk copy `(key, write)` on the disk of segment `name`: the node
    /// must delete it.
    pub fn tombstone(&mut self, name: &str, key: &str, write: WriteId) {
        self.tombstones
            .entry(name.to_string())
            .or_default()
            .insert((key.to_string(), write));
    }

    /// Tombstones outstanding, over all disks.
    pub fn tombstone_count(&self) -> usize {
        self.tombstones.values().map(BTreeSet::len).sum()
    }

    /// `key`'s object gets a new value or goes away: its disk copy, if any, is a tombstone.
    pub fn retire_disk_copy(&mut self, key: &str) {
        let Some(object) = self.objects.get_mut(key) else {
            return;
        };
        object.offload_failed = false;
        object.maybe_queued = false;
        let (Some(disk), write) = (object.disk.take(), object.write_id) else {
            return;
        };
        let name = self
            .segment_by_id(disk)
            .map(|(n, _)| n.clone())
            .expect("a disk copy is on a mounted segment");
        self.tombstone(&name, key, write);
    }

    /// `key` is written again: its ghost, an older value, is deleted when its node returns.
    pub fn bury_ghost(&mut self, key: &str) {
        if let Some((name, write, _, _)) = self.ghosts.remove(key) {
            self.tombstone(&name, key, write);
        }
    }

    /// Whether the master may queue the object for offload now: an eviction candidate with no
    /// disk copy and a complete replica on a segment whose node has a disk.
    pub fn may_queue(&self, object: &MObject, now: Millis) -> bool {
        object.disk.is_none()
            && !object.offload_failed
            && object.eviction_tier(now).is_some()
            && object
                .replicas
                .iter()
                .any(|r| r.complete && self.disk_segments.contains(&r.segment))
    }

    /// Marks every object the master may have queued for offload by now (sticky: the model
    /// cannot see the queue, only orders coming out of it).
    pub fn mark_maybe_queued(&mut self, now: Millis) {
        let marks: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, o)| !o.maybe_queued && self.may_queue(o, now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in marks {
            self.objects.get_mut(&key).expect("listed").maybe_queued = true;
        }
    }

    pub fn segment_by_id(&self, id: SegmentId) -> Option<(&String, &MSegment)> {
        self.segments.iter().find(|(_, s)| s.id == id)
    }

    /// Parks blocks that readers may still read until `readers_done`.
    pub fn reserve_for_readers(&mut self, replicas: &[MReplica], size: u64, readers_done: Millis) {
        for r in replicas {
            self.reserved.push(Reserved {
                segment: r.segment,
                addr: r.addr,
                len: block_len(size),
                release_at: readers_done,
                writer: None,
            });
        }
    }

    /// Parks blocks a (possibly zombie) writer may still write into.
    pub fn reserve_for_writer(
        &mut self,
        replicas: &[MReplica],
        size: u64,
        release_at: Millis,
        writer: ClientId,
    ) {
        for r in replicas {
            self.reserved.push(Reserved {
                segment: r.segment,
                addr: r.addr,
                len: block_len(size),
                release_at,
                writer: Some(writer),
            });
        }
    }

    /// Checks that a freshly granted block is legal: inside a mounted segment, overlapping no
    /// live replica and no block still reserved. A reserved block it overlaps that the master
    /// may legitimately have released (due, or its writer dead) is taken as released.
    pub fn claim_block(
        &mut self,
        segment: SegmentId,
        addr: u64,
        size: u64,
        now: Millis,
        ignore_key: Option<&str>,
    ) -> Result<(), String> {
        let len = block_len(size);
        let (name, seg) = self
            .segment_by_id(segment)
            .ok_or_else(|| format!("granted block on unknown or unmounted segment {segment}"))?;
        if addr < seg.base || addr + len > seg.base + seg.capacity {
            return Err(format!("block {addr}+{len} outside segment {name}"));
        }
        if !(addr - seg.base).is_multiple_of(crate::segments::ALLOC_ALIGN) {
            return Err(format!("block {addr} not aligned"));
        }
        let overlaps = |a: u64, l: u64| addr < a + l && a < addr + len;
        for (key, object) in &self.objects {
            if Some(key.as_str()) == ignore_key {
                continue;
            }
            for r in &object.replicas {
                if r.segment == segment && overlaps(r.addr, block_len(object.size)) {
                    return Err(format!(
                        "block {addr}+{len} overlaps live replica of {key:?} at {}",
                        r.addr
                    ));
                }
            }
        }
        let clients = &self.clients;
        let mut conflict = None;
        self.reserved.retain(|b| {
            if b.segment != segment || !overlaps(b.addr, b.len) {
                return true;
            }
            let may_be_free =
                b.release_at <= now || b.writer.is_some_and(|w| !clients.contains_key(&w));
            if !may_be_free {
                conflict = Some(*b);
            }
            false
        });
        if let Some(b) = conflict {
            return Err(format!(
                "block {addr}+{len} reuses reserved block {}+{} before {} (writer {:?})",
                b.addr, b.len, b.release_at, b.writer
            ));
        }
        Ok(())
    }

    /// Whether a segment certainly has nothing allocated (so any block that fits must fit).
    pub fn segment_certainly_empty(&self, id: SegmentId) -> bool {
        !self
            .objects
            .values()
            .any(|o| o.replicas.iter().any(|r| r.segment == id))
            && !self.reserved.iter().any(|b| b.segment == id)
    }
}
