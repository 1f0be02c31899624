//! The per-segment offset allocator: O(1) allocation and free with low fragmentation.
//!
//! A 64-bit port of Sebastian Aaltonen's OffsetAllocator (the allocator Mooncake Store adopted):
//! free blocks sit in 512 size bins laid out like a tiny float (5-bit exponent, 3-bit mantissa),
//! so every bin's sizes lie within 12.5% of each other. A two-level bitmask (64 "top" exponent
//! bins × 8 mantissa "leaf" bins) finds the smallest non-empty bin that fits in a few bit
//! operations. Allocation splits the found block and files the remainder; free merges with free
//! neighbours, which every block links to, so both are O(1).
//!
//! One addition over the original: when no bin is guaranteed to fit, allocation scans a few
//! blocks of the bin just below, which may hold a block that is large enough (the guaranteed
//! search rounds up and would otherwise miss it). This matters when a segment is nearly full.
//!
//! The allocator hands out byte offsets in `[0, capacity)`; it never touches memory.

use crate::chunked::ChunkedVec;

/// Marks "no node" in the intrusive lists.
const NONE: u32 = u32::MAX;
const MANTISSA_BITS: u32 = 3;
const MANTISSA_VALUE: u64 = 1 << MANTISSA_BITS;
const MANTISSA_MASK: u64 = MANTISSA_VALUE - 1;
const TOP_BINS: usize = 64;
const LEAF_BINS_PER_TOP: usize = 8;
const BINS: usize = TOP_BINS * LEAF_BINS_PER_TOP;
/// How many blocks of the round-down bin the fallback search inspects.
const FALLBACK_SCAN: usize = 16;

/// The largest capacity one allocator manages (64 PiB); keeps bin arithmetic in range.
pub const MAX_CAPACITY: u64 = 1 << 56;

/// The smallest bin whose every block is at least `size` bytes.
fn bin_round_up(size: u64) -> u32 {
    if size < MANTISSA_VALUE {
        return size as u32;
    }
    let highest_bit = 63 - size.leading_zeros();
    let mantissa_start = highest_bit - MANTISSA_BITS;
    let exponent = mantissa_start + 1;
    let mut mantissa = ((size >> mantissa_start) & MANTISSA_MASK) as u32;
    if size & ((1u64 << mantissa_start) - 1) != 0 {
        mantissa += 1; // may carry into the exponent, which is what we want
    }
    (exponent << MANTISSA_BITS) + mantissa
}

/// The bin a free block of `size` bytes is filed under (its size rounded down).
fn bin_round_down(size: u64) -> u32 {
    if size < MANTISSA_VALUE {
        return size as u32;
    }
    let highest_bit = 63 - size.leading_zeros();
    let mantissa_start = highest_bit - MANTISSA_BITS;
    let exponent = mantissa_start + 1;
    let mantissa = ((size >> mantissa_start) & MANTISSA_MASK) as u32;
    (exponent << MANTISSA_BITS) | mantissa
}

/// The smallest block size filed under `bin`.
#[cfg(test)]
fn bin_size(bin: u32) -> u64 {
    let exponent = bin >> MANTISSA_BITS;
    let mantissa = u64::from(bin) & MANTISSA_MASK;
    if exponent == 0 {
        mantissa
    } else {
        (mantissa | MANTISSA_VALUE) << (exponent - 1)
    }
}

/// The lowest set bit of `mask` at or above `start`.
fn lowest_set_bit_from(mask: u64, start: u32) -> Option<u32> {
    if start >= 64 {
        return None;
    }
    let bits = mask & (u64::MAX << start);
    (bits != 0).then(|| bits.trailing_zeros())
}

/// What a node currently describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum NodeState {
    /// A free block, filed in a bin.
    Free,
    /// An allocated block.
    Used,
    /// Describes nothing; waiting on the recycle stack.
    Recycled,
}

/// One block of the managed range, linked to its bin neighbours and its address neighbours.
/// 32 bytes: the state lives in the top bits of the size (sizes are below 2^56).
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct Node {
    offset: u64,
    size_state: u64,
    bin_prev: u32,
    bin_next: u32,
    neighbor_prev: u32,
    neighbor_next: u32,
}

