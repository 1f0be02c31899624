//! Eviction: freeing memory by dropping the least recently used objects nobody is using.
//!
//! A pass runs when usage reaches the high watermark (from `tick`) or when an allocation finds
//! no room. It frees about `eviction_ratio` of capacity (and at least what the allocation
//! needs), least recently accessed (written or read) first. Three tiers: unpinned objects that also have a copy on a
//! node's disk go first (dropping their memory loses nothing: they stay readable from disk),
//! then every other unpinned candidate, then soft-pinned ones, and those only if
//! `allow_evict_soft_pinned`. Objects queued for offload wait for their copy (see `offload`),
//! in both passes below: a put that finds no room while they wait is refused. Hard-pinned,
//! leased, held, replicating and in-progress objects are never candidates (see
//! `Object::eviction_class`).
//!
//! A pass scans the whole table once and selects victims with `select_nth_unstable` rather
//! than a full sort, so it costs O(objects) plus O(victims log victims).
//!
//! LRU order frees bytes, not room: after it, a large value may still find no contiguous
//! block. Allocation then falls back to a *window* eviction: in each segment, the shortest
//! runs of adjacent blocks that are free or evictable and add up to the needed length, and the
//! run whose newest object is oldest is evicted (unpinned-only runs before runs with
//! soft-pinned objects). It costs a walk over every block, and runs only when LRU eviction
//! left no room.

use std::collections::{HashMap, VecDeque};

use smallvec::SmallVec;

use crate::error::{Error, ErrorCode, Result};
use crate::events::Event;
use crate::master::Master;
use crate::object::{EvictionClass, OffloadMark};
use crate::placement::{Placed, place};
use crate::segments::block_len;
use crate::time::Millis;

/// An eviction candidate: (last access, slot, bytes freed).
type Candidate = (Millis, u32, u64);

/// A block owner that may be evicted now: (object slot, soft-pinned, lease expiry).
type Evictable = (u32, bool, Millis);

/// A window's cost: (holds soft-pinned objects, newest lease expiry). Lower is better.
type WindowCost = (bool, Millis);
/// What a block means to a window: `None` if it blocks one, else its owner if it may go
/// (`None` for free space).
type WindowBlock = Option<Option<Evictable>>;

impl Master {
    /// Whether usage has reached the high watermark.
    pub(crate) fn over_watermark(&self) -> bool {
        let capacity = self.segments.capacity();
        capacity > 0
            && self.segments.used() as f64 >= self.config.eviction_high_watermark * capacity as f64
    }

    /// The `tick` duty: one pass if usage is at the watermark, rate-limited so an unevictable
    /// full pool does not make the driver spin.
    pub(crate) fn evict_if_over_watermark(&mut self, now: Millis) {
        if !self.over_watermark()
            || now < self.counters.last_eviction_pass + self.config.eviction_retry_interval
        {
            return;
        }
        self.counters.last_eviction_pass = now;
        let capacity = self.segments.capacity() as f64;
        let low = (self.config.eviction_high_watermark - self.config.eviction_ratio).max(0.0);
        let target = (self.segments.used() as f64 - low * capacity).max(1.0) as u64;
        self.evict(target, now);
    }

    /// Places `count` replicas of a `size`-byte value, evicting (and, as a last resort,
    /// releasing dead writers' discarded blocks) if nothing fits. Fails with
    /// `NO_AVAILABLE_HANDLE` only if not even one replica fits afterwards.
    pub(crate) fn place_or_evict(
        &mut self,
        size: u64,
        count: usize,
        preferred: &[String],
        excluded: &[u32],
        now: Millis,
    ) -> Result<SmallVec<[Placed; 2]>> {
        let largest = self
            .segments
            .iter()
            .map(|(_, s)| s.allocator.capacity())
            .max()
            .unwrap_or(0);
        if block_len(size) > largest {
            return Err(Error::new(
                ErrorCode::NO_AVAILABLE_HANDLE,
                format!(
                    "a {size}-byte value does not fit in any segment (largest is {largest} bytes)"
                ),
            ));
        }
        for attempt in 0..4 {
            let placed = place(
                &mut self.segments,
                &mut self.rng,
                size,
                count,
                preferred,
                excluded,
            );
            if !placed.is_empty() {
                return Ok(placed);
            }
            match attempt {
                0 => {
                    let ratio =
                        (self.config.eviction_ratio * self.segments.capacity() as f64) as u64;
                    let need = block_len(size).saturating_mul(count as u64).max(ratio);
                    self.evict(need, now);
                }
                1 => {
                    self.release_blocks_under_pressure();
                }
                2 if !self.evict_window(block_len(size), excluded, now) => break,
                _ => {}
            }
        }
        let waiting = self
            .objects
            .iter()
            .filter(|(_, o)| o.offload() == OffloadMark::Queued)
            .count();
        let why = if waiting > 0 {
            format!(
                "; {waiting} objects wait for their nodes to copy them to disk before their memory \
                 may go: retry shortly, or give the nodes faster disks or more memory"
            )
        } else {
            String::new()
        };
        Err(Error::new(
            ErrorCode::NO_AVAILABLE_HANDLE,
            format!(
                "no segment has {} free contiguous bytes after eviction ({} of {} bytes in use){why}",
                block_len(size),
                self.segments.used(),
                self.segments.capacity()
            ),
        ))
    }

