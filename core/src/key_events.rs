//! KV events: what a cache-aware router is told about keys coming and going, so it can send a
//! request to the engine whose prefix is already in the store.
//!
//! The master reports a [`KeyChange`]: *stored* when a key's value becomes readable (a write
//! ended, or a prefetch brought back a value whose only copy had gone), *removed* when it
//! stops being readable (removed, evicted with no disk copy, lost with its segments, or taken
//! by an upsert, whose end is a new *stored*). Replaying them in order gives exactly the
//! readable keys: the auditor checks that after every call
//! ([`crate::invariants::KeyEventLedger`]), so a path that forgets to report is a violation
//! the simulation names.
//!
//! [`KeyEventLog`] keeps the latest of them, numbered, for subscribers that poll: each asks
//! for what came after the last number it saw and is told when it fell so far behind that
//! some were dropped (it then lists the keys again and follows from the number it was given).

use std::collections::VecDeque;

use crate::ids::WriteId;
use crate::master::Master;
use crate::object::Object;
use crate::time::Millis;

/// Whether a KV event says a value came or went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyEventKind {
    /// The key's value became readable.
    Stored,
    /// The key's value stopped being readable.
    Removed,
}

/// A key's value coming or going, as the master reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyChange {
    /// Stored or removed.
    pub kind: KeyEventKind,
    /// The key as stored (a tenant's keys carry the tenant's prefix).
    pub key: Box<str>,
    /// The write whose value came or went.
    pub write: WriteId,
    /// The value's length in bytes (0 for a removal).
    pub size: u64,
}

impl KeyChange {
    /// `object`'s value, under `key`, became readable.
    pub(crate) fn stored(key: &str, object: &Object) -> KeyChange {
        KeyChange {
            kind: KeyEventKind::Stored,
            key: key.into(),
            write: object.write_id(),
            size: object.size(),
        }
    }

    /// `object`'s current value, under `key`, stopped being readable.
    pub(crate) fn removed(key: &str, object: &Object) -> KeyChange {
        KeyChange {
            kind: KeyEventKind::Removed,
            key: key.into(),
            write: object.write_id(),
            size: 0,
        }
    }
}

/// The key changes reported since the driver last took them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyChanges {
    /// The changes, oldest first.
    pub changes: VecDeque<KeyChange>,
    /// Changes dropped before these because the driver took none for too long (the oldest
    /// go first): whoever follows them must list the keys again.
    pub dropped: u64,
}

/// Key changes kept before the oldest are dropped: a `remove_all` of a huge store between two
/// drains must not grow the master without bound (its subscribers are told they missed some).
const KEY_CHANGE_LIMIT: usize = 1 << 16;

impl Master {
    /// Stops (`true`) or resumes reporting key changes. A journal's replay pauses them: its
    /// changes were reported when they first happened, a restarted master's subscribers start
    /// afresh from the keys they list, and building each would cost a copy of its key
    /// (millions in a restart).
    pub fn pause_key_changes(&mut self, paused: bool) {
        self.key_changes_paused = paused;
    }

    /// Whether key changes are reported now.
    pub(crate) fn reports_key_changes(&self) -> bool {
        !self.key_changes_paused
    }

    /// Reports that `slot`'s value became readable.
    pub(crate) fn value_stored(&mut self, slot: u32) {
        if self.key_changes_paused {
            return;
        }
        let change = KeyChange::stored(self.objects.key(slot), self.objects.at(slot));
        self.report_key_change(change);
    }

    /// Reports that `slot`'s current value stopped being readable (before it changes).
    pub(crate) fn value_removed(&mut self, slot: u32) {
        if self.key_changes_paused {
            return;
        }
        let change = KeyChange::removed(self.objects.key(slot), self.objects.at(slot));
        self.report_key_change(change);
    }

