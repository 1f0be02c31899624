//! A storage node's half of the SSD tier, as a pure state value: which copies its disk holds,
//! which go when the disk is full, when an evicted or removed copy may be deleted, and what
//! the node owes the master in its next disk sync. The node's adapter moves the bytes and
//! drives this with what happened; every decision is here, where tests and the reference
//! model reach it.
//!
//! Deletion is two-phase (docs/ssd-tier.md): a copy tombstoned, found damaged, or evicted once
//! the master has been told leaves the index (no new reader finds it), and its file is deleted
//! only once every read already in progress has finished ([`DiskCopies::readers_left`]). A
//! deletion that fails is retried until it succeeds: the master has forgotten the copy, so it
//! must not come back after a restart. An eviction victim stays readable while the master is
//! being told: the master still lists it until then, and a reader it sent there must not be
//! told the copy is gone when, if the master cannot be told, it is not.

use std::collections::BTreeMap;

use crate::checksum::Checksum;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::WriteId;

/// Which copies disk eviction takes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskEvictionOrder {
    /// The oldest written.
    Fifo,
    /// The least recently read (never-read copies first, oldest written among them).
    Lru,
}

/// One copy on the node's disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCopy {
    /// The write of the key it holds.
    pub version: u64,
    /// The value's length.
    pub size: u64,
    /// The value's checksum, reported to the master with a recovered copy.
    pub checksum: Checksum,
    /// The eviction unit it belongs to (a bucket): evicted whole.
    pub unit: u64,
    /// Write order (FIFO).
    written: u64,
    /// Last read (LRU); 0 if never read.
    read: u64,
    /// Reads in progress.
    readers: u32,
}

/// A read of a copy in progress; hand it back to [`DiskCopies::end_read`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a read that never ends holds its copy's deletion back"]
pub struct ReadTicket {
    key: String,
    version: u64,
}

/// What a node's disk holds, and its deletions in progress.
#[derive(Clone, Debug, Default)]
pub struct DiskCopies {
    entries: BTreeMap<String, DiskCopy>,
    bytes: u64,
    /// A logical clock for FIFO and LRU order.
    tick: u64,
    /// Copies out of the index whose files are not deleted yet, with their reads in progress.
    leaving: BTreeMap<(String, u64), u32>,
    /// Deletions that failed, retried at every sync.
    doomed: Vec<(String, u64)>,
    /// Copies found damaged, to report to the master as evicted.
    damaged: Vec<(String, u64)>,
}

impl DiskCopies {
    /// An empty disk.
    pub fn new() -> DiskCopies {
        DiskCopies::default()
    }

    /// Records a copy written (or found by recovery). It replaces any copy of the key.
    pub fn insert(&mut self, key: String, version: u64, size: u64, checksum: Checksum, unit: u64) {
        self.tick += 1;
        let copy = DiskCopy {
            version,
            size,
            checksum,
            unit,
            written: self.tick,
            read: 0,
            readers: 0,
        };
        if let Some(old) = self.entries.insert(key, copy) {
            self.bytes -= old.size;
        }
        self.bytes += size;
    }

    /// The copy of `key`, if the disk holds one.
    pub fn get(&self, key: &str) -> Option<&DiskCopy> {
        self.entries.get(key)
    }

