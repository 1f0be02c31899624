//! What the peer world's clients did, and the judgement of every value they read.
//!
//! Each value names its key and version in its first bytes and is otherwise a function of
//! them, so any read is checked whole: bytes that are not exactly some version written to
//! that key are a violation at any time. A read is also held to the latest completed write
//! when nothing excuses it: no write or removal of the key racing it, no fault (kill, join,
//! partition, healing) within one settling period before it, and the latest value's peer
//! never killed. At the end, after everything healed and settled, every key must read as its
//! last completed operation left it, through every live peer.

use std::collections::BTreeMap;
use std::time::Duration;

/// How long after a fault reads may still see what it disturbed, with membership's default
/// timing: a death noticed (three seconds), a re-publish round (five), and margin.
pub const SETTLE: Duration = Duration::from_secs(10);

/// The value of `key`'s version `version`: its key and version, then filler derived from
/// both, 64 bytes to 16 KiB long.
pub fn value_for(key: u32, version: u64) -> Vec<u8> {
    let mut x = (u64::from(key) << 32 ^ version).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let len = 64 + (x % (16 << 10)) as usize;
    let mut value = Vec::with_capacity(len);
    value.extend_from_slice(&u64::from(key).to_le_bytes());
    value.extend_from_slice(&version.to_le_bytes());
    while value.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        value.push(x as u8);
    }
    value
}

/// The key and version `bytes` claim, if they are exactly that version's value.
fn identify(bytes: &[u8]) -> Option<(u32, u64)> {
    let key = u32::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let version = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
    (value_for(key, version) == bytes).then_some((key, version))
}

/// One write or removal of a key.
#[derive(Clone, Debug)]
struct Change {
    /// The version written (`None`: a removal).
    version: Option<u64>,
    /// The peer it went through (the one that answered).
    peer: usize,
    start: Duration,
    /// When it completed or failed, or `None` while in flight.
    end: Option<Duration>,
    /// It failed: its outcome is unknown (it may have taken effect).
    failed: bool,
}

/// The whole run's history.
#[derive(Debug, Default)]
pub struct History {
    /// How long after a fault reads are excused (see [`SETTLE`]).
    pub settle: Duration,
    changes: BTreeMap<u32, Vec<Change>>,
    /// When each fault happened or healed.
    disturbed: Vec<Duration>,
    /// Peers killed, and when (what they held then is lost; a restarted peer's later
    /// writes are not).
    killed: Vec<(usize, Duration)>,
    /// Peers that started without their disk tier (its disk failed the start's scan), and
    /// when: until they restart, what they hold is in memory only, and eviction takes it.
    diskless: Vec<(usize, Duration)>,
    /// Peers that stopped (killed, restarted, left), and when: a new incarnation after.
    stopped: Vec<(usize, Duration)>,
    next_version: u64,
    /// What went wrong.
    pub violations: Vec<String>,
    /// Reads held to the latest value (not excused).
    pub strict_reads: u64,
    /// Reads checked for bytes only.
    pub reads: u64,
}

impl History {
    /// A history whose reads are excused for `settle` after each fault.
    pub fn new(settle: Duration) -> History {
        History {
            settle,
            ..History::default()
        }
    }

    /// A write of `key` starting at `now`: its version, and an index to finish it with.
    pub fn start_put(&mut self, key: u32, now: Duration) -> (u64, usize) {
        self.next_version += 1;
        let version = self.next_version;
        (version, self.start(key, Some(version), now))
    }

    /// A removal of `key` starting at `now`.
    pub fn start_remove(&mut self, key: u32, now: Duration) -> usize {
        self.start(key, None, now)
    }

    fn start(&mut self, key: u32, version: Option<u64>, now: Duration) -> usize {
        let changes = self.changes.entry(key).or_default();
        changes.push(Change {
            version,
            peer: usize::MAX,
            start: now,
            end: None,
            failed: false,
        });
        changes.len() - 1
    }

    /// The change `index` of `key` ended at `now` through peer `peer` (`ok`: completed;
    /// else its outcome is unknown).
    pub fn finish(&mut self, key: u32, index: usize, ok: bool, peer: usize, now: Duration) {
        let change = &mut self.changes.get_mut(&key).expect("started")[index];
        change.peer = peer;
        change.end = Some(now);
        change.failed = !ok;
    }

    /// A fault happened or healed at `now`.
    pub fn disturb(&mut self, now: Duration) {
        self.disturbed.push(now);
    }

    /// Peer `peer` was killed: what it held is lost.
    pub fn kill(&mut self, peer: usize, now: Duration) {
        self.stopped.push((peer, now));
        self.may_have_lost(peer, now);
    }

    /// Peer `peer` started at `now` without its disk tier: writes through it from now until
    /// its next restart may be evicted for good (the pools are small).
    pub fn started_without_disk(&mut self, peer: usize, now: Duration) {
        self.diskless.push((peer, now));
    }

