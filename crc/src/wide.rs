//! The AVX-512 engine: carry-less-multiply folding 256 bytes at a time in four 512-bit
//! accumulators, on CPUs with AVX-512 and the 512-bit VPCLMULQDQ.
//!
//! Bits are reflected as in [`crate::x86`]. Each step multiplies every 128-bit lane of the
//! accumulators forward by x^2048 (the 256 bytes a step consumes) and adds the next 256
//! bytes; what remains is 256 bytes with the same CRC, summed with the `crc32` instruction.
//! Folding alone runs at several times the speed of the `crc32` instruction, so a copy that
//! folds the bytes it moves ([`copy_append`]) runs at about the speed of the copy.

use std::arch::x86_64::*;

use crate::poly::x_pow;

/// Bytes folded per step (four 512-bit accumulators).
const STEP: usize = 256;
/// The shortest value folded here; shorter ones (and what is left after the last step) go
/// to the `crc32` instruction alone.
pub const MIN_LEN: usize = 4 * STEP;

/// Folding a 128-bit lane forward by 2048 bits (see `FOLD_BY_1024_*` in [`crate::x86`] for
/// the `- 1` and the shift).
const FOLD_BY_2048_HIGH: u64 = (x_pow(2048 + 64 - 1, 0) as u64) << 32;
const FOLD_BY_2048_LOW: u64 = (x_pow(2048 - 1, 0) as u64) << 32;

/// Whether this CPU has what [`append`] and [`copy_append`] use.
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("vpclmulqdq")
        && is_x86_feature_detected!("sse4.2")
}

/// The crc32c of `crc`'s bytes followed by `bytes` (see [`crate::append`]).
///
/// # Panics
/// If the CPU lacks what [`available`] checks for.
pub fn append(crc: u32, bytes: &[u8]) -> u32 {
    assert!(available(), "this CPU lacks AVX-512 or VPCLMULQDQ");
    let folded = bytes.len() / STEP * STEP;
    if folded < MIN_LEN {
        return crc32c::crc32c_append(crc, bytes);
    }
    // SAFETY: the CPU has the features (checked above); `bytes` has `folded` readable bytes,
    // and without copying nothing is stored.
    let register =
        unsafe { fold::<false, false>(!crc, bytes.as_ptr(), std::ptr::null_mut(), folded) };
    crc32c::crc32c_append(!register, &bytes[folded..])
}

/// Copies `len` bytes from `src` to `dst` and returns the crc32c of `crc`'s bytes followed
/// by them (see [`crate::copy_append`]). Each 64 bytes are folded from the register they
/// were loaded into and stored from, so the checksum is of exactly what was read from `src`
/// and what `dst` received; the few bytes around them are read back from the side `own`
/// names. Copies of
/// [`STREAM_MIN`] bytes or more bypass the caches on the way into `dst`.
///
/// # Safety
/// As for [`crate::copy_append`].
///
/// # Panics
/// If the CPU lacks what [`available`] checks for.
pub unsafe fn copy_append(
    crc: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
    own: crate::Own,
) -> u32 {
    assert!(available(), "this CPU lacks AVX-512 or VPCLMULQDQ");
    // Bytes before the first 64-byte boundary of `dst` are copied and summed apart, so that
    // the folded part's stores are aligned (cache-bypassing stores must be).
    let head = dst.align_offset(64).min(len);
    // SAFETY (every `add` below): offsets stay within the `len` bytes the caller promised.
    let mut crc = unsafe { copy_small(crc, src, dst, head, own) };
    let (src, dst, len) = unsafe { (src.add(head), dst.add(head), len - head) };
    let mut folded = len / STEP * STEP;
    if folded < MIN_LEN {
        folded = 0;
    } else if len >= STREAM_MIN {
        // SAFETY: the CPU has the features (checked above); `src` has `folded` readable
        // bytes, and `dst` as many writable ones, 64-byte aligned.
        crc = !unsafe { fold::<true, true>(!crc, src, dst, folded) };
    } else {
        // SAFETY: as above.
        crc = !unsafe { fold::<true, false>(!crc, src, dst, folded) };
    }
    unsafe { copy_small(crc, src.add(folded), dst.add(folded), len - folded, own) }
}

