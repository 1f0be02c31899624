//! One peer's published pool: the memory its writes are copied into and remote readers read
//! from, with its least-recently-used eviction, its pins and its disk tier's residency.
//!
//! A value lives here from its write until it is evicted, removed or superseded. Eviction
//! keeps a value that has a disk copy (it becomes *non-resident*: its directory entry stays,
//! marked so, and a read promotes it back); one without is gone, and its entry with it. A
//! freed block waits [`PublishedPool::new`]'s read grace before reuse, so a reader that looked
//! the old location up just before rarely reads over a new value (and when it does, the
//! value's checksum tells it: never wrong bytes).
//!
//! A directory entry can outlive its value (a re-publish still in flight when the value was
//! dropped), and a freed block may still hold the old bytes, which match the old entry's
//! checksum. So each block starts with a header naming the write it holds: the driver writes
//! it with the value, and applies [`PublishedPool::take_header_writes`], before
//! the block can be reused. A reader checks the header against the entry's stamp: a stale
//! entry then reads as a miss, never as an older value.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::allocator::{Allocation, OffsetAllocator, check_ownership};
use crate::checksum::Checksum;
use crate::time::Millis;

use super::directory::{Location, Stamp};
use super::disk::{DiskShelf, DiskWork};
use super::ring::stable_hash;

/// How many of the least recently used values eviction looks through for one whose disk copy
/// is complete before it takes the oldest anyway.
const VICTIM_SEARCH: usize = 64;

/// Bytes of the header at the start of every block, before the value.
pub const BLOCK_HEADER: u64 = 24;

/// The header of a block that holds write `stamp`: what a reader must find just before the
/// value (a cleared header is all zeros). The third word is a hash of the first two, so a
/// block never written since its memory was mapped does not read as a header.
pub fn block_header(stamp: Stamp) -> [u8; BLOCK_HEADER as usize] {
    let mut header = [0u8; BLOCK_HEADER as usize];
    header[..8].copy_from_slice(&stamp.clock.to_le_bytes());
    header[8..16].copy_from_slice(&stamp.writer.to_le_bytes());
    let check = stable_hash(&header[..16]) ^ HEADER_TAG;
    header[16..].copy_from_slice(&check.to_le_bytes());
    header
}

/// Mixed into a header's check word, so an all-zero block never checks.
const HEADER_TAG: u64 = 0x6d6f_6f72_696e_6731;

/// A value in the pool (or, non-resident, only on the peer's disk).
#[derive(Clone, Debug)]
struct PoolEntry {
    /// Its block, while resident.
    block: Option<Allocation>,
    len: u64,
    stamp: Stamp,
    checksum: Checksum,
    /// Its place in least-recently-used order (last access, then a serial).
    order: (Millis, u64),
    pinned: bool,
    /// Whether to keep a copy on disk (the tier is on and the disk had room).
    wants_disk: bool,
}

/// A change the driver owes a block's header (see the module's note on headers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderWrite {
    /// The block at this offset holds no value any more.
    Clear(u64),
    /// The block at `offset` holds `key`'s write `stamp`.
    Write {
        /// The block's offset.
        offset: u64,
        /// The key.
        key: Box<str>,
        /// The write.
        stamp: Stamp,
    },
}

/// A value the pool let go of to make room: its directory entry must be updated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evicted {
    /// The key.
    pub key: Box<str>,
    /// The write evicted.
    pub stamp: Stamp,
    /// Its disk copy stays: re-publish it as non-resident rather than unpublish it.
    pub kept_on_disk: bool,
}

/// What a store or a promote did: where the value is, and what went to make room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The value's location, to publish.
    pub location: Location,
    /// What was evicted for it, in eviction order.
    pub evicted: Vec<Evicted>,
}

/// Why a value found no room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolFull {
    /// What was evicted trying (each still needs its directory update).
    pub evicted: Vec<Evicted>,
    /// The bytes asked for.
    pub wanted: u64,
}

