//! Object keys, packed in pages and named by an 8-byte [`KeyRef`].
//!
//! A boxed string per key costs its object 16 bytes (pointer and length) and the memory
//! allocator's rounding on the bytes; at a hundred million objects the pointers alone are
//! 800 MB. Here keys sit in pages of 1 MiB (the last one grows to that size by doubling, so a
//! small master's pages stay small), each in a slot of its length rounded up to 8
//! bytes, and an object keeps the slot's offset and the key's length in one word. A removed
//! key's slot goes on a free list for its size and is taken by the next key of that size:
//! KV-cache keys mostly share a few lengths, so freed slots do not wait long.
//!
//! Pages are shared on clone and copied on first write, like the object slab's chunks
//! (`crate::chunked`), so a snapshot keeps the keys of its moment for the price of copying
//! the page table. A restore keeps the pages it read, once every reference and free slot in
//! them is checked ([`KeyArena::check_restored`]).

use std::num::NonZeroU64;
use std::sync::Arc;

/// Pages start 1 MiB apart in the offsets a reference holds; each holds a little less, so
/// that a page and its reference count take exactly 1 MiB of the memory allocator (a byte
/// more would cost a larger size class).
const PAGE_SHIFT: u32 = 20;
const PAGE_BYTES: usize = (1 << PAGE_SHIFT) - 64;
const WITHIN_PAGE: usize = (1 << PAGE_SHIFT) - 1;
const SLOT_ALIGN: usize = 8;
const LEN_BITS: u32 = 16;

/// The longest key the arena can name: a key reference holds its length in 16 bits.
pub const MAX_KEY_LEN: usize = (1 << LEN_BITS) - 1;

/// Where a key's bytes are: the slot's offset in the arena (the high 48 bits) and the key's
/// length (the low 16). Keys are never empty, so the word is never zero, which leaves the
/// compiler a value for `Option<Object>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct KeyRef(NonZeroU64);

impl KeyRef {
    fn new(offset: u64, len: usize) -> KeyRef {
        debug_assert!((1..=MAX_KEY_LEN).contains(&len), "a key of {len} bytes");
        KeyRef(NonZeroU64::new((offset << LEN_BITS) | len as u64).expect("keys are not empty"))
    }

    fn offset(self) -> usize {
        (self.0.get() >> LEN_BITS) as usize
    }

    /// The key's length in bytes.
    pub(crate) fn len(self) -> usize {
        (self.0.get() & ((1 << LEN_BITS) - 1)) as usize
    }
}

/// The slot a key of `len` bytes takes.
fn slot_len(len: usize) -> usize {
    len.next_multiple_of(SLOT_ALIGN)
}

/// Every object's key, in pages.
#[derive(Clone, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct KeyArena {
    /// Full pages, then the page being filled. This table holds each page's address
    /// itself, so reading a key costs one load from the (small, cached) table and then the
    /// key's own bytes.
    #[rkyv(with = rkyv::with::Map<PageBytes>)]
    pages: Vec<Arc<[u8]>>,
    /// Where the next slot starts in the last page.
    tail: usize,
    /// Offsets of free slots, by slot size in 8-byte units.
    free: Vec<Vec<u64>>,
    /// The live keys' bytes.
    key_bytes: usize,
}

/// How a page is archived: as rkyv archives any `Arc<[u8]>`, but read back with one copy
/// into its shared allocation. rkyv's own reading copies the bytes into a box and then the
/// box into the `Arc`: twice the fresh memory for every page when a snapshot of ten million
/// keys is restored, on a machine where first touches of memory are what a restore waits for.
struct PageBytes;

impl rkyv::with::ArchiveWith<Arc<[u8]>> for PageBytes {
    type Archived = rkyv::Archived<Arc<[u8]>>;
    type Resolver = rkyv::Resolver<Arc<[u8]>>;

    fn resolve_with(page: &Arc<[u8]>, resolver: Self::Resolver, out: rkyv::Place<Self::Archived>) {
        rkyv::Archive::resolve(page, resolver, out);
    }
}

impl<S> rkyv::with::SerializeWith<Arc<[u8]>, S> for PageBytes
where
    S: rkyv::rancor::Fallible + ?Sized,
    Arc<[u8]>: rkyv::Serialize<S>,
{
    fn serialize_with(page: &Arc<[u8]>, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        rkyv::Serialize::serialize(page, serializer)
    }
}

