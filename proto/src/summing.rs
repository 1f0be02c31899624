//! Checksums summed on a helper thread while the caller moves the next bytes.
//!
//! A reader checks every value against its checksum, and summing at ~20 GB/s is a fifth of the
//! work of a large get over TCP or more: done inline, it adds that much to every transfer. A
//! transfer instead hands each piece to a [`Summing`] as soon as the piece has landed (or, for
//! a write, before it goes out) and carries on; the process's helper thread
//! ([`crate::helper`]) sums pieces while the transfer's own thread receives or sends the next
//! ones, and whatever the helper has not started by the time the transfer ends, the transfer
//! sums itself. So the helper only
//! ever speeds things up: with no spare core (or no helper thread at all) the cost is what
//! summing inline costs.
//!
//! The helper reads the caller's buffers through raw pointers. That is sound because a
//! `Summing` borrows every buffer it was given for its whole life, and neither
//! [`Summing::finish`] nor its drop returns until no helper is reading any of them, so a
//! buffer cannot be written or freed while it is being summed. The one way around this is to
//! leak a `Summing` (or a future holding one) without dropping it, which transfers never do;
//! a DMA-based transport has the same contract with the network card.
//!
//! Where the CPU sums with the 512-bit engine, summing a piece costs less than handing it
//! over, and every piece is summed inline ([`helper_pays`]).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use mooring_core::Checksum;

use crate::helper::{Work, helper};
use crate::transport::LandedPiece;

/// Bytes handed to the helper at a time: small enough that a piece is summed while it is
/// still in cache, and while a transfer's next bytes are still arriving. Smaller pieces are
/// summed inline: waking the helper for them costs more than it saves (a 64 KiB get summed by
/// the helper ran a quarter slower than one summed inline).
pub const STEP: usize = 128 * 1024;

/// Checksums of the pieces a transfer moved, summed by the process's helper thread and by
/// the caller.
pub struct Summing<'b> {
    batch: Arc<Batch>,
    /// Which operation and remote address each piece is of, and its length.
    pieces: Vec<(usize, u64, u64)>,
    /// Sum every piece in the caller's thread.
    inline: bool,
    /// Every buffer handed to [`Summing::add`] stays borrowed until this is dropped.
    _borrows: PhantomData<&'b [u8]>,
}

impl<'b> Summing<'b> {
    /// An empty set of pieces, summed by the helper where handing them over pays
    /// ([`helper_pays`]), else in the caller's thread as they are added.
    pub fn new() -> Summing<'b> {
        Summing::summed(!helper_pays())
    }

    /// An empty set of pieces that are all summed as they are added, in the caller's thread:
    /// for a transfer whose pieces would otherwise wait for the helper to wake (a single
    /// value copied in memory, where the copy is too quick for the helper to overlap it).
    pub fn inline() -> Summing<'b> {
        Summing::summed(true)
    }

    /// An empty set of pieces that go to the helper (if there is one) whatever the CPU.
    #[cfg(test)]
    fn with_helper() -> Summing<'b> {
        Summing::summed(false)
    }

    fn summed(inline: bool) -> Summing<'b> {
        Summing {
            batch: Arc::new(Batch::default()),
            pieces: Vec::new(),
            inline,
            _borrows: PhantomData,
        }
    }

    /// Queues `bytes`, the piece of operation `op` at remote address `addr`, to be summed.
    /// Pieces of [`STEP`] bytes or more go to the helper; pass pieces of at most that size as
    /// they land, so the helper sums one while the next arrives.
    pub fn add(&mut self, op: usize, addr: u64, bytes: &'b [u8]) {
        self.pieces.push((op, addr, bytes.len() as u64));
        let mut state = self.batch.lock();
        let index = state.sums.len();
        let helper = if self.inline { None } else { helper() };
        if bytes.len() < STEP || helper.is_none() {
            state.sums.push(Some(Checksum::of(bytes)));
            return;
        }
        state.sums.push(None);
        state.pending.push_back(Piece {
            index,
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        });
        drop(state);
        if let Some(helper) = helper {
            helper.offer(self.batch.clone());
        }
    }

    /// Queues `bytes` (operation `op`'s bytes from remote address `addr`), cut into
    /// [`STEP`]-sized pieces, for bytes that are all there already (a write's source).
    pub fn add_all(&mut self, op: usize, addr: u64, bytes: &'b [u8]) {
        for (i, piece) in bytes.chunks(STEP).enumerate() {
            self.add(op, addr + (i * STEP) as u64, piece);
        }
    }

    /// Every piece with its checksum, in the order they were added.
    pub fn finish(mut self) -> Vec<LandedPiece> {
        self.batch.settle();
        let sums = std::mem::take(&mut self.batch.lock().sums);
        std::mem::take(&mut self.pieces)
            .into_iter()
            .zip(sums)
            .map(|((op, addr, len), sum)| LandedPiece {
                op,
                addr,
                len,
                checksum: sum.expect("settled pieces are summed"),
            })
            .collect()
    }
}

