//! A software device: host memory posing as device memory, so the staging pipeline, its
//! bounded pool and its failures are tested on machines without a GPU.
//!
//! Like a GPU's, the model's memory is at addresses the CPU must not touch: they lie in a
//! range reserved with no access rights, and the bytes behind them live elsewhere, so a path
//! that dereferenced a device address instead of copying would crash the test at once. Copies
//! run on the model's own copy engine (a thread), finish asynchronously, and can be slowed,
//! failed or cut off by a "lost" device, as a test asks.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use mooring_core::{Error, ErrorCode, Result};

use crate::device_error;
use crate::memory::{CopyPart, DeviceMemory, Direction, HostBuffer, PendingCopy};

/// Address space the model reserves for its memory.
const SPAN: usize = 64 << 30;

/// The model's memory and its faults.
#[derive(Debug, Default)]
struct State {
    /// Allocations by device address: their bytes live here, not at the address.
    allocations: BTreeMap<usize, Vec<u8>>,
    /// The next free device address (allocations are never reused, so a stale address
    /// stays invalid).
    next: usize,
    /// Fail the copy job that many jobs from now (0: the next one).
    fail_in: Option<u64>,
    /// The device was lost: every copy from now on fails.
    lost: bool,
    /// How long each copy job takes.
    delay: Duration,
    /// Copy jobs started, finished, and bytes they moved.
    started: u64,
    jobs: u64,
    bytes: u64,
    /// Host buffers given out.
    host_buffers: u64,
}

/// A copy job for the engine.
struct Job {
    direction: Direction,
    parts: Vec<CopyPart>,
    done: Arc<Completion>,
}

/// Where the engine leaves a job's outcome.
#[derive(Default)]
struct Completion {
    outcome: Mutex<Option<Result<()>>>,
    ended: Condvar,
}

/// The software device; see the module docs. One per process ([`ModelDevice::installed`]),
/// so that [`crate::locate`] finds its memory as it finds CUDA's.
#[derive(Debug)]
pub struct ModelDevice {
    base: usize,
    state: Arc<Mutex<State>>,
    engine: Mutex<mpsc::Sender<Job>>,
}

static INSTALLED: OnceLock<Arc<ModelDevice>> = OnceLock::new();

impl ModelDevice {
    /// The process's model device, made on first use.
    pub fn install() -> Result<Arc<ModelDevice>> {
        if let Some(model) = INSTALLED.get() {
            return Ok(Arc::clone(model));
        }
        let model = Arc::new(ModelDevice::new()?);
        Ok(Arc::clone(INSTALLED.get_or_init(|| model)))
    }

    /// The model device, if this process made one.
    pub fn installed() -> Option<Arc<ModelDevice>> {
        INSTALLED.get().cloned()
    }

    /// A model device of its own (tests that inject faults use one each; the process's
    /// shared one is [`ModelDevice::install`]'s).
    pub fn new() -> Result<ModelDevice> {
        // SAFETY: a fresh anonymous mapping with no access rights: nothing is read or written
        // through it, it only keeps the range from being handed to anything else.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SPAN,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(device_error(format!(
                "the device model could not reserve {SPAN} bytes of address space: {}",
                std::io::Error::last_os_error()
            )));
        }
        let base = base as usize;
        let state = Arc::new(Mutex::new(State {
            next: base,
            ..State::default()
        }));
        let (engine, jobs) = mpsc::channel::<Job>();
        let engine_state = Arc::clone(&state);
        std::thread::Builder::new()
            .name("mooring-device-model".into())
            .spawn(move || copy_engine(&engine_state, &jobs))
            .map_err(|e| device_error(format!("the device model's copy engine: {e}")))?;
        Ok(ModelDevice {
            base,
            state,
            engine: Mutex::new(engine),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `len` bytes of (model) device memory, zeroed; its address.
    pub fn alloc(&self, len: usize) -> Result<usize> {
        let mut state = self.state();
        let addr = state.next;
        let end = addr + len.max(1).next_multiple_of(4096);
        if end > self.base + SPAN {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "the device model's memory is used up",
            ));
        }
        state.next = end;
        state.allocations.insert(addr, vec![0; len]);
        Ok(addr)
    }

    /// Frees the allocation at `addr`.
    pub fn free(&self, addr: usize) -> Result<()> {
        self.state()
            .allocations
            .remove(&addr)
            .map(|_| ())
            .ok_or_else(|| invalid_address(addr, 0))
    }

    /// Writes `bytes` at device address `addr`, as a kernel on the device would.
    pub fn write(&self, addr: usize, bytes: &[u8]) -> Result<()> {
        let mut state = self.state();
        let (slot, offset) = find(&mut state.allocations, addr, bytes.len())?;
        slot[offset..offset + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    /// Reads `len` bytes at device address `addr`, as a kernel on the device would.
    pub fn read(&self, addr: usize, len: usize) -> Result<Vec<u8>> {
        let mut state = self.state();
        let (slot, offset) = find(&mut state.allocations, addr, len)?;
        Ok(slot[offset..offset + len].to_vec())
    }

    /// Makes the copy job `after` jobs from now fail (0: the next one).
    pub fn fail_copy(&self, after: u64) {
        self.state().fail_in = Some(after);
    }

    /// Loses the device (or, with `false`, brings it back): every copy fails, those in flight
    /// too.
    pub fn set_lost(&self, lost: bool) {
        self.state().lost = lost;
    }

    /// Makes each copy job take `delay` (a slow device, or a window to act in).
    pub fn set_delay(&self, delay: Duration) {
        self.state().delay = delay;
    }

    /// Copy jobs finished so far, and the bytes they moved.
    pub fn copies(&self) -> (u64, u64) {
        let state = self.state();
        (state.jobs, state.bytes)
    }

    /// Copy jobs started so far (finished or not).
    pub fn started(&self) -> u64 {
        self.state().started
    }

    /// Host buffers given out so far.
    pub fn host_buffers(&self) -> u64 {
        self.state().host_buffers
    }
}

impl Drop for ModelDevice {
    fn drop(&mut self) {
        // SAFETY: the range reserved in `new`, which nothing reads or writes.
        unsafe { libc::munmap(self.base as *mut libc::c_void, SPAN) };
    }
}

/// The allocation holding `len` bytes at `addr`, and `addr`'s offset in it.
fn find(
    allocations: &mut BTreeMap<usize, Vec<u8>>,
    addr: usize,
    len: usize,
) -> Result<(&mut Vec<u8>, usize)> {
    match allocations.range_mut(..=addr).next_back() {
        Some((&start, slot)) if addr + len <= start + slot.len() => Ok((slot, addr - start)),
        _ => Err(invalid_address(addr, len)),
    }
}

fn invalid_address(addr: usize, len: usize) -> Error {
    device_error(format!(
        "the device model has no allocation holding {len} bytes at {addr:#x} (an illegal address on a real device)"
    ))
}

/// The copy engine: runs jobs in order, each after the model's delay.
fn copy_engine(state: &Mutex<State>, jobs: &mpsc::Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        let delay = state.lock().unwrap_or_else(|e| e.into_inner()).delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = run(&mut state, &job);
        *job.done.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        job.done.ended.notify_all();
    }
}

