//! The key index: key hash -> object slot, in one flat array.
//!
//! A linear-probing table of 8-byte entries, `tag << 32 | (slot + 1)`, where `tag` is 32 bits of
//! the key's hash and also its home position (`tag & mask`). Keeping tag and slot in one word
//! means a lookup among a million keys touches one cache line of index before it reaches the
//! object, and false matches (which cost a trip to the key bytes) happen once in 2^32 probes.
//! Because the home position is recomputable from the entry alone, growing and deleting
//! (Knuth's algorithm R, backward shift, no tombstones) never touch the keys.
//!
//! The table knows nothing about keys: callers pass the hash and a predicate that checks a
//! candidate slot's key.

/// An empty entry.
const EMPTY: u64 = 0;
/// Grow when more than this fraction (as a ratio of 8) of entries is used.
const MAX_LOAD_EIGHTHS: usize = 6;

/// Hash -> slot, open addressing with linear probing.
#[derive(Clone, Debug)]
pub(crate) struct KeyIndex {
    entries: Vec<u64>,
    len: usize,
}

fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

fn entry(tag: u32, slot: u32) -> u64 {
    debug_assert!(slot < u32::MAX);
    (u64::from(tag) << 32) | u64::from(slot + 1)
}

fn entry_tag(e: u64) -> u32 {
    (e >> 32) as u32
}

fn entry_slot(e: u64) -> u32 {
    (e as u32) - 1
}

impl KeyIndex {
    pub(crate) fn new() -> KeyIndex {
        KeyIndex {
            entries: vec![EMPTY; 16],
            len: 0,
        }
    }