    /// Peer `peer` may have lost any value it held by `now` (its disk failed reads and
    /// writes until then: a copy not written or not read back takes its value with it).
    pub fn may_have_lost(&mut self, peer: usize, now: Duration) {
        self.killed.push((peer, now));
        self.disturb(now);
    }

    /// Judges an `exists` of `key` through `peer` that ran from `start` to `end` and answered
    /// `found`: held, as a read is, to the latest completed changes when nothing excuses a
    /// difference, and judged only when they agree on whether there is a value.
    pub fn exists(&mut self, key: u32, peer: usize, found: bool, start: Duration, end: Duration) {
        let quiet = !self
            .disturbed
            .iter()
            .any(|&at| at + self.settle >= start && at <= end);
        let Some(expected) = self.expected(key, start, end).filter(|_| quiet) else {
            return;
        };
        let present = expected.iter().all(Option::is_some);
        if present != expected.iter().any(Option::is_some) {
            return;
        }
        self.strict_reads += 1;
        if found != present {
            self.violations.push(format!(
                "exists of key {key} through peer {peer} from {start:?} to {end:?} answered \
                 {found}, but the latest completed changes left one of {expected:?} and \
                 nothing excuses the difference"
            ));
        }
    }

    /// Judges a read of `key` through `peer` that ran from `start` to `end` and returned
    /// `read`.
    pub fn read(
        &mut self,
        key: u32,
        peer: usize,
        read: Option<&[u8]>,
        start: Duration,
        end: Duration,
    ) {
        self.reads += 1;
        if let Some(bytes) = read {
            match identify(bytes) {
                Some((k, version)) if k == key && self.was_written(key, version, end) => {
                    if let Some(removal) = self.removed_after(key, version, start) {
                        self.violations.push(format!(
                            "a read of key {key} through peer {peer} at {end:?} returned \
                             version {version}, which a removal from {:?} to {:?} covered",
                            removal.0, removal.1
                        ));
                        return;
                    }
                }
                _ => {
                    self.violations.push(format!(
                        "a read of key {key} through peer {peer} at {end:?} returned {} bytes \
                         that are no value written to it",
                        bytes.len()
                    ));
                    return;
                }
            }
        }
        let quiet = !self
            .disturbed
            .iter()
            .any(|&at| at + self.settle >= start && at <= end);
        if !quiet {
            return;
        }
        let Some(expected) = self.expected(key, start, end) else {
            return;
        };
        self.strict_reads += 1;
        let got = read.and_then(identify).map(|(_, version)| version);
        if !expected.contains(&got) {
            self.violations.push(format!(
                "a read of key {key} through peer {peer} from {start:?} to {end:?} returned \
                 {got:?}, but the latest completed changes left one of {expected:?} and \
                 nothing excuses the difference"
            ));
        }
    }

    /// A removal of `key` that began after its write `version` ended (completed or failed)
    /// and completed before `by`: its span. Whatever happens, such a removal covers that
    /// write (it is stamped above it), so the value must never be read again.
    fn removed_after(&self, key: u32, version: u64, by: Duration) -> Option<(Duration, Duration)> {
        let changes = self.changes.get(&key)?;
        let written = changes.iter().find(|c| c.version == Some(version))?.end?;
        changes
            .iter()
            .filter(|c| c.version.is_none() && !c.failed && c.start > written)
            .find_map(|c| c.end.filter(|&end| end < by).map(|end| (c.start, end)))
    }

    /// Whether a write of `key`'s `version` began by `by`.
    fn was_written(&self, key: u32, version: u64, by: Duration) -> bool {
        self.changes.get(&key).is_some_and(|changes| {
            changes
                .iter()
                .any(|c| c.version == Some(version) && c.start <= by)
        })
    }