/// One peer's published pool.
#[derive(Clone, Debug)]
pub struct PublishedPool {
    name: Box<str>,
    writer: u64,
    allocator: OffsetAllocator,
    entries: HashMap<Box<str>, PoolEntry>,
    /// Resident, unpinned entries by least-recently-used order: eviction's candidates.
    lru: BTreeMap<(Millis, u64), Box<str>>,
    serial: u64,
    /// The hybrid clock stamps come from.
    clock: u64,
    /// Freed blocks and when they may be reused.
    quarantine: VecDeque<(Millis, Allocation)>,
    read_grace: Millis,
    /// Header writes the driver owes since it last asked, in order.
    headers: Vec<HeaderWrite>,
    /// The disk tier's books.
    disk: DiskShelf,
    /// Values lost since the last [`PublishedPool::take_lost`]: only their disk copy held
    /// them, and it went (made room, or could not be read).
    lost: Vec<Evicted>,
}

/// How a promote went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Promotion {
    /// The pool does not hold the key (or only held it on a disk that lost it).
    Absent,
    /// The value is in memory.
    Resident(Location),
    /// Another operation on the key's disk copy is in flight: ask again shortly.
    Busy,
    /// Read the disk copy of write `stamp` (`len` bytes) into the block at `offset` (value
    /// after its header), then report with [`PublishedPool::promoted`].
    Load {
        /// The write.
        stamp: Stamp,
        /// The block's offset.
        offset: u64,
        /// The value's length.
        len: u64,
        /// The value's checksum, for the bytes read.
        checksum: Checksum,
        /// What was evicted to make room.
        evicted: Vec<Evicted>,
    },
    /// No room: everything else is pinned or loading.
    Full(PoolFull),
}

impl PublishedPool {
    /// The pool of peer `name`, `capacity` bytes; freed blocks wait `read_grace` for readers.
    pub fn new(name: &str, capacity: u64, read_grace: Millis) -> PublishedPool {
        PublishedPool {
            name: name.into(),
            writer: stable_hash(name.as_bytes()),
            allocator: OffsetAllocator::new(capacity),
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            serial: 0,
            clock: 0,
            quarantine: VecDeque::new(),
            read_grace,
            headers: Vec::new(),
            disk: DiskShelf::new(0),
            lost: Vec::new(),
        }
    }

    /// The same pool with a disk tier of `capacity` bytes (0: none).
    pub fn with_disk(mut self, capacity: u64) -> PublishedPool {
        self.disk = DiskShelf::new(capacity);
        self
    }

    /// The disk tier's books.
    pub fn disk(&self) -> &DiskShelf {
        &self.disk
    }

    /// How many values it holds (resident or on disk).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes allocated (values and blocks waiting for reuse).
    pub fn used_bytes(&self) -> u64 {
        self.allocator.used_bytes()
    }

    /// A stamp for a write at `now`: later than every stamp this pool gave or saw.
    pub fn next_stamp(&mut self, now: Millis) -> Stamp {
        self.clock = (self.clock + 1).max(now.0);
        Stamp {
            clock: self.clock,
            writer: self.writer,
        }
    }

    /// Keeps the clock ahead of a stamp seen elsewhere (a directory's newer entry).
    pub fn observe(&mut self, stamp: Stamp) {
        self.clock = self.clock.max(stamp.clock);
    }

