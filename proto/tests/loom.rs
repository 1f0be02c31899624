//! Loom model checks of the structures that share state across threads without one coarse
//! lock: the data servers' `ExportTable` (an `RwLock`ed map plus an atomic key counter), and
//! the pieces a large copy's caller shares with the helper thread (`striped::Pieces`).
//! Loom runs each model under every interleaving of its threads, so the assertions hold for
//! all schedules, not just the ones a stress test happens to hit.
//!
//! Built only under `--cfg mooring_loom` (which swaps loom's lock and atomics into the table,
//! see `proto/src/sync.rs`); run with `scripts/loom.sh`.
#![cfg(mooring_loom)]

use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::thread;
use mooring_core::ErrorCode;
use mooring_proto::striped::Pieces;
use mooring_proto::transport::{ExportTable, SegmentMemory};
use mooring_proto::wire::Range;

const LEN: usize = 64;

/// A segment's backing bytes, whose drop (the unmap) is counted in `drops`.
struct Mapping {
    _bytes: Vec<u8>,
    drops: Arc<AtomicUsize>,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
    }
}

/// `LEN` fresh bytes as segment memory, owned by a [`Mapping`] that counts into `drops`.
fn segment(drops: &Arc<AtomicUsize>) -> SegmentMemory {
    let mut bytes = vec![0u8; LEN];
    let ptr = NonNull::new(bytes.as_mut_ptr()).expect("vec pointer");
    let owner = std::sync::Arc::new(Mapping {
        _bytes: bytes,
        drops: drops.clone(),
    });
    // SAFETY: the bytes are the Vec's heap buffer, which moving the Vec into `owner` does not
    // move; they live exactly as long as `owner`.
    unsafe { SegmentMemory::new(ptr, LEN, owner) }
}

/// The whole segment starting at `base`, as one range.
fn whole(base: u64) -> [Range; 1] {
    [Range {
        addr: base,
        len: LEN as u64,
    }]
}

/// Three concurrent exports (two spawned threads and the main one) get three distinct keys,
/// each resolving to the memory exported under it, and the table lists exactly those keys.
#[test]
fn concurrent_exports_get_distinct_resolvable_keys() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let table = Arc::new(ExportTable::new(0x5eed));
        let exporters: Vec<_> = (0..2)
            .map(|_| {
                let table = table.clone();
                let memory = segment(&drops);
                thread::spawn(move || {
                    let base = memory.base();
                    (table.export(memory), base)
                })
            })
            .collect();
        let memory = segment(&drops);
        let base = memory.base();
        let mut exported = vec![(table.export(memory), base)];
        for exporter in exporters {
            exported.push(exporter.join().expect("exporter"));
        }

        let mut keys: Vec<u64> = exported.iter().map(|&(key, _)| key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(
            keys.len(),
            3,
            "concurrent exports reused a key: {exported:x?}"
        );
        assert_eq!(
            table.keys(),
            keys,
            "the table lists exactly the exported keys"
        );
        for &(key, base) in &exported {
            let region = table
                .resolve(key, &whole(base))
                .unwrap_or_else(|e| panic!("key {key:#x} does not resolve: {e:?}"));
            assert_eq!(
                region.base(),
                base,
                "key {key:#x} resolves to another segment"
            );
        }
        assert_eq!(drops.load(SeqCst), 0, "an exported segment was unmapped");
        drop(table);
        assert_eq!(
            drops.load(SeqCst),
            3,
            "dropping the table releases every segment once"
        );
    });
}

/// Schedules in which the reader held a resolved region after the unexport had finished.
static HELD_ACROSS_UNEXPORT: StdAtomicUsize = StdAtomicUsize::new(0);
/// Schedules in which the reader came after the unexport and found the key gone.
static RESOLVED_TOO_LATE: StdAtomicUsize = StdAtomicUsize::new(0);