    /// Copies on disk and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        (self.entries.len(), self.bytes)
    }

    /// Every copy, as a recovery report to the master: (key, write, size, checksum).
    pub fn report(&self) -> Vec<(String, WriteId, u64, Checksum)> {
        self.entries
            .iter()
            .map(|(k, c)| (k.clone(), WriteId(c.version), c.size, c.checksum))
            .collect()
    }

    /// Starts a read of `key`'s write `version`, `size` bytes, as the master described it;
    /// counts as a use for LRU order.
    pub fn begin_read(&mut self, key: &str, version: u64, size: u64) -> Result<ReadTicket> {
        self.tick += 1;
        let tick = self.tick;
        let copy = self
            .entries
            .get_mut(key)
            .filter(|c| c.size == size && c.version == version)
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::OBJECT_NOT_FOUND,
                    format!(
                        "this node has no disk copy of write {version} of {key:?} (evicted or replaced)"
                    ),
                )
            })?;
        copy.read = tick;
        copy.readers += 1;
        Ok(ReadTicket {
            key: key.to_string(),
            version,
        })
    }

    /// Ends a read, wherever its copy is now (still held, or leaving).
    pub fn end_read(&mut self, ticket: ReadTicket) {
        let ReadTicket { key, version } = ticket;
        if let Some(copy) = self.entries.get_mut(&key).filter(|c| c.version == version) {
            copy.readers = copy.readers.saturating_sub(1);
        } else if let Some(readers) = self.leaving.get_mut(&(key, version)) {
            *readers = readers.saturating_sub(1);
        }
    }

    /// Phase one of disk eviction: the copies (key and write) to evict, whole units, least
    /// valuable first, until `need` more bytes fit under `capacity`. They stay in the index,
    /// readable: tell the master, then [`DiskCopies::take_writes`] and delete them once
    /// [`DiskCopies::readers_left`] is zero (or leave them, if the master could not be told).
    pub fn choose_victims(
        &self,
        need: u64,
        capacity: u64,
        order: DiskEvictionOrder,
    ) -> Vec<(String, WriteId)> {
        let mut bytes = self.bytes;
        if bytes + need <= capacity {
            return Vec::new();
        }
        // Per unit: (first written, last read, its keys).
        let mut units: BTreeMap<u64, (u64, u64, Vec<String>)> = BTreeMap::new();
        for (key, c) in &self.entries {
            let unit = units.entry(c.unit).or_insert((u64::MAX, 0, Vec::new()));
            unit.0 = unit.0.min(c.written);
            unit.1 = unit.1.max(c.read);
            unit.2.push(key.clone());
        }
        let mut ranked: Vec<(u64, u64, Vec<String>)> = units.into_values().collect();
        ranked.sort_by_key(|(written, read, _)| match order {
            DiskEvictionOrder::Fifo => (*written, 0),
            DiskEvictionOrder::Lru => (*read, *written),
        });
        let mut victims = Vec::new();
        for (_, _, keys) in ranked {
            if bytes + need <= capacity {
                break;
            }
            for key in keys {
                let copy = &self.entries[&key];
                bytes -= copy.size;
                victims.push((key, WriteId(copy.version)));
            }
        }
        victims
    }

    /// Takes copies out of the index (the master tombstoned them, or was told of their
    /// eviction): a key only if it still holds that write. They are leaving, with their
    /// reads in progress.
    pub fn take_writes(&mut self, writes: &[(String, WriteId)]) -> Vec<(String, DiskCopy)> {
        let mut taken = Vec::new();
        for (key, write) in writes {
            if self.entries.get(key).is_some_and(|c| c.version == write.0) {
                taken.extend(self.take(key));
            }
        }
        taken
    }

    /// Puts leaving copies back (the master could not be told, or their deletion is to be
    /// retried when the master asks again).
    pub fn restore(&mut self, copies: Vec<(String, DiskCopy)>) {
        for (key, mut copy) in copies {
            copy.readers = self
                .leaving
                .remove(&(key.clone(), copy.version))
                .unwrap_or(0);
            self.bytes += copy.size;
            if let Some(newer) = self.entries.insert(key.clone(), copy) {
                // Written again meanwhile: the newer copy stays.
                let older = self.entries.insert(key, newer).expect("just inserted");
                self.bytes -= older.size;
            }
        }
    }

    /// Reads still in progress of a leaving copy: its file may be deleted at zero.
    pub fn readers_left(&self, key: &str, version: u64) -> u32 {
        self.leaving
            .get(&(key.to_string(), version))
            .copied()
            .unwrap_or(0)
    }

    /// The leaving copies' files are deleted (`done`), or their deletion failed and is to be
    /// retried at the next sync.
    pub fn deletion_finished(&mut self, writes: &[(String, u64)], done: bool) {
        for (key, version) in writes {
            self.leaving.remove(&(key.clone(), *version));
        }
        if !done {
            self.doomed.extend(writes.iter().cloned());
        }
    }

    /// Deletions to retry now.
    pub fn take_doomed(&mut self) -> Vec<(String, u64)> {
        std::mem::take(&mut self.doomed)
    }

    /// A copy found damaged is never served again: it leaves the index, is reported to the
    /// master as evicted at the next sync, and is deleted. False if the disk no longer held
    /// that write.
    pub fn forget_damaged(&mut self, key: &str, version: u64) -> bool {
        if self.entries.get(key).is_none_or(|c| c.version != version) {
            return false;
        }
        let (key, copy) = self.take(key).expect("checked");
        self.leaving.remove(&(key.clone(), copy.version));
        self.damaged.push((key.clone(), version));
        self.doomed.push((key, version));
        true
    }

    /// Damaged copies to report to the master as evicted.
    pub fn take_damaged(&mut self) -> Vec<(String, WriteId)> {
        std::mem::take(&mut self.damaged)
            .into_iter()
            .map(|(key, version)| (key, WriteId(version)))
            .collect()
    }

    /// Takes a copy out of the index; it is leaving with its reads in progress.
    fn take(&mut self, key: &str) -> Option<(String, DiskCopy)> {
        let copy = self.entries.remove(key)?;
        self.bytes -= copy.size;
        self.leaving
            .insert((key.to_string(), copy.version), copy.readers);
        Some((key.to_string(), copy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> DiskCopies {
        let mut disk = DiskCopies::new();
        // Units: {a}, {b, c} (one bucket), {d}.
        for (i, (key, unit)) in [("a", 1), ("b", 2), ("c", 2), ("d", 3)].iter().enumerate() {
            disk.insert(key.to_string(), i as u64, 100, Checksum::EMPTY, *unit);
        }
        disk
    }

    fn names<T>(victims: &[(String, T)]) -> Vec<&str> {
        victims.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn victims_follow_the_order_and_go_by_whole_units() {
        let mut read_a = disk();
        let ticket = read_a.begin_read("a", 0, 100).unwrap();
        read_a.end_read(ticket);
        let fifo = read_a.choose_victims(150, 400, DiskEvictionOrder::Fifo);
        assert_eq!(names(&fifo), ["a", "b", "c"], "oldest first, whole units");
        assert_eq!(fifo[2], ("c".to_string(), WriteId(2)));
        let lru = read_a.choose_victims(100, 400, DiskEvictionOrder::Lru);
        assert_eq!(
            names(&lru),
            ["b", "c"],
            "never-read units go before read ones"
        );
        assert!(
            read_a
                .choose_victims(100, 500, DiskEvictionOrder::Lru)
                .is_empty()
        );
        assert_eq!(read_a.usage(), (4, 400));
    }

    #[test]
    fn a_leaving_copy_is_deleted_only_after_its_reads_and_a_failed_deletion_is_retried() {
        let mut disk = disk();
        let reading = disk.begin_read("a", 0, 100).unwrap();
        let victims = disk.choose_victims(100, 400, DiskEvictionOrder::Fifo);
        assert_eq!(names(&victims), ["a"]);
        // Until the master has been told, the victim is still read.
        let second = disk.begin_read("a", 0, 100).unwrap();
        assert_eq!(names(&disk.take_writes(&victims)), ["a"]);
        assert_eq!(disk.usage(), (3, 300));
        assert!(
            disk.get("a").is_none(),
            "no new reader finds a leaving copy"
        );
        disk.end_read(second);
        assert!(disk.begin_read("a", 0, 100).is_err());
        assert_eq!(
            disk.readers_left("a", 0),
            1,
            "the read in progress holds it"
        );
        disk.end_read(reading);
        assert_eq!(disk.readers_left("a", 0), 0);
        disk.deletion_finished(&[("a".into(), 0)], false);
        assert_eq!(disk.take_doomed(), [("a".to_string(), 0)]);
        assert!(disk.take_doomed().is_empty());
    }

    #[test]
    fn a_copy_the_master_was_not_told_about_goes_back_with_its_readers() {
        let mut disk = disk();
        let reading = disk.begin_read("d", 3, 100).unwrap();
        let victims = disk.take_writes(&disk.choose_victims(400, 400, DiskEvictionOrder::Lru));
        assert_eq!(disk.usage(), (0, 0));
        disk.restore(victims);
        assert_eq!(disk.usage(), (4, 400));
        disk.end_read(reading);
        assert_eq!(disk.get("d").unwrap().readers, 0);
        // A key written again while its old copy was leaving keeps the newer copy.
        let victims = disk.take_writes(&disk.choose_victims(400, 400, DiskEvictionOrder::Fifo));
        disk.insert("a".into(), 9, 50, Checksum::of(b"a"), 7);
        disk.restore(victims);
        assert_eq!(disk.get("a").unwrap().version, 9);
        assert_eq!(disk.usage(), (4, 350));
    }

    #[test]
    fn a_victim_written_again_while_the_master_is_told_stays() {
        let mut disk = disk();
        let victims = disk.choose_victims(100, 400, DiskEvictionOrder::Fifo);
        assert_eq!(victims, [("a".to_string(), WriteId(0))]);
        disk.insert("a".into(), 9, 100, Checksum::of(b"a"), 7);
        assert!(disk.take_writes(&victims).is_empty());
        assert_eq!(disk.get("a").unwrap().version, 9);
        assert_eq!(disk.usage(), (4, 400));
    }

    #[test]
    fn tombstones_take_only_the_write_they_name_and_damage_is_reported_once() {
        let mut disk = disk();
        let taken = disk.take_writes(&[("a".into(), WriteId(7)), ("b".into(), WriteId(1))]);
        assert_eq!(names(&taken), ["b"], "a holds write 0, not 7");
        assert!(
            !disk.forget_damaged("c", 99),
            "another write: not this copy"
        );
        assert!(disk.forget_damaged("c", 2));
        assert!(disk.get("c").is_none());
        assert_eq!(disk.take_damaged(), [("c".to_string(), WriteId(2))]);
        assert!(disk.take_damaged().is_empty());
        assert_eq!(disk.take_doomed(), [("c".to_string(), 2)]);
        assert_eq!(
            disk.report(),
            [
                ("a".to_string(), WriteId(0), 100, Checksum::EMPTY),
                ("d".to_string(), WriteId(3), 100, Checksum::EMPTY)
            ]
        );
    }
}
