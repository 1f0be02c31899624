//! One peer's shard of the directory: for each key the ring gives this peer, where its latest
//! value lives.
//!
//! The rules, each checked here so that no adapter decides them:
//! - A peer publishes only locations in its own pool, and unpublishes only its own entries.
//! - The newest write wins: a location older than the entry's is refused as stale (its peer
//!   frees the copy), so a late re-publish never brings back an overwritten value.
//! - A removal covers every write up to a stamp (the newest its client saw, or its own clock):
//!   the key keeps a tombstone of that stamp for [`TOMBSTONE_TTL`], even on an owner that had
//!   no entry yet, so a re-publish of a covered write, racing the removal, does not bring it
//!   back either.
//! - A lost peer's entries go, and each leaves a tombstone just below its write: an older
//!   write of that key some other peer may still re-publish was superseded, and stays so,
//!   while the lost write itself comes back if its peer was only cut off.
//! - Entries the ring no longer gives this peer are dropped on a ring change; their data
//!   peers re-publish them to the new owners (see [`super::pool::PublishedPool::locations`]),
//!   and the shard hands its tombstones to the new owners, so a removal is not undone by a
//!   re-publish reaching an owner that never heard of it.

use std::collections::HashMap;

use crate::checksum::Checksum;
use crate::time::Millis;

use super::entries::EntryTable;
use super::ring::Ring;

/// How long a removal's tombstone outlives it: longer than a re-publish round.
pub const TOMBSTONE_TTL: Millis = Millis::from_secs(60);

/// When a write happened, as its writer's hybrid clock says, and whose it was: the order in
/// which values of one key supersede each other (later clock first, then the peer's name hash
/// to break ties the same way everywhere).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct Stamp {
    /// The writer's clock: milliseconds, never going backwards, above every stamp it has seen.
    pub clock: u64,
    /// The writer's name's [`super::ring::stable_hash`].
    pub writer: u64,
}

impl Stamp {
    /// The stamp just before this one: a tombstone of it covers every older write and not this
    /// one. (The first stamp of all has none before it, and is its own.)
    pub fn just_before(self) -> Stamp {
        match (self.clock, self.writer) {
            (clock, writer) if writer > 0 => Stamp {
                clock,
                writer: writer - 1,
            },
            (clock, _) if clock > 0 => Stamp {
                clock: clock - 1,
                writer: u64::MAX,
            },
            _ => self,
        }
    }
}

/// Where a value lives: its peer, its place in that peer's published pool, and what it is.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct Location {
    /// The data's peer.
    pub peer: Box<str>,
    /// Byte offset in that peer's published pool of the value's block: its header
    /// ([`super::pool::BLOCK_HEADER`] bytes naming the write), then the value.
    pub offset: u64,
    /// The value's length.
    pub len: u64,
    /// The write that stored it.
    pub stamp: Stamp,
    /// The value's crc32c: readers check the bytes they read against it.
    pub checksum: Checksum,
    /// In the pool (readable now), or only on the peer's disk (ask it to promote first).
    pub resident: bool,
}

/// What a publish did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    /// The location is the key's entry now; `superseded` is the older one it replaced, whose
    /// peer may free its copy.
    Stored {
        /// The entry it replaced, if any.
        superseded: Option<Location>,
    },
    /// The entry already holds this write: its place or residency was updated.
    Updated,
    /// A newer write (or a removal of this one) is known: the publisher should free its copy
    /// (or, for a write it has just made, stamp it again above `newer`).
    Stale {
        /// The newer write's stamp, or the newest write the removal covers.
        newer: Stamp,
    },
}

/// Why a publish was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishRefused {
    /// The location names another peer's pool.
    NotOwnPool,
    /// The ring does not give this shard the key.
    NotOwner,
    /// The publisher is no member (a peer that died, its publish still in flight).
    NotMember,
}

/// An entry as the shard keeps it: the data's peer as an index into the shard's peer names,
/// so an entry costs a few dozen bytes beside its key (a shard may hold tens of millions).
#[derive(Clone, Copy, Debug)]
struct Entry {
    offset: u64,
    len: u64,
    stamp: Stamp,
    peer: u32,
    checksum: Checksum,
    resident: bool,
}

