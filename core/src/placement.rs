//! The allocation strategy: where an object's replicas go.
//!
//! Preferred segments first, in the caller's order; then, for each remaining replica, the
//! emptier of two randomly drawn segments ("power of two choices", which keeps segments evenly
//! filled), and if neither has room a sweep over all segments from a random start, so a
//! replica is never refused while any segment could hold it. Every replica of an object lands
//! on a distinct segment; `excluded` segments are never used. Best effort on the count: the
//! caller gets as many replicas as fit, possibly none.

use smallvec::SmallVec;

use crate::object::Replica;
use crate::rng::Rng;
use crate::segments::Segments;

/// One placed replica: the segment slot and the block within it, PROCESSING.
pub(crate) type Placed = Replica;

/// Places up to `count` blocks for a `size`-byte value on distinct segments, none of them in
/// `excluded`.
pub(crate) fn place(
    segments: &mut Segments,
    rng: &mut Rng,
    size: u64,
    count: usize,
    preferred: &[String],
    excluded: &[u32],
) -> SmallVec<[Placed; 2]> {
    let mut placed: SmallVec<[Placed; 2]> = SmallVec::new();
    let usable = |slot: u32, placed: &[Placed]| {
        !excluded.contains(&slot) && !placed.iter().any(|p| p.segment == slot)
    };
    for name in preferred {
        if placed.len() == count {
            return placed;
        }
        if let Some(slot) = segments.slot_by_name(name)
            && usable(slot, &placed)
            && let Some(replica) = segments.allocate_on(slot, size)
        {
            placed.push(replica);
        }
    }
    while placed.len() < count {
        let n = segments.mounted.len();
        if n == 0 {
            break;
        }
        // Two random draws; try the one with more free bytes first.
        let a = segments.mounted[rng.below(n)];
        let b = segments.mounted[rng.below(n)];
        let (first, second) = if segments.free_bytes(b) > segments.free_bytes(a) {
            (b, a)
        } else {
            (a, b)
        };
        let mut got = None;
        for slot in [first, second] {
            if got.is_none() && usable(slot, &placed) {
                got = segments.allocate_on(slot, size);
            }
        }
        if got.is_none() {
            let start = rng.below(n);
            for i in 0..n {
                let slot = segments.mounted[(start + i) % n];
                if usable(slot, &placed)
                    && let Some(replica) = segments.allocate_on(slot, size)
                {
                    got = Some(replica);
                    break;
                }
            }
        }
        match got {
            Some(p) => placed.push(p),
            None => break, // no segment can hold another replica
        }
    }
    placed
}
