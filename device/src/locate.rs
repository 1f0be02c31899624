//! Which device, if any, owns a range of memory: asked once, when a buffer is registered.

use std::sync::Arc;

use crate::cuda::CudaDevice;
use crate::memory::DeviceMemory;
use crate::model::ModelDevice;

/// The device whose memory holds `len` bytes at `addr`, or `None` for host memory.
///
/// The software model is asked first (a test process that made one), then CUDA, which is asked
/// only if the process has loaded its driver.
pub fn locate(addr: usize, len: usize) -> Option<Arc<dyn DeviceMemory>> {
    if let Some(model) = ModelDevice::installed()
        && model.owns(addr, len.max(1))
    {
        return Some(model);
    }
    let cuda = CudaDevice::holding(addr)?;
    Some(cuda)
}
