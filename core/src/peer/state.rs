//! One peer: its pool, its directory shard and its view of the ring, with every decision
//! about what to tell whom. The driver moves the messages this returns and calls back with
//! what arrives; it decides nothing.

use crate::checksum::Checksum;
use crate::time::Millis;

use super::directory::{DirectoryShard, Location, PublishRefused, Published, Stamp};
use super::disk::DiskWork;
use super::pool::{Evicted, HeaderWrite, PoolFull, Promotion, PublishedPool};
use super::ring::Ring;

/// Directory replicas by default: each entry is held by its owner and the next peer.
pub const DEFAULT_DIRECTORY_REPLICAS: usize = 2;

pub use message::DirectoryMessage;

#[allow(missing_docs)] // rkyv's generated archive types carry no docs
mod message {
    use super::{Location, Stamp};

    /// What one peer tells another about the directory.
    #[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    #[rkyv(derive(Debug))]
    pub enum DirectoryMessage {
        /// To a key's owner: the key's value is at `location` (in the sender's pool).
        Publish {
            /// The key.
            key: Box<str>,
            /// Where its value is.
            location: Location,
        },
        /// To a key's owner: the sender no longer holds its write `stamp`.
        Unpublish {
            /// The key.
            key: Box<str>,
            /// The write it let go of.
            stamp: Stamp,
        },
        /// To a publisher, the answer to its publish: the entry now holds `location`. A publisher
        /// that has let go of that write since answers with an unpublish, and one whose value has
        /// moved since (promoted, evicted to disk) with a publish of where it is now, so an entry
        /// that arrived late or out of order does not stay behind its value.
        Held {
            /// The key.
            key: Box<str>,
            /// What the entry holds.
            location: Location,
        },
        /// To a key's new owner after a ring change: the key was removed, up to write
        /// `covering` (a tombstone handed over, so a late re-publish does not undo the removal).
        Removed {
            /// The key.
            key: Box<str>,
            /// The newest write the removal covers.
            covering: Stamp,
        },
        /// To a publisher: its write `stamp` of `key` is older than `newer` (a newer write, or
        /// a removal), as far as the owner knows. A write the publisher has just made and not
        /// yet seen held anywhere is stamped again above `newer` and re-published (its clock was
        /// behind: the write is the latest in fact); any other is freed.
        Stale {
            /// The key.
            key: Box<str>,
            /// The publisher's write.
            stamp: Stamp,
            /// What the owner holds as newer.
            newer: Stamp,
        },
        /// To a data peer: its write `stamp` of `key` was removed or superseded; free it.
        Drop {
            /// The key.
            key: Box<str>,
            /// The write to free.
            stamp: Stamp,
        },
    }
}

/// The order a reader tries the owners' answers in: newest write first, so an owner that has
/// not heard of the newest write yet does not decide the answer. Each location is read and
/// its block's header checked against its stamp; a mismatch is a stale entry: try the next.
pub fn read_order(answers: impl IntoIterator<Item = Option<Location>>) -> Vec<Location> {
    let mut found: Vec<Location> = answers.into_iter().flatten().collect();
    found.sort_by_key(|l| std::cmp::Reverse(l.stamp));
    found.dedup_by(|a, b| a.stamp == b.stamp && a.peer == b.peer && a.offset == b.offset);
    found
}

/// A message and the peer it goes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The receiving peer's name.
    pub to: Box<str>,
    /// The message.
    pub message: DirectoryMessage,
}

/// A peer's state.
#[derive(Clone, Debug)]
pub struct PeerState {
    name: Box<str>,
    ring: Ring,
    replicas: usize,
    pool: PublishedPool,
    shard: DirectoryShard,
    /// Writes made here not yet held by any owner: a stale answer re-stamps them.
    fresh: std::collections::HashSet<(Box<str>, Stamp)>,
}

impl PeerState {
    /// Peer `name` with a pool of `capacity` bytes, in `ring`, keeping each directory entry on
    /// `replicas` owners; freed blocks wait `read_grace` for readers.
    pub fn new(
        name: &str,
        capacity: u64,
        ring: Ring,
        replicas: usize,
        read_grace: Millis,
    ) -> PeerState {
        PeerState {
            name: name.into(),
            ring,
            replicas: replicas.max(1),
            pool: PublishedPool::new(name, capacity, read_grace),
            shard: DirectoryShard::new(),
            fresh: Default::default(),
        }
    }

    /// The same peer with a disk tier of `capacity` bytes (0: none).
    pub fn with_disk(mut self, capacity: u64) -> PeerState {
        self.pool = self.pool.with_disk(capacity);
        self
    }

    /// The peer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ring as this peer sees it.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The peer's pool.
    pub fn pool(&self) -> &PublishedPool {
        &self.pool
    }