fn run(state: &mut State, job: &Job) -> Result<()> {
    if state.lost {
        return Err(device_error(
            "the device was lost during the copy (the model was told to lose it)",
        ));
    }
    match state.fail_in {
        Some(0) => {
            state.fail_in = None;
            return Err(device_error(
                "a device copy failed (the model was told to fail it)",
            ));
        }
        Some(n) => state.fail_in = Some(n - 1),
        None => {}
    }
    for part in &job.parts {
        let (slot, offset) = find(&mut state.allocations, part.device, part.len)?;
        let device = &mut slot[offset..offset + part.len];
        // SAFETY: the pipeline keeps each part's host memory valid, and touched by nothing
        // else, until the job's handle has seen it end (see `DeviceMemory::copy`).
        unsafe {
            match job.direction {
                Direction::ToHost => {
                    std::ptr::copy_nonoverlapping(device.as_ptr(), part.host as *mut u8, part.len)
                }
                Direction::ToDevice => std::ptr::copy_nonoverlapping(
                    part.host as *const u8,
                    device.as_mut_ptr(),
                    part.len,
                ),
            }
        }
        state.bytes += part.len as u64;
    }
    state.jobs += 1;
    Ok(())
}

impl DeviceMemory for ModelDevice {
    fn describe(&self) -> String {
        "software device model".into()
    }

    fn owns(&self, addr: usize, len: usize) -> bool {
        addr >= self.base && addr.saturating_add(len) <= self.base + SPAN
    }

    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        self.state().host_buffers += 1;
        let bytes: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let addr = Box::into_raw(bytes) as *mut u8 as usize;
        Ok(HostBuffer::new(
            addr,
            len,
            Box::new(move |addr| {
                // SAFETY: `addr` came from `Box::into_raw` of a `len`-byte boxed slice above,
                // and the buffer frees it once.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(addr as *mut u8, len))
                });
            }),
        ))
    }

    fn copy(&self, direction: Direction, parts: &[CopyPart]) -> Result<Box<dyn PendingCopy>> {
        self.state().started += 1;
        let done = Arc::new(Completion::default());
        let job = Job {
            direction,
            parts: parts.to_vec(),
            done: Arc::clone(&done),
        };
        self.engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .map_err(|_| device_error("the device model's copy engine stopped"))?;
        Ok(Box::new(ModelCopy { done }))
    }
}

/// A model copy job in flight.
struct ModelCopy {
    done: Arc<Completion>,
}

impl PendingCopy for ModelCopy {
    fn wait(&mut self) -> Result<()> {
        let mut outcome = self.done.outcome.lock().unwrap_or_else(|e| e.into_inner());
        while outcome.is_none() {
            outcome = self
                .done
                .ended
                .wait(outcome)
                .unwrap_or_else(|e| e.into_inner());
        }
        outcome.clone().expect("set before the loop ended")
    }
}

impl Drop for ModelCopy {
    fn drop(&mut self) {
        // The host memory must outlive the copy: a handle dropped early waits for it.
        let _ = self.wait();
    }
}
