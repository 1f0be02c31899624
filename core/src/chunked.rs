//! A vector that grows in fixed-size chunks instead of doubling.
//!
//! The master's big tables (the object slab and its checksum column) hold a million
//! entries or more. A doubling `Vec` keeps up to half its capacity as slack and copies the
//! whole table on growth (a latency spike in the middle of a put); chunks bound the slack to
//! one chunk and never move an element. Indexing costs one extra load from a chunk table that
//! stays in cache.
//!
//! Chunks are shared on clone and copied on first write (copy on write): a snapshot clones
//! the tables under the master's lock in time proportional to the number of chunks, not
//! entries, and serializes them on another thread while the master goes on. Only chunks the
//! master writes to while the snapshot still holds them are copied. The archived form is a
//! plain vector of chunks, as if the chunks were not shared.

use std::ops::{Index, IndexMut};
use std::sync::Arc;

const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// A growable array of `T` stored in chunks of 4096, shared between clones until written.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct ChunkedVec<T> {
    #[rkyv(with = rkyv::with::Map<rkyv::with::Unshare>)]
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
}

impl<T> Default for ChunkedVec<T> {
    fn default() -> Self {
        ChunkedVec {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> ChunkedVec<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        self.chunks
            .get(index >> CHUNK_BITS)
            .and_then(|c| c.get(index & (CHUNK - 1)))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// Checks the chunk structure (every chunk full but the last, `len` their sum); a
    /// restored snapshot could claim anything.
    pub(crate) fn check(&self) -> Result<(), String> {
        let sum: usize = self.chunks.iter().map(|c| c.len()).sum();
        let shaped = self
            .chunks
            .iter()
            .enumerate()
            .all(|(i, c)| c.len() <= CHUNK && (i + 1 == self.chunks.len() || c.len() == CHUNK));
        if sum != self.len || !shaped || self.chunks.last().is_some_and(|c| c.is_empty()) {
            return Err(format!(
                "chunked vector of {} chunks claims {} elements, holds {sum}",
                self.chunks.len(),
                self.len
            ));
        }
        Ok(())
    }

    /// Heap bytes held, including the unused tail of the last chunk (shared chunks are
    /// counted by each holder).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks.len() * (CHUNK * size_of::<T>() + size_of::<(usize, usize, Vec<T>)>())
            + self.chunks.capacity() * size_of::<Arc<Vec<T>>>()
    }
}

impl<T: Clone> ChunkedVec<T> {
    /// Appends `value`; returns its index.
    pub(crate) fn push(&mut self, value: T) -> usize {
        if self.len == self.chunks.len() * CHUNK {
            self.chunks.push(Arc::new(Vec::with_capacity(CHUNK)));
        }
        let last = self.chunks.last_mut().expect("a chunk with room");
        Arc::make_mut(last).push(value);
        self.len += 1;
        self.len - 1
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.chunks
            .iter_mut()
            .flat_map(|c| Arc::make_mut(c).iter_mut())
    }

    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        self.chunks
            .get_mut(index >> CHUNK_BITS)
            .and_then(|c| Arc::make_mut(c).get_mut(index & (CHUNK - 1)))
    }
}

impl<T: Clone> FromIterator<T> for ChunkedVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut v = ChunkedVec::default();
        for item in iter {
            v.push(item);
        }
        v
    }
}

impl<T> Index<usize> for ChunkedVec<T> {
    type Output = T;
    fn index(&self, index: usize) -> &T {
        &self.chunks[index >> CHUNK_BITS][index & (CHUNK - 1)]
    }
}

impl<T: Clone> IndexMut<usize> for ChunkedVec<T> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        &mut Arc::make_mut(&mut self.chunks[index >> CHUNK_BITS])[index & (CHUNK - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_across_chunks() {
        let mut v: ChunkedVec<u32> = ChunkedVec::default();
        for i in 0..10_000u32 {
            assert_eq!(v.push(i), i as usize);
        }
        assert_eq!(v.len(), 10_000);
        assert_eq!(v[4095], 4095);
        assert_eq!(v[4096], 4096);
        v[9999] = 7;
        assert_eq!(v.get(9999), Some(&7));
        assert_eq!(v.get(10_000), None);
        assert_eq!(v.iter().count(), 10_000);
        assert_eq!(v.heap_bytes() / size_of::<u32>() / CHUNK, 3);
    }

    #[test]
    fn a_clone_shares_chunks_until_either_side_writes() {
        let mut v: ChunkedVec<u32> = (0..10_000u32).collect();
        let snapshot = v.clone();
        let shared = |a: &ChunkedVec<u32>, b: &ChunkedVec<u32>, chunk: usize| {
            Arc::ptr_eq(&a.chunks[chunk], &b.chunks[chunk])
        };
        assert!((0..3).all(|c| shared(&v, &snapshot, c)));
        v[5000] = 7;
        v.push(10_000);
        assert!(shared(&v, &snapshot, 0), "an untouched chunk stays shared");
        assert!(!shared(&v, &snapshot, 1) && !shared(&v, &snapshot, 2));
        assert_eq!(
            (v[5000], snapshot[5000]),
            (7, 5000),
            "the clone keeps its values"
        );
        assert_eq!((v.len(), snapshot.len()), (10_001, 10_000));
        assert!(v.check().is_ok() && snapshot.check().is_ok());
    }
}
