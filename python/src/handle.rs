//! `BufferHandle`: a value read into memory the extension owns, which Python views without a
//! copy (`memoryview(handle)`, `numpy.frombuffer(handle, ...)`), as Mooncake's `get_buffer`
//! returns it.

use std::ffi::c_int;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// A value in memory owned by the handle: `ptr()`, `size()`, `len()` and the buffer
/// protocol (read-only). The memory lives as long as the handle and every view of it.
#[pyclass(module = "mooring.store", frozen)]
pub struct BufferHandle {
    data: Box<[u8]>,
}

impl BufferHandle {
    /// A handle owning `data`.
    pub(crate) fn new(data: Vec<u8>) -> BufferHandle {
        BufferHandle {
            data: data.into_boxed_slice(),
        }
    }
}

#[pymethods]
impl BufferHandle {
    /// The address of the first byte, as an int (valid while the handle lives).
    fn ptr(&self) -> usize {
        self.data.as_ptr() as usize
    }

    /// The value's size in bytes.
    fn size(&self) -> usize {
        self.data.len()
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<BufferHandle size={} ptr={:#x}>",
            self.data.len(),
            self.ptr()
        )
    }

    /// Exports the bytes read-only.
    ///
    /// # Safety
    ///
    /// Called by the interpreter with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        let data = &slf.get().data;
        // SAFETY: `view` is the interpreter's; the bytes live in a frozen handle that the view
        // keeps alive (FillInfo stores a new reference to it in `view.obj`).
        let filled = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::ffi::c_void,
                data.len() as ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if filled == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(slf.py()))
        }
    }

    /// Nothing to release: the bytes belong to the handle.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