impl<D> rkyv::with::DeserializeWith<rkyv::Archived<Arc<[u8]>>, Arc<[u8]>, D> for PageBytes
where
    D: rkyv::rancor::Fallible + ?Sized,
{
    fn deserialize_with(
        page: &rkyv::Archived<Arc<[u8]>>,
        _: &mut D,
    ) -> Result<Arc<[u8]>, D::Error> {
        Ok(Arc::from(page.get()))
    }
}

impl KeyArena {
    /// Stores `key` (1 to [`MAX_KEY_LEN`] bytes; checked where a request names it).
    pub(crate) fn insert(&mut self, key: &str) -> KeyRef {
        let slot = slot_len(key.len());
        let offset = match self.free.get_mut(slot / SLOT_ALIGN).and_then(Vec::pop) {
            Some(offset) => offset as usize,
            None => self.take_from_tail(slot),
        };
        let page = Arc::make_mut(&mut self.pages[offset >> PAGE_SHIFT]);
        let at = offset & WITHIN_PAGE;
        page[at..at + key.len()].copy_from_slice(key.as_bytes());
        self.key_bytes += key.len();
        KeyRef::new(offset as u64, key.len())
    }

    /// A new slot of `slot` bytes at the end of the last page, or of a new one; what is left
    /// of a page too short for it becomes a free slot of its own size.
    fn take_from_tail(&mut self, slot: usize) -> usize {
        let room = if self.pages.is_empty() {
            0
        } else {
            PAGE_BYTES - self.tail
        };
        if room < slot {
            if room > 0 {
                self.grow_last_page(PAGE_BYTES);
                self.release(((self.pages.len() - 1) << PAGE_SHIFT) + self.tail, room);
            }
            self.pages.push(Arc::from(Vec::new()));
            self.tail = 0;
        }
        let at = self.tail;
        self.tail += slot;
        self.grow_last_page(self.tail);
        ((self.pages.len() - 1) << PAGE_SHIFT) + at
    }

    /// Makes the last page hold at least `len` bytes. The last page grows by doubling up to
    /// its full size, so a small master's keys (and its snapshots) take little room.
    fn grow_last_page(&mut self, len: usize) {
        let last = self.pages.last_mut().expect("a page to grow");
        if last.len() >= len {
            return;
        }
        // Sized so a page and its reference count fill an allocator size class.
        let grown = ((len + 64).next_power_of_two().min(1 << PAGE_SHIFT)) - 64;
        let mut bytes = vec![0u8; grown];
        bytes[..last.len()].copy_from_slice(last);
        *last = Arc::from(bytes);
    }

    fn release(&mut self, offset: usize, slot: usize) {
        let class = slot / SLOT_ALIGN;
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        self.free[class].push(offset as u64);
    }

    /// Lets the key's slot go; `key` must not be read again.
    pub(crate) fn remove(&mut self, key: KeyRef) {
        self.key_bytes -= key.len();
        self.release(key.offset(), slot_len(key.len()));
    }

    /// The key's bytes, if `key` is within the arena.
    fn bytes(&self, key: KeyRef) -> Option<&[u8]> {
        let page = self.pages.get(key.offset() >> PAGE_SHIFT)?;
        let at = key.offset() & WITHIN_PAGE;
        page.get(at..at + key.len())
    }

    /// The key `key` names (one this arena handed out).
    pub(crate) fn get(&self, key: KeyRef) -> &str {
        let bytes = self
            .bytes(key)
            .expect("a key reference this arena handed out");
        std::str::from_utf8(bytes).expect("keys are stored from strings")
    }

    /// Whether `key` names exactly `candidate`: compares bytes, which is all a lookup needs.
    pub(crate) fn is(&self, key: KeyRef, candidate: &str) -> bool {
        key.len() == candidate.len() && self.bytes(key) == Some(candidate.as_bytes())
    }

