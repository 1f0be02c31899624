//! Who is in the cluster, as one peer sees it, with no service to ask.
//!
//! A peer is known by its name (its place on the ring and in locations) and reached at its
//! address (which is its name too, unless its credential gives it another). A peer starts
//! knowing a few seed addresses. It greets every address it knows of at a steady pace; each greeting (either way) tells it the other is alive and which peers the other
//! knows of, so addresses spread through the cluster from any seed. Liveness is always
//! first-hand: a peer is a member of this peer's ring while this peer itself has heard from
//! it within [`MembershipConfig::dead_after`], and never because a third peer vouched for it,
//! so a dead peer cannot be kept alive by gossip about it. Peers that see each other see the
//! same members and so build the same ring; while views differ (a join, a death not yet
//! noticed everywhere), the directory refuses publishes from non-members and re-publishing
//! repairs what a view change moved.

use std::collections::BTreeMap;

use crate::time::Millis;

use super::ring::{Ring, RingMember};

/// What a peer says of itself when it greets another: its name, the address peers reach it
/// at, where its published pool is read, and its weight on the ring.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct MemberInfo {
    /// The peer's name on the ring: its address, or its credential's name.
    pub name: Box<str>,
    /// The address its peer service is reached at.
    pub address: Box<str>,
    /// The data endpoint its published pool is read through.
    pub data_endpoint: Box<str>,
    /// The access key its pool is exported under at that endpoint.
    pub data_key: u64,
    /// The address of its pool's first byte: a location's offset is from here.
    pub data_base: u64,
    /// Its weight on the ring (its share of the directory).
    pub weight: u32,
}

/// How membership paces itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MembershipConfig {
    /// A member not heard from for this long is dead.
    pub dead_after: Millis,
    /// An address heard of but never reached (or dead) for this long is forgotten, unless it
    /// is a seed.
    pub forget_after: Millis,
    /// Virtual nodes per unit of weight on the ring.
    pub vnodes: u32,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            dead_after: Millis(3_000),
            forget_after: Millis(60_000),
            vnodes: super::ring::DEFAULT_VNODES,
        }
    }
}

/// A peer this peer knows of.
#[derive(Clone, Debug)]
struct Known {
    /// What it said of itself, once it has greeted or answered.
    info: Option<MemberInfo>,
    /// When it was last heard from first-hand.
    heard: Option<Millis>,
    /// When this peer first heard of it, or last lost it: the start of its forget clock.
    since: Millis,
    /// Whether it is on this peer's ring now.
    member: bool,
}

/// What a membership step changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipChange {
    /// The new ring, if it changed (give it to the peer's state).
    pub ring: Option<Ring>,
    /// Members found dead, or gone from their address (their directory entries go; so do
    /// connections to them).
    pub lost: Vec<MemberInfo>,
    /// Members that joined.
    pub joined: Vec<Box<str>>,
}

/// One peer's view of the cluster.
#[derive(Clone, Debug)]
pub struct Membership {
    me: MemberInfo,
    seeds: Vec<Box<str>>,
    /// Every address this peer knows of.
    known: BTreeMap<Box<str>, Known>,
    /// Each member's address, by name.
    addresses: BTreeMap<Box<str>, Box<str>>,
    config: MembershipConfig,
    ring: Ring,
}

impl Membership {
    /// The view of peer `me`, which starts knowing `seeds` (its own name among them is
    /// ignored), at `now`. Its ring holds only itself until others answer.
    pub fn new(
        me: MemberInfo,
        seeds: impl IntoIterator<Item = impl Into<Box<str>>>,
        config: MembershipConfig,
        now: Millis,
    ) -> Membership {
        let mut seeds: Vec<Box<str>> = seeds.into_iter().map(Into::into).collect();
        seeds.retain(|seed| *seed != me.address);
        let known = seeds
            .iter()
            .map(|seed| {
                let known = Known {
                    info: None,
                    heard: None,
                    since: now,
                    member: false,
                };
                (seed.clone(), known)
            })
            .collect();
        let mut membership = Membership {
            me,
            seeds,
            known,
            addresses: BTreeMap::new(),
            config,
            ring: Ring::new([], config.vnodes),
        };
        membership.ring = membership.build_ring();
        membership
    }