    /// Places a new value of `key`, `len` bytes with `checksum`, written at `now`, evicting
    /// the least recently used unpinned values as needed. A value it replaces is freed.
    pub fn store(
        &mut self,
        key: &str,
        len: u64,
        checksum: Checksum,
        now: Millis,
    ) -> Result<Placed, PoolFull> {
        self.release_due(now);
        let old = self.entries.get(key).map(|e| (e.order, e.pinned));
        if let Some((order, _)) = old {
            self.lru.remove(&order);
        }
        let (block, evicted) = match self.allocate(len) {
            Ok(placed) => placed,
            Err(full) => {
                if let Some((order, false)) = old
                    && self.entries.get(key).is_some_and(|e| e.block.is_some())
                {
                    self.lru.insert(order, key.into());
                }
                return Err(full);
            }
        };
        let stamp = self.next_stamp(now);
        let pinned = old.is_some_and(|(_, pinned)| pinned);
        if let Some(replaced) = self.entries.remove(key)
            && let Some(block) = replaced.block
        {
            self.headers.push(HeaderWrite::Clear(block.offset));
            self.quarantine.push_back((now + self.read_grace, block));
        }
        let order = self.next_order(now);
        self.entries.insert(
            key.into(),
            PoolEntry {
                block: Some(block),
                len,
                stamp,
                checksum,
                order,
                pinned,
                wants_disk: self.disk.enabled(),
            },
        );
        if !pinned {
            self.lru.insert(order, key.into());
        }
        for gone in &evicted {
            self.settle_disk(&gone.key);
        }
        self.settle_disk(key);
        Ok(Placed {
            location: self.location(key).expect("just stored"),
            evicted,
        })
    }

    /// The location of `key` (resident or not), counting as an access at `now` if resident.
    pub fn read(&mut self, key: &str, now: Millis) -> Option<Location> {
        let entry = self.entries.get(key)?;
        if entry.block.is_some() && !entry.pinned {
            let old = entry.order;
            let order = self.next_order(now);
            let key: Box<str> = self.lru.remove(&old).unwrap_or_else(|| key.into());
            self.entries.get_mut(&*key).expect("entry").order = order;
            self.lru.insert(order, key.clone());
            return self.location(&key);
        }
        self.location(key)
    }

    /// Starts bringing a non-resident value back from disk (a reader asked): sets a block
    /// aside for the disk copy. A resident value is only read (an access at `now`).
    pub fn promote(&mut self, key: &str, now: Millis) -> Promotion {
        let Some(entry) = self.entries.get(key) else {
            return Promotion::Absent;
        };
        if entry.block.is_some() {
            return match self.read(key, now) {
                Some(location) => Promotion::Resident(location),
                None => Promotion::Absent,
            };
        }
        if self.disk.is_busy(key) {
            return Promotion::Busy;
        }
        let (stamp, len, checksum) = (entry.stamp, entry.len, entry.checksum);
        if !self.disk.holds(key, stamp) {
            return Promotion::Absent;
        }
        self.release_due(now);
        match self.allocate(len) {
            Ok((block, evicted)) => {
                self.disk.start_read(key, stamp, block);
                for gone in &evicted {
                    self.settle_disk(&gone.key);
                }
                Promotion::Load {
                    stamp,
                    offset: block.offset,
                    len,
                    checksum,
                    evicted,
                }
            }
            Err(full) => {
                for gone in &full.evicted {
                    self.settle_disk(&gone.key);
                }
                Promotion::Full(full)
            }
        }
    }

    /// The promote of `key`'s write `stamp` ended: `ok` if the disk copy's bytes (checked)
    /// are in the block, value then header. Returns the value's location to publish, or
    /// `None` (the value was dropped meanwhile, or its copy could not be read: then it is
    /// lost, see [`PublishedPool::take_lost`]). The block's header is owed either way.
    pub fn promoted(&mut self, key: &str, stamp: Stamp, ok: bool, now: Millis) -> Option<Location> {
        let block = self.disk.end_read(key, stamp)?;
        let entry = self
            .entries
            .get_mut(key)
            .filter(|e| e.stamp == stamp && e.block.is_none());
        let location = match entry {
            Some(entry) if ok => {
                entry.block = Some(block);
                let pinned = entry.pinned;
                let order = self.next_order(now);
                self.entries.get_mut(key).expect("entry").order = order;
                if !pinned {
                    self.lru.insert(order, key.into());
                }
                self.headers.push(HeaderWrite::Write {
                    offset: block.offset,
                    key: key.into(),
                    stamp,
                });
                self.location(key)
            }
            _ => {
                self.headers.push(HeaderWrite::Clear(block.offset));
                self.quarantine.push_back((now + self.read_grace, block));
                if !ok && self.entries.get(key).is_some_and(|e| e.stamp == stamp) {
                    // An unreadable copy was the value's only one.
                    self.entries.remove(key);
                    self.lost.push(Evicted {
                        key: key.into(),
                        stamp,
                        kept_on_disk: false,
                    });
                }
                None
            }
        };
        self.settle_disk(key);
        location
    }

