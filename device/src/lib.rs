//! Device (GPU) memory for Mooring's client.
//!
//! The client checksums and sends registered bytes with the CPU, which cannot touch device
//! memory. So a value in device memory is carried through pinned host memory: copied off the
//! device into a staging slab before it is sent, or received into a slab and copied onto the
//! device after, with one wave's device copy overlapping the next wave's network transfer. The
//! checksum is taken on the host side of the staging copy, so end-to-end checking keeps its
//! meaning: what was sent is what the device held when it was copied.
//!
//! | module | concept |
//! | --- | --- |
//! | [`memory`] | [`DeviceMemory`], the seam: pinned host buffers and asynchronous copies |
//! | [`cuda`] | the real device: CUDA's driver, loaded at run time only if the process uses it |
//! | [`model`] | a software device: host memory at addresses the CPU cannot touch, its own copy engine, faults on demand |
//! | [`locate`] | which device, if any, owns an address |
//! | [`pool`] | the bounded staging pool: slabs of pinned host memory |
//! | [`pipeline`] | puts from and gets into device memory, wave by wave |
//!
//! The same pipeline runs over either device, so what the model tests (ordering, the bounded
//! pool, failed copies, a device lost mid-transfer, cancellation) is what runs on a GPU.

pub mod cuda;
pub mod locate;
pub mod memory;
pub mod model;
pub mod pipeline;
pub mod pool;

pub use locate::locate;
pub use memory::{CopyPart, DeviceMemory, Direction, HostBuffer, PendingCopy};
pub use pipeline::{GetInto, Part, PutFrom, get_into, put_from};
pub use pool::{Slab, StagingPool};

use mooring_core::{Error, ErrorCode};

/// A failed device operation: TRANSFER_FAIL, with what the device said.
pub(crate) fn device_error(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::TRANSFER_FAIL, message.into())
}
