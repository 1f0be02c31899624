//! `mooring._native.DeviceModel`: the software device model, for tests on machines without a
//! GPU. Its memory is at addresses the CPU cannot touch; buffers registered there are staged
//! exactly as GPU memory is, and the model can be told to fail a copy, lose the device or
//! slow down.

use std::sync::Arc;
use std::time::Duration;

use mooring_device::model::ModelDevice;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::raise;

/// The process's software device (one per process; every `DeviceModel()` is the same one).
#[pyclass(module = "mooring._native", frozen)]
pub struct DeviceModel {
    model: Arc<ModelDevice>,
}

#[pymethods]
impl DeviceModel {
    /// The process's model device, made on first use.
    #[new]
    fn new() -> PyResult<DeviceModel> {
        Ok(DeviceModel {
            model: raise(ModelDevice::install())?,
        })
    }

    /// Allocates `size` bytes of model device memory (zeroed); its address.
    fn alloc(&self, size: usize) -> PyResult<usize> {
        raise(self.model.alloc(size))
    }

    /// Frees the allocation at `addr`.
    fn free(&self, addr: usize) -> PyResult<()> {
        raise(self.model.free(addr))
    }

    /// Writes `data` at device address `addr`, as a kernel would.
    fn write(&self, addr: usize, data: &[u8]) -> PyResult<()> {
        raise(self.model.write(addr, data))
    }

    /// Reads `size` bytes at device address `addr`, as a kernel would.
    fn read<'py>(
        &self,
        py: Python<'py>,
        addr: usize,
        size: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = raise(self.model.read(addr, size))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Fails the copy job `after` jobs from now (0: the next).
    fn fail_copy(&self, after: u64) {
        self.model.fail_copy(after);
    }

    /// Loses the device (every copy fails, those in flight too), or brings it back.
    fn set_lost(&self, lost: bool) {
        self.model.set_lost(lost);
    }

    /// Makes each copy job take `ms` milliseconds.
    fn set_delay_ms(&self, ms: u64) {
        self.model.set_delay(Duration::from_millis(ms));
    }

    /// Copy jobs finished so far, and the bytes they moved.
    fn copies(&self) -> (u64, u64) {
        self.model.copies()
    }

    /// Host (staging) buffers the model has given out.
    fn host_buffers(&self) -> u64 {
        self.model.host_buffers()
    }
}
