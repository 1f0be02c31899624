//! The per-segment offset allocator: fast allocation and free with low fragmentation.
//!
//! After Sebastian Aaltonen's OffsetAllocator (the allocator Mooncake Store adopted), in 64
//! bits: free blocks sit in 512 size bins laid out like a tiny float (5-bit exponent, 3-bit
//! mantissa), so every bin's sizes lie within 12.5% of each other. A two-level bitmask (64
//! "top" exponent bins × 8 mantissa "leaf" bins) finds the smallest non-empty bin that fits in
//! a few bit operations. Allocation splits the found block and files the remainder.
//!
//! Two departures from the original:
//! - **Books on free space only.** The original keeps a 32-byte node for every block, free or
//!   allocated, linked to its address neighbours. Here an allocated block has no node: its
//!   owner (an object's replica) already knows its offset and length and hands both back to
//!   `free`. The free blocks are also kept in an ordered map by end offset, so a freed block
//!   finds a free neighbour before it by its own offset and one after it as the next entry,
//!   in O(log free blocks); the same lookup refuses a free that overlaps free space. With a
//!   hundred million objects resident, that is 3.2 GB the master does not hold.
//! - **A fallback search.** When no bin is guaranteed to fit, allocation scans a few blocks
//!   of the bin just below, which may hold a block that is large enough (the guaranteed
//!   search rounds up and would otherwise miss it). This matters when a segment is nearly
//!   full.
//!
//! The allocator hands out byte offsets in `[0, capacity)`; it never touches memory.

use std::collections::BTreeMap;

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

/// One free block, linked to its bin neighbours. Allocated blocks have no node at all: their
/// owner remembers where they are and how long, which is what lets a hundred million objects
/// cost no allocator memory. A node with size 0 describes nothing and waits on the recycle
/// stack.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct Node {
    offset: u64,
    size: u64,
    bin_prev: u32,
    bin_next: u32,
}

/// An allocated block: where it starts and how long it is. The owner keeps it (or can
/// recompute it) and hands it back to [`OffsetAllocator::free`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Byte offset of the block within the managed range.
    pub offset: u64,
    /// Length of the block in bytes.
    pub len: u64,
}