    /// This peer's own description.
    pub fn me(&self) -> &MemberInfo {
        &self.me
    }

    /// The ring as this peer sees it: itself and every peer it heard from recently.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The description member `name` gave of itself.
    pub fn info(&self, name: &str) -> Option<&MemberInfo> {
        if name == &*self.me.name {
            return Some(&self.me);
        }
        let address = self.addresses.get(name)?;
        self.known.get(address).filter(|k| k.member)?.info.as_ref()
    }

    /// Where member `name` is reached.
    pub fn address_of(&self, name: &str) -> Option<&str> {
        self.info(name).map(|info| &*info.address)
    }

    /// Every address to greet this round: all it knows of but its own.
    pub fn to_greet(&self) -> Vec<Box<str>> {
        self.known.keys().cloned().collect()
    }

    /// The addresses this peer tells others of in a greeting: its own and its members'.
    pub fn gossip(&self) -> Vec<Box<str>> {
        let members = self.addresses.values().cloned();
        members.chain([self.me.address.clone()]).collect()
    }

    /// `info` greeted this peer or answered its greeting at `now`, knowing of `heard_of`
    /// (addresses). A greeting under this peer's own name or address, or under the name of a
    /// member at another address, changes nothing: two peers cannot share a name.
    pub fn heard_from(
        &mut self,
        info: MemberInfo,
        heard_of: impl IntoIterator<Item = impl Into<Box<str>>>,
        now: Millis,
    ) -> MembershipChange {
        let mut change = MembershipChange::default();
        let taken = self
            .addresses
            .get(&info.name)
            .is_some_and(|address| *address != info.address);
        if info.name == self.me.name || info.address == self.me.address || taken {
            return change;
        }
        let known = self.known.entry(info.address.clone()).or_insert(Known {
            info: None,
            heard: None,
            since: now,
            member: false,
        });
        // A member that restarted with another pool (or name) is a new member: its old
        // entries name memory it no longer serves.
        if known.member && known.info.as_ref() != Some(&info) {
            let old = known.info.take().expect("a member has said who it is");
            self.addresses.remove(&old.name);
            change.lost.push(old);
            known.member = false;
        }
        known.heard = Some(now);
        if !known.member {
            known.member = true;
            change.joined.push(info.name.clone());
            self.addresses
                .insert(info.name.clone(), info.address.clone());
        }
        known.info = Some(info);
        for other in heard_of {
            let other: Box<str> = other.into();
            if other != self.me.address && !other.is_empty() {
                self.known.entry(other).or_insert(Known {
                    info: None,
                    heard: None,
                    since: now,
                    member: false,
                });
            }
        }
        if !change.joined.is_empty() {
            change.ring = Some(self.rebuild());
        }
        change
    }

    /// Member `name` said it is leaving: it is lost now, not after `dead_after` of silence,
    /// so the ring stops sending readers and writers to it at once. Its address stays known
    /// (a peer that starts again there greets and joins as any peer does).
    pub fn left(&mut self, name: &str, now: Millis) -> MembershipChange {
        let mut change = MembershipChange::default();
        let Some(address) = self.addresses.remove(name) else {
            return change;
        };
        if let Some(known) = self.known.get_mut(&address)
            && known.member
        {
            known.member = false;
            known.heard = None;
            known.since = now;
            change.lost.extend(known.info.clone());
            change.ring = Some(self.rebuild());
        }
        change
    }

    /// A membership round at `now`: members not heard from within `dead_after` are lost, and
    /// addresses unreached for `forget_after` (not seeds) forgotten.
    pub fn tick(&mut self, now: Millis) -> MembershipChange {
        let mut change = MembershipChange::default();
        let dead_after = self.config.dead_after;
        for known in self.known.values_mut() {
            let silent = known
                .heard
                .is_none_or(|heard| now.since(heard) >= dead_after);
            if known.member && silent {
                known.member = false;
                known.since = now;
                let info = known.info.clone().expect("a member has said who it is");
                self.addresses.remove(&info.name);
                change.lost.push(info);
            }
        }
        let forget_after = self.config.forget_after;
        let seeds = &self.seeds;
        self.known.retain(|address, known| {
            known.member || seeds.contains(address) || now.since(known.since) < forget_after
        });
        if !change.lost.is_empty() {
            change.ring = Some(self.rebuild());
        }
        change
    }

