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
//! On CPUs that also have AVX-512 with the 512-bit VPCLMULQDQ ([`wide`]), folding alone in
//! 512-bit registers is faster still, and fast enough that a copy can fold the bytes it
//! moves at about the speed of the copy ([`copy_append`]).
//!
//! Checksums of consecutive pieces join into the checksum of the whole ([`combine`], from
//! [`poly`]), so pieces can be summed as they land, on any thread, in any order.

pub mod poly;
#[cfg(target_arch = "x86_64")]
pub mod wide;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use poly::combine;

/// Whether this CPU sums large values with the 512-bit engine ([`wide`]): at several times
/// the speed of the 256-bit one, so fast that summing a piece costs less than handing it
/// to another thread.
pub fn folds_wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    return wide::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The crc32c of `crc`'s bytes followed by `bytes`, where `crc` is the crc32c of the bytes
/// before (0 for none): `append(append(0, a), b) == append(0, a ++ b)`.
pub fn append(crc: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if bytes.len() >= wide::MIN_LEN && wide::available() {
            return wide::append(crc, bytes);
        }
        if bytes.len() >= x86::BLOCK && x86::available() {
            return x86::append(crc, bytes);
        }
    }
    crc32c::crc32c_append(crc, bytes)
}

/// Which side of a copy is this process's own, that nobody else writes while the copy runs.
/// A copy's checksum is read back from that side, so it describes exactly the bytes this
/// process meant to move, whatever another process does to the other side meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Own {
    /// A read out of shared memory: the checksum is of what the destination received (if the
    /// source changed meanwhile, the reader's check refuses the torn copy).
    Destination,
    /// A write into shared memory: the checksum is of the source, the value meant to land
    /// (if a late writer clobbers the destination meanwhile, a reader's check refuses it;
    /// summed from the destination, the clobbered bytes would be vouched for).
    Source,
}

/// Copies `len` bytes from `src` to `dst` and returns the crc32c of `crc`'s bytes followed by
/// the bytes copied (see [`append`]), as read back from the side `own` names. With AVX-512
/// ([`wide`]) in one pass over them, at about the speed of the copy alone; elsewhere
/// [`copy_then_sum`].
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, not overlapping. The
/// side `own` does not name may be memory shared with another process, written meanwhile;
/// nobody else may write the side it names until this returns.
pub unsafe fn copy_append(crc: u32, src: *const u8, dst: *mut u8, len: usize, own: Own) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if len >= wide::MIN_LEN && wide::available() {
        // SAFETY: the caller's promise, passed on.
        return unsafe { wide::copy_append(crc, src, dst, len, own) };
    }
    // SAFETY: the caller's promise, passed on.
    unsafe { copy_then_sum(crc, src, dst, len, own) }
}

/// [`copy_append`] by copying pieces that fit the nearest cache and summing each after its
/// copy, from the side `own` names. (A copy that folds as it goes in the 256-bit engine ran
/// slower than this: its 8-byte `crc32` streams make a poor copy.)
///
/// # Safety
/// As for [`copy_append`].
pub unsafe fn copy_then_sum(crc: u32, src: *const u8, dst: *mut u8, len: usize, own: Own) -> u32 {
    let mut crc = crc;
    for at in (0..len).step_by(COPY_PIECE) {
        let piece = COPY_PIECE.min(len - at);
        // SAFETY: the caller's promise covers `[at, at + piece)` of both.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), piece);
            crc = append(
                crc,
                std::slice::from_raw_parts(own.pick(src, dst).add(at), piece),
            );
        }
    }
    crc
}

impl Own {
    /// The pointer to read a copy's bytes back from.
    pub(crate) fn pick(self, src: *const u8, dst: *mut u8) -> *const u8 {
        match self {
            Own::Destination => dst,
            Own::Source => src,
        }
    }
}