    /// Queues `change`, dropping the oldest past [`KEY_CHANGE_LIMIT`].
    pub(crate) fn report_key_change(&mut self, change: KeyChange) {
        let queue = &mut self.key_changes;
        if queue.changes.len() == KEY_CHANGE_LIMIT {
            queue.changes.pop_front();
            queue.dropped += 1;
        }
        queue.changes.push_back(change);
    }

    /// Takes the key changes reported since the last call, oldest first.
    pub fn drain_key_changes(&mut self) -> KeyChanges {
        std::mem::take(&mut self.key_changes)
    }
}

/// One KV event as subscribers see it: a numbered [`KeyChange`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyEvent {
    /// Its number: one more than the event before it, from 1.
    pub seq: u64,
    /// When the master reported it.
    pub at: Millis,
    /// What changed.
    pub change: KeyChange,
}

/// One answer to a subscriber: the events after the number it gave that pass its filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyEventPage {
    /// The events, oldest first.
    pub events: Vec<KeyEvent>,
    /// The number to ask after next time: the last event looked at, whether or not it passed
    /// the filter.
    pub next: u64,
    /// Events after the number asked for were dropped before this answer (the subscriber fell
    /// behind the log's capacity): its picture of the keys may be wrong until it lists them.
    pub missed: bool,
}

/// The latest KV events, numbered, kept for subscribers that poll.
#[derive(Clone, Debug)]
pub struct KeyEventLog {
    events: VecDeque<KeyEvent>,
    capacity: usize,
    /// The number the next event gets.
    next_seq: u64,
    /// The highest number given to a change the master dropped (0: none).
    lost_through: u64,
}

impl KeyEventLog {
    /// A log keeping the latest `capacity` events (at least one).
    pub fn new(capacity: usize) -> KeyEventLog {
        KeyEventLog {
            events: VecDeque::new(),
            capacity: capacity.max(1),
            next_seq: 1,
            lost_through: 0,
        }
    }

    /// Numbers and keeps `changes` (what a drain of the master gave), reported at `now`; the
    /// oldest kept go when the log is full. Changes the master dropped take numbers too, so a
    /// subscriber whose range covers them is told it missed some.
    pub fn record(&mut self, changes: KeyChanges, now: Millis) {
        if changes.dropped > 0 {
            self.next_seq += changes.dropped;
            self.lost_through = self.next_seq - 1;
        }
        for change in changes.changes {
            if self.events.len() == self.capacity {
                self.events.pop_front();
            }
            self.events.push_back(KeyEvent {
                seq: self.next_seq,
                at: now,
                change,
            });
            self.next_seq += 1;
        }
    }

    /// The number of the latest event (0 before any): where a subscriber that wants only
    /// what happens from now on starts.
    pub fn latest(&self) -> u64 {
        self.next_seq - 1
    }