/// A bin-based offset allocator over `[0, capacity)` that keeps books on free space only.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct OffsetAllocator {
    capacity: u64,
    free_bytes: u64,
    used_top_bins: u64,
    used_leaf_bins: [u8; TOP_BINS],
    bin_heads: Vec<u32>,
    /// Free blocks only, so a plain vector: a snapshot's clone copies them whole, as it copies
    /// `by_end`, and every write skips the copy-on-write check a shared chunk would need.
    nodes: Vec<Node>,
    recycled: Vec<u32>,
    /// Every free block by the offset just past its end, in address order: a freed block
    /// finds the free block before it by its own offset, and the one after it (or an overlap,
    /// which refuses the free) as the first entry beyond its offset.
    by_end: BTreeMap<u64, u32>,
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
            free_bytes: capacity,
            used_top_bins: 0,
            used_leaf_bins: [0; TOP_BINS],
            bin_heads: vec![NONE; BINS],
            nodes: Vec::new(),
            recycled: Vec::new(),
            by_end: BTreeMap::new(),
        };
        allocator.add_free_block(0, capacity);
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
        self.free_bytes -= size;
        let block = &mut self.nodes[node as usize];
        let offset = block.offset;
        if block.size > size {
            // The rest stays free under the same end, so its place in `by_end` holds.
            block.offset += size;
            block.size -= size;
            self.link_into_bin(node);
        } else {
            let end = block.offset + block.size;
            self.by_end.remove(&end);
            self.recycle(node);
        }
        Some(Allocation { offset, len: size })
    }

    /// Frees `block`, merging it with the free blocks on either side. Returns false, changing
    /// nothing, if the block is empty, reaches beyond the range, or overlaps free space (a
    /// double free or a wrong length).
    pub fn free(&mut self, block: Allocation) -> bool {
        let Allocation { offset, len } = block;
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if len == 0 || end > self.capacity {
            return false;
        }
        let after = self.by_end.range(offset + 1..).next().map(|(_, &n)| n);
        let after = match after {
            Some(n) if self.nodes[n as usize].offset < end => return false,
            Some(n) if self.nodes[n as usize].offset == end => Some(n),
            _ => None,
        };
        let before = self.by_end.get(&offset).copied();
        self.free_bytes += len;
        match (before, after) {
            (None, None) => self.add_free_block(offset, len),
            (Some(before), None) => {
                // The block before grows forward: its end, and so its key, moves.
                self.unlink_from_bin(before);
                self.by_end.remove(&offset);
                self.by_end.insert(end, before);
                self.nodes[before as usize].size += len;
                self.link_into_bin(before);
            }
            (before, Some(after)) => {
                // The block after grows backward and keeps its end.
                self.unlink_from_bin(after);
                let (mut start, mut size) = (offset, len);
                if let Some(before) = before {
                    self.unlink_from_bin(before);
                    self.by_end.remove(&offset);
                    start = self.nodes[before as usize].offset;
                    size += self.nodes[before as usize].size;
                    self.recycle(before);
                }
                let grown = &mut self.nodes[after as usize];
                grown.size += size;
                grown.offset = start;
                self.link_into_bin(after);
            }
        }
        true
    }

    /// Whether an allocation of `size` bytes would succeed right now.
    pub fn can_allocate(&self, size: u64) -> bool {
        size > 0
            && size <= self.free_bytes
            && (self.find_guaranteed_fit(size).is_some() || self.find_fallback_fit(size).is_some())
    }

    /// Every free block in address order, as `(offset, size)`. What lies between them is
    /// allocated.
    pub fn free_blocks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_end.values().map(|&n| {
            let block = &self.nodes[n as usize];
            (block.offset, block.size)
        })
    }

    /// Heap bytes this allocator uses for its bookkeeping (the ordered map's nodes counted at
    /// about 24 bytes an entry).
    pub fn heap_bytes(&self) -> usize {
        self.nodes.capacity() * size_of::<Node>()
            + self.recycled.capacity() * size_of::<u32>()
            + self.bin_heads.capacity() * size_of::<u32>()
            + self.by_end.len() * 24
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
            if block.size >= size {
                return Some(node);
            }
            node = block.bin_next;
        }
        None
    }

    /// Records a new free block (its bytes are already counted free) and files it.
    fn add_free_block(&mut self, offset: u64, size: u64) {
        let node = Node {
            offset,
            size,
            bin_prev: NONE,
            bin_next: NONE,
        };
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
        self.by_end.insert(offset + size, index);
        self.link_into_bin(index);
    }

    /// Files free block `node` at the head of the bin its size rounds down to.
    fn link_into_bin(&mut self, node: u32) {
        let bin = bin_round_down(self.nodes[node as usize].size) as usize;
        let (top, leaf) = (bin / LEAF_BINS_PER_TOP, bin % LEAF_BINS_PER_TOP);
        let head = self.bin_heads[bin];
        if head == NONE {
            self.used_leaf_bins[top] |= 1 << leaf;
            self.used_top_bins |= 1 << top;
        } else {
            self.nodes[head as usize].bin_prev = node;
        }
        let block = &mut self.nodes[node as usize];
        block.bin_prev = NONE;
        block.bin_next = head;
        self.bin_heads[bin] = node;
    }

    /// Removes free block `node` from its bin (its size must not have changed since it was
    /// filed).
    fn unlink_from_bin(&mut self, node: u32) {
        let (prev, next, size) = {
            let block = &self.nodes[node as usize];
            (block.bin_prev, block.bin_next, block.size)
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

    /// Retires a node that no longer describes a free block.
    fn recycle(&mut self, node: u32) {
        self.nodes[node as usize].size = 0;
        self.recycled.push(node);
    }

    /// Verifies every structural invariant and returns the allocated space as maximal runs
    /// `(offset, len)` in address order (adjacent allocations form one run): free blocks are
    /// non-empty, in range, apart (never touching: they would have merged) and each filed
    /// once by its end; bins hold exactly the free blocks with consistent masks; the recycle
    /// stack holds exactly the empty nodes; and the byte counter agrees. Never panics,
    /// whatever a restored snapshot holds.
    pub fn check(&self) -> Result<Vec<(u64, u64)>, String> {
        if self.bin_heads.len() != BINS {
            return Err(format!("{} bins, expected {BINS}", self.bin_heads.len()));
        }
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(format!("capacity {} out of range", self.capacity));
        }
        let node_at = |index: u32| {
            self.nodes
                .get(index as usize)
                .ok_or_else(|| format!("link to node {index} beyond {}", self.nodes.len()))
        };
        // Address order, by end: the free blocks and the allocated runs between them.
        let mut filed = vec![false; self.nodes.len()];
        let mut used = Vec::new();
        let (mut at, mut free_sum) = (0u64, 0u64);
        for (&end, &index) in &self.by_end {
            let block = node_at(index)?;
            if block.size == 0 || filed[index as usize] {
                return Err(format!("end {end} names an empty or repeated node {index}"));
            }
            filed[index as usize] = true;
            if block.offset.checked_add(block.size) != Some(end) || end > self.capacity {
                return Err(format!(
                    "free block at {} of {} bytes filed under end {end}",
                    block.offset, block.size
                ));
            }
            if block.offset < at || (block.offset == at && at > 0) {
                return Err(format!(
                    "free block at {} overlaps or touches the one before (ends {at})",
                    block.offset
                ));
            }
            if block.offset > at {
                used.push((at, block.offset - at));
            }
            free_sum += block.size;
            at = end;
        }
        if at < self.capacity {
            used.push((at, self.capacity - at));
        }
        if free_sum != self.free_bytes {
            return Err(format!(
                "free blocks sum to {free_sum} but free_bytes is {}",
                self.free_bytes
            ));
        }
        let empty = self.nodes.iter().filter(|n| n.size == 0).count();
        if empty + self.by_end.len() != self.nodes.len() {
            return Err(format!(
                "{} nodes: {empty} empty and {} filed by end",
                self.nodes.len(),
                self.by_end.len()
            ));
        }
        let mut on_stack = vec![false; self.nodes.len()];
        for &index in &self.recycled {
            if node_at(index)?.size != 0 || on_stack[index as usize] {
                return Err(format!("recycle stack holds live or repeated node {index}"));
            }
            on_stack[index as usize] = true;
        }
        if empty != self.recycled.len() {
            return Err(format!(
                "{empty} empty nodes but {} on the stack",
                self.recycled.len()
            ));
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
                if block.size == 0 {
                    return Err(format!("bin {bin} holds an empty node {node}"));
                }
                if bin_round_down(block.size) as usize != bin {
                    return Err(format!("block of {} bytes filed in bin {bin}", block.size));
                }
                if block.bin_prev != prev {
                    return Err(format!("bin {bin} has a bad back link"));
                }
                in_bins += 1;
                if in_bins > self.by_end.len() {
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
        if in_bins != self.by_end.len() {
            return Err(format!(
                "{in_bins} blocks in bins, {} free blocks",
                self.by_end.len()
            ));
        }
        Ok(used)
    }
}

/// How owned blocks fail to cover allocated space exactly (see [`check_ownership`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnershipFault<O> {
    /// Allocated bytes from `offset` of `region` that nothing claims: a leak.
    Unowned { region: u32, offset: u64 },
    /// `owner` claims `len` bytes at `offset` of `region` that are not all allocated (or
    /// that an earlier claim already covers).
    NotAllocated {
        owner: O,
        region: u32,
        offset: u64,
        len: u64,
    },
    /// `first` and `second` both claim the bytes at `offset` of `region`.
    Twice {
        region: u32,
        offset: u64,
        first: O,
        second: O,
    },
    /// `owner` claims an empty block at `offset` of `region`.
    Empty { owner: O, region: u32, offset: u64 },
}

/// Checks that the owners' claims `(region, offset, len, owner)` tile allocated space
/// exactly: every allocated byte claimed once, nothing claimed that is not allocated. `used`
/// lists allocated space as maximal runs `(region, offset, len)` sorted by region and offset
/// (what [`OffsetAllocator::check`] returns, one region per allocator); `claims` is sorted
/// the same way. One walk of both.
pub(crate) fn check_ownership<O: Copy>(
    used: &[(u32, u64, u64)],
    claims: &[(u32, u64, u64, O)],
) -> Result<(), OwnershipFault<O>> {
    let mut claims = claims.iter().peekable();
    for &(region, start, len) in used {
        let end = start + len;
        let mut at = start;
        while at < end {
            let Some(&&(claim_region, offset, claim_len, owner)) = claims.peek() else {
                return Err(OwnershipFault::Unowned { region, offset: at });
            };
            if (claim_region, offset) > (region, at) {
                return Err(OwnershipFault::Unowned { region, offset: at });
            }
            let not_allocated = OwnershipFault::NotAllocated {
                owner,
                region: claim_region,
                offset,
                len: claim_len,
            };
            if (claim_region, offset) < (region, at) {
                return Err(not_allocated);
            }
            if claim_len == 0 {
                return Err(OwnershipFault::Empty {
                    owner,
                    region,
                    offset,
                });
            }
            claims.next();
            at = at.saturating_add(claim_len);
            if at > end {
                return Err(not_allocated);
            }
            if let Some(&&(next_region, next, _, second)) = claims.peek()
                && (next_region, next) < (region, at)
            {
                return Err(OwnershipFault::Twice {
                    region,
                    offset: next,
                    first: owner,
                    second,
                });
            }
        }
    }
    match claims.next() {
        Some(&(region, offset, len, owner)) => Err(OwnershipFault::NotAllocated {
            owner,
            region,
            offset,
            len,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn free_block_nodes_are_24_bytes() {
        assert_eq!(size_of::<Node>(), 24);
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
        assert_eq!(
            x,
            Allocation {
                offset: 0,
                len: 1024
            }
        );
        assert_eq!(a.free_bytes(), 0);
        assert_eq!(a.check().unwrap(), vec![(0, 1024)]);
        assert!(a.allocate(1).is_none());
        assert!(a.free(x));
        assert!(!a.free(x), "double free must be refused");
        assert_eq!(a.free_bytes(), 1024);
        assert_eq!(a.check().unwrap(), vec![]);
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
            assert!(a.free(*b));
            a.check().unwrap();
        }
        assert_eq!(a.free_bytes(), 1 << 20);
        assert_eq!(a.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
        assert_eq!(a.allocate(1 << 20).unwrap().offset, 0);
    }

    #[test]
    fn fallback_finds_a_block_the_rounded_search_misses() {
        // Leave exactly one free block of 4500 bytes: the guaranteed search for 4400 rounds up
        // to a bin above 4500 and finds nothing; the fallback scan finds it.
        let mut a = OffsetAllocator::new(4500 + 8192);
        let first = a.allocate(4500).unwrap();
        let _second = a.allocate(8192).unwrap();
        assert!(a.free(first));
        assert!(a.find_guaranteed_fit(4400).is_none());
        let got = a.allocate(4400).expect("fallback fit");
        assert_eq!(got.offset, 0);
        a.check().unwrap();
    }

    #[test]
    fn frees_that_overlap_free_space_or_leave_the_range_are_refused() {
        let mut a = OffsetAllocator::new(4096);
        let x = a.allocate(1024).unwrap();
        let y = a.allocate(1024).unwrap();
        assert!(a.free(x));
        let before = a.free_bytes();
        for bad in [
            Allocation {
                offset: 0,
                len: 1024,
            }, // freed already
            Allocation {
                offset: 512,
                len: 1024,
            }, // half freed, half live
            Allocation {
                offset: 1024,
                len: 2048,
            }, // live, then free space
            Allocation {
                offset: 1024,
                len: 0,
            },
            Allocation {
                offset: 4000,
                len: 200,
            },
            Allocation {
                offset: u64::MAX,
                len: 2,
            },
        ] {
            assert!(!a.free(bad), "{bad:?}");
        }
        assert_eq!(a.free_bytes(), before);
        a.check().unwrap();
        assert!(a.free(y));
        assert_eq!(a.free_blocks().collect::<Vec<_>>(), vec![(0, 4096)]);
        assert!(a.allocate(0).is_none());
        assert!(a.allocate(4097).is_none());
    }

    #[test]
    fn the_check_reports_damage() {
        let a = OffsetAllocator::new(4096);
        let mut bad = a.clone();
        bad.free_bytes = 1;
        assert!(bad.check().unwrap_err().contains("free_bytes"));
        let mut bad = a.clone();
        bad.by_end = BTreeMap::from([(4000, 0)]);
        assert!(bad.check().is_err());
        let mut bad = a.clone();
        bad.recycled.push(0);
        assert!(bad.check().is_err());
        let mut bad = a;
        bad.by_end.insert(9, 7);
        assert!(bad.check().unwrap_err().contains("beyond"));
    }

    #[test]
    fn ownership_faults_are_named() {
        let used = [(0, 0, 256), (1, 64, 64)];
        let ok = [(0, 0, 128, 'a'), (0, 128, 128, 'b'), (1, 64, 64, 'c')];
        assert_eq!(check_ownership(&used, &ok), Ok(()));
        let leak = [(0, 0, 128, 'a'), (1, 64, 64, 'c')];
        assert_eq!(
            check_ownership(&used, &leak),
            Err(OwnershipFault::Unowned {
                region: 0,
                offset: 128
            })
        );
        let twice = [(0, 0, 128, 'a'), (0, 64, 192, 'b'), (1, 64, 64, 'c')];
        assert!(matches!(
            check_ownership(&used, &twice),
            Err(OwnershipFault::Twice {
                first: 'a',
                second: 'b',
                ..
            })
        ));
        let beyond = [(0, 0, 256, 'a'), (1, 64, 128, 'c')];
        assert!(matches!(
            check_ownership(&used, &beyond),
            Err(OwnershipFault::NotAllocated { owner: 'c', .. })
        ));
        let stray = [(0, 0, 256, 'a'), (1, 64, 64, 'c'), (2, 0, 64, 'd')];
        assert!(matches!(
            check_ownership(&used, &stray),
            Err(OwnershipFault::NotAllocated { owner: 'd', .. })
        ));
        let empty = [(0, 0, 0, 'e'), (0, 0, 256, 'a'), (1, 64, 64, 'c')];
        assert!(matches!(
            check_ownership(&used, &empty),
            Err(OwnershipFault::Empty { owner: 'e', .. })
        ));
    }

    proptest! {
        #[test]
        fn random_sequences_keep_the_allocator_consistent(
            ops in prop::collection::vec((any::<bool>(), 1u64..5000, any::<prop::sample::Index>()), 1..300)
        ) {
            let capacity = 64 * 1024;
            let mut a = OffsetAllocator::new(capacity);
            let mut live: Vec<Allocation> = Vec::new();
            for (alloc, size, pick) in ops {
                if alloc || live.is_empty() {
                    match a.allocate(size) {
                        Some(got) => {
                            prop_assert_eq!(got.len, size);
                            live.push(got);
                        }
                        None => {
                            // Refusal is only legal if no free block is big enough: the bin
                            // search may miss blocks in the request's own bin; any block in a
                            // bin at or above its round-up bin must be found.
                            let biggest = a.free_blocks().map(|b| b.1).max().unwrap_or(0);
                            prop_assert!(biggest < bin_size(bin_round_up(size)),
                                "refused {} with a {} byte free block", size, biggest);
                        }
                    }
                } else {
                    let block = live.swap_remove(pick.index(live.len()));
                    prop_assert!(a.free(block));
                    prop_assert!(!a.free(block), "a second free of {:?} was taken", block);
                }
                // The allocated runs are exactly the live blocks, merged where they touch.
                let used = a.check().map_err(TestCaseError::fail)?;
                let mut expected: Vec<(u64, u64)> = Vec::new();
                let mut sorted = live.clone();
                sorted.sort_by_key(|b| b.offset);
                for b in sorted {
                    match expected.last_mut() {
                        Some(run) if run.0 + run.1 == b.offset => run.1 += b.len,
                        _ => expected.push((b.offset, b.len)),
                    }
                }
                prop_assert_eq!(used, expected);
            }
        }
    }
}
