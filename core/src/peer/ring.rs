//! The ring: which peers own a key's directory entry, decided by every peer alone.
//!
//! A consistent-hash ring of virtual nodes (160 per peer by default, more for a heavier
//! peer). Chosen over weighted rendezvous hashing because a lookup is a binary search, not one
//! hash per peer: with hundreds of peers and a lookup on every get, that difference is the
//! directory's cost. A peer's points come from its name alone, so every peer that knows the
//! same members builds the same ring, and a join or a leave moves only the keys on the arcs
//! that peer's points take or give back (about 1/N of them).
//!
//! Positions use [`stable_hash`], fixed here for good: peers of different builds must agree.

use smallvec::SmallVec;

/// Virtual nodes per peer of weight 1.
pub const DEFAULT_VNODES: u32 = 160;

/// A peer, as the ring knows it: its name (what its points are derived from) and its weight.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RingMember {
    /// The peer's name: unique in the cluster (its advertised address, typically).
    pub name: Box<str>,
    /// Points relative to a peer of weight 1 (at least 1).
    pub weight: u32,
}

/// The owners of keys: a ring of every member's virtual nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    /// Members, sorted by name: a peer's index here is how the ring names it.
    members: Vec<RingMember>,
    /// Every virtual node: its position and its member's index, sorted by position.
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// The ring of `members` with `vnodes` points per unit of weight. Duplicate names count
    /// once (the heavier weight wins).
    pub fn new(members: impl IntoIterator<Item = RingMember>, vnodes: u32) -> Ring {
        let mut members: Vec<RingMember> = members.into_iter().collect();
        members.sort_by(|a, b| a.name.cmp(&b.name).then(b.weight.cmp(&a.weight)));
        members.dedup_by(|later, kept| later.name == kept.name);
        let mut points = Vec::new();
        for (index, member) in members.iter().enumerate() {
            let count = vnodes.max(1).saturating_mul(member.weight.max(1));
            for point in 0..count {
                let mut seed = Vec::with_capacity(member.name.len() + 5);
                seed.extend_from_slice(member.name.as_bytes());
                seed.push(b'#');
                seed.extend_from_slice(&point.to_le_bytes());
                points.push((stable_hash(&seed), index as u32));
            }
        }
        // Equal positions (vanishingly rare) are ordered by member, so every peer agrees.
        points.sort_unstable();
        Ring { members, points }
    }

    /// The members, sorted by name.
    pub fn members(&self) -> &[RingMember] {
        &self.members
    }

    /// Whether `name` is a member.
    pub fn has_member(&self, name: &str) -> bool {
        self.members
            .binary_search_by(|m| (*m.name).cmp(name))
            .is_ok()
    }

    /// Whether the ring has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The names of the first `count` distinct members clockwise from `key`'s position: the
    /// key's owner, then the owners of its directory replicas. Fewer if the ring has fewer.
    pub fn owners(&self, key: &str, count: usize) -> SmallVec<[&str; 3]> {
        let mut owners: SmallVec<[&str; 3]> = SmallVec::new();
        if self.points.is_empty() || count == 0 {
            return owners;
        }
        let position = stable_hash(key.as_bytes());
        let start = self.points.partition_point(|&(p, _)| p < position);
        let wanted = count.min(self.members.len());
        for offset in 0..self.points.len() {
            let (_, member) = self.points[(start + offset) % self.points.len()];
            let name = &*self.members[member as usize].name;
            if !owners.contains(&name) {
                owners.push(name);
                if owners.len() == wanted {
                    break;
                }
            }
        }
        owners
    }

    /// Whether `peer` is among the first `count` owners of `key`.
    pub fn owns(&self, peer: &str, key: &str, count: usize) -> bool {
        self.owners(key, count).contains(&peer)
    }
}

/// A 64-bit hash of `bytes` that never changes between builds or machines: FNV-1a, then a
/// 64-bit finalizer so that nearby inputs (`peer#1`, `peer#2`) land far apart.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(names: &[&str]) -> Ring {
        Ring::new(
            names.iter().map(|n| RingMember {
                name: (*n).into(),
                weight: 1,
            }),
            DEFAULT_VNODES,
        )
    }

    #[test]
    fn the_hash_is_fixed() {
        // Peers of every build must place keys alike: these values may never change.
        assert_eq!(stable_hash(b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(stable_hash(b"kv/0"), 0x9f38_f5e3_1fb0_9b0d);
        assert_eq!(stable_hash(b"peer#1"), 0x6d38_bc58_a03d_b1d0);
    }

    #[test]
    fn owners_are_distinct_and_agree_whatever_the_order_members_are_given_in() {
        let a = ring(&["p1", "p2", "p3", "p4"]);
        let b = ring(&["p4", "p2", "p1", "p3", "p2"]);
        assert_eq!(a, b);
        for i in 0..1000 {
            let key = format!("k{i}");
            let owners = a.owners(&key, 3);
            assert_eq!(owners.len(), 3);
            assert!(owners[0] != owners[1] && owners[1] != owners[2] && owners[0] != owners[2]);
            assert_eq!(owners, b.owners(&key, 3));
        }
        assert_eq!(a.owners("k", 9).len(), 4, "no more owners than members");
        assert!(ring(&[]).owners("k", 2).is_empty());
    }

    #[test]
    fn keys_spread_evenly_and_a_join_moves_only_the_newcomers_share() {
        let names: Vec<String> = (0..8).map(|i| format!("10.0.0.{i}:7000")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let before = ring(&refs);
        let keys: Vec<String> = (0..40_000).map(|i| format!("kv/model/block-{i}")).collect();
        let mut load = std::collections::HashMap::new();
        for key in &keys {
            *load.entry(before.owners(key, 1)[0]).or_insert(0usize) += 1;
        }
        // 160 points give each peer an even share within about 8% (one standard deviation):
        // these eight land within 30%.
        let mean = keys.len() / names.len();
        for (peer, n) in &load {
            assert!(
                *n > mean * 7 / 10 && *n < mean * 13 / 10,
                "{peer} owns {n} keys, the mean is {mean}"
            );
        }
        let mut grown = refs.clone();
        grown.push("10.0.0.8:7000");
        let after = ring(&grown);
        let moved = keys
            .iter()
            .filter(|k| before.owners(k, 1)[0] != after.owners(k, 1)[0])
            .count();
        // Only keys the newcomer takes move: about 1/9 of them.
        for key in &keys {
            let (was, now) = (before.owners(key, 1)[0], after.owners(key, 1)[0]);
            assert!(
                was == now || now == "10.0.0.8:7000",
                "{key} moved between old peers"
            );
        }
        assert!(
            moved > keys.len() / 14 && moved < keys.len() / 6,
            "{moved} moved"
        );
    }

    #[test]
    fn a_heavier_peer_owns_more() {
        let ring = Ring::new(
            [
                RingMember {
                    name: "big".into(),
                    weight: 3,
                },
                RingMember {
                    name: "small".into(),
                    weight: 1,
                },
            ],
            DEFAULT_VNODES,
        );
        let big = (0..20_000)
            .filter(|i| ring.owns("big", &format!("k{i}"), 1))
            .count();
        assert!(big > 13_000 && big < 17_000, "big owns {big} of 20000");
    }
}
