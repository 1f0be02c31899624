//! Zombie cleanup: in-progress writes that never finish.
//!
//! A client can die (or be cut off) between PutStart and PutEnd. Its write keeps the key in
//! PROCESSING, unreadable and unwritable. After `put_start_discard_timeout` a new PutStart may
//! preempt it, and `tick` discards it anyway, so every key leaves PROCESSING within the discard
//! timeout. The blocks it held wait in the discarded list until the write fence says its last
//! byte has landed (`FenceRule::writes_land_by`), because the zombie may still be writing
//! into them.
//!
//! Deadlines are kept in a queue in start order. Because `now` never goes backwards, start
//! order is deadline order, so `tick` only looks at the front. Finished writes leave their
//! entry behind (it is recognised as stale by its write id) and the queue is compacted when
//! stale entries outnumber live ones.

use std::collections::VecDeque;

use crate::events::DiscardCause;
use crate::ids::WriteId;
use crate::master::Master;
use crate::time::Millis;

/// In-progress writes in start order: (deadline, object slot, write).
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct WriteDeadlines {
    queue: VecDeque<(Millis, u32, WriteId)>,
}

impl WriteDeadlines {
    pub(crate) fn push(&mut self, deadline: Millis, slot: u32, write: WriteId) {
        debug_assert!(self.queue.back().is_none_or(|&(d, _, _)| d <= deadline));
        self.queue.push_back((deadline, slot, write));
    }

    /// The earliest deadline (possibly of a write that has since finished).
    pub(crate) fn next_deadline(&self) -> Option<Millis> {
        self.queue.front().map(|&(d, _, _)| d)
    }

    fn pop_due(&mut self, now: Millis) -> Option<(u32, WriteId)> {
        match self.queue.front() {
            Some(&(deadline, slot, write)) if deadline <= now => {
                self.queue.pop_front();
                Some((slot, write))
            }
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether the queue holds `write` of `slot` with exactly `deadline`.
    pub(crate) fn contains(&self, deadline: Millis, slot: u32, write: WriteId) -> bool {
        self.queue.contains(&(deadline, slot, write))
    }

    pub(crate) fn retain(&mut self, live: impl Fn(u32, WriteId) -> bool) {
        self.queue.retain(|&(_, slot, write)| live(slot, write));
    }

    pub(crate) fn rebase(&mut self, shift: impl Fn(Millis) -> Millis) {
        for entry in &mut self.queue {
            entry.0 = shift(entry.0);
        }
    }
}

impl Master {
    /// Registers a write that just started, so it cannot outlive the discard timeout.
    pub(crate) fn track_write(&mut self, slot: u32) {
        let object = self.objects.at(slot);
        let deadline = object.put_start() + self.config.put_start_discard_timeout;
        let write = object.write_id();
        let (writer, size) = (self.objects.writer(slot), object.size());
        self.writes.push(deadline, slot, write);
        self.unfinished
            .start(slot, self.objects.key_of(object), writer, size);
        self.counters.writing_objects += 1;
        let live = self.counters.writing_objects as usize;
        if self.writes.len() > 2 * live + 1024 {
            let objects = &self.objects;
            self.writes.retain(|slot, write| {
                objects
                    .get(slot)
                    .is_some_and(|o| o.writing() && o.write_id() == write)
            });
        }
    }

    /// The write on `slot` ended, however it ended: it no longer counts as in progress, nor
    /// against its member's share.
    pub(crate) fn write_ended(&mut self, slot: u32) {
        self.counters.writing_objects -= 1;
        self.unfinished.end(slot);
    }

    /// Whether the write in progress on `slot` has outlived the discard timeout.
    pub(crate) fn write_expired(&self, slot: u32, now: Millis) -> bool {
        let object = self.objects.at(slot);
        object.writing() && object.put_start() + self.config.put_start_discard_timeout <= now
    }

    /// Discards every write whose discard timeout has passed.
    pub(crate) fn discard_expired_writes(&mut self, now: Millis) {
        while let Some((slot, write)) = self.writes.pop_due(now) {
            let current = self
                .objects
                .get(slot)
                .is_some_and(|o| o.writing() && o.write_id() == write);
            if current {
                self.discard_write(slot, DiscardCause::Timeout);
            }
        }
    }
}
