//! The real device: NVIDIA GPUs through CUDA's driver API.
//!
//! The driver (`libcuda.so.1`) is found only if the process has already loaded it (torch,
//! CuPy or JAX did, to make the memory being registered), so this crate builds, imports and
//! runs on machines without CUDA, and a process that never used a GPU starts no CUDA context.
//! The driver API is used rather than the runtime's because it takes a context explicitly:
//! the copies run on the caller's threads without changing which device those threads use
//! (the context is pushed for each call and popped after).
//!
//! Copies run on non-blocking streams of the buffer's own context, each batch followed by an
//! event created with blocking sync, so a thread waiting for a copy sleeps instead of spinning.
//!
//! Memory mapped through CUDA's virtual memory calls (JAX's allocator, torch's expandable
//! segments, vLLM's sleep-mode allocator) or taken from a stream-ordered pool belongs to no
//! context: the driver names only its device, and its copies run in that device's primary
//! context, the one those frameworks use.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use mooring_core::Result;
use tracing::debug;

use crate::device_error;
use crate::memory::{CopyPart, DeviceMemory, Direction, HostBuffer, PendingCopy};

type CuResult = c_int;
type Handle = *mut c_void;

const CUDA_SUCCESS: CuResult = 0;
const POINTER_ATTRIBUTE_CONTEXT: c_int = 1;
const POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
const POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
const MEMORYTYPE_DEVICE: c_uint = 2;
const STREAM_NON_BLOCKING: c_uint = 1;
const EVENT_BLOCKING_SYNC_NO_TIMING: c_uint = 1 | 2;
const MEMHOSTALLOC_PORTABLE: c_uint = 1;

/// The driver entry points the client uses.
struct Driver {
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult,
    ctx_push: unsafe extern "C" fn(Handle) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut Handle) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    stream_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    event_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(Handle, Handle) -> CuResult,
    event_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    event_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, u64, usize, Handle) -> CuResult,
    memcpy_htod_async: unsafe extern "C" fn(u64, *const c_void, usize, Handle) -> CuResult,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut Handle, c_int) -> CuResult,
}

impl Driver {
    /// The driver, if this process has loaded it.
    fn loaded() -> Option<&'static Driver> {
        static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();
        DRIVER
            .get_or_init(|| {
                // Only a driver already in the process: RTLD_NOLOAD loads nothing.
                // SAFETY: dlopen with a constant, NUL-terminated name.
                let lib = unsafe {
                    libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_NOW)
                };
                if lib.is_null() {
                    return None;
                }
                // SAFETY: each name is looked up in the driver and cast to the signature
                // CUDA's driver API (cuda.h, CUDA 11 and later) gives it.
                unsafe { Driver::bind(lib) }
            })
            .as_ref()
    }

    /// # Safety
    ///
    /// `lib` is a handle of CUDA's driver library, kept open for the life of the process.
    unsafe fn bind(lib: *mut c_void) -> Option<Driver> {
        macro_rules! symbol {
            ($name:literal) => {{
                // SAFETY: `lib` is open; the name is NUL-terminated.
                let f = unsafe { libc::dlsym(lib, concat!($name, "\0").as_ptr().cast()) };
                if f.is_null() {
                    debug!("CUDA's driver has no {}; device memory is not used", $name);
                    return None;
                }
                // SAFETY: the field's type is the symbol's documented signature.
                unsafe { function(f) }
            }};
        }
        Some(Driver {
            pointer_get_attribute: symbol!("cuPointerGetAttribute"),
            ctx_push: symbol!("cuCtxPushCurrent_v2"),
            ctx_pop: symbol!("cuCtxPopCurrent_v2"),
            stream_create: symbol!("cuStreamCreate"),
            stream_destroy: symbol!("cuStreamDestroy_v2"),
            stream_synchronize: symbol!("cuStreamSynchronize"),
            event_create: symbol!("cuEventCreate"),
            event_record: symbol!("cuEventRecord"),
            event_synchronize: symbol!("cuEventSynchronize"),
            event_destroy: symbol!("cuEventDestroy_v2"),
            memcpy_dtoh_async: symbol!("cuMemcpyDtoHAsync_v2"),
            memcpy_htod_async: symbol!("cuMemcpyHtoDAsync_v2"),
            mem_host_alloc: symbol!("cuMemHostAlloc"),
            mem_free_host: symbol!("cuMemFreeHost"),
            get_error_string: symbol!("cuGetErrorString"),
            device_get: symbol!("cuDeviceGet"),
            primary_ctx_retain: symbol!("cuDevicePrimaryCtxRetain"),
        })
    }

    /// `Ok` for CUDA_SUCCESS, else an error naming `what` and the driver's words.
    fn check(&self, result: CuResult, what: &str) -> Result<()> {
        if result == CUDA_SUCCESS {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
        let known = unsafe { (self.get_error_string)(result, &mut text) } == CUDA_SUCCESS;
        let words = if known && !text.is_null() {
            // SAFETY: the driver's static, NUL-terminated message.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        } else {
            "unknown error".into()
        };
        Err(device_error(format!(
            "CUDA {what} failed: {words} (CUresult {result})"
        )))
    }

    /// A pointer attribute of `addr`, or the driver's refusal.
    fn attribute<T: Default>(&self, attribute: c_int, addr: usize) -> std::result::Result<T, ()> {
        let mut value = T::default();
        // SAFETY: `value` is the attribute's documented type (an int, unsigned or handle).
        let result = unsafe {
            (self.pointer_get_attribute)((&raw mut value).cast(), attribute, addr as u64)
        };
        if result == CUDA_SUCCESS {
            Ok(value)
        } else {
            Err(())
        }
    }

    /// The context device memory at `addr` is used in: the one it was allocated in, or, for
    /// memory that belongs to no context (see the module's doc), its device's primary context.
    /// `None` if `addr` is not device memory.
    fn context_of(&self, addr: usize) -> Option<(usize, c_int)> {
        let kind: c_uint = self.attribute(POINTER_ATTRIBUTE_MEMORY_TYPE, addr).ok()?;
        if kind != MEMORYTYPE_DEVICE {
            return None;
        }
        let ordinal: c_int = self
            .attribute(POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr)
            .ok()?;
        match self.attribute::<usize>(POINTER_ATTRIBUTE_CONTEXT, addr) {
            Ok(context) if context != 0 => Some((context, ordinal)),
            _ => Some((self.primary_context(ordinal)?, ordinal)),
        }
    }

    /// Device `ordinal`'s primary context, retained once for the life of the process (the
    /// framework that mapped the memory holds it too).
    fn primary_context(&self, ordinal: c_int) -> Option<usize> {
        static PRIMARY: OnceLock<Mutex<HashMap<c_int, usize>>> = OnceLock::new();
        let mut primary = PRIMARY
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(&context) = primary.get(&ordinal) {
            return Some(context);
        }
        let mut device: c_int = 0;
        let mut context: Handle = std::ptr::null_mut();
        // SAFETY: each call writes one handle into the local passed to it.
        let retained = unsafe {
            (self.device_get)(&mut device, ordinal) == CUDA_SUCCESS
                && (self.primary_ctx_retain)(&mut context, device) == CUDA_SUCCESS
        };
        if !retained || context.is_null() {
            debug!("CUDA device {ordinal}'s primary context could not be retained");
            return None;
        }
        primary.insert(ordinal, context as usize);
        Some(context as usize)
    }
}

