//! The staging pool: a bounded number of slabs of pinned host memory, per device.
//!
//! Slabs are allocated on first use (registering device memory costs nothing until bytes
//! move) and kept for reuse: pinning memory is slow. The pool never holds more than its
//! setting, so a burst of device transfers waits for a slab rather than pinning more.

use std::sync::{Arc, Mutex};

use mooring_core::{Error, ErrorCode, Result};
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::info;

use crate::memory::{DeviceMemory, HostBuffer};

/// How many slabs a pool is cut into: two keep one wave's device copy overlapping another's
/// network transfer; four let two threads do so at once.
pub const SLABS: usize = 4;

/// The smallest slab: below this, per-wave costs dominate.
const MIN_SLAB: usize = 1 << 20;

/// A wave's worth of bytes by default: the first wave's copy, which nothing overlaps, stays
/// short (about 100 µs over PCIe), while each wave's fixed costs (a copy to start and wait
/// for, a transfer request per node) stay small beside its bytes.
pub const WAVE_BYTES: usize = 2 << 20;

/// Slabs of pinned host memory for one device.
#[derive(Debug)]
pub struct StagingPool {
    device: Arc<dyn DeviceMemory>,
    slab_bytes: usize,
    wave_bytes: usize,
    free: Mutex<Vec<HostBuffer>>,
    permits: Semaphore,
}

impl StagingPool {
    /// A pool of `total` bytes (cut into [`SLABS`] slabs) for `device`, whose batches move in
    /// waves of `wave_bytes` (see [`WAVE_BYTES`]).
    pub fn new(device: Arc<dyn DeviceMemory>, total: usize, wave_bytes: usize) -> StagingPool {
        let slab_bytes = (total / SLABS).max(MIN_SLAB);
        info!(
            "device memory on {} moves through {} MiB of pinned host memory ({SLABS} slabs of {} MiB); GPUDirect RDMA is not used",
            device.describe(),
            (slab_bytes * SLABS) >> 20,
            slab_bytes >> 20
        );
        StagingPool {
            device,
            slab_bytes,
            wave_bytes: wave_bytes.max(1),
            free: Mutex::default(),
            permits: Semaphore::new(SLABS),
        }
    }

    /// The device the pool stages for.
    pub fn device(&self) -> &Arc<dyn DeviceMemory> {
        &self.device
    }

    /// How many bytes one slab holds: the largest value that can be staged.
    pub fn slab_bytes(&self) -> usize {
        self.slab_bytes
    }

    /// How many bytes a wave holds before the next begins.
    pub fn wave_bytes(&self) -> usize {
        self.wave_bytes
    }

    /// A slab, waiting while every slab is in use.
    pub async fn acquire(&self) -> Result<Slab<'_>> {
        let permit = self.permits.acquire().await.map_err(|_| {
            Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "the staging pool is closed",
            )
        })?;
        self.slab(permit)
    }

    /// A slab if one is free now.
    pub fn try_acquire(&self) -> Option<Result<Slab<'_>>> {
        let permit = self.permits.try_acquire().ok()?;
        Some(self.slab(permit))
    }

    /// Slabs not in use now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    fn slab<'a>(&'a self, permit: SemaphorePermit<'a>) -> Result<Slab<'a>> {
        let kept = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let buffer = match kept {
            Some(buffer) => buffer,
            None => self.device.alloc_host(self.slab_bytes)?,
        };
        Ok(Slab {
            pool: self,
            buffer: Some(buffer),
            _permit: permit,
        })
    }
}

/// One slab, in use until dropped.
#[derive(Debug)]
pub struct Slab<'a> {
    pool: &'a StagingPool,
    buffer: Option<HostBuffer>,
    _permit: SemaphorePermit<'a>,
}

impl Slab<'_> {
    /// The slab's memory.
    pub fn buffer(&self) -> &HostBuffer {
        self.buffer.as_ref().expect("held until drop")
    }

    /// The slab's memory, to write.
    pub fn buffer_mut(&mut self) -> &mut HostBuffer {
        self.buffer.as_mut().expect("held until drop")
    }
}

impl Drop for Slab<'_> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.pool
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(buffer);
        }
    }
}