/// Bytes [`copy_then_sum`] copies then sums at a time: two of the 256-bit engine's blocks.
#[cfg(target_arch = "x86_64")]
const COPY_PIECE: usize = 2 * x86::BLOCK;
#[cfg(not(target_arch = "x86_64"))]
const COPY_PIECE: usize = 32 << 10;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    fn bytes(len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect()
    }

    type Sum = fn(u32, &[u8]) -> u32;
    type CopySum = unsafe fn(u32, *const u8, *mut u8, usize, super::Own) -> u32;

    /// Every way of summing this CPU can run, by name.
    fn engines() -> Vec<(&'static str, Sum)> {
        let mut engines: Vec<(&'static str, Sum)> = vec![("append", super::append)];
        #[cfg(target_arch = "x86_64")]
        {
            if super::x86::available() {
                engines.push(("256-bit", super::x86::append));
            } else {
                eprintln!("skipped: this CPU cannot run the 256-bit engine");
            }
            if super::wide::available() {
                engines.push(("512-bit", super::wide::append));
            } else {
                eprintln!("skipped: this CPU cannot run the 512-bit engine");
            }
        }
        engines
    }

    /// Every way of copying and summing this CPU can run, by name.
    fn copy_engines() -> Vec<(&'static str, CopySum)> {
        let mut engines: Vec<(&'static str, CopySum)> = vec![
            ("copy_append", super::copy_append),
            ("copy_then_sum", super::copy_then_sum),
        ];
        #[cfg(target_arch = "x86_64")]
        if super::wide::available() {
            engines.push(("512-bit", super::wide::copy_append));
        }
        engines
    }

    /// Checks every engine on `data` after `crc`.
    fn check(crc: u32, data: &[u8]) {
        let expected = crc32c::crc32c_append(crc, data);
        for (name, sum) in engines() {
            assert_eq!(sum(crc, data), expected, "{name}, {} bytes", data.len());
        }
        for ((name, copy_sum), own) in copy_engines().into_iter().flat_map(|engine| {
            [
                (engine, super::Own::Destination),
                (engine, super::Own::Source),
            ]
        }) {
            // One byte before the copy shows a store out of place.
            let mut copy = vec![0u8; data.len() + 1];
            // SAFETY: `data` has `data.len()` readable bytes, apart from `copy`.
            let sum =
                unsafe { copy_sum(crc, data.as_ptr(), copy[1..].as_mut_ptr(), data.len(), own) };
            assert_eq!(sum, expected, "{name} ({own:?}), {} bytes", data.len());
            assert!(
                copy[1..] == *data,
                "{name} copied wrongly, {} bytes",
                data.len()
            );
            assert_eq!(copy[0], 0, "{name} wrote before its destination");
        }
    }

    proptest! {
        #[test]
        fn every_engine_matches_the_crc32_instruction_alone(
            len in 0usize..300_000,
            start in 0usize..64,
            crc in any::<u32>(),
            seed in any::<u32>(),
        ) {
            let data = bytes(start + len, seed);
            check(crc, &data[start..]);
        }
    }

    #[test]
    fn block_boundaries_and_a_large_value_agree() {
        let data = bytes(4 << 20, 9);
        #[cfg(target_arch = "x86_64")]
        let blocks = [
            super::x86::BLOCK,
            super::wide::MIN_LEN,
            256,
            super::wide::STREAM_MIN,
        ];
        #[cfg(not(target_arch = "x86_64"))]
        let blocks = [4096];
        for block in blocks {
            for len in [
                block - 1,
                block,
                block + 1,
                2 * block,
                7 * block + 3,
                4 << 20,
            ] {
                check(0x1234_5678, &data[..len]);
            }
        }
    }

    /// A pointer another thread may write through, as another process writes shared memory.
    #[derive(Clone, Copy)]
    struct Shared(*mut u8);
    // SAFETY: the test shares the buffer on purpose, to race a copy as another process would.
    unsafe impl Send for Shared {}

    #[test]
    fn a_write_is_summed_from_its_source_while_another_writer_clobbers_the_destination() {
        // The destination is shared memory another writer (a late one, from an expired
        // lease) may write meanwhile: the checksum must still be the source's, so that a
        // reader refuses what landed instead of the master recording its checksum.
        let source = bytes(64 << 10, 5);
        let expected = crc32c::crc32c(&source);
        let mut destination = vec![0u8; source.len() + 64];
        let (len, base) = (source.len(), Shared(destination.as_mut_ptr()));
        let stop = &std::sync::atomic::AtomicBool::new(false);
        let started = &std::sync::atomic::AtomicBool::new(false);
        let wrong = std::thread::scope(|scope| {
            scope.spawn(move || {
                let base = base;
                let mut at = 0usize;
                started.store(true, std::sync::atomic::Ordering::Relaxed);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: inside the buffer, which outlives the scope.
                    unsafe { base.0.add(at).write_volatile(0xA5) };
                    at = (at + 61) % len;
                }
            });
            while !started.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::yield_now();
            }
            // Counted, not asserted here: the other thread stops only when told.
            let mut wrong = Vec::new();
            for (name, copy_sum) in copy_engines() {
                for round in 0..1_000 {
                    // SAFETY: both buffers hold `len` bytes and do not overlap; the other
                    // thread writes only the destination, the side not named.
                    let sum =
                        unsafe { copy_sum(0, source.as_ptr(), base.0, len, super::Own::Source) };
                    if sum != expected {
                        wrong.push((name, round));
                    }
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            wrong
        });
        assert!(
            wrong.is_empty(),
            "{} copies summed what landed instead of the source, first {:?}",
            wrong.len(),
            wrong.first()
        );
    }
}