/// The directory entries one peer holds.
#[derive(Clone, Debug, Default)]
pub struct DirectoryShard {
    entries: EntryTable<Entry>,
    /// The names of the peers entries have named, by index (never shrinks: one per peer
    /// that ever published here).
    peers: Vec<Box<str>>,
    peer_index: HashMap<Box<str>, u32>,
    /// Removed keys: the newest write removed, and when its tombstone lapses.
    tombstones: HashMap<Box<str>, (Stamp, Millis)>,
}

impl DirectoryShard {
    /// An empty shard.
    pub fn new() -> DirectoryShard {
        DirectoryShard::default()
    }

    /// How many keys have entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records that `key`'s value is at `location`, as peer `from` says. `owns` is whether the
    /// ring gives this shard the key (the caller asks [`Ring::owns`]).
    pub fn publish(
        &mut self,
        from: &str,
        key: &str,
        location: Location,
        owns: bool,
    ) -> Result<Published, PublishRefused> {
        if *location.peer != *from {
            return Err(PublishRefused::NotOwnPool);
        }
        if !owns {
            return Err(PublishRefused::NotOwner);
        }
        if let Some(&(removed, _)) = self.tombstones.get(key)
            && location.stamp <= removed
        {
            return Ok(Published::Stale { newer: removed });
        }
        let entry = self.entry_of(&location);
        match self.entries.get_mut(key) {
            Some(held) if held.stamp > location.stamp => Ok(Published::Stale { newer: held.stamp }),
            Some(held) if held.stamp == location.stamp => {
                // The same write, re-published: it may have moved (promoted) or left memory.
                *held = entry;
                Ok(Published::Updated)
            }
            _ => {
                self.tombstones.remove(key);
                let superseded = self
                    .entries
                    .insert(key, entry)
                    .map(|old| self.location_of(&old));
                Ok(Published::Stored { superseded })
            }
        }
    }

    /// Drops `key`'s entry if it is `from`'s write `stamp` (its peer evicted it); returns
    /// whether it did. Another peer's entry, or a newer write, stays.
    pub fn unpublish(&mut self, from: &str, key: &str, stamp: Stamp) -> bool {
        let own = self
            .entries
            .get(key)
            .is_some_and(|e| *self.peers[e.peer as usize] == *from && e.stamp == stamp);
        if own {
            self.entries.remove(key);
        }
        own
    }

    /// Removes `key`'s writes up to `covering` (a client's remove): returns the entry if it
    /// was one of them (its peer should free its copy). A tombstone keeps re-publishes of
    /// covered writes out until `now + TOMBSTONE_TTL`; a newer write stays.
    pub fn remove(&mut self, key: &str, covering: Stamp, now: Millis) -> Option<Location> {
        let until = now + TOMBSTONE_TTL;
        let tombstone = self
            .tombstones
            .entry(key.into())
            .or_insert((covering, until));
        *tombstone = (tombstone.0.max(covering), until);
        if self.entries.get(key)?.stamp > covering {
            return None;
        }
        let removed = self.entries.remove(key)?;
        Some(self.location_of(&removed))
    }

    /// Where `key`'s latest value is, if known.
    pub fn lookup(&self, key: &str) -> Option<Location> {
        self.entries.get(key).map(|e| self.location_of(e))
    }

    /// Drops the entries the ring no longer gives `me` (as one of `replicas` owners) and the
    /// tombstones that lapsed by `now`; returns how many entries went. Their peers re-publish
    /// them to the new owners.
    pub fn ring_changed(&mut self, ring: &Ring, me: &str, replicas: usize, now: Millis) -> usize {
        self.tombstones
            .retain(|key, (_, until)| now < *until && ring.owns(me, key, replicas));
        self.entries.retain(|key, _| ring.owns(me, key, replicas))
    }

    /// The live tombstones: each removed key and the newest write its removal covers, in key
    /// order (what is sent for them goes out in the same order on every run).
    pub fn tombstones(&self) -> Vec<(&str, Stamp)> {
        let mut all: Vec<(&str, Stamp)> = self
            .tombstones
            .iter()
            .map(|(key, (stamp, _))| (&**key, *stamp))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        all
    }

    /// Drops the tombstones that lapsed by `now`.
    pub fn expire_tombstones(&mut self, now: Millis) {
        self.tombstones.retain(|_, (_, until)| now < *until);
    }

