//! Heap buffers aligned for direct I/O.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A zeroed byte buffer whose address and length are multiples of an alignment (a power of
/// two), as `O_DIRECT` transfers require.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is plain owned bytes, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` rounded up to `align`, zeroed. `align` must be a power of two.
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let align = align.max(1);
        assert!(
            align.is_power_of_two(),
            "alignment {align} is not a power of two"
        );
        let len = len.div_ceil(align) * align;
        let layout = Layout::from_size_align(len.max(align), align).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, layout }
    }

    /// A copy of `data`, zero-padded to a multiple of `align`.
    pub fn copy_of(data: &[u8], align: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::new(data.len(), align);
        buf[..data.len()].copy_from_slice(data);
        buf
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` owns `layout.size() >= len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Fails with `InvalidInput` unless offset, length and address are multiples of `alignment`
/// (as direct I/O needs; an alignment of 1 accepts anything).
// Only the real disks check alignment; they are not built under the simulator.
#[cfg_attr(madsim, allow(dead_code))]
pub(crate) fn check_aligned(
    alignment: usize,
    offset: u64,
    buf: *const u8,
    len: usize,
) -> io::Result<()> {
    let a = alignment;
    if a > 1
        && (!offset.is_multiple_of(a as u64)
            || !len.is_multiple_of(a)
            || !(buf as usize).is_multiple_of(a))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "direct I/O needs offset, length and buffer aligned to {a} bytes (offset \
                 {offset}, length {len}); use AlignedBuf"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_and_aligns() {
        let buf = AlignedBuf::copy_of(b"hello", 512);
        assert_eq!(buf.len(), 512);
        assert_eq!(buf.as_ptr() as usize % 512, 0);
        assert_eq!(&buf[..5], b"hello");
        assert!(buf[5..].iter().all(|&b| b == 0));
        assert_eq!(AlignedBuf::new(0, 4096).len(), 0);
    }
}