    /// Where the driver copies `key`'s write `stamp` to disk from: the value's offset in
    /// the pool and its length, while it is resident.
    pub fn disk_source(&self, key: &str, stamp: Stamp) -> Option<(u64, u64)> {
        let entry = self.entries.get(key).filter(|e| e.stamp == stamp)?;
        Some((entry.block?.offset + BLOCK_HEADER, entry.len))
    }

    /// The disk operation in flight on `key` (a write or deletion of write `stamp`) ended;
    /// `ok` if it took effect. The key's next operation, if any, is owed after it.
    pub fn disk_finished(&mut self, key: &str, stamp: Stamp, ok: bool) {
        self.disk.finished(key, stamp, ok);
        if !ok && let Some(entry) = self.entries.get_mut(key).filter(|e| e.stamp == stamp) {
            // Not tried again: the value lives in memory only.
            entry.wants_disk = false;
        }
        self.settle_disk(key);
    }

    /// The disk operations owed since the last call, in order.
    pub fn take_disk_work(&mut self) -> Vec<DiskWork> {
        self.disk.take_work()
    }

    /// Values lost since the last call (only their disk copy held them, and it went): their
    /// entries must be unpublished.
    pub fn take_lost(&mut self) -> Vec<Evicted> {
        std::mem::take(&mut self.lost)
    }

    /// Brings `key`'s disk copy in line with its value, if no operation is in flight on it:
    /// a resident value that wants a copy gets one written; a copy no value wants is deleted.
    fn settle_disk(&mut self, key: &str) {
        if !self.disk.enabled() || self.disk.is_busy(key) {
            return;
        }
        let wanted = self
            .entries
            .get(key)
            .map(|e| (e.stamp, e.len, e.wants_disk, e.block.is_some()));
        if let Some((stamp, len, true, true)) = wanted
            && !self.disk.holds(key, stamp)
        {
            match self.disk.start_write(key, stamp, len) {
                Some(victims) => {
                    for (victim, copy) in victims {
                        self.disk_victim(&victim, copy);
                    }
                    return;
                }
                None => self.entries.get_mut(key).expect("entry").wants_disk = false,
            }
        }
        if self
            .disk
            .held_stamp(key)
            .is_some_and(|held| wanted.is_none_or(|(stamp, ..)| stamp != held))
        {
            self.disk.start_delete(key);
        }
    }

    /// `key`'s copy of write `stamp` was deleted to make room: a value only that copy held is
    /// lost; a resident one stays in memory, and is not written again.
    fn disk_victim(&mut self, key: &str, stamp: Stamp) {
        let Some(entry) = self.entries.get_mut(key).filter(|e| e.stamp == stamp) else {
            return;
        };
        entry.wants_disk = false;
        if entry.block.is_none() {
            self.entries.remove(key);
            self.lost.push(Evicted {
                key: key.into(),
                stamp,
                kept_on_disk: false,
            });
        }
    }

    /// Drops `key`'s write `stamp` (removed, or superseded by another peer's newer write);
    /// its block waits the read grace. Returns whether the pool held that write.
    pub fn drop_value(&mut self, key: &str, stamp: Stamp, now: Millis) -> bool {
        if self.entries.get(key).is_none_or(|e| e.stamp != stamp) {
            return false;
        }
        let entry = self.entries.remove(key).expect("checked");
        self.lru.remove(&entry.order);
        if let Some(block) = entry.block {
            self.headers.push(HeaderWrite::Clear(block.offset));
            self.quarantine.push_back((now + self.read_grace, block));
        }
        self.settle_disk(key);
        true
    }