/// Readers (two threads) that resolved a region keep the segment's memory (its owner) alive
/// even while the main thread unexports the key and drops the table's handle: the owner is
/// dropped only once the table entry and every region are gone, and exactly once. This is the
/// node's reader refcount against unmount: an in-flight transfer never touches unmapped memory.
#[test]
fn resolved_region_keeps_memory_alive_across_unexport() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let unexported = Arc::new(AtomicBool::new(false));
        let table = Arc::new(ExportTable::new(0x5eed));
        let memory = segment(&drops);
        let base = memory.base();
        let key = table.export(memory);

        let readers: Vec<_> = (0..2u8)
            .map(|i| {
                let (table, drops, unexported) = (table.clone(), drops.clone(), unexported.clone());
                thread::spawn(move || match table.resolve(key, &whole(base)) {
                    Ok(region) => {
                        // A transfer: write and read its own bytes while the unexport may run.
                        let at = base + 1 + 2 * u64::from(i);
                        assert!(region.copy_in(at, b"kv"));
                        let mut out = [0u8; 2];
                        assert!(region.copy_out(at, &mut out));
                        let unexport_done = unexported.load(SeqCst);
                        assert_eq!(
                            drops.load(SeqCst),
                            0,
                            "segment unmapped under a resolved region \
                             (unexport finished: {unexport_done})"
                        );
                        assert_eq!(&out, b"kv", "the transfer's bytes changed under it");
                        if unexport_done {
                            HELD_ACROSS_UNEXPORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        drop(region);
                    }
                    Err(e) => {
                        assert_eq!(e.code, ErrorCode::REPLICA_IS_GONE, "{e:?}");
                        RESOLVED_TOO_LATE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            })
            .collect();

        let removed = table.unexport(key).expect("the key was exported");
        drop(removed);
        unexported.store(true, SeqCst);
        for reader in readers {
            reader.join().expect("reader");
        }

        assert_eq!(
            drops.load(SeqCst),
            1,
            "with the entry and the region gone the segment is unmapped, exactly once"
        );
    });
    // Guards against a vacuous pass: loom must have explored both the schedule that holds the
    // region across the whole unexport and the one where the resolve comes too late.
    assert!(HELD_ACROSS_UNEXPORT.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert!(RESOLVED_TOO_LATE.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// Two threads unexport the same key while the main thread re-exports the segment's memory
/// (a remount): exactly one unexport gets the memory, and once both have joined the old key
/// resolves to `REPLICA_IS_GONE` while the new one resolves.
#[test]
fn resolve_after_joined_unexport_is_gone() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let table = Arc::new(ExportTable::new(0x5eed));
        let memory = segment(&drops);
        let base = memory.base();
        let old = table.export(memory.clone());

        let unexporters: Vec<_> = (0..2)
            .map(|_| {
                let table = table.clone();
                thread::spawn(move || table.unexport(old).is_some())
            })
            .collect();
        let new = table.export(memory);
        let got: Vec<bool> = unexporters
            .into_iter()
            .map(|t| t.join().expect("unexporter"))
            .collect();

        assert_eq!(
            got.iter().filter(|&&g| g).count(),
            1,
            "exactly one concurrent unexport removes the key: {got:?}"
        );
        let err = table
            .resolve(old, &whole(base))
            .expect_err("an unexported key still resolves");
        assert_eq!(err.code, ErrorCode::REPLICA_IS_GONE, "{err:?}");
        assert_ne!(new, old, "a remount reused the old key");
        let region = table
            .resolve(new, &whole(base))
            .expect("the remounted key resolves");
        assert_eq!(region.base(), base);
        assert_eq!(table.keys(), vec![new]);
        drop(region);
        drop(table);
        assert_eq!(drops.load(SeqCst), 1);
    });
}

/// A copy's pieces worked by the caller and the helper at once: each piece is taken by
/// exactly one of them (a piece written twice reads 2), and once the caller has waited for
/// every piece to finish it sees every piece's bytes, before and without joining the helper
/// (loom reports a read that is not ordered after the write it reads).
#[test]
fn a_copys_pieces_are_each_taken_once_and_all_seen_once_finished() {
    const PIECES: usize = 3;
    loom::model(|| {
        let pieces = Arc::new(Pieces::new(PIECES));
        let bytes: Arc<Vec<UnsafeCell<u8>>> =
            Arc::new((0..PIECES).map(|_| UnsafeCell::new(0)).collect());
        let work = |pieces: &Pieces, bytes: &[UnsafeCell<u8>]| {
            while let Some(piece) = pieces.take() {
                // SAFETY: loom checks it: the piece is this thread's alone.
                bytes[piece].with_mut(|b| unsafe { *b += 1 });
                pieces.finish();
            }
        };
        let helper = {
            let (pieces, bytes) = (pieces.clone(), bytes.clone());
            thread::spawn(move || work(&pieces, &bytes))
        };
        work(&pieces, &bytes);
        pieces.wait();
        for byte in bytes.iter() {
            // SAFETY: loom checks it: every write happened before `wait` returned.
            byte.with(|b| assert_eq!(unsafe { *b }, 1, "each piece copied exactly once"));
        }
        helper.join().expect("helper");
    });
}
