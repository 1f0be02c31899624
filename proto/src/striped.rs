//! Large copies in memory, split between the calling thread and the process's helper.
//!
//! A same-host get of a large value is a copy between memory that is not in cache (a segment
//! and the caller's buffer), and one thread moves at most what one core can pull through the
//! memory system: 7–13 GB/s on the 2-core development VM, where two threads moved 1.85 times
//! as much. (Same-host puts copy alone: see `SegmentMemory::copy_in_summed`.) So a copy of [`STRIPED_MIN`] bytes or more is cut into [`PIECE`]-byte
//! pieces that the caller and the helper ([`crate::helper`]) take from a shared counter
//! ([`Pieces`]), each copying and summing the pieces it took; the caller then joins the
//! pieces' checksums in order (crc32c composes, see `Checksum::then`).
//!
//! The caller never waits for the helper to start: it takes pieces from the first one on, and
//! a helper that wakes late (or never: busy with another job, no free core) finds them taken.
//! The caller returns only once every piece taken has been copied. That is what makes the
//! helper's raw pointers sound: after the call returns, no thread touches either buffer, and
//! a helper that comes to the job later takes no piece and so touches nothing but the counter.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use mooring_crc::Own;

use crate::helper::{Work, helper};
use crate::sync::{AtomicUsize, Ordering};

/// Copies shorter than this are done by the caller alone: waking the helper (tens of
/// microseconds in a VM) would cost about what it saves.
pub const STRIPED_MIN: usize = 512 * 1024;

/// Bytes a thread takes at a time: small enough that the caller, having taken the last piece,
/// waits for the helper's only briefly (64 KiB is 5–9 µs of copying here); large enough that
/// joining the checksums (one combine per piece, under a microsecond) costs little.
pub const PIECE: usize = 64 * 1024;

/// A job's pieces, numbered from 0, shared by the threads that do them: each piece is taken
/// by exactly one thread, and the job is done when every piece has been taken and finished.
#[derive(Debug)]
pub struct Pieces {
    count: usize,
    /// The next piece to hand out (past `count` once all are taken).
    next: AtomicUsize,
    /// Pieces finished. A thread finishes a piece after its last write for it, with release
    /// ordering, so a thread that sees every piece finished (with acquire) sees every write.
    finished: AtomicUsize,
}

impl Pieces {
    /// `count` pieces, none taken.
    pub fn new(count: usize) -> Pieces {
        Pieces {
            count,
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
        }
    }

    /// A piece no thread has taken yet, now this thread's; `None` once all are taken.
    pub fn take(&self) -> Option<usize> {
        // Each thread adds at most once past `count` before it stops taking, so this cannot
        // wrap.
        let piece = self.next.fetch_add(1, Ordering::Relaxed);
        (piece < self.count).then_some(piece)
    }

    /// Marks a piece this thread took as done, after its last write for it.
    pub fn finish(&self) {
        self.finished.fetch_add(1, Ordering::Release);
    }

    /// Whether every piece has been finished: then every write for them happened before
    /// whatever the caller does next.
    pub fn all_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire) == self.count
    }

    /// Waits until every piece has been finished: spins briefly (the last piece another
    /// thread took is a few microseconds of work), then yields the core between looks.
    pub fn wait(&self) {
        let mut spins = 0u32;
        while !self.all_finished() {
            if spins < 256 {
                spins += 1;
                crate::sync::spin_loop();
            } else {
                crate::sync::yield_now();
            }
        }
    }
}

/// Copies `len` bytes from `src` to `dst` and returns their crc32c, as read back from the side
/// `own` names (see [`mooring_crc::copy_append`]); from [`STRIPED_MIN`] bytes on, shared with
/// the process's helper thread where there is one.
///
/// # Safety
/// As for [`mooring_crc::copy_append`]: `src` valid for reads and `dst` for writes of `len`
/// bytes, not overlapping, for the whole call; nobody else writes the side `own` names
/// meanwhile.
pub unsafe fn copy_summed(src: *const u8, dst: *mut u8, len: usize, own: Own) -> u32 {
    let helper = if len >= STRIPED_MIN { helper() } else { None };
    let Some(helper) = helper else {
        // SAFETY: the caller's promise, passed on.
        return unsafe { mooring_crc::copy_append(0, src, dst, len, own) };
    };
    let pieces = len.div_ceil(PIECE);
    let job = Arc::new(StripedCopy {
        src,
        dst,
        len,
        own,
        pieces: Pieces::new(pieces),
        sums: (0..pieces).map(|_| AtomicU32::new(0)).collect(),
    });
    helper.offer(job.clone());
    job.copy_pieces();
    job.pieces.wait();
    // Checksums of consecutive pieces, joined in order (from the empty value's 0).
    job.sums.iter().enumerate().fold(0, |whole, (i, sum)| {
        let next = sum.load(std::sync::atomic::Ordering::Relaxed);
        mooring_crc::combine(whole, next, job.piece_len(i) as u64)
    })
}