    /// Pins or unpins `key`: a pinned value is never evicted. Returns whether it is held.
    pub fn set_pinned(&mut self, key: &str, pinned: bool) -> bool {
        let Some(entry) = self.entries.get_mut(key) else {
            return false;
        };
        if entry.pinned != pinned && entry.block.is_some() {
            if pinned {
                self.lru.remove(&entry.order);
            } else {
                self.lru.insert(entry.order, key.into());
            }
        }
        entry.pinned = pinned;
        true
    }

    /// Every value's location, for re-publishing to the owners of a changed ring.
    pub fn locations(&self) -> Vec<(Box<str>, Location)> {
        let mut all: Vec<_> = self
            .entries
            .keys()
            .map(|key| (key.clone(), self.location(key).expect("held")))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The header writes owed since the last call, in order: clear the headers of blocks
    /// whose value ended (evicted, dropped, replaced), so readers of stale entries find no
    /// value there, and rewrite those of values stamped again.
    pub fn take_header_writes(&mut self) -> Vec<HeaderWrite> {
        std::mem::take(&mut self.headers)
    }

    /// Stamps `key`'s write `stamp` again, above `newer` (its first publish met a newer
    /// stamp that is not newer in fact: another peer's clock ran ahead). Returns the new
    /// location, or `None` if the pool no longer holds that write.
    pub fn restamp(
        &mut self,
        key: &str,
        stamp: Stamp,
        newer: Stamp,
        now: Millis,
    ) -> Option<Location> {
        let entry = self.entries.get(key).filter(|e| e.stamp == stamp)?;
        if entry.block.is_none() {
            // Only on disk, under the old stamp: its copy cannot be stamped again.
            self.drop_value(key, stamp, now);
            return None;
        }
        self.observe(newer);
        let fresh = self.next_stamp(now);
        let entry = self.entries.get_mut(key).expect("checked");
        entry.stamp = fresh;
        if let Some(block) = entry.block {
            self.headers.push(HeaderWrite::Write {
                offset: block.offset,
                key: key.into(),
                stamp: fresh,
            });
        }
        self.settle_disk(key);
        self.location(key)
    }

    /// Frees the blocks whose read grace ended by `now`.
    pub fn release_due(&mut self, now: Millis) {
        while let Some(&(due, block)) = self.quarantine.front() {
            if due > now {
                break;
            }
            self.quarantine.pop_front();
            let freed = self.allocator.free(block);
            debug_assert!(freed, "a quarantined block was not live");
        }
    }

    /// Checks the pool's own bookkeeping: every resident value's block and every waiting
    /// block allocated, nothing else; eviction's order holds exactly the resident unpinned
    /// values.
    pub fn check(&self) -> Result<(), String> {
        let used = self.allocator.check()?;
        let used: Vec<(u32, u64, u64)> = used.into_iter().map(|(o, l)| (0, o, l)).collect();
        fn claim(block: Allocation, owner: &str) -> (u32, u64, u64, &str) {
            (0, block.offset, block.len, owner)
        }
        let mut claims: Vec<(u32, u64, u64, &str)> = self
            .entries
            .iter()
            .filter_map(|(key, e)| e.block.map(|b| claim(b, key)))
            .chain(
                self.quarantine
                    .iter()
                    .map(|&(_, b)| claim(b, "a block in its read grace")),
            )
            .chain(self.disk.reading().map(|b| claim(b, "a read from disk")))
            .collect();
        claims.sort_unstable_by_key(|c| c.1);
        check_ownership(&used, &claims).map_err(|fault| format!("the pool's blocks: {fault:?}"))?;
        for (key, entry) in &self.entries {
            if entry.block.is_none() && !self.disk.holds(key, entry.stamp) {
                return Err(format!("{key:?} is neither in memory nor on disk"));
            }
        }
        for (key, stamp) in self.disk.copies() {
            let wanted = self.entries.get(key).is_some_and(|e| e.stamp == stamp);
            if !wanted && !self.disk.is_busy(key) {
                return Err(format!(
                    "the disk keeps {key:?}'s write {stamp:?}, which no value wants"
                ));
            }
        }
        self.disk.check()?;
        let candidates = self
            .entries
            .values()
            .filter(|e| e.block.is_some() && !e.pinned)
            .count();
        if candidates != self.lru.len() {
            return Err(format!(
                "{candidates} evictable values, {} in eviction order",
                self.lru.len()
            ));
        }
        for (order, key) in &self.lru {
            if self.entries.get(key).is_none_or(|e| e.order != *order) {
                return Err(format!("eviction order names {key:?} out of place"));
            }
        }
        Ok(())
    }

    fn next_order(&mut self, now: Millis) -> (Millis, u64) {
        self.serial += 1;
        (now, self.serial)
    }

    /// The location of `key`'s value, resident or not, without counting an access.
    pub fn location(&self, key: &str) -> Option<Location> {
        let entry = self.entries.get(key)?;
        Some(Location {
            peer: self.name.clone(),
            offset: entry.block.map_or(0, |b| b.offset),
            len: entry.len,
            stamp: entry.stamp,
            checksum: entry.checksum,
            resident: entry.block.is_some(),
        })
    }

    /// The next value eviction takes: the least recently used one that loses nothing by
    /// going (its disk copy is complete, or it will never have one) among the oldest
    /// [`VICTIM_SEARCH`], else the least recently used of all. A value whose copy is still
    /// being written would otherwise be dropped only because eviction came before the disk.
    fn next_victim(&self) -> Option<(Millis, u64)> {
        let awaits_copy = |key: &str| {
            self.entries.get(key).is_some_and(|e| {
                self.disk.enabled() && e.wants_disk && !self.disk.holds(key, e.stamp)
            })
        };
        self.lru
            .iter()
            .take(VICTIM_SEARCH)
            .find(|(_, key)| !awaits_copy(key))
            .or_else(|| self.lru.first_key_value())
            .map(|(order, _)| *order)
    }

    /// A block of `len` bytes, evicting least recently used unpinned values until one fits.
    fn allocate(&mut self, len: u64) -> Result<(Allocation, Vec<Evicted>), PoolFull> {
        let mut evicted = Vec::new();
        loop {
            if let Some(block) = self.allocator.allocate(len + BLOCK_HEADER) {
                return Ok((block, evicted));
            }
            let Some(order) = self.next_victim() else {
                return Err(PoolFull {
                    evicted,
                    wanted: len,
                });
            };
            let key = self
                .lru
                .remove(&order)
                .expect("the victim is in eviction order");
            let entry = self
                .entries
                .get_mut(&key)
                .expect("an evictable value is held");
            let block = entry.block.take().expect("an evictable value is resident");
            // Its block is freed now: a reader mid-read meets a checksum mismatch at worst.
            // Waiting would let a full pool refuse writes it could serve.
            self.headers.push(HeaderWrite::Clear(block.offset));
            let freed = self.allocator.free(block);
            debug_assert!(freed);
            let stamp = entry.stamp;
            let kept_on_disk = self.disk.holds(&key, stamp);
            if !kept_on_disk {
                self.entries.remove(&key);
            }
            evicted.push(Evicted {
                key,
                stamp,
                kept_on_disk,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    fn pool() -> PublishedPool {
        PublishedPool::new("peer-a", 64 * KIB, Millis(100))
    }

    #[test]
    fn a_store_evicts_the_least_recently_used_and_keeps_pinned_values() {
        let mut pool = pool();
        for (i, key) in ["a", "b", "c", "d"].iter().enumerate() {
            let placed = pool
                .store(key, 16 * KIB - BLOCK_HEADER, Checksum(1), Millis(i as u64))
                .unwrap();
            assert!(placed.evicted.is_empty());
            assert_eq!(*placed.location.peer, *"peer-a");
        }
        pool.read("a", Millis(10)); // a is now the most recent
        pool.set_pinned("b", true);
        let placed = pool
            .store("e", 16 * KIB - BLOCK_HEADER, Checksum(2), Millis(11))
            .unwrap();
        let gone: Vec<_> = placed.evicted.iter().map(|e| &*e.key).collect();
        assert_eq!(gone, ["c"], "b is pinned, a was read");
        assert!(!placed.evicted[0].kept_on_disk);
        assert!(pool.read("c", Millis(12)).is_none());
        pool.check().unwrap();
    }

    #[test]
    fn an_evicted_value_with_a_disk_copy_stays_non_resident_and_is_promoted_back() {
        let mut pool = pool().with_disk(128 * KIB);
        let value = 32 * KIB - BLOCK_HEADER;
        let a = pool.store("a", value, Checksum(1), Millis(0)).unwrap();
        let a = a.location.stamp;
        let written = pool.take_disk_work();
        assert_eq!(
            written,
            [DiskWork::Write {
                key: "a".into(),
                stamp: a,
                len: value
            }]
        );
        assert_eq!(pool.disk_source("a", a), Some((BLOCK_HEADER, value)));
        pool.disk_finished("a", a, true);
        // b's copy is still being written when c's store evicts a, then b.
        pool.store("b", value, Checksum(1), Millis(1)).unwrap();
        let placed = pool.store("c", value, Checksum(1), Millis(2)).unwrap();
        assert_eq!(
            placed.evicted,
            [Evicted {
                key: "a".into(),
                stamp: a,
                kept_on_disk: true
            }]
        );
        let location = pool.read("a", Millis(3)).unwrap();
        assert!(!location.resident);
        let Promotion::Load { stamp, evicted, .. } = pool.promote("a", Millis(4)) else {
            panic!("a's copy is on disk");
        };
        assert_eq!(stamp, a, "the same write");
        assert_eq!(evicted.len(), 1, "b made room");
        assert!(!evicted[0].kept_on_disk, "b's copy was not complete");
        assert_eq!(
            pool.promote("a", Millis(4)),
            Promotion::Busy,
            "a is loading"
        );
        pool.check().unwrap();
        let promoted = pool.promoted("a", a, true, Millis(5)).unwrap();
        assert!(promoted.resident);
        assert_eq!(promoted.stamp, a);
        // b's copy, complete at last, belongs to no value: it is deleted.
        pool.take_disk_work();
        let b = Stamp {
            clock: a.clock + 1,
            ..a
        };
        pool.disk_finished("b", b, true);
        assert_eq!(
            pool.take_disk_work(),
            [DiskWork::Delete {
                key: "b".into(),
                stamp: b
            }]
        );
        pool.check().unwrap();
        assert_eq!(pool.promote("zzz", Millis(5)), Promotion::Absent);
    }

    #[test]
    fn eviction_passes_over_a_value_whose_copy_is_still_being_written() {
        let mut pool = pool().with_disk(128 * KIB);
        let value = 32 * KIB - BLOCK_HEADER;
        let a = pool.store("a", value, Checksum(1), Millis(0)).unwrap();
        let b = pool.store("b", value, Checksum(2), Millis(1)).unwrap();
        pool.take_disk_work();
        // b's copy is complete, a's is still being written: c's store takes b, though a is
        // older, and keeps it on disk; dropping a would lose it.
        pool.disk_finished("b", b.location.stamp, true);
        let placed = pool.store("c", value, Checksum(3), Millis(2)).unwrap();
        assert_eq!(
            placed.evicted,
            [Evicted {
                key: "b".into(),
                stamp: b.location.stamp,
                kept_on_disk: true
            }]
        );
        assert!(pool.location("a").unwrap().resident);
        // With no complete copy left to take, the oldest goes all the same: a store is never
        // refused for want of a finished copy.
        let placed = pool.store("d", value, Checksum(4), Millis(4)).unwrap();
        assert_eq!(placed.evicted.len(), 1);
        assert_eq!(&*placed.evicted[0].key, "a");
        assert!(!placed.evicted[0].kept_on_disk);
        pool.disk_finished("a", a.location.stamp, true);
        pool.check().unwrap();
    }

    #[test]
    fn a_copy_that_cannot_be_read_loses_its_value_and_is_deleted() {
        let mut pool = pool().with_disk(128 * KIB);
        let value = 64 * KIB - BLOCK_HEADER;
        let a = pool.store("a", value, Checksum(1), Millis(0)).unwrap();
        let a = a.location.stamp;
        pool.disk_finished("a", a, true);
        pool.store("b", value, Checksum(1), Millis(1)).unwrap();
        pool.set_pinned("b", true);
        // b is pinned and fills the pool: no room to promote a.
        assert!(matches!(pool.promote("a", Millis(2)), Promotion::Full(_)));
        pool.drop_value("b", pool.location("b").unwrap().stamp, Millis(2));
        let Promotion::Load { stamp, .. } = pool.promote("a", Millis(200)) else {
            panic!("b's block is free");
        };
        assert_eq!(pool.promoted("a", stamp, false, Millis(201)), None);
        assert_eq!(
            pool.take_lost(),
            [Evicted {
                key: "a".into(),
                stamp: a,
                kept_on_disk: false
            }]
        );
        assert!(pool.take_disk_work().contains(&DiskWork::Delete {
            key: "a".into(),
            stamp: a
        }));
        assert!(pool.location("a").is_none());
        pool.check().unwrap();
    }

    #[test]
    fn freed_blocks_wait_for_readers_and_a_full_pool_says_what_it_evicted() {
        let mut pool = pool();
        let first = pool
            .store("a", 64 * KIB - BLOCK_HEADER, Checksum(1), Millis(0))
            .unwrap();
        assert!(pool.drop_value("a", first.location.stamp, Millis(0)));
        assert!(
            !pool.drop_value("a", first.location.stamp, Millis(0)),
            "already gone"
        );
        // The block waits its read grace: no room before it ends.
        let full = pool
            .store("b", 64 * KIB - BLOCK_HEADER, Checksum(1), Millis(50))
            .unwrap_err();
        assert!(full.evicted.is_empty());
        pool.check().unwrap();
        assert!(
            pool.store("b", 64 * KIB - BLOCK_HEADER, Checksum(1), Millis(100))
                .is_ok()
        );
        pool.set_pinned("b", true);
        let full = pool.store("c", KIB, Checksum(1), Millis(101)).unwrap_err();
        assert_eq!(full.wanted, KIB);
        pool.check().unwrap();
    }

    #[test]
    fn stamps_only_move_forward_and_overtake_what_was_seen() {
        let mut pool = pool();
        let a = pool.next_stamp(Millis(10));
        let b = pool.next_stamp(Millis(5));
        assert!(b > a, "a clock that went back still moves forward");
        pool.observe(Stamp {
            clock: 1_000,
            writer: 1,
        });
        assert!(pool.next_stamp(Millis(20)).clock > 1_000);
        // A rewrite of a key supersedes its own value.
        let first = pool.store("k", KIB, Checksum(1), Millis(30)).unwrap();
        let second = pool.store("k", KIB, Checksum(2), Millis(30)).unwrap();
        assert!(second.location.stamp > first.location.stamp);
        assert_eq!(pool.len(), 1);
        assert_eq!(pool.locations().len(), 1);
        pool.check().unwrap();
    }
}
