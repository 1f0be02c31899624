//! The objects a run writes and reads back: their keys, their values (cheap to make, distinct
//! per object), and how many there are of each size.

/// Largest total bytes of distinct objects per size (reads cycle over them).
const MAX_BYTES_PER_SIZE: u64 = 512 << 20;

/// The value of object `i` of `size` bytes: cheap to generate, distinct per object.
pub(super) fn value(size: u64, i: usize) -> Vec<u8> {
    let mut out = vec![0u8; size as usize];
    let seed = (size ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
    for (n, chunk) in out.chunks_mut(8).enumerate() {
        let word = seed.wrapping_mul(n as u64 + 1).rotate_left(17);
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
    out
}

pub(super) fn key(run: &str, size: u64, i: usize) -> String {
    format!("bench/{run}/{size}/{i:07}")
}

pub(super) fn objects_for(size: u64, count: usize) -> usize {
    count.min((MAX_BYTES_PER_SIZE / size.max(1)).max(16) as usize)
}