/// One striped copy: the two buffers, its pieces, and each piece's checksum once copied.
struct StripedCopy {
    src: *const u8,
    dst: *mut u8,
    len: usize,
    own: Own,
    pieces: Pieces,
    sums: Box<[AtomicU32]>,
}

// SAFETY: the buffers are touched only through pieces taken from `pieces`, and
// `copy_summed`'s caller keeps both valid (and the side it owns unwritten by others) until
// every taken piece has finished; see the module docs.
unsafe impl Send for StripedCopy {}
// SAFETY: as above; each piece is copied by the one thread that took it.
unsafe impl Sync for StripedCopy {}

impl StripedCopy {
    fn piece_len(&self, piece: usize) -> usize {
        PIECE.min(self.len - piece * PIECE)
    }

    /// Copies and sums pieces until none is left to take.
    fn copy_pieces(&self) {
        while let Some(piece) = self.pieces.take() {
            let at = piece * PIECE;
            // SAFETY: `at + piece_len <= len`, and the piece is this thread's alone; the
            // buffers are valid until every taken piece is finished (see `unsafe impl Send`).
            let sum = unsafe {
                mooring_crc::copy_append(
                    0,
                    self.src.add(at),
                    self.dst.add(at),
                    self.piece_len(piece),
                    self.own,
                )
            };
            self.sums[piece].store(sum, std::sync::atomic::Ordering::Relaxed);
            self.pieces.finish();
        }
    }
}

impl Work for StripedCopy {
    fn help(&self) {
        self.copy_pieces();
    }
}

#[cfg(all(test, not(mooring_loom)))]
mod tests {
    use super::*;
    use crate::test_bytes as bytes;

    #[test]
    fn a_striped_copy_lands_every_byte_and_sums_the_whole() {
        for len in [
            0,
            1,
            PIECE,
            STRIPED_MIN - 1,
            STRIPED_MIN,
            STRIPED_MIN + 1,
            3 << 20,
        ] {
            for own in [Own::Source, Own::Destination] {
                let src = bytes(len, len as u32);
                let mut dst = vec![0u8; len];
                // SAFETY: two distinct vectors of `len` bytes, alive for the call.
                let sum = unsafe { copy_summed(src.as_ptr(), dst.as_mut_ptr(), len, own) };
                assert!(dst == src, "{len} bytes copied");
                assert_eq!(sum, mooring_crc::append(0, &src), "{len} bytes summed");
            }
        }
    }

    #[test]
    fn copies_from_many_threads_share_the_helper_and_each_lands_whole() {
        // Several callers at once: the helper works one job while others queue, and each
        // caller's result is its own bytes and sum; each destination is rewritten right after
        // its copy returns, which would race a helper still writing it.
        std::thread::scope(|scope| {
            for t in 0..4u32 {
                scope.spawn(move || {
                    let len = STRIPED_MIN + 4096 * t as usize + 17;
                    let mut dst = vec![0u8; len];
                    for round in 0..20u32 {
                        let src = bytes(len, t * 100 + round);
                        // SAFETY: two distinct vectors of `len` bytes, alive for the call.
                        let sum = unsafe {
                            copy_summed(src.as_ptr(), dst.as_mut_ptr(), len, Own::Source)
                        };
                        assert!(dst == src);
                        assert_eq!(sum, mooring_crc::append(0, &src));
                        dst.iter_mut().for_each(|b| *b = 0);
                    }
                });
            }
        });
    }

    #[test]
    fn each_piece_is_taken_once_and_the_job_ends_when_all_are_finished() {
        let pieces = Pieces::new(3);
        assert!(!pieces.all_finished());
        let taken: Vec<usize> = std::iter::from_fn(|| pieces.take()).collect();
        assert_eq!(taken, [0, 1, 2]);
        assert_eq!(pieces.take(), None, "none left, however often asked");
        pieces.finish();
        pieces.finish();
        assert!(!pieces.all_finished(), "a piece taken but unfinished");
        pieces.finish();
        assert!(pieces.all_finished());
        Pieces::new(0).wait();
    }
}