    /// Checks an arena read from a snapshot, in place, against the references `refs` its
    /// objects hold, and refuses what a damaged or hand-made one could hold that the arena's
    /// own operations assume never happens: a reference outside the pages or past the last
    /// page's filled part, bytes that are not a string, two keys (or a key and a free slot)
    /// sharing bytes (a removal would then free bytes another key still uses), pages of the
    /// wrong size, or a count of live bytes that disagrees. Checking where the keys lie
    /// costs a bit per 8 bytes of arena; packing them anew would cost a second arena.
    pub(crate) fn check_restored(&self, refs: impl Iterator<Item = KeyRef>) -> Result<(), String> {
        let last = self.pages.len().checked_sub(1);
        for (i, page) in self.pages.iter().enumerate() {
            let full = Some(i) != last;
            if page.len() > PAGE_BYTES || (full && page.len() != PAGE_BYTES) {
                return Err(format!("key page {i} holds {} bytes", page.len()));
            }
        }
        let filled = |page: usize| match Some(page) == last {
            true => self.tail,
            false => PAGE_BYTES,
        };
        if last.map_or(self.tail != 0, |last| self.tail > self.pages[last].len()) {
            return Err(format!(
                "the key pages end before their tail at {}",
                self.tail
            ));
        }
        let units_per_page = (1 << PAGE_SHIFT) / SLOT_ALIGN;
        let mut taken = vec![0u64; (self.pages.len() * units_per_page).div_ceil(64)];
        let mut claim = |offset: usize, slot: usize, what: &dyn Fn() -> String| {
            let (page, at) = (offset >> PAGE_SHIFT, offset & WITHIN_PAGE);
            if page >= self.pages.len() || at % SLOT_ALIGN != 0 || at + slot > filled(page) {
                return Err(format!("{} lies outside the key pages", what()));
            }
            let first = page * units_per_page + at / SLOT_ALIGN;
            for unit in first..first + slot / SLOT_ALIGN {
                let (word, bit) = (unit / 64, 1u64 << (unit % 64));
                if taken[word] & bit != 0 {
                    return Err(format!("{} shares bytes with another key", what()));
                }
                taken[word] |= bit;
            }
            Ok(())
        };
        let mut live_bytes = 0;
        for key in refs {
            claim(key.offset(), slot_len(key.len()), &|| {
                format!("key reference {key:?}")
            })?;
            let bytes = self.bytes(key).expect("claimed inside its page");
            std::str::from_utf8(bytes).map_err(|e| format!("a key that is not UTF-8: {e}"))?;
            live_bytes += key.len();
        }
        for (class, offsets) in self.free.iter().enumerate() {
            for &offset in offsets {
                let slot = class * SLOT_ALIGN;
                let what = || format!("the free key slot of {slot} bytes at {offset}");
                if slot == 0 {
                    return Err(format!("{} is empty", what()));
                }
                claim(offset as usize, slot, &what)?;
            }
        }
        if live_bytes != self.key_bytes {
            return Err(format!(
                "the keys hold {live_bytes} bytes, the arena counts {}",
                self.key_bytes
            ));
        }
        Ok(())
    }

    /// Heap bytes held besides the live keys' own bytes: slot rounding, free slots, the
    /// unfilled end of the last page, and the free lists.
    pub(crate) fn overhead_bytes(&self) -> usize {
        self.heap_bytes() - self.key_bytes
    }