    fn rebuild(&mut self) -> Ring {
        self.ring = self.build_ring();
        self.ring.clone()
    }

    fn build_ring(&self) -> Ring {
        let members = self
            .known
            .values()
            .filter(|k| k.member)
            .filter_map(|k| k.info.as_ref())
            .chain([&self.me])
            .map(|info| RingMember {
                name: info.name.clone(),
                weight: info.weight.max(1),
            });
        Ring::new(members, self.config.vnodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, key: u64) -> MemberInfo {
        MemberInfo {
            name: name.into(),
            address: name.into(),
            data_endpoint: format!("{name}-data").into(),
            data_key: key,
            data_base: 1 << 40,
            weight: 1,
        }
    }

    fn names(ring: &Ring) -> Vec<&str> {
        ring.members().iter().map(|m| &*m.name).collect()
    }

    #[test]
    fn seeds_are_greeted_and_join_the_ring_only_once_they_answer() {
        let mut a = Membership::new(
            info("a", 1),
            ["a", "b"],
            MembershipConfig::default(),
            Millis(0),
        );
        assert_eq!(names(a.ring()), ["a"]);
        assert_eq!(a.to_greet(), vec![Box::<str>::from("b")]);
        assert!(a.info("b").is_none());
        let change = a.heard_from(info("b", 2), ["b", "c", "a"], Millis(10));
        assert_eq!(change.joined, vec![Box::<str>::from("b")]);
        assert_eq!(names(change.ring.as_ref().unwrap()), ["a", "b"]);
        // "c" was heard of, not heard from: greeted, but not a member.
        assert_eq!(a.to_greet().len(), 2);
        assert_eq!(names(a.ring()), ["a", "b"]);
        assert_eq!(a.info("b").unwrap().data_key, 2);
        // Hearing again from a member changes nothing.
        assert_eq!(
            a.heard_from(info("b", 2), ["c"], Millis(20)),
            MembershipChange::default()
        );
    }

    #[test]
    fn a_silent_member_is_lost_and_gossip_cannot_keep_it() {
        let config = MembershipConfig::default();
        let mut a = Membership::new(info("a", 1), ["b"], config, Millis(0));
        a.heard_from(info("b", 2), Vec::<&str>::new(), Millis(0));
        a.heard_from(info("c", 3), ["b"], Millis(0));
        // "c" keeps talking about "b", which is silent.
        a.heard_from(info("c", 3), ["b"], Millis(2_000));
        assert_eq!(a.tick(Millis(2_999)), MembershipChange::default());
        let change = a.tick(Millis(3_000));
        assert_eq!(change.lost, vec![info("b", 2)]);
        assert_eq!(names(change.ring.as_ref().unwrap()), ["a", "c"]);
        assert!(a.info("b").is_none());
        // It comes back: a member again.
        let back = a.heard_from(info("b", 2), ["a"], Millis(4_000));
        assert_eq!(back.joined, vec![Box::<str>::from("b")]);
        assert_eq!(names(a.ring()), ["a", "b", "c"]);
    }

    #[test]
    fn a_member_that_leaves_is_lost_at_once_and_may_join_again() {
        let config = MembershipConfig::default();
        let mut a = Membership::new(info("a", 1), ["b"], config, Millis(0));
        a.heard_from(info("b", 2), Vec::<&str>::new(), Millis(0));
        a.heard_from(info("c", 3), Vec::<&str>::new(), Millis(0));
        let change = a.left("b", Millis(100));
        assert_eq!(change.lost, vec![info("b", 2)]);
        assert_eq!(names(change.ring.as_ref().unwrap()), ["a", "c"]);
        assert!(a.info("b").is_none());
        // Nothing more to lose: a second goodbye, or one from a stranger, changes nothing.
        assert_eq!(a.left("b", Millis(200)), MembershipChange::default());
        assert_eq!(a.left("z", Millis(200)), MembershipChange::default());
        assert_eq!(a.tick(Millis(5_000)).lost, vec![info("c", 3)]);
        // Started again at its address, it greets and is a member again.
        let back = a.heard_from(info("b", 2), ["a"], Millis(6_000));
        assert_eq!(back.joined, vec![Box::<str>::from("b")]);
        assert!(a.to_greet().contains(&Box::<str>::from("b")));
    }

    #[test]
    fn a_member_back_with_another_pool_is_lost_and_joins_again() {
        let mut a = Membership::new(info("a", 1), ["b"], MembershipConfig::default(), Millis(0));
        a.heard_from(info("b", 2), Vec::<&str>::new(), Millis(0));
        let change = a.heard_from(info("b", 9), Vec::<&str>::new(), Millis(100));
        assert_eq!(change.lost, vec![info("b", 2)]);
        assert_eq!(change.joined, vec![Box::<str>::from("b")]);
        assert_eq!(a.info("b").unwrap().data_key, 9);
    }

    #[test]
    fn members_are_named_apart_from_their_addresses_and_a_name_is_held_once() {
        let config = MembershipConfig::default();
        let mut a = Membership::new(info("a", 1), ["10.0.0.2:7100"], config, Millis(0));
        let b = MemberInfo {
            name: "node-b".into(),
            address: "10.0.0.2:7100".into(),
            ..info("x", 2)
        };
        a.heard_from(b.clone(), Vec::<&str>::new(), Millis(0));
        assert_eq!(names(a.ring()), ["a", "node-b"]);
        assert_eq!(a.address_of("node-b"), Some("10.0.0.2:7100"));
        assert!(a.gossip().contains(&Box::<str>::from("10.0.0.2:7100")));
        // Another address claiming the name changes nothing.
        let impostor = MemberInfo {
            address: "10.0.0.3:7100".into(),
            ..b.clone()
        };
        let unchanged = a.heard_from(impostor, Vec::<&str>::new(), Millis(10));
        assert_eq!(unchanged, MembershipChange::default());
        assert_eq!(a.address_of("node-b"), Some("10.0.0.2:7100"));
        assert_eq!(a.to_greet(), vec![Box::<str>::from("10.0.0.2:7100")]);
    }

    #[test]
    fn unreached_addresses_are_forgotten_but_seeds_never() {
        let config = MembershipConfig::default();
        let mut a = Membership::new(info("a", 1), ["seed"], config, Millis(0));
        a.heard_from(info("b", 2), ["ghost"], Millis(0));
        a.tick(Millis(3_000));
        assert_eq!(a.to_greet().len(), 3);
        // "b", silent since 0, was lost at 3 s and is forgotten 60 s after that; "ghost",
        // never reached, 60 s after it was heard of.
        a.tick(Millis(60_000));
        assert_eq!(
            a.to_greet(),
            vec![Box::<str>::from("b"), Box::<str>::from("seed")]
        );
        a.tick(Millis(63_000));
        assert_eq!(a.to_greet(), vec![Box::<str>::from("seed")]);
    }

    #[test]
    fn peers_that_hear_each_other_build_the_same_ring() {
        let config = MembershipConfig::default();
        let all = ["p1", "p2", "p3"];
        let mut views: Vec<Membership> = all
            .iter()
            .enumerate()
            .map(|(i, name)| Membership::new(info(name, i as u64), ["p1"], config, Millis(0)))
            .collect();
        for round in 1..=3 {
            for i in 0..views.len() {
                for j in 0..views.len() {
                    if i != j && views[i].to_greet().contains(&views[j].me().address) {
                        let (me, gossip) = (views[i].me().clone(), views[i].gossip());
                        views[j].heard_from(me, gossip, Millis(round));
                        let (them, gossip) = (views[j].me().clone(), views[j].gossip());
                        views[i].heard_from(them, gossip, Millis(round));
                    }
                }
            }
        }
        for view in &views {
            assert_eq!(names(view.ring()), all);
            assert_eq!(view.ring(), views[0].ring());
        }
    }
}
