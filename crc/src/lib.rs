//! # mooring-crc
//!
//! The crc32c (Castagnoli) of large values, as fast as this CPU allows. Every get verifies
//! its value's checksum, so summing speed is get speed: the `crc32` instruction alone (the
//! `crc32c` crate, ~23 GB/s here) made summing a fifth of a large get's work.
//!
//! On x86-64 CPUs with AVX2, VPCLMULQDQ and SSE 4.2 ([`x86`]) a value is cut into blocks, and
//! within each block two engines run side by side on different execution units: carry-less
//! multiplication folds the block's first part 128 bytes at a time, while three interleaved
//! `crc32` streams sum the rest; the four partial results are joined by multiplying with
//! constants fixed at compile time. About 1.5 times the speed of the `crc32` instruction alone
//! (`cargo bench -p mooring-benches --bench crc`). Elsewhere, and for what is left after the
//! last whole block, the `crc32c` crate does the work.
//!
//! Checksums of consecutive pieces join into the checksum of the whole ([`combine`], from
//! [`poly`]), so pieces can be summed as they land, on any thread, in any order.

pub mod poly;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use poly::combine;

/// The crc32c of `crc`'s bytes followed by `bytes`, where `crc` is the crc32c of the bytes
/// before (0 for none): `append(append(0, a), b) == append(0, a ++ b)`.
pub fn append(crc: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() >= x86::BLOCK && x86::available() {
        return x86::append(crc, bytes);
    }
    crc32c::crc32c_append(crc, bytes)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    fn bytes(len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect()
    }

    proptest! {
        #[test]
        fn matches_the_crc32_instruction_alone(
            len in 0usize..200_000,
            start in 0usize..64,
            crc in any::<u32>(),
            seed in any::<u32>(),
        ) {
            let data = bytes(start + len, seed);
            let data = &data[start..];
            prop_assert_eq!(super::append(crc, data), crc32c::crc32c_append(crc, data));
        }
    }

    #[test]
    fn block_boundaries_and_a_large_value_agree() {
        #[cfg(target_arch = "x86_64")]
        let block = super::x86::BLOCK;
        #[cfg(not(target_arch = "x86_64"))]
        let block = 4096;
        let data = bytes(4 << 20, 9);
        for len in [
            block - 1,
            block,
            block + 1,
            2 * block,
            7 * block + 3,
            4 << 20,
        ] {
            assert_eq!(super::append(0, &data[..len]), crc32c::crc32c(&data[..len]));
        }
    }
}
