//! Synchronous log shipping to standby masters: which journal records the leader may
//! acknowledge, and which standbys may take over from it.
//!
//! The leader's journal is a byte stream per generation; a position in it is a
//! [`LogPosition`]. Each time the leader's own disk holds more, it reports the sync
//! ([`LogShipping::synced`]); each standby reports how far its disk holds the same bytes
//! ([`LogShipping::acked`]). A record may be acknowledged to a client once the leader and every
//! **in-sync** standby hold it ([`LogShipping::replicated`]). Only in-sync standbys may become
//! leader, so whoever takes over holds every acknowledged change.
//!
//! The in-sync set is also kept outside the leader (in etcd), and the order of changes there
//! is what makes this safe; the caller follows the returned instructions:
//!
//! - a standby that came near (within [`NEAR`] bytes) is waited for **here first**; once it
//!   holds everything the leader had synced at that moment — so every record acknowledged
//!   without it — it is recorded as in sync outside ([`Membership::Join`]): nothing is
//!   acknowledged without it from before the moment it could be elected;
//! - a standby that holds acknowledgements back for longer than the timeout is recorded as out
//!   of sync **outside first** ([`LogShipping::overdue`]), and only then stops being waited for
//!   ([`LogShipping::drop_follower`]): if the leader cannot record that (it lost its
//!   leadership), it must not acknowledge without the standby.

use std::collections::{BTreeMap, VecDeque};

use crate::time::Millis;

/// A place in the leader's journal: a generation and a byte offset in its journal file.
/// Generations follow one another, so positions order lexicographically.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    /// The journal's generation.
    pub generation: u64,
    /// Bytes of that generation's journal before this point.
    pub offset: u64,
}

/// What changed in the in-sync set after an acknowledgement from a standby.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Nothing.
    Unchanged,
    /// The standby caught up and is now waited for: record it as in sync.
    Join(String),
}

/// How close to the leader's newest sync a standby must come to be waited for. Under steady
/// writes a standby that asks for more after each sync is always a little behind: waiting for
/// it from here costs the leader at most this much of its transfer per acknowledgement.
pub const NEAR: u64 = 4 << 20;

#[derive(Clone, Debug)]
struct Follower {
    position: LogPosition,
    /// How far the leader has sent it the journal: it cannot hold more than that, so no
    /// claim (a confused or lying standby's) counts beyond it.
    sent: LogPosition,
    /// Acknowledgements wait for it, holding since this point: it holds every record
    /// acknowledged without it once it reaches the point.
    waited_from: Option<LogPosition>,
    /// It was reported as in sync.
    in_sync: bool,
}

/// The leader's view of its standbys (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct LogShipping {
    /// Local syncs not yet held by every in-sync standby: (last record, end, when synced).
    pending: VecDeque<(u64, LogPosition, Millis)>,
    /// The newest local sync.
    durable: (u64, LogPosition),
    followers: BTreeMap<String, Follower>,
    /// The last record every in-sync standby holds.
    replicated: u64,
}

impl LogShipping {
    /// A leader whose journal holds records up to `seq`, ending at `end`, with no standby.
    pub fn new(seq: u64, end: LogPosition) -> LogShipping {
        LogShipping {
            durable: (seq, end),
            replicated: seq,
            ..LogShipping::default()
        }
    }

    /// The leader's disk holds every record up to `seq`, ending at `end`, since `now`.
    pub fn synced(&mut self, seq: u64, end: LogPosition, now: Millis) {
        if seq <= self.durable.0 {
            return;
        }
        self.durable = (seq, end);
        self.pending.push_back((seq, end, now));
        self.advance();
    }

    /// The leader sent standby `name` its journal up to `end` (a snapshot counts as the
    /// start of the journal after it).
    pub fn sent(&mut self, name: &str, end: LogPosition) {
        let follower = self.followers.entry(name.to_string()).or_insert(Follower {
            position: LogPosition::default(),
            sent: end,
            waited_from: None,
            in_sync: false,
        });
        follower.sent = follower.sent.max(end);
    }

    /// Standby `name` holds the leader's journal up to `position`, as far as the leader sent
    /// it (see [`LogShipping::sent`]); a claim beyond that counts only as far as was sent. A
    /// standby that comes near the newest sync is waited for from then on, and joins the
    /// in-sync set once it holds what was synced when it came near.
    pub fn acked(&mut self, name: &str, position: LogPosition) -> Membership {
        let position = self
            .followers
            .get(name)
            .map_or(LogPosition::default(), |f| position.min(f.sent));
        let durable = self.durable.1;
        let near = position >= durable
            || (position.generation == durable.generation
                && durable.offset - position.offset <= NEAR);
        let follower = self.followers.entry(name.to_string()).or_insert(Follower {
            position,
            sent: position,
            waited_from: None,
            in_sync: false,
        });
        follower.position = follower.position.max(position);
        if near && follower.waited_from.is_none() {
            follower.waited_from = Some(durable);
        }
        let joined = !follower.in_sync
            && follower
                .waited_from
                .is_some_and(|from| follower.position >= from);
        follower.in_sync |= joined;
        self.advance();
        if joined {
            Membership::Join(name.to_string())
        } else {
            Membership::Unchanged
        }
    }

    /// Waited-for standbys that have held back a sync for longer than `timeout` at `now`:
    /// record each as out of sync, then [`LogShipping::drop_follower`] it.
    pub fn overdue(&self, now: Millis, timeout: Millis) -> Vec<String> {
        let Some(&(_, end, since)) = self.pending.front() else {
            return Vec::new();
        };
        if now.since(since) < timeout {
            return Vec::new();
        }
        self.followers
            .iter()
            .filter(|(_, f)| f.waited_from.is_some() && f.position < end)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Stops waiting for standby `name` (it is recorded as out of sync, or it was never in).
    pub fn drop_follower(&mut self, name: &str) {
        self.followers.remove(name);
        self.advance();
    }

    /// The last record the leader may acknowledge: on its disk and every in-sync standby's.
    pub fn replicated(&self) -> u64 {
        self.replicated
    }

    /// The standbys reported as in sync.
    pub fn in_sync(&self) -> Vec<String> {
        self.followers
            .iter()
            .filter(|(_, f)| f.in_sync)
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn advance(&mut self) {
        let slowest = self
            .followers
            .values()
            .filter(|f| f.waited_from.is_some())
            .map(|f| f.position)
            .min();
        while let Some(&(seq, end, _)) = self.pending.front() {
            if slowest.is_some_and(|held| held < end) {
                break;
            }
            self.replicated = seq;
            self.pending.pop_front();
        }
    }
}
