//! The synchronisation primitives shared state is built from, switched to loom's model-checked
//! versions under `--cfg mooring_loom` (see `core/tests/loom.rs` and `scripts/loom.sh`).
//!
//! Only what [`ExportTable`](crate::transport::ExportTable) and a striped copy's
//! [`Pieces`](crate::striped::Pieces) need is here. `Arc` is not:
//! `SegmentMemory`'s keep-alive is a public `Arc<dyn Any + Send + Sync>` that other crates
//! build by unsized coercion, which loom's `Arc` cannot do, so it stays std's.

#[cfg(mooring_loom)]
pub(crate) use loom::{
    hint::spin_loop,
    sync::{
        RwLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread::yield_now,
};
#[cfg(not(mooring_loom))]
pub(crate) use std::{
    hint::spin_loop,
    sync::{
        RwLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread::yield_now,
};
