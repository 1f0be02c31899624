//! Discarded blocks: replica space that is no longer part of any object but may not be reused
//! yet, because someone may still touch it.
//!
//! Two kinds of someone. A preempted or timed-out writer may still be writing into its blocks;
//! they wait until the write fence says its last byte has landed (a write window and the
//! late-landing bound after its start: seconds, where Mooncake's zombie rule waits
//! `put_start_release_timeout`), or, under memory pressure, until the writer is known dead. A reader holding a lease on replaced
//! contents (upsert to a new size or a copy-on-write upsert) may still be reading; those blocks
//! wait until the lease ends plus a grace for clock drift.

use std::collections::BTreeMap;

use crate::ids::ClientId;
use crate::time::Millis;

/// Who may still touch a discarded block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) enum DiscardReason {
    /// A writer that lost its write may still be writing.
    Preempted { writer: ClientId },
    /// Readers with leases on the old contents may still be reading.
    Superseded,
}

/// One block waiting to be freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct DiscardedBlock {
    pub segment: u32,
    /// The block's offset in its segment and its length.
    pub offset: u64,
    pub len: u64,
    pub reason: DiscardReason,
}

/// Discarded blocks in release order.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Discarded {
    by_release: BTreeMap<(Millis, u64), DiscardedBlock>,
    next_seq: u64,
}

impl Discarded {
    pub(crate) fn push(&mut self, release_at: Millis, block: DiscardedBlock) {
        self.by_release.insert((release_at, self.next_seq), block);
        self.next_seq += 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.by_release.len()
    }

    /// When the next block becomes free.
    pub(crate) fn next_release(&self) -> Option<Millis> {
        self.by_release.keys().next().map(|&(at, _)| at)
    }

    /// Removes and returns the blocks due at `now`.
    pub(crate) fn take_due(&mut self, now: Millis) -> Vec<DiscardedBlock> {
        let later = self.by_release.split_off(&(now + Millis(1), 0));
        let due = std::mem::replace(&mut self.by_release, later);
        due.into_values().collect()
    }

    /// Removes and returns, in release order, the blocks `early` allows to go now.
    pub(crate) fn take_early(
        &mut self,
        early: impl Fn(&DiscardedBlock) -> bool,
    ) -> Vec<DiscardedBlock> {
        let keys: Vec<(Millis, u64)> = self
            .by_release
            .iter()
            .filter(|(_, b)| early(b))
            .map(|(&k, _)| k)
            .collect();
        keys.iter()
            .map(|k| self.by_release.remove(k).expect("listed key"))
            .collect()
    }

    /// Forgets the blocks on a segment that is going away.
    pub(crate) fn forget_segment(&mut self, segment: u32) {
        self.by_release.retain(|_, b| b.segment != segment);
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (Millis, &DiscardedBlock)> {
        self.by_release.iter().map(|(&(at, _), b)| (at, b))
    }

    pub(crate) fn rebase(&mut self, shift: impl Fn(Millis) -> Millis) {
        let old = std::mem::take(&mut self.by_release);
        self.by_release = old
            .into_iter()
            .map(|((at, seq), b)| ((shift(at), seq), b))
            .collect();
    }
}
