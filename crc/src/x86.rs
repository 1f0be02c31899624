//! The x86-64 engine: carry-less-multiply folding beside three `crc32` instruction streams.
//!
//! Bits are reflected throughout, as crc32c defines them: in a 32-bit register the top bit is
//! the coefficient of x^0, and byte 0 of a message carries its highest-degree coefficients.
//!
//! A block of [`BLOCK`] bytes is `FOLD_LEN` bytes for folding followed by three streams of
//! `STREAM_LEN` bytes. Each step of the loop folds 128 bytes (four 256-bit accumulators, each
//! multiplied forward by x^1024 and added to the next 128 bytes) and feeds 8 bytes to each
//! stream six times. The block's CRC is then the folded remainder, summed with the `crc32`
//! instruction, shifted past each stream in turn and added to that stream's CRC.

use std::arch::x86_64::*;

use crate::poly::x_pow;

/// Bytes folded per step of the loop (four 256-bit accumulators).
const FOLD_STEP: usize = 128;
/// 8-byte words each `crc32` stream takes per step of the loop.
const STREAM_WORDS: usize = 6;
/// Steps of the loop per block.
const STEPS: usize = 64;
/// Bytes of each block that are folded.
const FOLD_LEN: usize = FOLD_STEP * STEPS;
/// Bytes of each block in each `crc32` stream.
const STREAM_LEN: usize = 8 * STREAM_WORDS * STEPS;
/// Bytes per block; shorter values (and what is left after the last block) go to the
/// `crc32` instruction alone.
pub const BLOCK: usize = FOLD_LEN + 3 * STREAM_LEN;

/// Folding a 128-bit lane forward by 1024 bits: its first 64 bits (the higher degrees) are
/// multiplied by x^(1024 + 64) and its last 64 bits by x^1024. The carry-less product of two
/// reflected operands comes out one degree short, hence the `- 1`; placed in the high half of
/// a 64-bit lane, a 32-bit reflected constant keeps x^0 at bit 63.
const FOLD_BY_1024_HIGH: u64 = (x_pow(1024 + 64 - 1, 0) as u64) << 32;
const FOLD_BY_1024_LOW: u64 = (x_pow(1024 - 1, 0) as u64) << 32;
/// Shifting a CRC past one stream: multiplying by x^(8 * STREAM_LEN). The carry-less product
/// is one degree short and the `crc32` reduction adds 32, hence `- 33`.
const PAST_A_STREAM: u32 = x_pow(8 * STREAM_LEN as u64 - 33, 0);

/// Whether this CPU has what [`append`] uses.
pub fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("vpclmulqdq")
        && is_x86_feature_detected!("pclmulqdq")
        && is_x86_feature_detected!("sse4.2")
}

/// The crc32c of `crc`'s bytes followed by `bytes` (see [`crate::append`]).
///
/// # Panics
/// If the CPU lacks what [`available`] checks for.
pub fn append(crc: u32, bytes: &[u8]) -> u32 {
    assert!(available(), "this CPU lacks AVX2, VPCLMULQDQ or SSE 4.2");
    // SAFETY: the CPU has every feature `blocks` is compiled for (checked just above).
    let (register, rest) = unsafe { blocks(!crc, bytes) };
    crc32c::crc32c_append(!register, rest)
}

/// Runs the CRC register `register` over every whole block of `bytes`; returns the register
/// after them and the bytes left over.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
fn blocks(mut register: u32, bytes: &[u8]) -> (u32, &[u8]) {
    let mut blocks = bytes.chunks_exact(BLOCK);
    for block in &mut blocks {
        register = one_block(register, block);
    }
    (register, blocks.remainder())
}

/// The CRC register after `block` (exactly [`BLOCK`] bytes) starting from `register`.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
fn one_block(register: u32, block: &[u8]) -> u32 {
    assert_eq!(block.len(), BLOCK);
    let fold = block.as_ptr();
    // SAFETY (every `add` and read below): offsets stay inside the block, whose length was
    // just checked: folding reads [0, FOLD_LEN), stream i reads STREAM_LEN bytes from
    // FOLD_LEN + i * STREAM_LEN. Loads and reads are unaligned.
    let load = |at: usize| unsafe { _mm256_loadu_si256(fold.add(at).cast()) };
    let streams = [0, 1, 2].map(|i| unsafe { fold.add(FOLD_LEN + i * STREAM_LEN).cast::<u64>() });
    let word =
        |stream: usize, i: usize| u64::from_le(unsafe { streams[stream].add(i).read_unaligned() });
    let constants = _mm256_set_epi64x(
        FOLD_BY_1024_LOW as i64,
        FOLD_BY_1024_HIGH as i64,
        FOLD_BY_1024_LOW as i64,
        FOLD_BY_1024_HIGH as i64,
    );
    let fold_into = |acc: __m256i, next: __m256i| {
        let high = _mm256_clmulepi64_epi128(acc, constants, 0x00);
        let low = _mm256_clmulepi64_epi128(acc, constants, 0x11);
        _mm256_xor_si256(_mm256_xor_si256(high, low), next)
    };
    // The register enters the CRC as if added to the block's first four bytes.
    let mut acc = [
        _mm256_xor_si256(
            load(0),
            _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, register as i32),
        ),
        load(32),
        load(64),
        load(96),
    ];
    let mut crcs = [0u64; 3];
    let stream_step = |step: usize, crcs: &mut [u64; 3]| {
        for w in step * STREAM_WORDS..(step + 1) * STREAM_WORDS {
            crcs[0] = _mm_crc32_u64(crcs[0], word(0, w));
            crcs[1] = _mm_crc32_u64(crcs[1], word(1, w));
            crcs[2] = _mm_crc32_u64(crcs[2], word(2, w));
        }
    };
    for step in 1..STEPS {
        let at = FOLD_STEP * step;
        acc = [
            fold_into(acc[0], load(at)),
            fold_into(acc[1], load(at + 32)),
            fold_into(acc[2], load(at + 64)),
            fold_into(acc[3], load(at + 96)),
        ];
        stream_step(step - 1, &mut crcs);
    }
    stream_step(STEPS - 1, &mut crcs);
    // What remains of the folded part is 128 bytes with the same CRC.
    let mut remainder = [0u64; 16];
    for (i, a) in acc.iter().enumerate() {
        // SAFETY: 32 writable bytes at `remainder[4 * i..]`; the store is unaligned.
        unsafe { _mm256_storeu_si256(remainder.as_mut_ptr().add(4 * i).cast(), *a) };
    }
    let mut register = sum_words(&remainder);
    for crc in crcs {
        register = past_a_stream(register) ^ crc as u32;
    }
    register
}

/// The CRC register after `words` (what remains of a folded block), starting from zero:
/// the register the block began with was added into its first bytes before folding.
#[target_feature(enable = "sse4.2")]
pub(crate) fn sum_words(words: &[u64]) -> u32 {
    let mut register = 0u64;
    for &w in words {
        register = _mm_crc32_u64(register, u64::from_le(w));
    }
    register as u32
}

/// `register` shifted past one stream's bytes (as if they were zeros).
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
fn past_a_stream(register: u32) -> u32 {
    let product = _mm_clmulepi64_si128(
        _mm_cvtsi64_si128(register as i64),
        _mm_cvtsi64_si128(PAST_A_STREAM as i64),
        0x00,
    );
    _mm_crc32_u64(0, _mm_cvtsi128_si64(product) as u64) as u32
}
