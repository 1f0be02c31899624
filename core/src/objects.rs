//! The object table: a slab of object metadata indexed by key.
//!
//! Objects live in a `Vec` slab addressed by a `u32` slot; their keys live in a key arena
//! (`key_arena`) and the key index (`key_index`) maps key hashes to slots without storing the
//! key twice. Iteration is in slot order, which depends only on the
//! sequence of operations, so everything that walks the table (eviction, regex queries) is
//! deterministic. The hash is seeded from the master's seed.
//!
//! Each object's value checksum sits in a column beside the slab rather than in [`Object`],
//! whose 72 bytes are full: four bytes per object instead of another 32.

use std::hash::BuildHasher;

use foldhash::fast::FixedState;

use crate::checksum::Checksum;
use crate::chunked::ChunkedVec;
use crate::ids::{ClientId, WriteId};
use crate::key_arena::KeyArena;
use crate::key_index::KeyIndex;
use crate::object::Object;
use crate::tenant::TenantUsage;
use crate::writers::{WriterParts, Writers};

/// The table as a snapshot stores it: the slab with its checksum column, the free list, the
/// keys, and the writers the objects name.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct TableParts {
    pub(crate) slots: ChunkedVec<Option<Object>>,
    pub(crate) keys: KeyArena,
    pub(crate) checksums: ChunkedVec<Checksum>,
    pub(crate) free_slots: Vec<u32>,
    pub(crate) writers: WriterParts,
}

/// What a restored table derives from its objects ([`ObjectTable::derive`]).
pub(crate) struct Derived {
    index: KeyIndex,
    tenants: TenantUsage,
}

/// All objects, by slot and by key.
#[derive(Clone)]
pub(crate) struct ObjectTable {
    slots: ChunkedVec<Option<Object>>,
    /// Every live object's key; an object names its own by a [`crate::key_arena::KeyRef`].
    keys: KeyArena,
    /// The checksum of each slot's current value (meaningless while it is being written).
    checksums: ChunkedVec<Checksum>,
    free_slots: Vec<u32>,
    index: KeyIndex,
    hasher: FixedState,
    len: usize,
    /// Who wrote the objects: each names its writer by a reference into this table.
    writers: Writers,
    /// Objects and value bytes per tenant (see `crate::tenant`), for quotas and metrics.
    tenants: TenantUsage,
}

impl ObjectTable {
    pub(crate) fn new(seed: u64) -> ObjectTable {
        ObjectTable {
            slots: ChunkedVec::default(),
            keys: KeyArena::default(),
            checksums: ChunkedVec::default(),
            free_slots: Vec::new(),
            index: KeyIndex::new(),
            hasher: FixedState::with_seed(seed),
            len: 0,
            writers: Writers::default(),
            tenants: TenantUsage::default(),
        }
    }

    /// Rebuilds a table from its parts, as saved by a snapshot, without its key index: refuses
    /// parts whose shape is damaged, objects no build would hold, or keys the arena cannot
    /// vouch for ([`KeyArena::check_restored`]). What the table derives from its objects (the
    /// index, usage per tenant) comes next, from [`ObjectTable::derive`], while the rest of
    /// the restored state is checked beside it; until [`ObjectTable::install`], nothing may
    /// look a key up.
    pub(crate) fn from_parts(seed: u64, parts: TableParts) -> Result<Self, String> {
        let TableParts {
            slots,
            keys,
            checksums,
            free_slots,
            writers,
        } = parts;
        // The lengths size the index later: a damaged snapshot must not claim more than
        // it holds.
        slots.check()?;
        checksums.check()?;
        let mut packed = Ok(());
        keys.check_restored(slots.iter().flatten().map(|object| {
            if packed.is_ok() {
                packed = object.check_packed();
            }
            object.key
        }))?;
        packed?;
        let mut table = ObjectTable::new(seed);
        table.writers = Writers::from_parts(writers, slots.iter().flatten().map(Object::writer))?;
        table.len = slots.len().saturating_sub(free_slots.len());
        table.keys = keys;
        table.slots = slots;
        table.checksums = checksums;
        table.free_slots = free_slots;
        Ok(table)
    }

