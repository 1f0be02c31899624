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

use crate::allocator::{Allocation, OffsetAllocator};
use crate::checksum::Checksum;
use crate::time::Millis;

use super::directory::{Location, Stamp};
use super::ring::stable_hash;

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
    on_disk: bool,
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
    quarantine: VecDeque<(Millis, u32)>,
    read_grace: Millis,
    /// Header writes the driver owes since it last asked, in order.
    headers: Vec<HeaderWrite>,
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
        }
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
            self.quarantine
                .push_back((now + self.read_grace, block.node));
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
                on_disk: false,
            },
        );
        if !pinned {
            self.lru.insert(order, key.into());
        }
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

    /// Brings a non-resident value back from disk into the pool (the caller then reads the
    /// disk copy into the block and re-publishes the location). A resident one is only read.
    /// `None` if the pool does not hold `key`.
    pub fn promote(&mut self, key: &str, now: Millis) -> Option<Result<Placed, PoolFull>> {
        let entry = self.entries.get(key)?;
        if entry.block.is_some() {
            let location = self.read(key, now)?;
            return Some(Ok(Placed {
                location,
                evicted: Vec::new(),
            }));
        }
        let len = entry.len;
        self.release_due(now);
        Some(self.allocate(len).map(|(block, evicted)| {
            let order = self.next_order(now);
            let entry = self.entries.get_mut(key).expect("entry");
            entry.block = Some(block);
            entry.order = order;
            if !entry.pinned {
                self.lru.insert(order, key.into());
            }
            Placed {
                location: self.location(key).expect("promoted"),
                evicted,
            }
        }))
    }

    /// Records that `key`'s write `stamp` is now on disk too (write-through finished).
    pub fn disk_written(&mut self, key: &str, stamp: Stamp) {
        if let Some(entry) = self.entries.get_mut(key)
            && entry.stamp == stamp
        {
            entry.on_disk = true;
        }
    }

    /// Records that the disk let go of `key`'s write `stamp`; if that was its only copy, the
    /// value is gone and its entry must be unpublished (returned).
    pub fn disk_dropped(&mut self, key: &str, stamp: Stamp) -> Option<Evicted> {
        let entry = self.entries.get_mut(key)?;
        if entry.stamp != stamp {
            return None;
        }
        entry.on_disk = false;
        if entry.block.is_some() {
            return None;
        }
        self.entries.remove(key);
        Some(Evicted {
            key: key.into(),
            stamp,
            kept_on_disk: false,
        })
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
            self.quarantine
                .push_back((now + self.read_grace, block.node));
        }
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
        if self.entries.get(key).is_none_or(|e| e.stamp != stamp) {
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
        self.location(key)
    }

    /// Frees the blocks whose read grace ended by `now`.
    pub fn release_due(&mut self, now: Millis) {
        while let Some(&(due, node)) = self.quarantine.front() {
            if due > now {
                break;
            }
            self.quarantine.pop_front();
            let freed = self.allocator.free(node);
            debug_assert!(freed, "a quarantined block was not live");
        }
    }

    /// Checks the pool's own bookkeeping: every resident value's block and every waiting
    /// block allocated, nothing else; eviction's order holds exactly the resident unpinned
    /// values.
    pub fn check(&self) -> Result<(), String> {
        let resident: u64 = self
            .entries
            .values()
            .filter_map(|e| e.block.map(|b| self.allocator.allocation(b.node)))
            .map(|a| a.map_or(u64::MAX, |(_, size)| size))
            .sum();
        let waiting: u64 = self
            .quarantine
            .iter()
            .map(|&(_, node)| self.allocator.allocation(node).map_or(0, |(_, size)| size))
            .sum();
        if resident.saturating_add(waiting) != self.allocator.used_bytes() {
            return Err(format!(
                "{resident} bytes resident and {waiting} waiting, but {} allocated",
                self.allocator.used_bytes()
            ));
        }
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

    /// A block of `len` bytes, evicting least recently used unpinned values until one fits.
    fn allocate(&mut self, len: u64) -> Result<(Allocation, Vec<Evicted>), PoolFull> {
        let mut evicted = Vec::new();
        loop {
            if let Some(block) = self.allocator.allocate(len + BLOCK_HEADER) {
                return Ok((block, evicted));
            }
            let Some((_, key)) = self.lru.pop_first() else {
                return Err(PoolFull {
                    evicted,
                    wanted: len,
                });
            };
            let entry = self
                .entries
                .get_mut(&key)
                .expect("an evictable value is held");
            let block = entry.block.take().expect("an evictable value is resident");
            // Its block is freed now: a reader mid-read meets a checksum mismatch at worst.
            // Waiting would let a full pool refuse writes it could serve.
            self.headers.push(HeaderWrite::Clear(block.offset));
            let freed = self.allocator.free(block.node);
            debug_assert!(freed);
            let kept_on_disk = entry.on_disk;
            let stamp = entry.stamp;
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
        let mut pool = pool();
        let placed = pool
            .store("a", 32 * KIB - BLOCK_HEADER, Checksum(1), Millis(0))
            .unwrap();
        pool.disk_written("a", placed.location.stamp);
        pool.store("b", 32 * KIB - BLOCK_HEADER, Checksum(1), Millis(1))
            .unwrap();
        let placed = pool
            .store("c", 32 * KIB - BLOCK_HEADER, Checksum(1), Millis(2))
            .unwrap();
        assert_eq!(
            placed.evicted,
            [Evicted {
                key: "a".into(),
                stamp: pool.read("a", Millis(2)).unwrap().stamp,
                kept_on_disk: true
            }]
        );
        let location = pool.read("a", Millis(3)).unwrap();
        assert!(!location.resident);
        let promoted = pool.promote("a", Millis(4)).unwrap().unwrap();
        assert!(promoted.location.resident);
        assert_eq!(promoted.location.stamp, location.stamp, "the same write");
        assert_eq!(promoted.evicted.len(), 1, "b made room");
        pool.check().unwrap();
        // A disk that drops the copy of a non-resident value loses it.
        let b = &promoted.evicted[0];
        assert!(
            pool.disk_dropped(&b.key, b.stamp).is_none(),
            "b had no disk copy"
        );
        assert!(pool.promote("zzz", Millis(5)).is_none());
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