/// A looked-up symbol as the function type `F`.
///
/// # Safety
///
/// `F` is a function pointer type matching the symbol's signature.
unsafe fn function<F: Copy>(symbol: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&symbol) }
}

/// One GPU context (in practice, one GPU's primary context, as torch uses).
#[derive(Debug)]
pub struct CudaDevice {
    context: usize,
    ordinal: i32,
    /// Streams made and not in use, to reuse.
    streams: Arc<Mutex<Vec<usize>>>,
}

impl CudaDevice {
    /// The device holding `addr`, if CUDA is in use in this process and `addr` is device
    /// memory.
    pub fn holding(addr: usize) -> Option<Arc<CudaDevice>> {
        let (context, ordinal) = Driver::loaded()?.context_of(addr)?;
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        let mut devices = DEVICES
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Some(Arc::clone(devices.entry(context).or_insert_with(|| {
            Arc::new(CudaDevice {
                context,
                ordinal,
                streams: Arc::default(),
            })
        })))
    }

    fn driver() -> Result<&'static Driver> {
        Driver::loaded().ok_or_else(|| device_error("CUDA's driver is not loaded"))
    }

    /// Runs `work` with this device's context current on the calling thread.
    fn in_context<T>(&self, work: impl FnOnce(&Driver) -> Result<T>) -> Result<T> {
        in_context(self.context, work)
    }

    fn take_stream(&self, driver: &Driver) -> Result<usize> {
        if let Some(stream) = self.streams.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(stream);
        }
        let mut stream: Handle = std::ptr::null_mut();
        // SAFETY: writes a new stream handle into `stream`.
        driver.check(
            unsafe { (driver.stream_create)(&mut stream, STREAM_NON_BLOCKING) },
            "stream creation",
        )?;
        Ok(stream as usize)
    }

    fn give_stream(&self, stream: usize) {
        give_stream(&self.streams, stream);
    }
}

/// Runs `work` with `context` current on the calling thread, then restores the thread's own.
fn in_context<T>(context: usize, work: impl FnOnce(&Driver) -> Result<T>) -> Result<T> {
    let driver = CudaDevice::driver()?;
    // SAFETY: the context came from the driver and lives as long as its allocations.
    driver.check(
        unsafe { (driver.ctx_push)(context as Handle) },
        "context push",
    )?;
    let result = work(driver);
    let mut popped: Handle = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    unsafe { (driver.ctx_pop)(&mut popped) };
    result
}