    /// What a table restored by [`ObjectTable::from_parts`] derives from its objects: the key
    /// index (refusing a key held by two slots) and the objects and bytes per tenant. Built
    /// from the slots, they agree with them by construction (see
    /// [`ObjectTable::check_slots`]).
    pub(crate) fn derive(&self) -> Result<Derived, String> {
        let (slots, keys) = (&self.slots, &self.keys);
        let mut index = KeyIndex::with_capacity(self.len);
        let mut tenants = TenantUsage::default();
        for (slot, object) in slots.iter().enumerate() {
            let Some(object) = object else { continue };
            let key = keys.get(object.key);
            let same_key = |other: u32| {
                slots
                    .get(other as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|o| keys.is(o.key, key))
            };
            index
                .insert_unique(self.hasher.hash_one(key), slot as u32, same_key)
                .map_err(|other| format!("key {key:?} is held by slots {other} and {slot}"))?;
            tenants.add(key, object.size());
            if object.disk() != crate::object::NO_DISK {
                tenants.count_disk(key, object.size(), true);
            }
        }
        Ok(Derived { index, tenants })
    }

    /// Puts what [`ObjectTable::derive`] derived in place: the table is whole again.
    pub(crate) fn install(&mut self, derived: Derived) {
        self.index = derived.index;
        self.tenants = derived.tenants;
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The slot holding `key`.
    pub(crate) fn find(&self, key: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        let (slots, keys) = (&self.slots, &self.keys);
        self.index.find(hash, |slot| {
            slots[slot as usize]
                .as_ref()
                .is_some_and(|o| keys.is(o.key, key))
        })
    }

    /// [`ObjectTable::find`] for many keys at once, in the keys' order. A lookup is a chain
    /// of cache misses (the index entry, then the object, then the key's bytes), each
    /// waiting for the one before. Done one key at a time, the misses of different keys
    /// queue behind each other; done a step at a time for all keys, each step's misses are
    /// independent of each other, so the processor has them in flight together. The slots
    /// stay right until an object is inserted or removed: callers use them before that (a
    /// read changes leases and access times, never which slot holds which key).
    pub(crate) fn find_many<K: AsRef<str>>(&self, keys: &[K]) -> Vec<Option<u32>> {
        let candidates: Vec<Option<u32>> = keys
            .iter()
            .map(|key| {
                let hash = self.hasher.hash_one(key.as_ref());
                self.index.first_candidate(hash)
            })
            .collect();
        // Reads each candidate's object (the key's length and where its bytes are).
        let same_len: Vec<bool> = keys
            .iter()
            .zip(&candidates)
            .map(|(key, candidate)| {
                candidate
                    .and_then(|slot| self.get(slot))
                    .is_some_and(|o| o.key.len() == key.as_ref().len())
            })
            .collect();
        keys.iter()
            .zip(candidates)
            .zip(same_len)
            .map(|((key, candidate), same_len)| {
                let key = key.as_ref();
                match candidate {
                    // The probe sequence ended without the key's tag: not indexed.
                    None => None,
                    Some(slot) if same_len && self.keys.is(self.at(slot).key, key) => Some(slot),
                    // Another key with the same tag came first: the whole probe decides.
                    Some(_) => self.find(key),
                }
            })
            .collect()
    }

    /// Reads what lookups and writes of `keys` will read (index entries, objects, key bytes,
    /// checksums) a step at a time for all of them, as [`ObjectTable::find_many`] does, so
    /// that their cache misses are in flight together; the work that follows finds them in
    /// the caches. Returns how many of the keys are present.
    pub(crate) fn warm<K: AsRef<str>>(&self, keys: &[K]) -> usize {
        let present: Vec<u32> = self.find_many(keys).into_iter().flatten().collect();
        for &slot in &present {
            std::hint::black_box(self.checksum(slot));
        }
        present.len()
    }

    /// Adds an object of `size` bytes under `key`, which is not in the table, written by
    /// `writer`'s `write` (no replicas yet, not writing, pinned or leased); returns its slot.
    pub(crate) fn insert(&mut self, key: &str, size: u64, writer: ClientId, write: WriteId) -> u32 {
        debug_assert!(self.find(key).is_none());
        let hash = self.hasher.hash_one(key);
        self.tenants.add(key, size);
        let object = Object::new(self.keys.insert(key), size, self.writers.add(writer), write);
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(object);
                self.checksums[slot as usize] = Checksum::EMPTY;
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("more than 4 billion objects");
                self.slots.push(Some(object));
                self.checksums.push(Checksum::EMPTY);
                slot
            }
        };
        self.index.insert(hash, slot);
        self.len += 1;
        slot
    }

    /// Removes the object in `slot` and returns it. Its key leaves the arena: a caller that
    /// needs the key takes it first (`key`), so removals that drop it allocate nothing.
    pub(crate) fn remove(&mut self, slot: u32) -> Object {
        let object = self.slots[slot as usize]
            .take()
            .expect("removing a live slot");
        let key = self.keys.get(object.key);
        let hash = self.hasher.hash_one(key);
        let indexed = self.index.remove(hash, slot);
        debug_assert!(indexed, "live slot missing from the key index");
        if object.disk() != crate::object::NO_DISK {
            self.tenants.count_disk(key, object.size(), false);
        }
        self.tenants.take(key, object.size());
        self.keys.remove(object.key);
        self.writers.release(object.writer());
        self.free_slots.push(slot);
        self.len -= 1;
        object
    }

    /// The key of the object in a live slot.
    pub(crate) fn key(&self, slot: u32) -> &str {
        self.key_of(self.at(slot))
    }

    /// The key of `object`, one of this table's.
    pub(crate) fn key_of(&self, object: &Object) -> &str {
        self.keys.get(object.key)
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&Object> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut Object> {
        self.slots.get_mut(slot as usize).and_then(Option::as_mut)
    }

    /// The object in a slot known to be live.
    pub(crate) fn at(&self, slot: u32) -> &Object {
        self.slots[slot as usize].as_ref().expect("live slot")
    }

    /// The client that wrote (or is writing) the object in a live slot.
    pub(crate) fn writer(&self, slot: u32) -> ClientId {
        self.writers.client(self.at(slot).writer())
    }

    /// Whether `client` wrote (or is writing) the object in a live slot.
    pub(crate) fn written_by(&self, slot: u32, client: ClientId) -> bool {
        self.writers.find(client) == Some(self.at(slot).writer())
    }

    /// Whether `client` may become a writer: some object names it already, or the writers'
    /// table has room for one more.
    pub(crate) fn has_writer_room(&self, client: ClientId) -> bool {
        self.writers.find(client).is_some() || self.writers.has_room()
    }

    /// `client` writes the object in a live slot from now on.
    pub(crate) fn set_writer(&mut self, slot: u32, client: ClientId) {
        // Added before the old one is released, so an entry that stays is never freed.
        let writer = self.writers.add(client);
        let object = self.slots[slot as usize].as_mut().expect("live slot");
        let was = object.writer();
        object.set_writer(writer);
        self.writers.release(was);
    }

    /// Gives the object in `slot` a value of `size` bytes (an upsert of another size).
    pub(crate) fn set_size(&mut self, slot: u32, size: u64) {
        let object = self.slots[slot as usize].as_mut().expect("live slot");
        let key = self.keys.get(object.key);
        let on_disk = object.disk() != crate::object::NO_DISK;
        if on_disk {
            self.tenants.count_disk(key, object.size(), false);
        }
        self.tenants.take(key, object.size());
        self.tenants.add(key, size);
        if on_disk {
            self.tenants.count_disk(key, size, true);
        }
        object.set_size(size);
    }

    /// The object in `slot` gained (`true`) or lost its disk copy: its tenant's disk bytes.
    pub(crate) fn count_disk_copy(&mut self, slot: u32, gained: bool) {
        let object = self.slots[slot as usize].as_ref().expect("live slot");
        self.tenants
            .count_disk(self.keys.get(object.key), object.size(), gained);
    }

    /// Objects and value bytes per tenant.
    pub(crate) fn tenants(&self) -> &TenantUsage {
        &self.tenants
    }

    /// The object in a slot known to be live.
    pub(crate) fn at_mut(&mut self, slot: u32) -> &mut Object {
        self.slots[slot as usize].as_mut().expect("live slot")
    }

    /// The checksum of the value in a live slot.
    pub(crate) fn checksum(&self, slot: u32) -> Checksum {
        self.checksums[slot as usize]
    }

    /// Records the checksum of the value just written into a live slot.
    pub(crate) fn set_checksum(&mut self, slot: u32, checksum: Checksum) {
        debug_assert!(self.get(slot).is_some(), "checksum of a free slot");
        self.checksums[slot as usize] = checksum;
    }

    /// Live objects in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Object)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, o)| o.as_ref().map(|o| (slot as u32, o)))
    }

    /// A copy of the slab (sharing its chunks), its checksums and its free list, for
    /// snapshots.
    pub(crate) fn parts(&self) -> TableParts {
        TableParts {
            slots: self.slots.clone(),
            keys: self.keys.clone(),
            checksums: self.checksums.clone(),
            free_slots: self.free_slots.clone(),
            writers: self.writers.parts(),
        }
    }

    /// The slab, checksums and free list, for comparing states.
    pub(crate) fn debug_parts(&self) -> impl std::fmt::Debug + '_ {
        // Each object with its key: where the arena keeps a key is not part of the state.
        let slots: Vec<_> = (self.slots.iter())
            .map(|o| o.as_ref().map(|o| (self.key_of(o), o)))
            .collect();
        (
            slots,
            &self.checksums,
            &self.free_slots,
            self.writers.parts(),
        )
    }

    /// Heap bytes used by the table itself (not counting the keys' own bytes).
    pub(crate) fn heap_bytes(&self) -> usize {
        let spilled: usize = self.iter().map(|(_, o)| o.heap_bytes()).sum();
        self.slots.heap_bytes()
            + self.checksums.heap_bytes()
            + self.free_slots.capacity() * size_of::<u32>()
            + self.index.heap_bytes()
            + self.writers.heap_bytes()
            + self.keys.overhead_bytes()
            + spilled
    }

    /// Checks that the index, the slab and its checksum column agree.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.check_slots()?;
        self.check_index()
    }

    /// Checks the slab, its checksum column, its free list and its writers: all
    /// [`ObjectTable::check`] checks but the index's, which is what a restore checks, as its
    /// index is derived from the slots ([`ObjectTable::derive`]) and agrees with them by
    /// construction (checking each key against it would cost a lookup per object: seconds at
    /// ten million).
    pub(crate) fn check_slots(&self) -> Result<(), String> {
        self.slots.check()?;
        self.checksums.check()?;
        if self.checksums.len() != self.slots.len() {
            return Err(format!(
                "object table: {} slots but {} checksums",
                self.slots.len(),
                self.checksums.len()
            ));
        }
        let live = self.slots.iter().filter(|s| s.is_some()).count();
        if live != self.len {
            return Err(format!("object table: {live} live slots, len {}", self.len));
        }
        let mut free = vec![false; self.slots.len()];
        for &slot in &self.free_slots {
            let seen = free
                .get_mut(slot as usize)
                .ok_or_else(|| format!("free slot {slot} is out of range"))?;
            if *seen || self.get(slot).is_some() {
                return Err(format!("free slot {slot} is live or listed twice"));
            }
            *seen = true;
        }
        if self.free_slots.len() + live != self.slots.len() {
            return Err("object table: free list does not cover the dead slots".into());
        }
        self.writers.check(self.iter().map(|(_, o)| o.writer()))
    }

    /// Checks that the index finds every live slot by its key, and nothing else.
    fn check_index(&self) -> Result<(), String> {
        if self.index.len() != self.len {
            return Err(format!(
                "object table: {} live objects, index {}",
                self.len,
                self.index.len()
            ));
        }
        let mut indexed = self.index.check()?;
        indexed.sort_unstable();
        let live_slots: Vec<u32> = self.iter().map(|(slot, _)| slot).collect();
        if indexed != live_slots {
            return Err("object table: the key index and the live slots differ".into());
        }
        for (slot, object) in self.iter() {
            let key = self.key_of(object);
            if self.find(key) != Some(slot) {
                return Err(format!("key {key:?} does not index its slot {slot}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table from its parts as a restore builds it: the parts, then what it derives.
    fn rebuild(parts: TableParts) -> Result<ObjectTable, String> {
        let mut table = ObjectTable::from_parts(7, parts)?;
        let derived = table.derive()?;
        table.install(derived);
        Ok(table)
    }

    #[test]
    fn a_table_rebuilt_from_its_parts_finds_every_key_and_refuses_a_key_held_twice() {
        let mut table = ObjectTable::new(7);
        for key in ["a", "b", "c"] {
            table.insert(key, 10, ClientId(1), WriteId(1));
        }
        let b = table.find("b").expect("b is in");
        table.remove(b);
        let rebuilt = rebuild(table.parts()).expect("consistent parts");
        rebuilt
            .check()
            .expect("the full check agrees with the rebuilt index");
        for key in ["a", "b", "c"] {
            assert_eq!(rebuilt.find(key), table.find(key), "{key}");
        }
        // A second copy of "a"'s bytes in the arena, named by the slot that held "c".
        let mut parts = table.parts();
        let c_key = parts.slots[2].as_ref().expect("c is in").key;
        parts.keys.remove(c_key);
        let mut copy = parts.slots[0].clone();
        copy.as_mut().expect("a is in").key = parts.keys.insert("a");
        parts.slots[2] = copy;
        let refused = rebuild(parts).err().expect("refused");
        assert!(
            refused.contains("\"a\" is held by slots 0 and 2"),
            "{refused}"
        );
        // Two slots naming one key's bytes (and the arena counting them once): removing
        // either would free the other's key.
        let mut parts = table.parts();
        let c = table.find("c").expect("c is in") as usize;
        let a_key = parts.slots[0].as_ref().expect("a is in").key;
        parts.slots[c].as_mut().expect("c is in").key = a_key;
        let refused = rebuild(parts).err().expect("refused");
        assert!(refused.contains("shares bytes"), "{refused}");
    }

    #[test]
    fn finding_many_keys_at_once_finds_what_finding_each_does_even_past_a_shared_tag() {
        let mut table = ObjectTable::new(7);
        // Two keys of one length whose hashes share their index tag (found by a search;
        // about one pair in 2^32 does). Once `first` is indexed, a lookup of `second` meets
        // its entry first on the same probe sequence, whether `second` is indexed or not.
        let key = |i: u32| format!("key-{i:08}");
        let mut seen = std::collections::HashMap::new();
        let (first, second) = (0..)
            .find_map(|i| {
                let tag = table.hasher.hash_one(key(i)) >> 32;
                seen.insert(tag, i).map(|j| (key(j), key(i)))
            })
            .expect("a shared tag");
        for i in 0..1000 {
            table.insert(&key(u32::MAX - i), 10, ClientId(1), WriteId(1));
        }
        let first_slot = table.insert(&first, 10, ClientId(1), WriteId(1));
        let hash = table.hasher.hash_one(&*second);
        assert_eq!(
            table.index.first_candidate(hash),
            Some(first_slot),
            "a lookup of the second key meets the first's entry first"
        );
        let mut asked: Vec<String> = vec![second.clone(), first.clone(), "".into(), "x".into()];
        asked.extend((0..2000).map(|i| key(u32::MAX - i)));
        let each: Vec<Option<u32>> = asked.iter().map(|k| table.find(k)).collect();
        assert_eq!(table.find_many(&asked), each);
        assert_eq!(each[0], None, "the second key is not indexed yet");
        assert_eq!(each[1], Some(first_slot));
        assert_eq!(each.iter().filter(|found| found.is_some()).count(), 1001);
        assert_eq!(table.warm(&asked), 1001, "warming counts the keys present");

        let second_slot = table.insert(&second, 10, ClientId(1), WriteId(1));
        assert_eq!(
            table.find_many(&[&second, &first]),
            [Some(second_slot), Some(first_slot)]
        );
    }
}
