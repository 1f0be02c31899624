//! A peer's disk tier: which write of each key its disk holds, the operations the driver owes
//! the disk, and the room they take.
//!
//! With the tier on, the pool writes every value through to disk once it is in the pool (the
//! driver copies it from the block). A value evicted from memory whose copy is complete stays,
//! non-resident, and a read brings it back (a *promote*: the driver reads the copy into a
//! block the pool set aside). The pool decides when; this file keeps the books:
//!
//! - **One operation per key.** The disk keeps one file per key, so a newer write, a deletion
//!   or a promote of a key waits until the operation in flight on it ends: two operations on
//!   one file never race (an older write finishing last would replace the newer copy).
//! - **Room.** Copies held and being written never exceed the capacity. Making room deletes
//!   the oldest written copies first (first in, first out); a value that was only on disk goes
//!   with its copy. A value that cannot get room is not written (it lives in memory only).
//! - **Deletion.** A copy no value of the pool wants any more (removed, superseded, lost) is
//!   deleted as soon as its key is free; space is counted free when the deletion starts.

use std::collections::{BTreeMap, HashMap};

use crate::allocator::Allocation;

use super::directory::Stamp;

/// An operation the driver owes the disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskWork {
    /// Copy `key`'s write `stamp` (`len` bytes) to disk, replacing any copy of the key. Its
    /// bytes are in the pool: ask [`super::state::PeerState::disk_source`] where, when the
    /// copy is made (the value may have gone by then: the write is then reported failed).
    Write {
        /// The key.
        key: Box<str>,
        /// The write.
        stamp: Stamp,
        /// Its length.
        len: u64,
    },
    /// Delete `key`'s copy of write `stamp` (a copy of another write of the key stays).
    Delete {
        /// The key.
        key: Box<str>,
        /// The write whose copy goes.
        stamp: Stamp,
    },
}

/// The operation in flight on a key's file.
#[derive(Clone, Debug)]
enum Busy {
    Write {
        stamp: Stamp,
        len: u64,
    },
    Delete,
    /// A promote: the copy is being read into `block`, which the read owns until it ends.
    Read {
        stamp: Stamp,
        block: Allocation,
    },
}

/// A complete copy on disk.
#[derive(Clone, Copy, Debug)]
struct Copy {
    stamp: Stamp,
    len: u64,
    /// When it was written, for first-in-first-out eviction.
    serial: u64,
}

#[derive(Clone, Debug, Default)]
struct KeyFile {
    held: Option<Copy>,
    busy: Option<Busy>,
}

/// A peer's disk: its capacity, what it holds, and what is in flight.
#[derive(Clone, Debug, Default)]
pub struct DiskShelf {
    capacity: u64,
    /// Bytes of copies held and of writes in flight.
    used: u64,
    files: HashMap<Box<str>, KeyFile>,
    /// Copies held, oldest written first.
    fifo: BTreeMap<u64, Box<str>>,
    serial: u64,
    work: Vec<DiskWork>,
}

impl DiskShelf {
    /// A disk of `capacity` bytes (0: no disk tier).
    pub fn new(capacity: u64) -> DiskShelf {
        DiskShelf {
            capacity,
            ..DiskShelf::default()
        }
    }

    /// Whether there is a disk tier.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Its capacity in bytes (0: no disk tier).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Copies held, and their bytes with writes in flight.
    pub fn usage(&self) -> (usize, u64) {
        (self.fifo.len(), self.used)
    }

    /// Whether the disk holds a complete copy of `key`'s write `stamp`, not leaving.
    pub fn holds(&self, key: &str, stamp: Stamp) -> bool {
        self.held(key).is_some_and(|c| c.stamp == stamp)
    }

    /// The write whose complete copy the disk holds of `key`, if any.
    pub fn held_stamp(&self, key: &str) -> Option<Stamp> {
        self.held(key).map(|c| c.stamp)
    }