    /// An empty index that holds `n` entries without growing (a restore knows how many
    /// it will insert: growing to them would place every entry about twice).
    pub(crate) fn with_capacity(n: usize) -> KeyIndex {
        let needed = (n * 8).div_ceil(MAX_LOAD_EIGHTHS) + 1;
        KeyIndex {
            entries: vec![EMPTY; needed.next_power_of_two().max(16)],
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    /// The slot whose key has `hash` and satisfies `is_key`.
    pub(crate) fn find(&self, hash: u64, is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        self.probe(tag_of(hash), is_key).ok()
    }

    /// The slot of the first entry on `hash`'s probe sequence whose tag matches, without
    /// checking its key; `None` if the sequence ends first (then no slot has the key). The
    /// first step of a lookup whose key check the caller does later (see
    /// `ObjectTable::find_many`): it reads only the index.
    pub(crate) fn first_candidate(&self, hash: u64) -> Option<u32> {
        self.probe(tag_of(hash), |_| true).ok()
    }

    /// Walks the probe sequence of `tag`: the slot of the first entry with that tag whose key
    /// satisfies `is_key`, or else the empty position the walk ended at.
    fn probe(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Result<u32, usize> {
        let mask = self.mask();
        let mut pos = tag as usize & mask;
        loop {
            let e = self.entries[pos];
            if e == EMPTY {
                return Err(pos);
            }
            if entry_tag(e) == tag && is_key(entry_slot(e)) {
                return Ok(entry_slot(e));
            }
            pos = (pos + 1) & mask;
        }
    }

    /// Adds `slot` under `hash`; the caller guarantees its key is not indexed yet.
    pub(crate) fn insert(&mut self, hash: u64, slot: u32) {
        if (self.len + 1) * 8 > self.entries.len() * MAX_LOAD_EIGHTHS {
            self.grow();
        }
        self.place(entry(tag_of(hash), slot));
        self.len += 1;
    }

    /// Adds `slot` under `hash` unless a slot whose key satisfies `is_key` is indexed
    /// already, which is returned: for rebuilding the index from slots that could hold a key
    /// twice (a restored snapshot).
    pub(crate) fn insert_unique(
        &mut self,
        hash: u64,
        slot: u32,
        is_key: impl FnMut(u32) -> bool,
    ) -> Result<(), u32> {
        if (self.len + 1) * 8 > self.entries.len() * MAX_LOAD_EIGHTHS {
            self.grow();
        }
        let tag = tag_of(hash);
        let empty = match self.probe(tag, is_key) {
            Ok(indexed) => return Err(indexed),
            Err(empty) => empty,
        };
        self.entries[empty] = entry(tag, slot);
        self.len += 1;
        Ok(())
    }

    /// Removes the entry for `slot` (indexed under `hash`).
    pub(crate) fn remove(&mut self, hash: u64, slot: u32) -> bool {
        let target = entry(tag_of(hash), slot);
        let mask = self.mask();
        let mut hole = tag_of(hash) as usize & mask;
        loop {
            match self.entries[hole] {
                EMPTY => return false,
                e if e == target => break,
                _ => hole = (hole + 1) & mask,
            }
        }
        // Algorithm R: pull later entries of the cluster back into the hole unless that would
        // put them before their home position.
        let mut next = hole;
        loop {
            next = (next + 1) & mask;
            let e = self.entries[next];
            if e == EMPTY {
                break;
            }
            let home = entry_tag(e) as usize & mask;
            let stays = if hole <= next {
                hole < home && home <= next
            } else {
                hole < home || home <= next
            };
            if !stays {
                self.entries[hole] = e;
                hole = next;
            }
        }
        self.entries[hole] = EMPTY;
        self.len -= 1;
        true
    }

    fn place(&mut self, e: u64) {
        let mask = self.mask();
        let mut pos = entry_tag(e) as usize & mask;
        while self.entries[pos] != EMPTY {
            pos = (pos + 1) & mask;
        }
        self.entries[pos] = e;
    }

    fn grow(&mut self) {
        let doubled = vec![EMPTY; self.entries.len() * 2];
        let old = std::mem::replace(&mut self.entries, doubled);
        for e in old.into_iter().filter(|&e| e != EMPTY) {
            self.place(e);
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.entries.capacity() * size_of::<u64>()
    }

    /// Every indexed slot with the home position of its hash tag, for consistency checks:
    /// each entry must be reachable from its home without crossing an empty entry.
    pub(crate) fn check(&self) -> Result<Vec<u32>, String> {
        let mask = self.mask();
        let mut slots = Vec::with_capacity(self.len);
        for (pos, &e) in self.entries.iter().enumerate() {
            if e == EMPTY {
                continue;
            }
            if e as u32 == 0 {
                return Err(format!("index entry {pos} has slot 0 marker"));
            }
            let mut at = entry_tag(e) as usize & mask;
            while at != pos {
                if self.entries[at] == EMPTY {
                    return Err(format!("index entry {pos} unreachable from its home"));
                }
                at = (at + 1) & mask;
            }
            slots.push(entry_slot(e));
        }
        if slots.len() != self.len {
            return Err(format!(
                "index holds {} entries, len {}",
                slots.len(),
                self.len
            ));
        }
        Ok(slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in prop::collection::vec((any::<bool>(), 0u64..64, 0u32..1000), 1..600)) {
            // Hashes from a tiny space force collisions, long clusters and wrap-around.
            let mut index = KeyIndex::new();
            let mut model: BTreeMap<u32, u64> = BTreeMap::new();
            let hash = |h: u64| h.wrapping_mul(0x9E37_79B9_7F4A_7C15) & 0xFFFF_0000_0000_0000 | h << 32;
            for (insert, h, slot) in ops {
                let h = hash(h);
                if insert && !model.contains_key(&slot) {
                    index.insert(h, slot);
                    model.insert(slot, h);
                } else if let Some(h) = model.remove(&slot) {
                    prop_assert!(index.remove(h, slot));
                }
                let mut indexed = index.check().map_err(TestCaseError::fail)?;
                indexed.sort();
                prop_assert_eq!(indexed, model.keys().copied().collect::<Vec<_>>());
                for (&s, &h) in &model {
                    prop_assert_eq!(index.find(h, |c| c == s), Some(s));
                }
            }
        }
    }

    #[test]
    fn missing_keys_and_removals_are_reported() {
        let mut index = KeyIndex::new();
        assert_eq!(index.find(42, |_| true), None);
        assert!(!index.remove(42, 0));
        for slot in 0..1000 {
            index.insert(u64::from(slot) << 40, slot);
        }
        assert_eq!(index.len(), 1000);
        assert_eq!(index.find(7 << 40, |s| s == 7), Some(7));
        assert_eq!(index.find(7 << 40, |_| false), None);
        assert!(index.remove(7 << 40, 7));
        assert_eq!(index.find(7 << 40, |s| s == 7), None);
        index.check().unwrap();
    }
}
