//! The directory shard's table: key → entry in the layout the master's object table uses (a
//! flat key index of 8-byte slots beside a chunked vector of entries), so a shard of tens of
//! millions of entries costs about 80 bytes an entry beside its key, with no power-of-two
//! doubling of the entries themselves.

use std::hash::BuildHasher;

use foldhash::fast::FixedState;

use crate::chunked::ChunkedVec;
use crate::key_index::KeyIndex;

/// Key → `V`.
#[derive(Clone, Debug)]
pub(crate) struct EntryTable<V> {
    slots: ChunkedVec<Option<(Box<str>, V)>>,
    free: Vec<u32>,
    index: KeyIndex,
    hasher: FixedState,
}

impl<V> Default for EntryTable<V> {
    fn default() -> Self {
        EntryTable {
            slots: ChunkedVec::default(),
            free: Vec::new(),
            index: KeyIndex::new(),
            hasher: FixedState::with_seed(0x6d6f_6f72_696e_6764),
        }
    }
}

impl<V: Clone> EntryTable<V> {
    /// How many keys it holds.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether it holds no key.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn slot_of(&self, key: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        let slots = &self.slots;
        self.index.find(hash, |slot| {
            slots[slot as usize]
                .as_ref()
                .is_some_and(|(k, _)| &**k == key)
        })
    }

    /// `key`'s value.
    pub(crate) fn get(&self, key: &str) -> Option<&V> {
        let slot = self.slot_of(key)?;
        self.slots[slot as usize].as_ref().map(|(_, v)| v)
    }

    /// `key`'s value, to change.
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let slot = self.slot_of(key)?;
        self.slots[slot as usize].as_mut().map(|(_, v)| v)
    }

    /// Sets `key`'s value; returns the one it replaced.
    pub(crate) fn insert(&mut self, key: &str, value: V) -> Option<V> {
        if let Some(slot) = self.slot_of(key) {
            let (_, held) = self.slots[slot as usize].as_mut().expect("indexed");
            return Some(std::mem::replace(held, value));
        }
        let hash = self.hasher.hash_one(key);
        let entry = Some((Box::from(key), value));
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = entry;
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("more than 4 billion entries");
                self.slots.push(entry);
                slot
            }
        };
        self.index.insert(hash, slot);
        None
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove(&mut self, key: &str) -> Option<V> {
        let slot = self.slot_of(key)?;
        Some(self.take(slot))
    }

    /// Keeps only the keys `keep` says yes to; returns how many went.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str, &V) -> bool) -> usize {
        let doomed: Vec<u32> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, entry)| {
                let (key, value) = entry.as_ref()?;
                (!keep(key, value)).then_some(slot as u32)
            })
            .collect();
        for &slot in &doomed {
            self.take(slot);
        }
        doomed.len()
    }

    /// Heap bytes it takes, keys included.
    pub(crate) fn heap_bytes(&self) -> usize {
        let keys: usize = self.slots.iter().flatten().map(|(k, _)| k.len()).sum();
        self.slots.heap_bytes() + self.index.heap_bytes() + self.free.capacity() * 4 + keys
    }

    fn take(&mut self, slot: u32) -> V {
        let (key, value) = self.slots[slot as usize].take().expect("a live slot");
        let removed = self.index.remove(self.hasher.hash_one(&*key), slot);
        debug_assert!(removed, "a live slot missing from the index");
        self.free.push(slot);
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_replaces_removes_and_retains() {
        let mut table = EntryTable::default();
        for i in 0..1000 {
            assert_eq!(table.insert(&format!("k{i}"), i), None);
        }
        assert_eq!(table.insert("k7", 70), Some(7));
        assert_eq!(table.get("k7"), Some(&70));
        *table.get_mut("k8").unwrap() = 80;
        assert_eq!(table.remove("k8"), Some(80));
        assert_eq!(table.remove("k8"), None);
        assert_eq!(table.retain(|_, v| v % 2 == 0), 499);
        assert_eq!(table.len(), 500);
        assert!(table.get("k3").is_none() && table.get("k4") == Some(&4));
        // Freed slots are reused.
        assert_eq!(table.insert("new", 1), None);
        assert_eq!(table.get("new"), Some(&1));
        assert!(table.heap_bytes() > 0);
    }
}