impl Default for Summing<'_> {
    fn default() -> Self {
        Summing::new()
    }
}

impl Drop for Summing<'_> {
    fn drop(&mut self) {
        // Whether finished or abandoned (an error, a timeout), no helper may still be reading
        // a buffer once the borrows end.
        self.batch.settle();
    }
}

/// A piece waiting to be summed.
struct Piece {
    index: usize,
    ptr: *const u8,
    len: usize,
}

// SAFETY: a piece is a shared view of bytes that its `Summing` keeps borrowed (and so
// unmodified and alive) until no thread holds the piece any more; see the module docs.
unsafe impl Send for Piece {}

impl Piece {
    fn sum(&self) -> Checksum {
        // SAFETY: see `unsafe impl Send for Piece`: the bytes are alive and not written while
        // any piece of them is pending or being summed.
        Checksum::of(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }
}

#[derive(Default)]
struct Batch {
    state: Mutex<BatchState>,
    /// Signalled when the last running piece is summed.
    idle: Condvar,
}

#[derive(Default)]
struct BatchState {
    pending: VecDeque<Piece>,
    sums: Vec<Option<Checksum>>,
    /// Pieces a helper has taken and not yet summed.
    running: usize,
}

impl Batch {
    fn lock(&self) -> MutexGuard<'_, BatchState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sums what no helper has started (from the back, away from the helper) and waits for
    /// what one has, so that no piece is pending or being read when it returns.
    fn settle(&self) {
        let mut state = self.lock();
        while let Some(piece) = state.pending.pop_back() {
            drop(state);
            let sum = piece.sum();
            state = self.lock();
            state.sums[piece.index] = Some(sum);
        }
        while state.running > 0 {
            state = self.idle.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Work for Batch {
    /// Sums pending pieces until none is left (the helper's side: from the front).
    fn help(&self) {
        loop {
            let piece = {
                let mut state = self.lock();
                match state.pending.pop_front() {
                    Some(piece) => {
                        state.running += 1;
                        piece
                    }
                    None => return,
                }
            };
            let sum = piece.sum();
            let mut state = self.lock();
            state.sums[piece.index] = Some(sum);
            state.running -= 1;
            if state.running == 0 {
                self.idle.notify_all();
            }
        }
    }
}

/// Whether handing pieces to the helper saves the transfer time. Not where the CPU sums
/// with the 512-bit engine (`mooring_crc::wide`): a 128 KiB piece is then summed in about
/// 2 µs, less than waking another thread and sharing the piece's cache lines with it costs.
/// Measured on TCP gets of 1–4 MiB on the 2-core VM, eight alternated runs each: summed
/// inline, 3% slower to 4% faster than the same build summing nothing; with the helper, 1–12%
/// slower than that.
pub fn helper_pays() -> bool {
    !mooring_crc::folds_wide()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_bytes as bytes;

    #[test]
    fn every_piece_gets_its_own_checksum_in_order() {
        let buffers: Vec<Vec<u8>> = (0..40)
            .map(|i| bytes([10, STEP - 1, STEP, 3 * STEP + 5][i % 4], i as u32))
            .collect();
        let mut summing = Summing::with_helper();
        let mut inline = Summing::inline();
        for (op, b) in buffers.iter().enumerate() {
            summing.add_all(op, 1000 * op as u64, b);
            inline.add_all(op, 1000 * op as u64, b);
        }
        let mut expected = Vec::new();
        for (op, b) in buffers.iter().enumerate() {
            for (i, piece) in b.chunks(STEP).enumerate() {
                expected.push(LandedPiece {
                    op,
                    addr: 1000 * op as u64 + (i * STEP) as u64,
                    len: piece.len() as u64,
                    checksum: Checksum::of(piece),
                });
            }
        }
        assert_eq!(summing.finish(), expected);
        assert_eq!(
            inline.finish(),
            expected,
            "summed in the caller's thread, the same"
        );
    }

    #[test]
    fn abandoning_a_summing_waits_until_no_one_reads_its_buffers() {
        // Many rounds of add-then-drop, each followed by overwriting the buffer: a helper still
        // reading after the drop would race the writes (and Miri or TSan would say so); the
        // sums that were finished stay right.
        let mut buffer = bytes(2 << 20, 7);
        for round in 0..50u8 {
            {
                let mut summing = if round % 4 < 2 {
                    Summing::with_helper()
                } else {
                    Summing::new()
                };
                summing.add_all(0, 0, &buffer);
                if round % 2 == 0 {
                    let sums: Vec<Checksum> = summing.finish().iter().map(|p| p.checksum).collect();
                    let expected: Vec<Checksum> = buffer.chunks(STEP).map(Checksum::of).collect();
                    assert_eq!(sums, expected);
                }
            }
            buffer.iter_mut().for_each(|b| *b = b.wrapping_add(round));
        }
    }
}