    /// The peer's directory shard.
    pub fn shard(&self) -> &DirectoryShard {
        &self.shard
    }

    /// The peers to ask where `key` is, in order: its owner, then its replicas.
    pub fn owners_of(&self, key: &str) -> Vec<Box<str>> {
        self.ring
            .owners(key, self.replicas)
            .into_iter()
            .map(Into::into)
            .collect()
    }

    /// Writes `key` (`len` bytes, `checksum`) into this peer's pool at `now`: the caller
    /// copies the value to the returned location's offset, then sends the messages (the
    /// publishes, and the directory updates for what was evicted to make room).
    pub fn put(
        &mut self,
        key: &str,
        len: u64,
        checksum: Checksum,
        now: Millis,
    ) -> Result<(Location, Vec<Outgoing>), PoolFull> {
        // A failed store may have evicted values all the same: the caller passes
        // `PoolFull::evicted` to [`PeerState::evictions`].
        let placed = self.pool.store(key, len, checksum, now)?;
        self.fresh.insert((key.into(), placed.location.stamp));
        let mut out = self.evictions(&placed.evicted);
        self.publish(key, &placed.location, &mut out);
        Ok((placed.location, out))
    }

    /// The directory updates for `evicted` values (a failed put's too), and for values the
    /// disk tier lost since the last call.
    pub fn evictions(&mut self, evicted: &[Evicted]) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let lost = self.pool.take_lost();
        for gone in evicted.iter().chain(&lost) {
            if gone.kept_on_disk {
                if let Some(location) = self.pool.location(&gone.key) {
                    self.publish(&gone.key, &location, &mut out);
                }
            } else {
                self.send_owners(
                    &gone.key,
                    DirectoryMessage::Unpublish {
                        key: gone.key.clone(),
                        stamp: gone.stamp,
                    },
                    &mut out,
                );
            }
        }
        out
    }

    /// Starts bringing `key` back from this peer's disk into its pool (a reader asked). On
    /// [`Promotion::Load`] the caller reads the disk copy into the block, then reports with
    /// [`PeerState::promoted`]. The messages are the directory updates for what was evicted.
    pub fn promote(&mut self, key: &str, now: Millis) -> (Promotion, Vec<Outgoing>) {
        let promotion = self.pool.promote(key, now);
        let out = match &promotion {
            Promotion::Load { evicted, .. } => self.evictions(evicted),
            Promotion::Full(full) => self.evictions(&full.evicted),
            _ => self.evictions(&[]),
        };
        (promotion, out)
    }

    /// The promote of `key`'s write `stamp` ended (`ok`: the copy's bytes, checked, are in
    /// the block): the value's new location, published, or `None` if it is gone.
    pub fn promoted(
        &mut self,
        key: &str,
        stamp: Stamp,
        ok: bool,
        now: Millis,
    ) -> (Option<Location>, Vec<Outgoing>) {
        let location = self.pool.promoted(key, stamp, ok, now);
        let mut out = self.evictions(&[]);
        if let Some(location) = &location {
            self.publish(key, location, &mut out);
        }
        (location, out)
    }

    /// Where the driver copies `key`'s write `stamp` to disk from (see
    /// [`PublishedPool::disk_source`]).
    pub fn disk_source(&self, key: &str, stamp: Stamp) -> Option<(u64, u64)> {
        self.pool.disk_source(key, stamp)
    }

    /// A disk write or deletion the driver was owed ended (`ok`: it took effect).
    pub fn disk_finished(&mut self, key: &str, stamp: Stamp, ok: bool) -> Vec<Outgoing> {
        self.pool.disk_finished(key, stamp, ok);
        self.evictions(&[])
    }

    /// The disk operations the driver owes (see [`super::disk`]).
    pub fn take_disk_work(&mut self) -> Vec<DiskWork> {
        self.pool.take_disk_work()
    }

    /// The header writes the driver owes (see [`super::pool`]).
    pub fn take_header_writes(&mut self) -> Vec<HeaderWrite> {
        self.pool.take_header_writes()
    }

    /// The location of a value in this peer's pool (a local read), if it holds it.
    pub fn read_local(&mut self, key: &str, now: Millis) -> Option<Location> {
        self.pool.read(key, now)
    }

    /// Where `key`'s latest value is, as this peer's shard knows (a reader asked it).
    pub fn lookup(&self, key: &str) -> Option<Location> {
        self.shard.lookup(key)
    }

    /// A client's removal of `key` through this peer at `now`, once the key's owners answered
    /// with the writes they know of (`known`). The removal covers those writes and every write
    /// this peer has made or seen; it goes to every owner in this peer's view of the ring, and
    /// each known write's peer is told to free it at once. An owner only the writer's view
    /// names (a peer that joined a moment ago, this one not yet told) hears of the removal
    /// from the writer as it lets go, so its answer is gone by the time the removal returns,
    /// not only after the owners' own Drops arrive.
    pub fn removal(&mut self, key: &str, now: Millis, known: &[Location]) -> Vec<Outgoing> {
        let own = self.pool.next_stamp(now);
        let covering = known.iter().map(|l| l.stamp).fold(own, Stamp::max);
        let mut out: Vec<Outgoing> = self
            .owners_of(key)
            .into_iter()
            .map(|owner| Outgoing {
                to: owner,
                message: DirectoryMessage::Removed {
                    key: key.into(),
                    covering,
                },
            })
            .collect();
        for location in known {
            let drop = DirectoryMessage::Drop {
                key: key.into(),
                stamp: location.stamp,
            };
            if !out
                .iter()
                .any(|o| o.to == location.peer && o.message == drop)
            {
                out.push(Outgoing {
                    to: location.peer.clone(),
                    message: drop,
                });
            }
        }
        out
    }

    /// A client removes `key`'s writes up to `covering` through this peer, one of its
    /// owners: its entry goes (a tombstone keeps covered writes out) and the data's peer is
    /// told to free it.
    pub fn remove(&mut self, key: &str, covering: Stamp, now: Millis) -> Vec<Outgoing> {
        let mut out = Vec::new();
        if let Some(removed) = self.shard.remove(key, covering, now) {
            out.push(Outgoing {
                to: removed.peer.clone(),
                message: DirectoryMessage::Drop {
                    key: key.into(),
                    stamp: removed.stamp,
                },
            });
        }
        out
    }

    /// Handles a message from peer `from`; returns the messages it causes.
    pub fn receive(&mut self, from: &str, message: DirectoryMessage, now: Millis) -> Vec<Outgoing> {
        let mut out = Vec::new();
        match message {
            DirectoryMessage::Publish { key, location } => {
                let owns = self.ring.owns(&self.name, &key, self.replicas);
                let stamp = location.stamp;
                let held = location.clone();
                let published = if self.ring.has_member(from) {
                    self.shard.publish(from, &key, location, owns)
                } else {
                    Err(PublishRefused::NotMember)
                };
                match published {
                    Ok(Published::Stored { superseded }) => {
                        if let Some(old) = superseded.filter(|old| old.stamp != stamp) {
                            out.push(Outgoing {
                                to: old.peer,
                                message: DirectoryMessage::Drop {
                                    key: key.clone(),
                                    stamp: old.stamp,
                                },
                            });
                        }
                        out.push(Outgoing {
                            to: from.into(),
                            message: DirectoryMessage::Held {
                                key,
                                location: held,
                            },
                        });
                    }
                    Ok(Published::Updated) => out.push(Outgoing {
                        to: from.into(),
                        message: DirectoryMessage::Held {
                            key,
                            location: held,
                        },
                    }),
                    Ok(Published::Stale { newer }) => out.push(Outgoing {
                        to: from.into(),
                        message: DirectoryMessage::Stale { key, stamp, newer },
                    }),
                    // A peer with another view of the ring: it re-publishes when its view
                    // catches up. Another peer's pool: refused, nothing to tell.
                    // A dead peer's publish, still in flight: its data went with it.
                    Err(
                        PublishRefused::NotOwner
                        | PublishRefused::NotOwnPool
                        | PublishRefused::NotMember,
                    ) => {}
                }
            }
            DirectoryMessage::Unpublish { key, stamp } => {
                self.shard.unpublish(from, &key, stamp);
            }
            DirectoryMessage::Stale { key, stamp, newer } => {
                if self.fresh.remove(&(key.clone(), stamp)) {
                    if let Some(location) = self.pool.restamp(&key, stamp, newer, now) {
                        self.fresh.insert((key.clone(), location.stamp));
                        self.publish(&key, &location, &mut out);
                    }
                } else if self.pool.drop_value(&key, stamp, now) {
                    self.pool.observe(newer);
                    // Other owners may hold the write: one that met no newer write or
                    // tombstone (a lost peer's leaves one only where its entry was).
                    self.withdraw(&key, stamp, &mut out);
                }
            }
            DirectoryMessage::Held { key, location } => match self.pool.location(&key) {
                Some(now) if now == location => {
                    self.fresh.remove(&(key, location.stamp));
                }
                Some(now) if now.stamp == location.stamp => out.push(Outgoing {
                    to: from.into(),
                    message: DirectoryMessage::Publish { key, location: now },
                }),
                _ => out.push(Outgoing {
                    to: from.into(),
                    message: DirectoryMessage::Unpublish {
                        key,
                        stamp: location.stamp,
                    },
                }),
            },
            DirectoryMessage::Removed { key, covering } => {
                if self.ring.has_member(from) {
                    out = self.remove(&key, covering, now);
                    self.free_covered(&key, covering, now, &mut out);
                }
            }
            DirectoryMessage::Drop { key, stamp } => {
                if self.pool.drop_value(&key, stamp, now) {
                    self.pool.observe(stamp);
                    // The remover's ring may differ from this peer's (a peer it still counts
                    // alive, one it has not met): every owner this peer published to lets go
                    // too, or one the removal missed would still answer for the write.
                    self.withdraw(&key, stamp, &mut out);
                }
            }
        }
        // A re-stamped write may have made room on disk at another value's cost.
        out.extend(self.evictions(&[]));
        out
    }

    /// The ring changed to `ring`: entries this peer no longer owns go, and every value it
    /// holds is re-published to whichever of its owners is new.
    pub fn ring_changed(&mut self, ring: Ring, now: Millis) -> Vec<Outgoing> {
        let old = std::mem::replace(&mut self.ring, ring);
        let mut out = Vec::new();
        for (key, covering) in self.shard.tombstones() {
            let before = old.owners(key, self.replicas);
            for owner in self.ring.owners(key, self.replicas) {
                if !before.contains(&owner) && owner != &*self.name {
                    out.push(Outgoing {
                        to: owner.into(),
                        message: DirectoryMessage::Removed {
                            key: key.into(),
                            covering,
                        },
                    });
                }
            }
        }
        self.shard
            .ring_changed(&self.ring, &self.name, self.replicas, now);
        for (key, location) in self.pool.locations() {
            let before = old.owners(&key, self.replicas);
            for owner in self.ring.owners(&key, self.replicas) {
                if !before.contains(&owner) {
                    out.push(Outgoing {
                        to: owner.into(),
                        message: DirectoryMessage::Publish {
                            key: key.clone(),
                            location: location.clone(),
                        },
                    });
                }
            }
        }
        out
    }

    /// Time passed to `now`: tombstones past their time go, and freed blocks whose read
    /// grace ended are reused.
    pub fn tick(&mut self, now: Millis) {
        self.shard.expire_tombstones(now);
        self.pool.release_due(now);
    }

    /// Peer `name` died at `now`: the entries naming its pool go (its data went with it), and
    /// older writes of their keys stay superseded.
    pub fn peer_lost(&mut self, name: &str, now: Millis) -> usize {
        self.shard.forget_peer(name, now)
    }

    /// Every value this peer holds, re-published to all its owners (a periodic round that
    /// repairs entries lost with a dead owner).
    pub fn republish(&mut self) -> Vec<Outgoing> {
        let mut out = Vec::new();
        for (key, location) in self.pool.locations() {
            self.publish(&key, &location, &mut out);
        }
        out
    }

    fn publish(&self, key: &str, location: &Location, out: &mut Vec<Outgoing>) {
        self.send_owners(
            key,
            DirectoryMessage::Publish {
                key: key.into(),
                location: location.clone(),
            },
            out,
        );
    }

    /// Frees this peer's own write of `key` if a removal up to `covering` covers it, and
    /// withdraws it from every owner. The removal reached this peer as an owner in the
    /// remover's view; the write's entries may stand at owners only this peer's view names
    /// (one the remover cannot reach across a partition, while the owners it can reach lost
    /// theirs in a restart), which no Drop would reach. A write made a moment ago, its
    /// publishes still on their way, is left to the owners' tombstones, which judge it as
    /// they judge any late publish.
    fn free_covered(&mut self, key: &str, covering: Stamp, now: Millis, out: &mut Vec<Outgoing>) {
        let Some(held) = self.pool.location(key) else {
            return;
        };
        if held.stamp > covering || self.fresh.contains(&(key.into(), held.stamp)) {
            return;
        }
        if self.pool.drop_value(key, held.stamp, now) {
            self.pool.observe(covering);
            self.withdraw(key, held.stamp, out);
        }
    }

    /// Tells every owner of `key` that this peer no longer holds its write `stamp`.
    fn withdraw(&self, key: &str, stamp: Stamp, out: &mut Vec<Outgoing>) {
        self.send_owners(
            key,
            DirectoryMessage::Unpublish {
                key: key.into(),
                stamp,
            },
            out,
        );
    }

    fn send_owners(&self, key: &str, message: DirectoryMessage, out: &mut Vec<Outgoing>) {
        for owner in self.ring.owners(key, self.replicas) {
            out.push(Outgoing {
                to: owner.into(),
                message: message.clone(),
            });
        }
    }
}
