//! The memory regions a program registered with `register_buffer`.
//!
//! Calls that take raw addresses (`put_from`, `get_into` and their batches) read and write
//! only inside these regions: an address outside every region, or a range running past the
//! end of one, is refused with INVALID_PARAMS instead of being dereferenced. Registering is
//! the program's promise that the region stays allocated until it unregisters it; in return,
//! `unregister_buffer` waits for the calls using the region to end, so once it returns
//! nothing of Mooring's touches the memory.
//!
//! A region in device (GPU) memory is recognised when it is registered and remembers its
//! device's staging pool: its bytes move only through the device's copies, never the CPU.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use mooring_core::Result;
use mooring_device::{DeviceMemory, StagingPool};
use tracing::info;

use crate::errors::invalid;

/// One registered region.
struct Entry {
    len: usize,
    /// The staging pool of the region's device; `None` for host memory.
    device: Option<Arc<StagingPool>>,
    /// One clone per call using the region (see [`Registered::unregister`]).
    users: Arc<()>,
}

/// Registered regions, by start address, and the staging pools of their devices.
pub(crate) struct Registered {
    regions: RwLock<BTreeMap<usize, Entry>>,
    pools: Mutex<Vec<Arc<StagingPool>>>,
    staging_bytes: usize,
    wave_bytes: usize,
}

/// A registered range's place: its region's start, its device's pool, and a token that
/// keeps the region registered while it lives.
#[derive(Clone)]
pub(crate) struct Placed {
    /// The staging pool of the region's device; `None` for host memory.
    pub(crate) device: Option<Arc<StagingPool>>,
    _user: Arc<()>,
}

impl Placed {
    /// The place of host memory that a pinned buffer view, not a registration, keeps alive.
    pub(crate) fn host() -> Placed {
        Placed {
            device: None,
            _user: Arc::new(()),
        }
    }
}

impl Registered {
    /// No regions yet; a device's pool will stage through `staging_bytes` of pinned memory,
    /// in waves of `wave_bytes`.
    pub(crate) fn new(staging_bytes: usize, wave_bytes: usize) -> Registered {
        Registered {
            regions: RwLock::default(),
            pools: Mutex::default(),
            staging_bytes,
            wave_bytes,
        }
    }

    /// Registers `len` bytes at `start`. Registering the same region again is harmless; one
    /// that overlaps another region is refused.
    pub(crate) fn register(&self, start: usize, len: usize) -> Result<()> {
        if start == 0 || len == 0 {
            return Err(invalid(format!(
                "cannot register {len} bytes at address {start:#x}: give a non-null address and a non-zero size"
            )));
        }
        let end = start.checked_add(len).ok_or_else(|| {
            invalid(format!(
                "{len} bytes at {start:#x} wrap around the address space"
            ))
        })?;
        let device = match mooring_device::locate(start, len) {
            Some(device) if !device.owns(start, len) => {
                return Err(invalid(format!(
                    "{len} bytes at {start:#x} start in the memory of {} but do not lie wholly in it: register one allocation at a time",
                    device.describe()
                )));
            }
            Some(device) => Some(self.pool_for(device)),
            None => None,
        };
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if regions.get(&start).is_some_and(|e| e.len == len) {
            return Ok(());
        }
        let before = regions.range(..end).next_back();
        if let Some((&s, e)) = before
            && s + e.len > start
        {
            return Err(invalid(format!(
                "{len} bytes at {start:#x} overlap the registered buffer of {} bytes at {s:#x}: unregister it first",
                e.len
            )));
        }
        regions.insert(
            start,
            Entry {
                len,
                device,
                users: Arc::new(()),
            },
        );
        Ok(())
    }

    /// The staging pool of `device`, made on its first registration.
    fn pool_for(&self, device: Arc<dyn DeviceMemory>) -> Arc<StagingPool> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let same = |p: &&Arc<StagingPool>| {
            std::ptr::addr_eq(Arc::as_ptr(p.device()), Arc::as_ptr(&device))
        };
        if let Some(pool) = pools.iter().find(same) {
            return Arc::clone(pool);
        }
        let pool = Arc::new(StagingPool::new(
            device,
            self.staging_bytes,
            self.wave_bytes,
        ));
        pools.push(Arc::clone(&pool));
        pool
    }

    /// Unregisters the region starting at `start`, waiting for the calls still using it.
    pub(crate) fn unregister(&self, start: usize) -> Result<()> {
        let entry = self
            .regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&start)
            .ok_or_else(|| {
                invalid(format!(
                    "no buffer is registered at {start:#x} (give the address register_buffer was given)"
                ))
            })?;
        let mut waited = Duration::ZERO;
        while Arc::strong_count(&entry.users) > 1 {
            if waited == Duration::from_secs(1) {
                info!(
                    "unregistering the buffer at {start:#x} waits for the transfers still using it"
                );
            }
            std::thread::sleep(Duration::from_millis(1));
            waited += Duration::from_millis(1);
        }
        Ok(())
    }

    /// How many bytes from `start` to the end of the registered region containing it.
    pub(crate) fn room_at(&self, start: usize) -> Result<usize> {
        self.locate(start).map(|(room, _)| room)
    }

    /// The room from `start` to its region's end, and the region's place.
    fn locate(&self, start: usize) -> Result<(usize, Placed)> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        match regions.range(..=start).next_back() {
            Some((&s, e)) if start < s + e.len => Ok((
                s + e.len - start,
                Placed {
                    device: e.device.clone(),
                    _user: Arc::clone(&e.users),
                },
            )),
            _ => Err(invalid(format!(
                "address {start:#x} is not inside a registered buffer: call register_buffer(ptr, size) first"
            ))),
        }
    }

    /// Checks that `len` bytes at `start` lie inside one registered region; its place.
    pub(crate) fn check(&self, start: usize, len: usize) -> Result<Placed> {
        let (room, placed) = self.locate(start)?;
        if len > room {
            return Err(invalid(format!(
                "{len} bytes at {start:#x} run past the end of its registered buffer ({room} bytes left there)"
            )));
        }
        Ok(placed)
    }

    /// What the registered device memory is and how it moves, for `stat`: per device, its
    /// name, its registered bytes and its staging pool's slab size and count.
    pub(crate) fn devices(&self) -> Vec<(String, usize, usize, usize)> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .iter()
            .map(|pool| {
                let registered = regions
                    .values()
                    .filter(|e| e.device.as_ref().is_some_and(|d| Arc::ptr_eq(d, pool)))
                    .map(|e| e.len)
                    .sum();
                (
                    pool.device().describe(),
                    registered,
                    pool.slab_bytes(),
                    mooring_device::pool::SLABS,
                )
            })
            .collect()
    }

    /// Unregisters everything (the client is closing).
    pub(crate) fn clear(&self) {
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}
