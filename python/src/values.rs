//! Byte slices over memory Python owns: buffer objects (bytes, bytearray, memoryview, numpy
//! arrays) and registered raw addresses.
//!
//! This is the one place the extension turns foreign memory into Rust slices. A buffer view
//! pins its exporter for as long as the view lives; a raw address is used only after
//! [`Registered::check`](crate::registered::Registered::check) found it inside a region the
//! program registered. Either way the program must not change or free the memory while a
//! call that uses it runs (Mooncake's rule too).

use std::sync::Arc;

use mooring_core::Result;
use mooring_device::StagingPool;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;

use crate::errors::invalid;
use crate::registered::{Placed, Registered};

/// A read-only view of a Python buffer object's bytes.
pub(crate) struct BufferView {
    buffer: PyUntypedBuffer,
}

impl BufferView {
    /// Views `object`, which must export a C-contiguous buffer (bytes, bytearray,
    /// memoryview, array.array, numpy arrays of any dtype).
    pub(crate) fn new(object: &Bound<'_, PyAny>) -> PyResult<BufferView> {
        let buffer = PyUntypedBuffer::get(object).map_err(|_| {
            let name = object
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into());
            PyTypeError::new_err(format!(
                "a value must be bytes-like (bytes, bytearray, memoryview, numpy array), got {name}"
            ))
        })?;
        if !buffer.is_c_contiguous() {
            return Err(PyBufferError::new_err(
                "the value's buffer is not contiguous: pass a contiguous copy (numpy.ascontiguousarray)",
            ));
        }
        Ok(BufferView { buffer })
    }

    /// Views `object` to read into: as [`BufferView::new`], and writable.
    pub(crate) fn writable(object: &Bound<'_, PyAny>) -> PyResult<BufferView> {
        let view = BufferView::new(object)?;
        if view.buffer.readonly() {
            return Err(PyBufferError::new_err(
                "the destination buffer is read-only: pass a writable one (bytearray, a writable memoryview, a tensor's storage)",
            ));
        }
        Ok(view)
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        let len = self.buffer.len_bytes();
        if len == 0 {
            return &[];
        }
        // SAFETY: the exporter keeps `len_bytes` contiguous bytes at `buf_ptr` alive and in
        // place until `self.buffer` is released, which happens no earlier than `self` drops;
        // the returned slice borrows `self`.
        unsafe { std::slice::from_raw_parts(self.buffer.buf_ptr() as *const u8, len) }
    }
}

/// A range of registered memory, checked to lie inside one registered region, which stays
/// registered while the range (or a clone) lives.
#[derive(Clone)]
pub(crate) struct Region {
    start: usize,
    len: usize,
    placed: Placed,
}

impl Region {
    /// `len` bytes at `start`, if they lie inside a region registered in `registered`.
    pub(crate) fn checked(registered: &Registered, start: usize, len: usize) -> Result<Region> {
        let placed = registered.check(start, len)?;
        Ok(Region { start, len, placed })
    }

    /// The host memory `view` covers, for a call whose views stay alive (pinning their
    /// exporters) until it ends: the view stands in for the registration [`Region::checked`]
    /// asks for, and the program's promise not to change or free the memory is the same.
    pub(crate) fn viewed(view: &BufferView) -> Region {
        Region {
            start: view.buffer.buf_ptr() as usize,
            len: view.buffer.len_bytes(),
            placed: Placed::host(),
        }
    }

    /// The region's first byte's address.
    pub(crate) fn start(&self) -> usize {
        self.start
    }

    /// The region's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The staging pool of the device whose memory this is; `None` for host memory, the
    /// only memory [`Region::bytes`] and [`Region::bytes_mut`] may be called on.
    pub(crate) fn device(&self) -> Option<&Arc<StagingPool>> {
        self.placed.device.as_ref()
    }

    /// The bytes, to write from.
    pub(crate) fn bytes(&self) -> &[u8] {
        assert!(
            self.device().is_none(),
            "device memory is never read by the CPU"
        );
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `checked` found the range inside a registered region, which the program
        // promised (by registering it) to keep allocated until it unregisters it, and not to
        // change while a call that uses it runs.
        unsafe { std::slice::from_raw_parts(self.start as *const u8, self.len) }
    }

    /// The bytes, to read into, for as long as the caller needs them.
    ///
    /// # Safety
    ///
    /// No other live slice may overlap this region while the returned one lives; callers
    /// check with [`disjoint`], and drop the slice before the call that made it returns.
    pub(crate) unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        assert!(
            self.device().is_none(),
            "device memory is never written by the CPU"
        );
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the caller guarantees no overlapping slice is alive.
        unsafe { std::slice::from_raw_parts_mut(self.start as *mut u8, self.len) }
    }
}

/// Checks that no two of `regions` overlap (a batch reading two values into the same bytes
/// is a bug in the caller, and would make the result depend on timing).
pub(crate) fn disjoint(regions: &[Region]) -> Result<()> {
    let mut sorted: Vec<&Region> = regions.iter().filter(|r| r.len > 0).collect();
    sorted.sort_by_key(|r| r.start);
    for pair in sorted.windows(2) {
        if pair[0].start + pair[0].len > pair[1].start {
            return Err(invalid(format!(
                "destination buffers overlap: {} bytes at {:#x} and {} bytes at {:#x}",
                pair[0].len, pair[0].start, pair[1].len, pair[1].start
            )));
        }
    }
    Ok(())
}
