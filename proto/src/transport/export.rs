//! The export table: the segments a data server exports, by access key, and the check that a
//! request's ranges lie inside one.

use std::collections::BTreeMap;
use std::sync::Arc;

use mooring_core::{Error, ErrorCode, Result};

use super::memory::SegmentMemory;
// The export table's lock and key counter: loom's under `--cfg mooring_loom`.
use crate::sync::{AtomicBool, AtomicU64, Ordering, RwLock};
use crate::wire::{MAX_DATA_REQUEST, Range};

/// The segments a data server exports, by access key: what every transport's data server
/// consults to turn a request's `(key, ranges)` into memory. A key names one export of one
/// segment; a remount exports under a fresh key, so descriptors from an earlier mount stop
/// working.
pub struct ExportTable {
    regions: RwLock<BTreeMap<u64, (SegmentMemory, Exported)>>,
    key_seed: u64,
    next_key: AtomicU64,
}

/// Whether one export is still in force: a transfer that runs long (a write trickling in over
/// a slow link) checks it as it goes, since once the segment is unexported (a remount) the
/// master may give its ranges to other writers.
#[derive(Clone)]
pub struct Exported(Arc<AtomicBool>);

impl Exported {
    /// Whether the export is still in force.
    pub fn still(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl ExportTable {
    /// An empty table. Keys are derived from `key_seed`: give distinct servers (and restarts
    /// of one) distinct seeds.
    pub fn new(key_seed: u64) -> ExportTable {
        ExportTable {
            regions: RwLock::new(BTreeMap::new()),
            key_seed,
            next_key: AtomicU64::new(1),
        }
    }

    /// Exports `memory` under a fresh key.
    pub fn export(&self, memory: SegmentMemory) -> u64 {
        let n = self.next_key.fetch_add(1, Ordering::Relaxed);
        let key = mix(self.key_seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
        let exported = Exported(Arc::new(AtomicBool::new(true)));
        self.regions
            .write()
            .expect("export table lock")
            .insert(key, (memory, exported));
        key
    }

    /// Stops exporting `key`; returns its memory if it was exported. Transfers under way
    /// see it through their [`Exported`].
    pub fn unexport(&self, key: u64) -> Option<SegmentMemory> {
        let (memory, exported) = self
            .regions
            .write()
            .expect("export table lock")
            .remove(&key)?;
        exported.0.store(false, Ordering::Release);
        Some(memory)
    }

    /// Every exported key.
    pub fn keys(&self) -> Vec<u64> {
        self.regions
            .read()
            .expect("export table lock")
            .keys()
            .copied()
            .collect()
    }

    /// The memory of `key` if every range lies inside it and the total is one request's
    /// worth at most.
    pub fn resolve(&self, key: u64, ranges: &[Range]) -> Result<SegmentMemory> {
        self.resolve_watched(key, ranges).map(|(memory, _)| memory)
    }

    /// As [`ExportTable::resolve`], with what tells whether the export is still in force.
    pub fn resolve_watched(&self, key: u64, ranges: &[Range]) -> Result<(SegmentMemory, Exported)> {
        let mut total: u64 = 0;
        for r in ranges {
            total = total
                .checked_add(r.len)
                .filter(|&t| t <= MAX_DATA_REQUEST)
                .ok_or_else(|| {
                    Error::new(
                        ErrorCode::INVALID_PARAMS,
                        "transfer larger than one request may move",
                    )
                })?;
        }
        let region = self
            .regions
            .read()
            .expect("export table lock")
            .get(&key)
            .cloned()
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::REPLICA_IS_GONE,
                    format!("segment key {key:#x} is not served here (unmounted or remounted)"),
                )
            })?;
        for r in ranges {
            if region.0.range(r.addr, r.len).is_none() {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("range {:#x}+{} lies outside the segment", r.addr, r.len),
                ));
            }
        }
        Ok(region)
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::ptr::NonNull;

    use super::*;

    #[test]
    #[cfg_attr(
        mooring_loom,
        ignore = "loom's lock only works inside loom::model: tests/loom.rs"
    )]
    fn exports_resolve_only_live_keys_and_ranges_inside() {
        let owner = Arc::new(std::sync::Mutex::new(vec![0u8; 4096]));
        let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
        let memory = unsafe { SegmentMemory::new(ptr, 4096, owner.clone()) };
        let base = memory.base();
        let table = ExportTable::new(42);
        let first = table.export(memory.clone());
        let second = table.export(memory);
        assert_ne!(first, second, "every export gets a fresh key");
        let inside = [Range {
            addr: base,
            len: 4096,
        }];
        assert!(table.resolve(first, &inside).is_ok());
        let outside = [Range {
            addr: base + 1,
            len: 4096,
        }];
        let err = table.resolve(first, &outside).unwrap_err();
        assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
        let huge = [
            Range {
                addr: base,
                len: u64::MAX,
            },
            Range { addr: base, len: 2 },
        ];
        assert_eq!(
            table.resolve(first, &huge).unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        let (_, exported) = table.resolve_watched(first, &inside).unwrap();
        assert!(exported.still());
        assert!(table.unexport(first).is_some());
        assert!(!exported.still(), "a transfer under way sees the unexport");
        assert_eq!(
            table.resolve(first, &inside).unwrap_err().code,
            ErrorCode::REPLICA_IS_GONE
        );
        assert_eq!(table.keys(), vec![second]);
        let other = ExportTable::new(43);
        assert_ne!(other.export(table.unexport(second).unwrap()), first);
    }
}
