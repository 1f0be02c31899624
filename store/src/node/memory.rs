//! Segment memory: an anonymous mapping a node contributes to the pool.
//!
//! Pre-faulted (so the first transfers do not pay page faults) and, where the kernel allows,
//! backed by transparent huge pages (fewer TLB misses for large transfers). Unmapped when the
//! last holder (the node, a data server, an in-flight transfer) lets go.

use std::ptr::NonNull;
use std::sync::Arc;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::transport::SegmentMemory;

/// `len` bytes of segment memory, optionally prefaulted: in shared memory (a sealed memfd
/// that clients on this host can map) when `shared`, else an anonymous private mapping.
pub fn segment_memory(len: usize, prefault: bool, shared: bool) -> Result<SegmentMemory> {
    if !shared {
        return Ok(MappedMemory::new(len, prefault)?.into_segment());
    }
    Ok(mooring_transport_shm::SharedMemory::new(len, prefault)?.into_segment())
}

/// An anonymous private mapping.
pub struct MappedMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value.
unsafe impl Send for MappedMemory {}
// SAFETY: as above; concurrent access discipline belongs to the protocol (see SegmentMemory).
unsafe impl Sync for MappedMemory {}

impl MappedMemory {
    /// Maps `len` bytes, asking for huge pages and optionally touching every page now.
    pub fn new(len: usize, prefault: bool) -> Result<MappedMemory> {
        if len == 0 {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "segment size is zero",
            ));
        }
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: an anonymous mapping with no address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "cannot map {len} bytes of segment memory: {}",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        // SAFETY: `ptr` is the start of a fresh mapping of `len` bytes. Huge pages are a hint;
        // failure (THP disabled) is harmless.
        unsafe {
            libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
        }
        let memory = MappedMemory {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned null"),
            len,
        };
        if prefault {
            memory.prefault();
        }
        Ok(memory)
    }

    /// Touches one byte per page so the kernel backs the whole range now.
    fn prefault(&self) {
        let page = 4096;
        let mut offset = 0;
        while offset < self.len {
            // SAFETY: offset < len, inside the mapping; a volatile write keeps it from being
            // optimised away.
            unsafe { self.ptr.as_ptr().add(offset).write_volatile(0) };
            offset += page;
        }
    }

    /// A segment view kept alive by this mapping.
    pub fn into_segment(self) -> SegmentMemory {
        let (ptr, len) = (self.ptr, self.len);
        // SAFETY: the mapping stays until the Arc (and every clone the view hands out) drops.
        unsafe { SegmentMemory::new(ptr, len, Arc::new(self)) }
    }
}

impl Drop for MappedMemory {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `new`; no view outlives the owner.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A zeroed buffer of `len` bytes for a value a peer described, or an error if it cannot be
/// had: a length from the network must never abort the process (a `vec![0; len]` does when
/// the allocator refuses). Zeroed pages come from the kernel lazily, as with `vec!`.
pub fn value_buffer(len: u64) -> Result<Vec<u8>> {
    let refused = || {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!(
                "cannot allocate a buffer for a {len}-byte value in this process (is the \
                 master describing values truthfully?)"
            ),
        )
    };
    let len = usize::try_from(len).map_err(|_| refused())?;
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).map_err(|_| refused())?;
    // SAFETY: the layout's size is non-zero (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(refused());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` bytes at
    // alignment 1, which is what a `Vec<u8>` of capacity `len` frees with; all `len` bytes are
    // initialized (zeroed).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_prefaults_and_bounds_checks() {
        let segment = MappedMemory::new(1 << 20, true).unwrap().into_segment();
        assert_eq!(segment.len(), 1 << 20);
        let base = segment.base();
        assert!(segment.copy_in(base + 4096, b"abc"));
        let mut out = [0u8; 3];
        assert!(segment.copy_out(base + 4096, &mut out));
        assert_eq!(&out, b"abc");
        assert!(!segment.copy_in(base + (1 << 20) - 1, b"ab"));
        assert!(MappedMemory::new(0, false).is_err());
    }

    #[test]
    fn value_buffers_are_zeroed_and_impossible_ones_are_refused() {
        let buf = value_buffer(4096).unwrap();
        assert_eq!(buf.len(), 4096);
        assert!(buf.iter().all(|&b| b == 0));
        assert!(value_buffer(0).unwrap().is_empty());
        assert_eq!(
            value_buffer(1 << 62).unwrap_err().code,
            ErrorCode::INTERNAL_ERROR
        );
        assert!(value_buffer(u64::MAX).is_err());
    }
}
