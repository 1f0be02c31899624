//! The seam between the staging pipeline and a device: what a device must do for the client.
//!
//! Two things: give out host memory it copies to and from fastest (pinned memory, for CUDA),
//! and run a list of copies between device and host memory asynchronously, answering a
//! handle that is waited on later. The real device ([`crate::cuda`]) and the software model
//! ([`crate::model`]) implement it; the pipeline sees nothing else.

use std::fmt;

use mooring_core::Result;

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From device memory into host memory (a put's staging).
    ToHost,
    /// From host memory onto the device (a get's delivery).
    ToDevice,
}

/// One copy: `len` bytes between device address `device` and host address `host`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyPart {
    /// The device-side address.
    pub device: usize,
    /// The host-side address (in a staging slab, or any host memory the caller keeps alive).
    pub host: usize,
    /// How many bytes.
    pub len: usize,
}

/// A device: where its memory is, and how bytes move on and off it.
pub trait DeviceMemory: Send + Sync + fmt::Debug {
    /// What to call it in logs and in `stat` ("cuda device 0", "software model").
    fn describe(&self) -> String;

    /// The CUDA device ordinal, for a GPU (so that callers can view its memory as tensors).
    fn cuda_ordinal(&self) -> Option<i32> {
        None
    }

    /// Whether `len` bytes at `addr` are this device's memory.
    fn owns(&self, addr: usize, len: usize) -> bool;

    /// `len` bytes of host memory this device copies to and from at full speed.
    fn alloc_host(&self, len: usize) -> Result<HostBuffer>;

    /// Starts `parts`' copies, in order, and returns at once; the handle says when they end.
    /// The host memory of every part must stay valid until then, which the handle's drop
    /// guarantees by waiting.
    fn copy(&self, direction: Direction, parts: &[CopyPart]) -> Result<Box<dyn PendingCopy>>;
}

/// Copies started on a device, not yet known to be done.
pub trait PendingCopy: Send {
    /// Blocks until every copy ended: `Ok` if all landed, else what the device said. Waiting
    /// again answers the same.
    fn wait(&mut self) -> Result<()>;
}

/// Host memory from [`DeviceMemory::alloc_host`], freed (as it was allocated) on drop.
pub struct HostBuffer {
    addr: usize,
    len: usize,
    free: Option<Box<dyn FnOnce(usize) + Send + Sync>>,
}

impl HostBuffer {
    /// Wraps `len` bytes at `addr`, which `free(addr)` releases.
    ///
    /// The caller promises that the bytes are valid, writable and owned by nobody else until
    /// `free` runs.
    pub fn new(addr: usize, len: usize, free: Box<dyn FnOnce(usize) + Send + Sync>) -> HostBuffer {
        HostBuffer {
            addr,
            len,
            free: Some(free),
        }
    }

    /// The first byte's address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes `range` of the buffer.
    pub fn bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: the buffer owns `len` valid bytes at `addr` (see `new`), and the slice
        // borrows `self`.
        unsafe { std::slice::from_raw_parts((self.addr + range.start) as *const u8, range.len()) }
    }

    /// The bytes `range` of the buffer, to write.
    pub fn bytes_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: as in `bytes`, and `&mut self` makes this the only slice.
        unsafe { std::slice::from_raw_parts_mut((self.addr + range.start) as *mut u8, range.len()) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some(free) = self.free.take() {
            free(self.addr);
        }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBuffer({} bytes at {:#x})", self.len, self.addr)
    }
}