const STATE_SHIFT: u32 = 62;
const SIZE_MASK: u64 = (1 << STATE_SHIFT) - 1;

impl Node {
    fn free(offset: u64, size: u64, bin_next: u32) -> Node {
        Node {
            offset,
            size_state: size | ((NodeState::Free as u64) << STATE_SHIFT),
            bin_prev: NONE,
            bin_next,
            neighbor_prev: NONE,
            neighbor_next: NONE,
        }
    }

    fn size(&self) -> u64 {
        self.size_state & SIZE_MASK
    }

    fn set_size(&mut self, size: u64) {
        self.size_state = (self.size_state & !SIZE_MASK) | size;
    }

    fn state(&self) -> NodeState {
        match self.size_state >> STATE_SHIFT {
            0 => NodeState::Free,
            1 => NodeState::Used,
            _ => NodeState::Recycled,
        }
    }

    fn set_state(&mut self, state: NodeState) {
        self.size_state = (self.size_state & SIZE_MASK) | ((state as u64) << STATE_SHIFT);
    }
}

/// A successful allocation: where it is, and the handle that frees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Byte offset of the block within the managed range.
    pub offset: u64,
    /// The handle to pass to [`OffsetAllocator::free`].
    pub node: u32,
}

/// A bin-based O(1) offset allocator over `[0, capacity)`.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct OffsetAllocator {
    capacity: u64,
    free_bytes: u64,
    used_top_bins: u64,
    used_leaf_bins: [u8; TOP_BINS],
    bin_heads: Vec<u32>,
    nodes: ChunkedVec<Node>,
    recycled: Vec<u32>,
    live_allocations: u32,
}

impl OffsetAllocator {
    /// An allocator whose whole range `[0, capacity)` is free. `capacity` must be in
    /// `1..=MAX_CAPACITY`.
    pub fn new(capacity: u64) -> OffsetAllocator {
        assert!(
            capacity > 0 && capacity <= MAX_CAPACITY,
            "allocator capacity {capacity} out of range"
        );
        let mut allocator = OffsetAllocator {
            capacity,
            free_bytes: 0,
            used_top_bins: 0,
            used_leaf_bins: [0; TOP_BINS],
            bin_heads: vec![NONE; BINS],
            nodes: ChunkedVec::default(),
            recycled: Vec::new(),
            live_allocations: 0,
        };
        allocator.insert_free_block(0, capacity);
        allocator
    }

    /// The size of the managed range.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes not allocated (possibly in several blocks).
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Bytes allocated.
    pub fn used_bytes(&self) -> u64 {
        self.capacity - self.free_bytes
    }

    /// How many allocations are live.
    pub fn live_allocations(&self) -> u32 {
        self.live_allocations
    }

    /// Allocates `size` bytes (`size > 0`), or `None` if no free block is large enough.
    pub fn allocate(&mut self, size: u64) -> Option<Allocation> {
        if size == 0 || size > self.free_bytes {
            return None;
        }
        let node = match self.find_guaranteed_fit(size) {
            Some(node) => node,
            None => self.find_fallback_fit(size)?,
        };
        self.unlink_from_bin(node);
        Some(self.carve(node, size))
    }

    /// Frees the allocation whose handle is `node`. Returns false, changing nothing, if `node`
    /// is not a live allocation (a double free or a stale handle).
    pub fn free(&mut self, node: u32) -> bool {
        let Some(freed) = self.nodes.get(node as usize) else {
            return false;
        };
        if freed.state() != NodeState::Used {
            return false;
        }
        let (mut offset, mut size) = (freed.offset, freed.size());
        let (mut prev, mut next) = (freed.neighbor_prev, freed.neighbor_next);
        if prev != NONE && self.nodes[prev as usize].state() == NodeState::Free {
            let block = &self.nodes[prev as usize];
            offset = block.offset;
            size += block.size();
            let before = block.neighbor_prev;
            self.take_free_block(prev);
            prev = before;
        }
        if next != NONE && self.nodes[next as usize].state() == NodeState::Free {
            let block = &self.nodes[next as usize];
            size += block.size();
            let after = block.neighbor_next;
            self.take_free_block(next);
            next = after;
        }
        self.recycle(node);
        self.live_allocations -= 1;
        let merged = self.insert_free_block(offset, size);
        self.nodes[merged as usize].neighbor_prev = prev;
        self.nodes[merged as usize].neighbor_next = next;
        if prev != NONE {
            self.nodes[prev as usize].neighbor_next = merged;
        }
        if next != NONE {
            self.nodes[next as usize].neighbor_prev = merged;
        }
        true
    }