    /// The events numbered after `after` whose stored key passes `wanted`, looking at no more
    /// than `limit` of them.
    pub fn read(&self, after: u64, limit: usize, wanted: impl Fn(&str) -> bool) -> KeyEventPage {
        let oldest = self.events.front().map_or(self.next_seq, |e| e.seq);
        // A number not yet given (from a log that restarted since, or made up) is a gap:
        // answered from the oldest kept.
        let unknown = after > self.latest();
        let after = if unknown { 0 } else { after };
        let mut page = KeyEventPage {
            events: Vec::new(),
            next: after.max(oldest - 1),
            missed: unknown || after + 1 < oldest || after < self.lost_through,
        };
        let skip = usize::try_from(page.next + 1 - oldest).unwrap_or(usize::MAX);
        // The limit counts events looked at, so a page stays bounded however few pass.
        for event in self.events.iter().skip(skip).take(limit) {
            page.next = event.seq;
            if wanted(&event.change.key) {
                page.events.push(event.clone());
            }
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(kind: KeyEventKind, key: &str, write: u64) -> KeyChange {
        KeyChange {
            kind,
            key: key.into(),
            write: WriteId(write),
            size: 10,
        }
    }

    fn stored(key: &str, write: u64) -> KeyChange {
        change(KeyEventKind::Stored, key, write)
    }

    fn batch(changes: Vec<KeyChange>) -> KeyChanges {
        KeyChanges {
            changes: changes.into(),
            dropped: 0,
        }
    }

    fn keys(page: &KeyEventPage) -> Vec<(u64, &str)> {
        page.events
            .iter()
            .map(|e| (e.seq, &*e.change.key))
            .collect()
    }

    #[test]
    fn numbers_only_kv_events_and_pages_through_them() {
        let mut log = KeyEventLog::new(100);
        log.record(
            batch(vec![
                stored("a", 1),
                change(KeyEventKind::Removed, "a", 1),
                stored("b", 2),
            ]),
            Millis(5),
        );
        assert_eq!(log.latest(), 3);
        let all = log.read(0, 10, |_| true);
        assert_eq!(keys(&all), [(1, "a"), (2, "a"), (3, "b")]);
        assert_eq!(all.events[1].change.kind, KeyEventKind::Removed);
        assert_eq!(all.events[1].at, Millis(5));
        assert_eq!((all.next, all.missed), (3, false));
        let first = log.read(0, 2, |_| true);
        assert_eq!((keys(&first), first.next), (vec![(1, "a"), (2, "a")], 2));
        let rest = log.read(first.next, 2, |_| true);
        assert_eq!((keys(&rest), rest.next), (vec![(3, "b")], 3));
        let none = log.read(3, 10, |_| true);
        assert_eq!((none.events.len(), none.next, none.missed), (0, 3, false));
    }

    #[test]
    fn a_filter_skips_events_but_the_cursor_moves_past_them() {
        let mut log = KeyEventLog::new(100);
        log.record(
            batch(vec![stored("x/1", 1), stored("y/1", 2), stored("x/2", 3)]),
            Millis(0),
        );
        let page = log.read(0, 10, |k| k.starts_with("x/"));
        assert_eq!(keys(&page), [(1, "x/1"), (3, "x/2")]);
        assert_eq!(page.next, 3);
        let page = log.read(1, 1, |k| k.starts_with("x/"));
        // The limit counts events looked at, so a page stays bounded however few pass.
        assert!(page.events.is_empty());
        assert_eq!(page.next, 2);
    }

    #[test]
    fn a_subscriber_that_fell_behind_is_told() {
        let mut log = KeyEventLog::new(2);
        log.record(
            batch(vec![stored("a", 1), stored("b", 2), stored("c", 3)]),
            Millis(0),
        );
        let page = log.read(0, 10, |_| true);
        assert!(page.missed, "event 1 was dropped");
        assert_eq!(keys(&page), [(2, "b"), (3, "c")]);
        let page = log.read(1, 10, |_| true);
        assert!(!page.missed, "the subscriber saw event 1");
        assert_eq!(keys(&page), [(2, "b"), (3, "c")]);
        // A number from a log that restarted since is a gap, answered from the start.
        let page = log.read(99, 10, |_| true);
        assert!(page.missed);
        assert_eq!(page.events.len(), 2);
        // An empty log answers nothing, missing nothing.
        let empty = KeyEventLog::new(4).read(0, 10, |_| true);
        assert_eq!(
            (empty.events.len(), empty.next, empty.missed),
            (0, 0, false)
        );
    }

    #[test]
    fn changes_the_master_dropped_are_a_gap_too() {
        let mut log = KeyEventLog::new(100);
        log.record(batch(vec![stored("a", 1)]), Millis(0));
        log.record(
            KeyChanges {
                changes: vec![stored("d", 4)].into(),
                dropped: 2,
            },
            Millis(1),
        );
        // Numbers 2 and 3 were never kept.
        let page = log.read(1, 10, |_| true);
        assert!(page.missed);
        assert_eq!(keys(&page), [(4, "d")]);
        let page = log.read(3, 10, |_| true);
        assert!(!page.missed, "a subscriber past the gap missed nothing");
    }
}