    /// What a read of `key` from `start` to `end` may return (`None` in the list: no
    /// value), or `None` when something excuses any answer: a change racing it, a failed
    /// change (its outcome unknown) no later change has superseded, or a candidate value
    /// whose peer was killed after it began. The candidates are the completed changes no
    /// other completed change began after (writes that overlapped each other may land in
    /// either order).
    fn expected(&self, key: u32, start: Duration, end: Duration) -> Option<Vec<Option<u64>>> {
        let changes = self
            .changes
            .get(&key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let racing = changes
            .iter()
            .any(|c| c.start <= end && c.end.is_none_or(|finished| finished >= start));
        if racing {
            return None;
        }
        let done: Vec<&Change> = changes
            .iter()
            .filter(|c| !c.failed && c.end.is_some_and(|finished| finished < start))
            .collect();
        let superseded = |c: &Change| {
            done.iter()
                .any(|later| later.start > c.end.unwrap_or_default())
        };
        let candidates: Vec<&Change> = done.iter().copied().filter(|c| !superseded(c)).collect();
        let unsettled = changes
            .iter()
            .any(|c| c.failed && c.start <= end && !superseded(c));
        let restarted_between = |peer: usize, from: Duration, to: Duration| {
            self.stopped
                .iter()
                .any(|&(p, at)| p == peer && at >= from && at <= to)
        };
        let lost = candidates.iter().any(|c| {
            c.version.is_some()
                && (self
                    .killed
                    .iter()
                    .any(|&(peer, at)| peer == c.peer && at >= c.start)
                    || self.diskless.iter().any(|&(peer, from)| {
                        peer == c.peer && c.start >= from && !restarted_between(peer, from, c.start)
                    }))
        });
        if unsettled || lost {
            return None;
        }
        if candidates.is_empty() {
            return Some(vec![None]);
        }
        Some(candidates.iter().map(|c| c.version).collect())
    }

    /// The keys written or removed, for the final sweep.
    pub fn keys(&self) -> Vec<u32> {
        self.changes.keys().copied().collect()
    }

    /// Every change that could have mattered to the value's identity, for the fingerprint.
    pub fn fingerprint(&self) -> u64 {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for (key, changes) in &self.changes {
            for c in changes {
                for word in [
                    u64::from(*key),
                    c.version.unwrap_or(0),
                    c.peer as u64,
                    c.end.map_or(u64::MAX, |e| e.as_nanos() as u64),
                ] {
                    hash = (hash ^ word).wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
        }
        hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn values_are_checked_whole() {
        let value = value_for(3, 9);
        assert_eq!(identify(&value), Some((3, 9)));
        let mut flipped = value.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(identify(&flipped), None);
        assert_eq!(identify(&value[..10]), None);
    }

    #[test]
    fn a_read_is_held_to_the_latest_change_unless_something_excuses_it() {
        let mut history = History::new(SETTLE);
        let (v1, i) = history.start_put(1, S);
        history.finish(1, i, true, 0, 2 * S);
        history.read(1, 1, Some(&value_for(1, v1)), 3 * S, 3 * S);
        assert!(history.violations.is_empty());
        // A miss of a completed write is a violation.
        history.read(1, 1, None, 4 * S, 4 * S);
        assert_eq!(history.violations.len(), 1);
        // Unless its peer was killed.
        history.kill(0, 5 * S);
        history.read(1, 1, None, 30 * S, 30 * S);
        assert_eq!(history.violations.len(), 1);
        // Bytes of another key are a violation at any time.
        history.read(1, 1, Some(&value_for(2, v1)), 31 * S, 31 * S);
        assert_eq!(history.violations.len(), 2);
        assert_eq!(history.strict_reads, 2);
        // A removal covers what was written before it, even right after a fault.
        let r = history.start_remove(1, 32 * S);
        history.finish(1, r, true, 1, 33 * S);
        history.kill(2, 33 * S);
        history.read(1, 1, Some(&value_for(1, v1)), 34 * S, 34 * S);
        assert_eq!(history.violations.len(), 3, "{:?}", history.violations);
        // A peer killed (restarted) long before a write through it does not excuse its miss.
        let (_, w) = history.start_put(2, 50 * S);
        history.finish(2, w, true, 0, 51 * S);
        history.read(2, 1, None, 70 * S, 70 * S);
        assert_eq!(history.violations.len(), 4, "{:?}", history.violations);
        // Nor an exists that says there is nothing.
        history.exists(2, 1, false, 71 * S, 71 * S);
        history.exists(2, 1, true, 72 * S, 72 * S);
        assert_eq!(history.violations.len(), 5, "{:?}", history.violations);
        // A peer that started without its disk tier may evict for good what is written
        // through it, until it restarts.
        history.started_without_disk(3, 80 * S);
        let (_, w) = history.start_put(3, 81 * S);
        history.finish(3, w, true, 3, 82 * S);
        history.read(3, 1, None, 100 * S, 100 * S);
        assert_eq!(history.violations.len(), 5, "{:?}", history.violations);
        history.kill(3, 110 * S);
        let (_, w) = history.start_put(4, 111 * S);
        history.finish(4, w, true, 3, 112 * S);
        history.read(4, 1, None, 130 * S, 130 * S);
        assert_eq!(history.violations.len(), 6, "{:?}", history.violations);
    }

    #[test]
    fn writes_that_overlapped_may_land_in_either_order() {
        let mut history = History::new(SETTLE);
        let (v1, i1) = history.start_put(1, S);
        let (v2, i2) = history.start_put(1, 2 * S);
        history.finish(1, i2, true, 0, 3 * S);
        history.finish(1, i1, true, 1, 4 * S);
        history.read(1, 0, Some(&value_for(1, v2)), 5 * S, 5 * S);
        history.read(1, 0, Some(&value_for(1, v1)), 6 * S, 6 * S);
        assert!(history.violations.is_empty(), "{:?}", history.violations);
        // A write begun after both ended supersedes them.
        let (v3, i3) = history.start_put(1, 7 * S);
        history.finish(1, i3, true, 0, 8 * S);
        history.read(1, 0, Some(&value_for(1, v3)), 9 * S, 9 * S);
        assert!(history.violations.is_empty());
        history.read(1, 0, Some(&value_for(1, v1)), 10 * S, 10 * S);
        assert_eq!(history.violations.len(), 1);
    }
}
