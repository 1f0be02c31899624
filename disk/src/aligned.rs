//! The alignment check of direct I/O.

use std::io;

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
                 {offset}, length {len}); use IoBuf::new with the disk's alignment"
            ),
        ));
    }
    Ok(())
}