fn give_stream(streams: &Mutex<Vec<usize>>, stream: usize) {
    streams
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(stream);
}

impl DeviceMemory for CudaDevice {
    fn describe(&self) -> String {
        format!("cuda device {}", self.ordinal)
    }

    fn cuda_ordinal(&self) -> Option<i32> {
        Some(self.ordinal)
    }

    fn owns(&self, addr: usize, len: usize) -> bool {
        let Some(driver) = Driver::loaded() else {
            return false;
        };
        let last = addr + len.max(1) - 1;
        [addr, last]
            .iter()
            .all(|&a| driver.context_of(a).map(|(context, _)| context) == Some(self.context))
    }

    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        self.in_context(|driver| {
            let mut host: *mut c_void = std::ptr::null_mut();
            // SAFETY: writes the address of `len` new pinned bytes into `host`.
            driver.check(
                unsafe { (driver.mem_host_alloc)(&mut host, len, MEMHOSTALLOC_PORTABLE) },
                "pinned host allocation",
            )?;
            Ok(HostBuffer::new(
                host as usize,
                len,
                Box::new(|addr| {
                    if let Ok(driver) = CudaDevice::driver() {
                        // SAFETY: `addr` came from cuMemHostAlloc and is freed once.
                        unsafe { (driver.mem_free_host)(addr as *mut c_void) };
                    }
                }),
            ))
        })
    }

    fn copy(&self, direction: Direction, parts: &[CopyPart]) -> Result<Box<dyn PendingCopy>> {
        self.in_context(|driver| {
            let stream = self.take_stream(driver)?;
            let enqueued = (|| {
                for part in parts {
                    // SAFETY: the pipeline checked both ranges (device memory registered with
                    // the client, host memory it keeps alive until the copy is waited on).
                    let result = unsafe {
                        match direction {
                            Direction::ToHost => (driver.memcpy_dtoh_async)(
                                part.host as *mut c_void,
                                part.device as u64,
                                part.len,
                                stream as Handle,
                            ),
                            Direction::ToDevice => (driver.memcpy_htod_async)(
                                part.device as u64,
                                part.host as *const c_void,
                                part.len,
                                stream as Handle,
                            ),
                        }
                    };
                    driver.check(result, "asynchronous copy")?;
                }
                let mut event: Handle = std::ptr::null_mut();
                // SAFETY: makes an event and records it after the copies on `stream`.
                driver.check(
                    unsafe { (driver.event_create)(&mut event, EVENT_BLOCKING_SYNC_NO_TIMING) },
                    "event creation",
                )?;
                // SAFETY: as above.
                if let Err(e) = driver.check(
                    unsafe { (driver.event_record)(event, stream as Handle) },
                    "event record",
                ) {
                    // SAFETY: the event was made above and is not used again.
                    unsafe { (driver.event_destroy)(event) };
                    return Err(e);
                }
                Ok(event as usize)
            })();
            match enqueued {
                Ok(event) => Ok(Box::new(CudaCopy {
                    context: self.context,
                    streams: Arc::clone(&self.streams),
                    stream,
                    event,
                    outcome: None,
                }) as Box<dyn PendingCopy>),
                Err(e) => {
                    // Copies enqueued before the failure still use the host memory: let them
                    // end before the caller reuses it.
                    // SAFETY: the stream is ours.
                    unsafe { (driver.stream_synchronize)(stream as Handle) };
                    self.give_stream(stream);
                    Err(e)
                }
            }
        })
    }
}

/// Copies in flight on a stream, ended by an event.
struct CudaCopy {
    context: usize,
    streams: Arc<Mutex<Vec<usize>>>,
    stream: usize,
    event: usize,
    outcome: Option<Result<()>>,
}

impl PendingCopy for CudaCopy {
    fn wait(&mut self) -> Result<()> {
        if let Some(outcome) = &self.outcome {
            return outcome.clone();
        }
        let (event, stream) = (self.event, self.stream);
        let outcome = in_context(self.context, |driver| {
            // SAFETY: the event was recorded on our stream and is destroyed once, here.
            let synced = driver.check(
                unsafe { (driver.event_synchronize)(event as Handle) },
                "copy",
            );
            // SAFETY: as above.
            unsafe { (driver.event_destroy)(event as Handle) };
            if synced.is_ok() {
                // A stream with no error left is reused; one that failed is dropped.
                return Ok(true);
            }
            // SAFETY: the stream is ours and no longer used.
            unsafe { (driver.stream_destroy)(stream as Handle) };
            synced.map(|_| false)
        });
        if let Ok(true) = outcome {
            give_stream(&self.streams, stream);
        }
        let outcome = outcome.map(|_| ());
        self.outcome = Some(outcome.clone());
        outcome
    }
}

impl Drop for CudaCopy {
    fn drop(&mut self) {
        // The host memory must outlive the copy: a handle dropped early waits for it.
        let _ = self.wait();
    }
}