    /// The offset and size of a live allocation, if `node` is one.
    pub fn allocation(&self, node: u32) -> Option<(u64, u64)> {
        self.nodes
            .get(node as usize)
            .filter(|n| n.state() == NodeState::Used)
            .map(|n| (n.offset, n.size()))
    }

    /// Whether an allocation of `size` bytes would succeed right now.
    pub fn can_allocate(&self, size: u64) -> bool {
        size > 0
            && size <= self.free_bytes
            && (self.find_guaranteed_fit(size).is_some() || self.find_fallback_fit(size).is_some())
    }

    /// Every block in address order: `(node, offset, size, used)`.
    pub fn blocks(&self) -> Vec<(u32, u64, u64, bool)> {
        let mut out = Vec::new();
        let first = self
            .nodes
            .iter()
            .position(|n| n.state() != NodeState::Recycled && n.offset == 0);
        let mut node = first.map_or(NONE, |i| i as u32);
        while node != NONE {
            let block = &self.nodes[node as usize];
            out.push((
                node,
                block.offset,
                block.size(),
                block.state() == NodeState::Used,
            ));
            node = block.neighbor_next;
        }
        out
    }

    /// Heap bytes this allocator uses for its bookkeeping.
    pub fn heap_bytes(&self) -> usize {
        self.nodes.heap_bytes()
            + self.recycled.capacity() * size_of::<u32>()
            + self.bin_heads.capacity() * size_of::<u32>()
    }

    /// Head of the smallest non-empty bin whose every block fits `size`.
    fn find_guaranteed_fit(&self, size: u64) -> Option<u32> {
        let min_bin = bin_round_up(size);
        let min_top = min_bin >> MANTISSA_BITS;
        let min_leaf = min_bin & MANTISSA_MASK as u32;
        let mut top = min_top;
        let mut leaf = None;
        if (top as usize) < TOP_BINS && self.used_top_bins & (1 << top) != 0 {
            leaf = lowest_set_bit_from(u64::from(self.used_leaf_bins[top as usize]), min_leaf);
        }
        let leaf = match leaf {
            Some(leaf) => leaf,
            None => {
                top = lowest_set_bit_from(self.used_top_bins, min_top + 1)?;
                self.used_leaf_bins[top as usize].trailing_zeros()
            }
        };
        let head = self.bin_heads[((top << MANTISSA_BITS) | leaf) as usize];
        debug_assert_ne!(head, NONE, "bin mask says non-empty");
        Some(head)
    }

    /// A block of the round-down bin that happens to be large enough, if one of the first few is.
    fn find_fallback_fit(&self, size: u64) -> Option<u32> {
        let mut node = self.bin_heads[bin_round_down(size) as usize];
        for _ in 0..FALLBACK_SCAN {
            if node == NONE {
                return None;
            }
            let block = &self.nodes[node as usize];
            if block.size() >= size {
                return Some(node);
            }
            node = block.bin_next;
        }
        None
    }

    /// Marks free block `node` (already out of its bin) used for its first `size` bytes and
    /// files the remainder as a new free block right after it.
    fn carve(&mut self, node: u32, size: u64) -> Allocation {
        let block = &mut self.nodes[node as usize];
        let total = block.size();
        let offset = block.offset;
        let after = block.neighbor_next;
        block.set_size(size);
        block.set_state(NodeState::Used);
        self.free_bytes -= total;
        self.live_allocations += 1;
        if total > size {
            let rest = self.insert_free_block(offset + size, total - size);
            self.nodes[rest as usize].neighbor_prev = node;
            self.nodes[rest as usize].neighbor_next = after;
            if after != NONE {
                self.nodes[after as usize].neighbor_prev = rest;
            }
            self.nodes[node as usize].neighbor_next = rest;
        }
        Allocation { offset, node }
    }