    /// Every entry naming `peer` (a peer that left: its data is gone with it), removed. Each
    /// leaves a tombstone just below its write until `now + TOMBSTONE_TTL`: an older write of
    /// the key, still held by a peer whose re-publish has not arrived yet, is the superseded
    /// value, not the latest, and must not take the lost write's place. The lost write itself
    /// is not covered: a peer only cut off for a while re-publishes it when it is back.
    pub fn forget_peer(&mut self, peer: &str, now: Millis) -> usize {
        let Some(&index) = self.peer_index.get(peer) else {
            return 0;
        };
        let until = now + TOMBSTONE_TTL;
        let tombstones = &mut self.tombstones;
        self.entries.retain(|key, entry| {
            if entry.peer != index {
                return true;
            }
            let older = entry.stamp.just_before();
            let tombstone = tombstones.entry(key.into()).or_insert((older, until));
            *tombstone = (tombstone.0.max(older), until);
            false
        })
    }

    /// Heap bytes the shard's entries take, keys included (for footprint measures).
    pub fn heap_bytes(&self) -> usize {
        self.entries.heap_bytes()
    }

    fn entry_of(&mut self, location: &Location) -> Entry {
        let next = self.peers.len() as u32;
        let peer = *self.peer_index.entry(location.peer.clone()).or_insert(next);
        if peer == next {
            self.peers.push(location.peer.clone());
        }
        Entry {
            offset: location.offset,
            len: location.len,
            stamp: location.stamp,
            peer,
            checksum: location.checksum,
            resident: location.resident,
        }
    }