    /// Heap bytes held: the pages (shared ones counted by each holder) and the free lists.
    fn heap_bytes(&self) -> usize {
        self.pages.iter().map(|p| p.len()).sum::<usize>()
            + self.pages.capacity() * size_of::<Arc<[u8]>>()
            + self.free.iter().map(|f| f.capacity() * 8).sum::<usize>()
            + self.free.capacity() * size_of::<Vec<u64>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_a_word_and_leaves_a_niche() {
        assert_eq!(size_of::<KeyRef>(), 8);
        assert_eq!(size_of::<Option<KeyRef>>(), 8);
    }

    #[test]
    fn keys_read_back_and_freed_slots_are_taken_by_keys_of_their_size() {
        let mut arena = KeyArena::default();
        let a = arena.insert("alpha");
        let b = arena.insert("a key of twenty bytes");
        let c = arena.insert("c");
        assert_eq!(
            (arena.get(a), arena.get(b), arena.get(c)),
            ("alpha", "a key of twenty bytes", "c")
        );
        assert!(arena.is(b, "a key of twenty bytes") && !arena.is(b, "a key of twenty byteZ"));
        assert!(!arena.is(a, "alph"));
        arena.remove(a);
        // Same slot size (8): the freed slot is reused.
        let d = arena.insert("delta!!");
        assert_eq!(d.offset(), a.offset());
        assert_eq!(
            (arena.get(d), arena.get(b), arena.get(c)),
            ("delta!!", "a key of twenty bytes", "c")
        );
        // Another size: a new slot at the tail.
        let e = arena.insert("nine byte");
        assert!(e.offset() > c.offset());
        // A few keys take a small page, not a whole one.
        assert!(arena.heap_bytes() < 1024, "{}", arena.heap_bytes());
    }

    #[test]
    fn keys_never_straddle_pages_and_the_tail_is_not_lost() {
        let mut arena = KeyArena::default();
        let len = 60_000;
        let per_page = PAGE_BYTES / len;
        let mut refs = Vec::new();
        for i in 0..2 * per_page + 1 {
            let key = format!("{i:03}{}", "x".repeat(len - 3));
            let r = arena.insert(&key);
            assert_eq!(
                r.offset() >> PAGE_SHIFT,
                (r.offset() + r.len() - 1) >> PAGE_SHIFT
            );
            refs.push((r, key));
        }
        for (r, key) in &refs {
            assert_eq!(arena.get(*r), key);
        }
        // The rest of each of the two full pages waits for a key that fits.
        let tail = PAGE_BYTES - per_page * len;
        assert_eq!(arena.free[tail / SLOT_ALIGN].len(), 2);
        let short = arena.insert(&"y".repeat(tail));
        assert_eq!(arena.get(short).len(), tail);
        assert_eq!(arena.free[tail / SLOT_ALIGN].len(), 1);
        let longest = arena.insert(&"z".repeat(MAX_KEY_LEN));
        assert_eq!(arena.get(longest).len(), MAX_KEY_LEN);
    }

    #[test]
    fn a_clone_keeps_its_keys_while_the_original_changes() {
        let mut arena = KeyArena::default();
        let a = arena.insert("first");
        let snapshot = arena.clone();
        arena.remove(a);
        let b = arena.insert("other");
        assert_eq!(b.offset(), a.offset());
        assert_eq!((snapshot.get(a), arena.get(b)), ("first", "other"));
    }

    #[test]
    fn a_restored_arena_is_kept_as_read_and_refused_where_it_cannot_be_trusted() {
        let mut arena = KeyArena::default();
        let mut refs: Vec<KeyRef> = (0..100)
            .map(|i| arena.insert(&format!("key-{i}")))
            .collect();
        for r in refs.drain(..50) {
            arena.remove(r);
        }
        arena
            .check_restored(refs.iter().copied())
            .expect("as the arena left it");
        let refused = |arena: &KeyArena, refs: &[KeyRef], why: &str| {
            let e = arena.check_restored(refs.iter().copied()).expect_err(why);
            assert!(e.contains(why), "{e}");
        };
        // A reference past the pages, and one past the last page's filled part.
        refused(
            &arena,
            &[KeyRef::new(4 << PAGE_SHIFT, 3)],
            "outside the key pages",
        );
        refused(
            &arena,
            &[KeyRef::new(arena.tail as u64, 3)],
            "outside the key pages",
        );
        // Two keys on the same bytes, or on overlapping ones: removing one would free the
        // other's.
        let mut twice = refs.clone();
        twice.push(refs[0]);
        refused(&arena, &twice, "shares bytes");
        let inside = KeyRef::new(refs[1].offset() as u64, 2);
        refused(&arena, &[refs[1], inside], "shares bytes");
        // A live key on a slot the free list also holds.
        let mut reused = arena.clone();
        reused.free[1].push(refs[3].offset() as u64);
        refused(&reused, &refs, "shares bytes");
        // A count of live bytes that disagrees, and a key missing (its bytes uncounted).
        refused(&arena, &refs[1..], "the keys hold");
        // Bytes that are not a string.
        let mut broken = arena.clone();
        Arc::make_mut(&mut broken.pages[0])[refs[0].offset()] = 0xff;
        refused(&broken, &refs, "not UTF-8");
        // A page of the wrong size before the last.
        let mut short = KeyArena::default();
        let long: Vec<KeyRef> = (0..PAGE_BYTES / 60_000 + 1)
            .map(|i| short.insert(&format!("{i:02}{}", "x".repeat(60_000 - 2))))
            .collect();
        assert_eq!(short.pages.len(), 2);
        short
            .check_restored(long.iter().copied())
            .expect("a full page and the last");
        short.pages[0] = Arc::from(vec![b'x'; 64]);
        refused(&short, &long, "key page 0 holds 64 bytes");
    }
}