    /// Files a new free block in its bin and returns its node. Neighbour links are the
    /// caller's to set.
    fn insert_free_block(&mut self, offset: u64, size: u64) -> u32 {
        let bin = bin_round_down(size) as usize;
        let (top, leaf) = (bin / LEAF_BINS_PER_TOP, bin % LEAF_BINS_PER_TOP);
        let head = self.bin_heads[bin];
        if head == NONE {
            self.used_leaf_bins[top] |= 1 << leaf;
            self.used_top_bins |= 1 << top;
        }
        let node = Node::free(offset, size, head);
        let index = match self.recycled.pop() {
            Some(index) => {
                self.nodes[index as usize] = node;
                index
            }
            None => {
                let index = u32::try_from(self.nodes.len()).expect("more than 4 billion blocks");
                self.nodes.push(node);
                index
            }
        };
        if head != NONE {
            self.nodes[head as usize].bin_prev = index;
        }
        self.bin_heads[bin] = index;
        self.free_bytes += size;
        index
    }

    /// Removes free block `node` from its bin (it stays `Free` until the caller decides).
    fn unlink_from_bin(&mut self, node: u32) {
        let (prev, next, size) = {
            let block = &self.nodes[node as usize];
            (block.bin_prev, block.bin_next, block.size())
        };
        if next != NONE {
            self.nodes[next as usize].bin_prev = prev;
        }
        if prev != NONE {
            self.nodes[prev as usize].bin_next = next;
        } else {
            let bin = bin_round_down(size) as usize;
            self.bin_heads[bin] = next;
            if next == NONE {
                let (top, leaf) = (bin / LEAF_BINS_PER_TOP, bin % LEAF_BINS_PER_TOP);
                self.used_leaf_bins[top] &= !(1 << leaf);
                if self.used_leaf_bins[top] == 0 {
                    self.used_top_bins &= !(1 << top);
                }
            }
        }
    }

    /// Removes a free block that is being merged into a neighbour.
    fn take_free_block(&mut self, node: u32) {
        self.unlink_from_bin(node);
        self.free_bytes -= self.nodes[node as usize].size();
        self.recycle(node);
    }

    fn recycle(&mut self, node: u32) {
        self.nodes[node as usize].set_state(NodeState::Recycled);
        self.recycled.push(node);
    }