    /// Every complete copy held: the key and its write.
    pub fn copies(&self) -> impl Iterator<Item = (&str, Stamp)> + '_ {
        self.files
            .iter()
            .filter_map(|(key, f)| f.held.map(|c| (&**key, c.stamp)))
    }

    /// Whether an operation is in flight on `key`'s file.
    pub fn is_busy(&self, key: &str) -> bool {
        self.files.get(key).is_some_and(|f| f.busy.is_some())
    }

    /// The operations owed since the last call, in order.
    pub fn take_work(&mut self) -> Vec<DiskWork> {
        std::mem::take(&mut self.work)
    }

    /// Starts writing `key`'s write `stamp` (`len` bytes); `key` must be free. The copy it
    /// replaces frees its room. Returns the copies deleted to make room (oldest first), or
    /// `None`, changing nothing else, if no room can be made.
    pub fn start_write(
        &mut self,
        key: &str,
        stamp: Stamp,
        len: u64,
    ) -> Option<Vec<(Box<str>, Stamp)>> {
        debug_assert!(!self.is_busy(key), "one operation per key");
        let replaced = self.held(key).map_or(0, |c| c.len);
        let free = self.capacity.saturating_sub(self.used) + replaced;
        let evictable: u64 = self
            .fifo
            .values()
            .filter(|k| ***k != *key && !self.is_busy(k))
            .filter_map(|k| self.held(k).map(|c| c.len))
            .sum();
        if len > free.saturating_add(evictable) {
            return None;
        }
        if let Some(old) = self.take_held(key) {
            self.used -= old.len;
        }
        let mut victims = Vec::new();
        while self.used + len > self.capacity {
            let victim = self
                .fifo
                .values()
                .find(|k| ***k != *key && !self.is_busy(k))
                .cloned()
                .expect("room was counted");
            let stamp = self.held(&victim).expect("in the fifo").stamp;
            self.start_delete(&victim);
            victims.push((victim, stamp));
        }
        self.used += len;
        self.files.entry(key.into()).or_default().busy = Some(Busy::Write { stamp, len });
        self.work.push(DiskWork::Write {
            key: key.into(),
            stamp,
            len,
        });
        Some(victims)
    }

    /// Starts deleting `key`'s copy, if it holds one and is free; returns the write deleted.
    pub fn start_delete(&mut self, key: &str) -> Option<Stamp> {
        if self.is_busy(key) {
            return None;
        }
        let old = self.take_held(key)?;
        self.used -= old.len;
        self.files.entry(key.into()).or_default().busy = Some(Busy::Delete);
        self.work.push(DiskWork::Delete {
            key: key.into(),
            stamp: old.stamp,
        });
        Some(old.stamp)
    }

    /// Starts reading `key`'s copy of write `stamp` into `block` (a promote); `key` must be
    /// free and hold that copy.
    pub fn start_read(&mut self, key: &str, stamp: Stamp, block: Allocation) {
        debug_assert!(self.holds(key, stamp) && !self.is_busy(key));
        self.files.entry(key.into()).or_default().busy = Some(Busy::Read { stamp, block });
    }

    /// Ends the promote of `key`'s write `stamp`: the block it read into, if that read was in
    /// flight.
    pub fn end_read(&mut self, key: &str, stamp: Stamp) -> Option<Allocation> {
        let file = self.files.get_mut(key)?;
        match file.busy {
            Some(Busy::Read { stamp: s, block }) if s == stamp => {
                file.busy = None;
                Some(block)
            }
            _ => None,
        }
    }

    /// The blocks promotes are reading into (the pool counts them allocated).
    pub fn reading(&self) -> impl Iterator<Item = Allocation> + '_ {
        self.files.values().filter_map(|f| match f.busy {
            Some(Busy::Read { block, .. }) => Some(block),
            _ => None,
        })
    }

    /// The write or deletion in flight on `key` ended (`ok`: it took effect). A write that
    /// failed frees its room; a deletion is counted done either way (one that failed leaves
    /// a file no copy counts, which the next write of the key replaces).
    pub fn finished(&mut self, key: &str, stamp: Stamp, ok: bool) {
        let Some(file) = self.files.get_mut(key) else {
            return;
        };
        match file.busy {
            Some(Busy::Write { stamp: s, len }) if s == stamp => {
                file.busy = None;
                if ok {
                    self.serial += 1;
                    file.held = Some(Copy {
                        stamp,
                        len,
                        serial: self.serial,
                    });
                    self.fifo.insert(self.serial, key.into());
                } else {
                    self.used -= len;
                }
            }
            Some(Busy::Delete) => file.busy = None,
            _ => return,
        }
        if file.busy.is_none() && file.held.is_none() {
            self.files.remove(key);
        }
    }

    /// Checks the books: the bytes counted are those of copies held and writes in flight, and
    /// the first-in-first-out order lists exactly the copies held.
    pub fn check(&self) -> Result<(), String> {
        let held: u64 = self
            .files
            .values()
            .filter_map(|f| f.held)
            .map(|c| c.len)
            .sum();
        let writing: u64 = self
            .files
            .values()
            .filter_map(|f| match f.busy {
                Some(Busy::Write { len, .. }) => Some(len),
                _ => None,
            })
            .sum();
        if held + writing != self.used {
            return Err(format!(
                "{held} bytes held and {writing} being written, but {} counted",
                self.used
            ));
        }
        if self.enabled() && self.used > self.capacity {
            return Err(format!(
                "{} bytes on a disk of {}",
                self.used, self.capacity
            ));
        }
        let copies = self.files.values().filter(|f| f.held.is_some()).count();
        if copies != self.fifo.len() {
            return Err(format!(
                "{copies} copies held, {} in eviction order",
                self.fifo.len()
            ));
        }
        Ok(())
    }

    fn held(&self, key: &str) -> Option<Copy> {
        self.files.get(key).and_then(|f| f.held)
    }

    fn take_held(&mut self, key: &str) -> Option<Copy> {
        let copy = self.files.get_mut(key)?.held.take()?;
        self.fifo.remove(&copy.serial);
        Some(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(clock: u64) -> Stamp {
        Stamp { clock, writer: 1 }
    }

    #[test]
    fn room_is_made_oldest_first_and_a_busy_key_is_never_a_victim() {
        let mut disk = DiskShelf::new(100);
        for (i, key) in ["a", "b", "c"].iter().enumerate() {
            assert_eq!(disk.start_write(key, stamp(i as u64), 30), Some(vec![]));
        }
        disk.finished("a", stamp(0), true);
        disk.finished("b", stamp(1), true);
        // c is still being written: only a and b can make room, oldest first.
        assert_eq!(
            disk.start_write("d", stamp(3), 40),
            Some(vec![("a".into(), stamp(0))])
        );
        assert_eq!(
            disk.start_write("e", stamp(4), 90),
            None,
            "c and d are in flight"
        );
        assert!(disk.holds("b", stamp(1)) && !disk.holds("a", stamp(0)));
        assert!(disk.is_busy("a"), "a's deletion is in flight");
        let work = disk.take_work();
        assert_eq!(work.len(), 5, "four writes and a deletion: {work:?}");
        disk.check().unwrap();
    }

    #[test]
    fn a_failed_write_frees_its_room_and_a_rewrite_replaces_the_old_copy() {
        let mut disk = DiskShelf::new(100);
        disk.start_write("a", stamp(1), 60).unwrap();
        disk.finished("a", stamp(1), false);
        assert_eq!(disk.usage(), (0, 0));
        disk.start_write("a", stamp(2), 60).unwrap();
        disk.finished("a", stamp(2), true);
        // The next write of a replaces its copy: no victim needed.
        assert_eq!(disk.start_write("a", stamp(3), 80), Some(vec![]));
        assert_eq!(disk.held_stamp("a"), None, "the old copy is being replaced");
        disk.finished("a", stamp(3), true);
        assert_eq!(disk.usage(), (1, 80));
        assert_eq!(disk.start_delete("a"), Some(stamp(3)));
        assert_eq!(disk.usage(), (0, 0));
        disk.check().unwrap();
    }
}