    /// Evicts objects until about `target` bytes are freed or no candidate is left. Returns
    /// the bytes freed.
    pub(crate) fn evict(&mut self, target: u64, now: Millis) -> u64 {
        let mut on_disk: Vec<Candidate> = Vec::new();
        // Most objects are unpinned: sized once, this is not copied again and again as it
        // grows (with a million objects, those copies and their page faults showed in profiles).
        let mut unpinned: Vec<Candidate> = Vec::with_capacity(self.objects.len());
        let mut soft_pinned: Vec<Candidate> = Vec::new();
        for (slot, object) in self.objects.iter() {
            if object.offload() == OffloadMark::Queued {
                continue;
            }
            let bytes = block_len(object.size()) * object.replicas.len() as u64;
            let candidate = (object.last_access, slot, bytes);
            match object.eviction_class(now) {
                Some(EvictionClass::Unpinned) if object.has_disk_replica() => {
                    on_disk.push(candidate)
                }
                Some(EvictionClass::Unpinned) => unpinned.push(candidate),
                Some(EvictionClass::SoftPinned) => soft_pinned.push(candidate),
                None => {}
            }
        }
        let mut victims = oldest_covering(&mut on_disk, target);
        let mut freed: u64 = victims.iter().map(|v| v.2).sum();
        if freed < target {
            let more = oldest_covering(&mut unpinned, target - freed);
            freed += more.iter().map(|v| v.2).sum::<u64>();
            victims.extend(more);
        }
        let first_tier = victims.len();
        if freed < target && self.config.allow_evict_soft_pinned {
            let more = oldest_covering(&mut soft_pinned, target - freed);
            freed += more.iter().map(|v| v.2).sum::<u64>();
            victims.extend(more);
        }
        for (i, &(_, slot, bytes)) in victims.iter().enumerate() {
            if self.offload_before_evicting(slot) {
                freed -= bytes;
                continue;
            }
            self.evict_object(slot, i >= first_tier, false);
        }
        freed
    }

    /// Evicts the object in `slot` from memory and reports it. An object with a disk copy
    /// stays, readable from disk; any other goes away.
    fn evict_object(&mut self, slot: u32, soft_pinned: bool, contiguous: bool) {
        let grace = self.config.lease_grace;
        let kept_on_disk = self.objects.at(slot).has_disk_replica();
        let last_access = self.objects.at(slot).last_access;
        let (key, size, replicas, done) = if kept_on_disk {
            let object = self.objects.at_mut(slot);
            let replicas = std::mem::take(&mut object.replicas);
            let done = object.readers_done_at(grace);
            // The lease covered the memory replicas; readers of the disk copy need none.
            object.clear_leased();
            let (size, key) = (object.size(), self.objects.key(slot).into());
            (key, size, replicas, done)
        } else {
            self.value_removed(slot);
            let key = self.objects.key(slot).into();
            let object = self.remove_object(slot);
            let done = object.readers_done_at(grace);
            (key, object.size(), object.replicas, done)
        };
        let bytes = block_len(size) * replicas.len() as u64;
        self.release_read_blocks(&replicas, size, done);
        self.counters.evicted_objects += 1;
        self.counters.evicted_to_disk += u64::from(kept_on_disk);
        self.counters.evicted_bytes += bytes;
        self.events.push(Event::Evicted {
            key,
            soft_pinned,
            bytes,
            contiguous,
            kept_on_disk,
            last_access,
        });
    }