    /// Verifies every structural invariant and returns the live allocations as
    /// `(node, offset, size)`, sorted by offset: blocks tile `[0, capacity)` exactly, no two
    /// free blocks are adjacent, bins hold exactly the free blocks with consistent masks, and
    /// the byte counters agree.
    pub fn check(&self) -> Result<Vec<(u32, u64, u64)>, String> {
        // Bounds first: a restored snapshot may hold anything, and the checker must report
        // rather than panic.
        if self.bin_heads.len() != BINS {
            return Err(format!("{} bins, expected {BINS}", self.bin_heads.len()));
        }
        self.nodes.check()?;
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(format!("capacity {} out of range", self.capacity));
        }
        let node_at = |index: u32| {
            self.nodes
                .get(index as usize)
                .ok_or_else(|| format!("link to node {index} beyond {}", self.nodes.len()))
        };
        let mut used = Vec::new();
        let mut free_blocks = 0usize;
        let mut free_sum = 0u64;
        let mut recycled = 0usize;
        let mut first = None;
        for (index, node) in self.nodes.iter().enumerate() {
            match node.state() {
                NodeState::Used => used.push((index as u32, node.offset, node.size())),
                NodeState::Free => {
                    free_blocks += 1;
                    free_sum = free_sum.saturating_add(node.size());
                }
                NodeState::Recycled => recycled += 1,
            }
            if node.state() != NodeState::Recycled && node.offset == 0 {
                if first.is_some() {
                    return Err("two live blocks start at offset 0".into());
                }
                first = Some(index as u32);
            }
        }
        let mut on_stack = vec![false; self.nodes.len()];
        for &index in &self.recycled {
            if node_at(index)?.state() != NodeState::Recycled || on_stack[index as usize] {
                return Err(format!("recycle stack holds live or repeated node {index}"));
            }
            on_stack[index as usize] = true;
        }
        if recycled != self.recycled.len() {
            return Err(format!(
                "{recycled} recycled nodes but {} on the stack",
                self.recycled.len()
            ));
        }
        if free_sum != self.free_bytes {
            return Err(format!(
                "free blocks sum to {free_sum} but free_bytes is {}",
                self.free_bytes
            ));
        }
        let used_sum = used.iter().fold(0u64, |sum, u| sum.saturating_add(u.2));
        if used_sum.checked_add(free_sum) != Some(self.capacity) {
            return Err(format!(
                "used {used_sum} + free {free_sum} != capacity {}",
                self.capacity
            ));
        }
        if used.len() != self.live_allocations as usize {
            return Err(format!(
                "{} used blocks but live_allocations is {}",
                used.len(),
                self.live_allocations
            ));
        }
        // Address order: the neighbour chain tiles the range.
        let mut at = 0u64;
        let mut prev = NONE;
        let mut node = first.ok_or("no block starts at offset 0")?;
        let mut walked = 0usize;
        while node != NONE {
            let block = node_at(node)?;
            if block.state() == NodeState::Recycled {
                return Err(format!("neighbour chain reaches recycled node {node}"));
            }
            if block.offset != at {
                return Err(format!(
                    "gap or overlap: block at {} expected at {at}",
                    block.offset
                ));
            }
            if block.size() == 0 {
                return Err(format!("empty block at {at}"));
            }
            if block.neighbor_prev != prev {
                return Err(format!("bad back link at offset {at}"));
            }
            if prev != NONE
                && block.state() == NodeState::Free
                && node_at(prev)?.state() == NodeState::Free
            {
                return Err(format!("adjacent free blocks not merged at offset {at}"));
            }
            at = at.checked_add(block.size()).ok_or("block sizes overflow")?;
            prev = node;
            node = block.neighbor_next;
            walked += 1;
            if walked > self.nodes.len() {
                return Err("neighbour chain has a cycle".into());
            }
        }
        if at != self.capacity {
            return Err(format!("blocks end at {at}, capacity is {}", self.capacity));
        }
        if walked != used.len() + free_blocks {
            return Err("neighbour chain misses some blocks".into());
        }
        // Bins hold exactly the free blocks, each in the bin its size rounds down to.
        let mut in_bins = 0usize;
        for (bin, &head) in self.bin_heads.iter().enumerate() {
            let (top, leaf) = (bin / LEAF_BINS_PER_TOP, bin % LEAF_BINS_PER_TOP);
            let marked = self.used_leaf_bins[top] & (1 << leaf) != 0;
            if marked != (head != NONE) {
                return Err(format!("bin {bin} mask disagrees with its list"));
            }
            let mut prev = NONE;
            let mut node = head;
            while node != NONE {
                let block = node_at(node)?;
                if block.state() != NodeState::Free {
                    return Err(format!("bin {bin} holds a non-free node {node}"));
                }
                if bin_round_down(block.size()) as usize != bin {
                    return Err(format!(
                        "block of {} bytes filed in bin {bin}",
                        block.size()
                    ));
                }
                if block.bin_prev != prev {
                    return Err(format!("bin {bin} has a bad back link"));
                }
                in_bins += 1;
                if in_bins > free_blocks {
                    return Err("bin lists hold more nodes than there are free blocks".into());
                }
                prev = node;
                node = block.bin_next;
            }
        }
        for top in 0..TOP_BINS {
            if (self.used_leaf_bins[top] != 0) != (self.used_top_bins & (1 << top) != 0) {
                return Err(format!("top bin {top} mask disagrees with its leaves"));
            }
        }
        if in_bins != free_blocks {
            return Err(format!(
                "{in_bins} blocks in bins, {free_blocks} free blocks"
            ));
        }
        used.sort_by_key(|u| u.1);
        Ok(used)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nodes_are_32_bytes() {
        assert_eq!(size_of::<Node>(), 32);
        let mut n = Node::free(64, (1 << 56) - 1, NONE);
        n.set_state(NodeState::Recycled);
        assert_eq!((n.size(), n.state()), ((1 << 56) - 1, NodeState::Recycled));
        n.set_size(5);
        assert_eq!((n.size(), n.state()), (5, NodeState::Recycled));
    }