    fn location_of(&self, entry: &Entry) -> Location {
        Location {
            peer: self.peers[entry.peer as usize].clone(),
            offset: entry.offset,
            len: entry.len,
            stamp: entry.stamp,
            checksum: entry.checksum,
            resident: entry.resident,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(peer: &str, clock: u64, offset: u64) -> Location {
        Location {
            peer: peer.into(),
            offset,
            len: 10,
            stamp: Stamp {
                clock,
                writer: super::super::ring::stable_hash(peer.as_bytes()),
            },
            checksum: Checksum(7),
            resident: true,
        }
    }

    #[test]
    fn a_peer_publishes_only_its_own_pool_and_only_where_the_ring_says() {
        let mut shard = DirectoryShard::new();
        assert_eq!(
            shard.publish("a", "k", at("b", 1, 0), true),
            Err(PublishRefused::NotOwnPool)
        );
        assert_eq!(
            shard.publish("a", "k", at("a", 1, 0), false),
            Err(PublishRefused::NotOwner)
        );
        assert!(shard.is_empty());
    }

    #[test]
    fn the_newest_write_wins_and_a_late_republish_of_an_older_one_is_stale() {
        let mut shard = DirectoryShard::new();
        assert_eq!(
            shard.publish("a", "k", at("a", 5, 0), true),
            Ok(Published::Stored { superseded: None })
        );
        assert_eq!(
            shard.publish("b", "k", at("b", 9, 100), true),
            Ok(Published::Stored {
                superseded: Some(at("a", 5, 0))
            })
        );
        assert_eq!(
            shard.publish("a", "k", at("a", 5, 0), true),
            Ok(Published::Stale {
                newer: at("b", 9, 0).stamp
            })
        );
        // The same write again (promoted to another place): updated in place.
        let mut moved = at("b", 9, 300);
        moved.resident = false;
        assert_eq!(
            shard.publish("b", "k", moved.clone(), true),
            Ok(Published::Updated)
        );
        assert_eq!(shard.lookup("k"), Some(moved));
    }

    #[test]
    fn a_peer_unpublishes_only_its_own_current_entry() {
        let mut shard = DirectoryShard::new();
        shard.publish("b", "k", at("b", 9, 0), true).unwrap();
        assert!(
            !shard.unpublish("a", "k", at("b", 9, 0).stamp),
            "not a's entry"
        );
        assert!(
            !shard.unpublish("b", "k", at("b", 8, 0).stamp),
            "an older write"
        );
        assert!(shard.unpublish("b", "k", at("b", 9, 0).stamp));
        assert!(shard.lookup("k").is_none());
    }

    #[test]
    fn a_removal_keeps_its_write_out_until_the_tombstone_lapses() {
        let mut shard = DirectoryShard::new();
        shard.publish("a", "k", at("a", 5, 0), true).unwrap();
        assert_eq!(
            shard.remove("k", at("a", 5, 0).stamp, Millis(1_000)),
            Some(at("a", 5, 0))
        );
        assert!(
            matches!(shard.publish("a", "k", at("a", 5, 0), true), Ok(Published::Stale { newer }) if newer == at("a", 5, 0).stamp),
            "a re-publish racing the removal"
        );
        assert!(matches!(
            shard.publish("a", "k", at("a", 6, 0), true),
            Ok(Published::Stored { superseded: None })
        ));
        // A removal reaching an owner before the write's publish keeps it out all the same.
        assert!(
            shard
                .remove("later", at("a", 7, 0).stamp, Millis(1_000))
                .is_none()
        );
        assert!(matches!(
            shard.publish("a", "later", at("a", 7, 0), true),
            Ok(Published::Stale { .. })
        ));
        // A write newer than the removal's stamp stays.
        assert!(
            shard
                .remove("k", at("a", 5, 0).stamp, Millis(2_000))
                .is_none()
        );
        assert_eq!(shard.lookup("k"), Some(at("a", 6, 0)));
        shard.remove("k", at("a", 6, 0).stamp, Millis(2_000));
        shard.expire_tombstones(Millis(2_000) + TOMBSTONE_TTL);
        assert!(matches!(
            shard.publish("a", "k", at("a", 6, 0), true),
            Ok(Published::Stored { .. })
        ));
    }

    #[test]
    fn a_ring_change_drops_what_the_shard_no_longer_owns_and_a_lost_peer_its_entries() {
        use super::super::ring::{DEFAULT_VNODES, RingMember};
        let member = |name: &str| RingMember {
            name: name.into(),
            weight: 1,
        };
        let two = Ring::new([member("a"), member("b")], DEFAULT_VNODES);
        let three = Ring::new([member("a"), member("b"), member("c")], DEFAULT_VNODES);
        let mut shard = DirectoryShard::new();
        let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
        for key in keys.iter().filter(|k| two.owns("a", k, 1)) {
            shard.publish("a", key, at("a", 1, 0), true).unwrap();
        }
        let held = shard.len();
        let dropped = shard.ring_changed(&three, "a", 1, Millis(0));
        assert!(dropped > 0 && dropped < held, "{dropped} of {held}");
        for key in &keys {
            assert_eq!(
                shard.lookup(key).is_some(),
                two.owns("a", key, 1) && three.owns("a", key, 1)
            );
        }
        assert_eq!(shard.forget_peer("a", Millis(0)), held - dropped);
        assert!(shard.is_empty());
    }

    /// The latest write's peer is lost while an older write's peer is still to re-publish
    /// (its entry moved with a ring change): the older write stays superseded, a miss rather
    /// than a value the latest write replaced, until the tombstone lapses; the lost write
    /// itself comes back if its peer does.
    #[test]
    fn a_lost_peers_writes_keep_the_ones_they_superseded_out() {
        let mut shard = DirectoryShard::new();
        shard.publish("b", "k", at("b", 9, 0), true).unwrap();
        assert_eq!(shard.forget_peer("b", Millis(1_000)), 1);
        assert_eq!(shard.lookup("k"), None);
        assert_eq!(
            shard.publish("a", "k", at("a", 5, 0), true),
            Ok(Published::Stale {
                newer: at("b", 9, 0).stamp.just_before()
            })
        );
        // The lost write itself, re-published by its peer once it is back (it was only cut
        // off), is the key's entry again.
        assert!(matches!(
            shard.publish("b", "k", at("b", 9, 0), true),
            Ok(Published::Stored { superseded: None })
        ));
        assert!(matches!(
            shard.publish("a", "k", at("a", 10, 0), true),
            Ok(Published::Stored {
                superseded: Some(_)
            })
        ));
        shard.forget_peer("a", Millis(1_000));
        shard.expire_tombstones(Millis(1_000) + TOMBSTONE_TTL);
        assert!(matches!(
            shard.publish("a", "k", at("a", 5, 0), true),
            Ok(Published::Stored { .. })
        ));
    }
}