    /// Evicts the least recently used run of adjacent blocks, free or evictable, that adds up
    /// to `len` bytes on one segment outside `excluded`. Returns whether it found one.
    pub(crate) fn evict_window(&mut self, len: u64, excluded: &[u32], now: Millis) -> bool {
        // Who owns each block, and whether it may go now. Blocks readers may still read (a lease
        // or its grace) would only move to the discarded list, so they do not count.
        let grace = self.config.lease_grace;
        let allow_soft = self.config.allow_evict_soft_pinned;
        // Each segment's blocks owned by objects: (offset, length, whether and how it may go).
        let mut owned: HashMap<u32, Vec<(u64, u64, WindowBlock)>> = HashMap::new();
        for (slot, object) in self.objects.iter() {
            // An object waiting for its disk copy waits here too (as in `evict`): dropping it
            // now would lose the value its queue entry promised to keep.
            let waiting_for_disk = object.offload() == OffloadMark::Queued;
            let evictable = match object.eviction_class(now) {
                Some(class) if object.readers_done_at(grace) <= now && !waiting_for_disk => {
                    let soft = class == EvictionClass::SoftPinned;
                    (!soft || allow_soft).then_some((slot, soft, object.last_access))
                }
                _ => None,
            };
            let block = block_len(object.size());
            for r in &object.replicas {
                owned
                    .entry(r.segment)
                    .or_default()
                    .push((r.offset(), block, evictable.map(Some)));
            }
        }
        // Best window: fewest soft-pinned objects first, then the oldest newest access.
        let mut best: Option<(WindowCost, Vec<(u32, bool)>)> = None;
        for (segment_slot, segment) in self.segments.iter() {
            if excluded.contains(&segment_slot) || segment.allocator.capacity() < len {
                continue;
            }
            // The segment in address order, as (length, what it means to a window). Allocated
            // space no object owns (a discarded block) blocks a window.
            let mut known = owned.remove(&segment_slot).unwrap_or_default();
            known.extend(
                segment
                    .allocator
                    .free_blocks()
                    .map(|(offset, size)| (offset, size, Some(None))),
            );
            known.sort_unstable_by_key(|b| b.0);
            let mut blocks: Vec<(u64, WindowBlock)> = Vec::new();
            let mut at = 0;
            for (offset, size, usable) in known {
                if offset > at {
                    blocks.push((offset - at, None));
                }
                blocks.push((size, usable));
                at = offset + size;
            }
            let mut start = 0;
            let mut bytes = 0u64;
            let mut newest: VecDeque<(usize, WindowCost)> = VecDeque::new();
            for end in 0..blocks.len() {
                let Some(owner) = blocks[end].1 else {
                    start = end + 1;
                    bytes = 0;
                    newest.clear();
                    continue;
                };
                bytes += blocks[end].0;
                let cost = owner.map_or((false, Millis::ZERO), |(_, soft, lease)| (soft, lease));
                while newest.back().is_some_and(|&(_, c)| c <= cost) {
                    newest.pop_back();
                }
                newest.push_back((end, cost));
                while bytes - blocks[start].0 >= len {
                    bytes -= blocks[start].0;
                    start += 1;
                    while newest.front().is_some_and(|&(i, _)| i < start) {
                        newest.pop_front();
                    }
                }
                if bytes >= len {
                    let cost = newest.front().expect("window is not empty").1;
                    if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                        let victims = (start..=end)
                            .filter_map(|i| {
                                blocks[i].1.flatten().map(|(slot, soft, _)| (slot, soft))
                            })
                            .collect();
                        best = Some((cost, victims));
                    }
                }
            }
        }
        match best {
            Some((_, victims)) => {
                for (slot, soft) in victims {
                    self.evict_object(slot, soft, true);
                }
                true
            }
            None => false,
        }
    }
}

/// The oldest candidates (by lease expiry, then slot) whose bytes add up to at least `target`,
/// or all of them if they do not. Selects in rounds with `select_nth_unstable`, sorting only
/// the selected prefix, so a pass that evicts a few percent never sorts the whole table.
fn oldest_covering(candidates: &mut [Candidate], target: u64) -> Vec<Candidate> {
    let mut taken = Vec::new();
    let mut got = 0u64;
    let mut start = 0;
    let mut remaining_bytes: u64 = candidates.iter().map(|c| c.2).sum();
    while got < target && start < candidates.len() {
        let rest = &mut candidates[start..];
        let average = (remaining_bytes / rest.len() as u64).max(1);
        let estimate = (target - got).div_ceil(average) as usize;
        let k = (estimate + estimate / 4 + 16).min(rest.len());
        if k < rest.len() {
            rest.select_nth_unstable_by_key(k - 1, |c| (c.0, c.1));
        }
        let chunk = &mut rest[..k];
        chunk.sort_unstable_by_key(|c| (c.0, c.1));
        for &candidate in chunk.iter() {
            if got >= target {
                break;
            }
            got += candidate.2;
            remaining_bytes -= candidate.2;
            taken.push(candidate);
        }
        start += k;
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_covering_takes_exactly_the_oldest_prefix() {
        let mut rng = crate::rng::Rng::seeded(3);
        let mut candidates: Vec<Candidate> = (0..10_000u32)
            .map(|slot| {
                (
                    Millis(rng.next_u64() % 1000),
                    slot,
                    64 + rng.next_u64() % 4096,
                )
            })
            .collect();
        let mut sorted = candidates.clone();
        sorted.sort_unstable_by_key(|c| (c.0, c.1));
        for target in [1, 100, 50_000, 1_000_000, u64::MAX] {
            let mut pool = candidates.clone();
            let taken = oldest_covering(&mut pool, target);
            let mut expected = Vec::new();
            let mut got = 0;
            for c in &sorted {
                if got >= target {
                    break;
                }
                got += c.2;
                expected.push(*c);
            }
            assert_eq!(taken, expected, "target {target}");
        }
        candidates.clear();
        assert!(oldest_covering(&mut candidates, 10).is_empty());
    }
}