    #[test]
    fn bins_bracket_sizes() {
        for size in (1..5000u64).chain([1 << 20, (1 << 20) + 1, 123_456_789, 1 << 50]) {
            let up = bin_round_up(size);
            let down = bin_round_down(size);
            assert!(bin_size(up) >= size, "round up {size}");
            assert!(bin_size(down) <= size, "round down {size}");
            assert!(up == down || up == down + 1);
        }
        assert!((bin_round_up(MAX_CAPACITY) as usize) < BINS);
    }

    #[test]
    fn allocates_whole_range_then_refuses() {
        let mut a = OffsetAllocator::new(1024);
        let x = a.allocate(1024).unwrap();
        assert_eq!(x.offset, 0);
        assert_eq!(a.free_bytes(), 0);
        assert!(a.allocate(1).is_none());
        assert!(a.free(x.node));
        assert!(!a.free(x.node), "double free must be refused");
        assert_eq!(a.free_bytes(), 1024);
        a.check().unwrap();
    }

    #[test]
    fn frees_merge_back_into_one_block() {
        let mut a = OffsetAllocator::new(1 << 20);
        let blocks: Vec<_> = (0..64).map(|_| a.allocate(4096).unwrap()).collect();
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(b.offset, i as u64 * 4096);
        }
        // Free in an interleaved order so merges happen on both sides.
        for b in blocks
            .iter()
            .step_by(2)
            .chain(blocks.iter().skip(1).step_by(2))
        {
            assert!(a.free(b.node));
            a.check().unwrap();
        }
        assert_eq!(a.free_bytes(), 1 << 20);
        assert_eq!(a.allocate(1 << 20).unwrap().offset, 0);
    }

    #[test]
    fn fallback_finds_a_block_the_rounded_search_misses() {
        // Leave exactly one free block of 4500 bytes: the guaranteed search for 4400 rounds up
        // to a bin above 4500 and finds nothing; the fallback scan finds it.
        let mut a = OffsetAllocator::new(4500 + 8192);
        let first = a.allocate(4500).unwrap();
        let _second = a.allocate(8192).unwrap();
        assert!(a.free(first.node));
        assert!(a.find_guaranteed_fit(4400).is_none());
        let got = a.allocate(4400).expect("fallback fit");
        assert_eq!(got.offset, 0);
        a.check().unwrap();
    }

    #[test]
    fn stale_and_out_of_range_handles_are_refused() {
        let mut a = OffsetAllocator::new(4096);
        assert!(!a.free(0), "node 0 is the free block, not an allocation");
        assert!(!a.free(99));
        assert!(a.allocation(99).is_none());
        assert!(a.allocate(0).is_none());
        assert!(a.allocate(4097).is_none());
    }

    proptest! {
        #[test]
        fn random_sequences_keep_the_allocator_consistent(
            ops in prop::collection::vec((any::<bool>(), 1u64..5000, any::<prop::sample::Index>()), 1..300)
        ) {
            let capacity = 64 * 1024;
            let mut a = OffsetAllocator::new(capacity);
            let mut live: Vec<(u32, u64, u64)> = Vec::new();
            for (alloc, size, pick) in ops {
                if alloc || live.is_empty() {
                    match a.allocate(size) {
                        Some(got) => live.push((got.node, got.offset, size)),
                        None => {
                            // Refusal is only legal if no free block is big enough.
                            let used = a.check().unwrap();
                            let mut at = 0;
                            let mut biggest_gap = 0;
                            for (_, offset, len) in &used {
                                biggest_gap = biggest_gap.max(offset - at);
                                at = offset + len;
                            }
                            biggest_gap = biggest_gap.max(capacity - at);
                            // The bin search may miss blocks in the request's own bin; any
                            // block in a bin at or above its round-up bin must be found.
                            prop_assert!(biggest_gap < bin_size(bin_round_up(size)),
                                "refused {} with a {} byte gap", size, biggest_gap);
                        }
                    }
                } else {
                    let (node, _, _) = live.swap_remove(pick.index(live.len()));
                    prop_assert!(a.free(node));
                }
                let mut used = a.check().map_err(TestCaseError::fail)?;
                let mut expected: Vec<_> = live.clone();
                expected.sort_by_key(|l| l.1);
                used.sort_by_key(|u| u.1);
                prop_assert_eq!(used, expected);
            }
        }
    }
}