/// Copies of this many bytes or more bypass the caches on the way into the destination: a
/// value that large is not read again at once, and the copy then runs at the speed of a
/// plain copy (with ordinary stores, each destination line is first read into the cache,
/// and a 1 MiB copy that sums as it goes ran at 0.87 of a plain copy's speed rather than
/// 1.0; `cargo bench -p mooring-benches --bench crc`).
pub const STREAM_MIN: usize = 256 << 10;

/// Copies, then sums what was copied, from the side `own` names: for the few bytes before
/// and after the folded part.
///
/// # Safety
/// As for [`crate::copy_append`].
unsafe fn copy_small(crc: u32, src: *const u8, dst: *mut u8, len: usize, own: crate::Own) -> u32 {
    let summed = own.pick(src, dst);
    // SAFETY: the caller's promise.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len);
        crc32c::crc32c_append(crc, std::slice::from_raw_parts(summed, len))
    }
}

/// The CRC register after the `len` bytes at `src` (a multiple of [`STEP`], at least two
/// steps), starting from `register`; with `COPY`, every byte folded is also stored at `dst`,
/// from the same register, and with `STREAM` past the caches.
///
/// # Safety
/// `src` must be valid for reads of `len` bytes and, with `COPY`, `dst` valid for writes of
/// as many, not overlapping them, and 64-byte aligned with `STREAM` (without `COPY`, `dst`
/// is not used).
#[target_feature(enable = "avx512f,vpclmulqdq,sse4.2")]
unsafe fn fold<const COPY: bool, const STREAM: bool>(
    register: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
) -> u32 {
    debug_assert!(len.is_multiple_of(STEP) && len >= 2 * STEP);
    debug_assert!(!STREAM || (dst as usize).is_multiple_of(64));
    // SAFETY (every load and store): `at + 64 <= len` for every `at` used below, inside
    // what the caller promised. Loads are unaligned; so are ordinary stores.
    let load = |at: usize| unsafe {
        let v = _mm512_loadu_si512(src.add(at).cast());
        if COPY && STREAM {
            _mm512_stream_si512(dst.add(at).cast(), v);
        } else if COPY {
            _mm512_storeu_si512(dst.add(at).cast(), v);
        }
        v
    };
    let constants = _mm512_set_epi64(
        FOLD_BY_2048_LOW as i64,
        FOLD_BY_2048_HIGH as i64,
        FOLD_BY_2048_LOW as i64,
        FOLD_BY_2048_HIGH as i64,
        FOLD_BY_2048_LOW as i64,
        FOLD_BY_2048_HIGH as i64,
        FOLD_BY_2048_LOW as i64,
        FOLD_BY_2048_HIGH as i64,
    );
    // acc * x^2048 + next, lane by lane (0x96: the three-way exclusive or).
    let fold_into = |acc: __m512i, next: __m512i| {
        let high = _mm512_clmulepi64_epi128(acc, constants, 0x00);
        let low = _mm512_clmulepi64_epi128(acc, constants, 0x11);
        _mm512_ternarylogic_epi64(high, low, next, 0x96)
    };
    // The register enters the CRC as if added to the first four bytes.
    let mut acc = [
        _mm512_xor_si512(
            load(0),
            _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, register as i32),
        ),
        load(64),
        load(128),
        load(192),
    ];
    for at in (STEP..len).step_by(STEP) {
        acc = [
            fold_into(acc[0], load(at)),
            fold_into(acc[1], load(at + 64)),
            fold_into(acc[2], load(at + 128)),
            fold_into(acc[3], load(at + 192)),
        ];
    }
    if STREAM {
        // Cache-bypassing stores are ordered with later ones only after a fence: whoever
        // reads `dst` next must see them.
        _mm_sfence();
    }
    // What remains is 256 bytes with the same CRC.
    let mut remainder = [0u64; 32];
    for (i, a) in acc.iter().enumerate() {
        // SAFETY: 64 writable bytes at `remainder[8 * i..]`; the store is unaligned.
        unsafe { _mm512_storeu_si512(remainder.as_mut_ptr().add(8 * i).cast(), *a) };
    }
    crate::x86::sum_words(&remainder)
}
