//! A storage node's staging buffer, as a pure state value: slots that disk copies are loaded
//! into for readers to pull with a one-sided read. A slot is the loader's alone until it is
//! loaded; then it is the reader's until the reader unstages it or its TTL runs out (a reader
//! that vanished must not leak the buffer).

use std::collections::BTreeMap;

use crate::allocator::{Allocation, OffsetAllocator};
use crate::time::Millis;

/// Where a slot lies: its id (for the reader to unstage) and its offset in the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingSlot {
    /// The id the reader unstages.
    pub id: u64,
    /// Offset of the slot's first byte in the buffer, aligned as asked.
    pub offset: u64,
}

/// The staging buffer's slots.
#[derive(Debug)]
pub struct StagingSlots {
    allocator: OffsetAllocator,
    /// Slot id → (its block, reclaimed at; `None` while it is being loaded).
    live: BTreeMap<u64, (Allocation, Option<Millis>)>,
    next: u64,
    ttl: Millis,
    /// Slots reclaimed because their reader outstayed the TTL, since the start.
    reclaimed: u64,
}

impl StagingSlots {
    /// Slots in a buffer of `capacity` bytes, each reclaimed `ttl` after it was loaded.
    pub fn new(capacity: u64, ttl: Millis) -> StagingSlots {
        StagingSlots {
            allocator: OffsetAllocator::new(capacity),
            live: BTreeMap::new(),
            next: 1,
            ttl,
            reclaimed: 0,
        }
    }

    /// How long a loaded slot waits for its reader.
    pub fn ttl(&self) -> Millis {
        self.ttl
    }

    /// A slot of `len` bytes whose address (`base` + offset) is a multiple of `align`, for a
    /// load starting at `now`; expired slots are reclaimed first if the buffer is full.
    /// `None` if there is no room.
    pub fn allocate(
        &mut self,
        len: u64,
        align: u64,
        base: u64,
        now: Millis,
    ) -> Option<StagingSlot> {
        let align = align.max(1);
        let size = len.checked_add(align - 1)?;
        let allocation = self.allocator.allocate(size).or_else(|| {
            self.reclaim_expired(now);
            self.allocator.allocate(size)
        })?;
        let id = self.next;
        self.next += 1;
        self.live.insert(id, (allocation, None));
        let start = base + allocation.offset;
        Some(StagingSlot {
            id,
            offset: start.div_ceil(align) * align - base,
        })
    }

    /// The slot's load finished at `now`: it is the reader's until unstaged or its TTL ends.
    pub fn loaded(&mut self, id: u64, now: Millis) {
        let ttl = self.ttl;
        if let Some((_, at)) = self.live.get_mut(&id) {
            *at = Some(now + ttl);
        }
    }

    /// A reader is done with its slot. A slot still loading is not a reader's yet (no reader
    /// knows its id), so it stays.
    pub fn unstage(&mut self, id: u64) {
        if let Some(&(block, Some(_))) = self.live.get(&id) {
            self.live.remove(&id);
            self.allocator.free(block);
        }
    }

    /// The slot's load failed and nothing will write into it any more: it is free again.
    pub fn abandon(&mut self, id: u64) {
        if let Some((block, _)) = self.live.remove(&id) {
            self.allocator.free(block);
        }
    }

    /// How many loaded slots were reclaimed because their reader outstayed the TTL.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed
    }

    /// Slots live (loading or waiting for their reader).
    pub fn live(&self) -> usize {
        self.live.len()
    }

    fn reclaim_expired(&mut self, now: Millis) {
        let expired: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, (_, at))| at.is_some_and(|at| at <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            let (block, _) = self.live.remove(&id).expect("listed");
            self.allocator.free(block);
            self.reclaimed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_and_come_back_when_unstaged_abandoned_or_expired() {
        let mut slots = StagingSlots::new(4096, Millis(100));
        let now = Millis(1_000);
        let a = slots.allocate(1000, 512, 0x10_0100, now).unwrap();
        assert_eq!((0x10_0100 + a.offset) % 512, 0, "the address is aligned");
        let b = slots.allocate(1000, 512, 0x10_0100, now).unwrap();
        assert_ne!(a.id, b.id);
        slots.unstage(a.id);
        assert_eq!(
            slots.live(),
            2,
            "a slot still loading is not the reader's to free"
        );
        slots.loaded(a.id, now);
        slots.unstage(a.id);
        slots.abandon(b.id);
        assert_eq!(slots.live(), 0);
        // Fill the buffer with loaded slots whose readers vanished.
        let mut taken = 0;
        while let Some(slot) = slots.allocate(1000, 1, 0, now) {
            slots.loaded(slot.id, now);
            taken += 1;
        }
        assert!(taken >= 2);
        assert!(
            slots.allocate(1000, 1, 0, now + Millis(99)).is_none(),
            "TTLs not over yet"
        );
        assert_eq!(slots.reclaimed(), 0);
        assert!(
            slots.allocate(1000, 1, 0, now + Millis(100)).is_some(),
            "expired slots reclaimed"
        );
        assert_eq!(
            slots.reclaimed(),
            taken,
            "every expired slot was reclaimed at once"
        );
    }
}
