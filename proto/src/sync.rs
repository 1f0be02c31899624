//! The synchronisation primitives shared state is built from, switched to loom's model-checked
//! versions under `--cfg mooring_loom` (see `core/tests/loom.rs` and `scripts/loom.sh`).
//!
//! Only what [`ExportTable`](crate::transport::ExportTable) needs is here. `Arc` is not:
//! `SegmentMemory`'s keep-alive is a public `Arc<dyn Any + Send + Sync>` that other crates
//! build by unsized coercion, which loom's `Arc` cannot do, so it stays std's.

#[cfg(mooring_loom)]
pub(crate) use loom::sync::{
    RwLock,
    atomic::{AtomicBool, AtomicU64, Ordering},
};
#[cfg(not(mooring_loom))]
pub(crate) use std::sync::{
    RwLock,
    atomic::{AtomicBool, AtomicU64, Ordering},
};
