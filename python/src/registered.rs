//! The memory regions a program registered with `register_buffer`.
//!
//! Calls that take raw addresses (`put_from`, `get_into` and their batches) read and write
//! only inside these regions: an address outside every region, or a range running past the
//! end of one, is refused with INVALID_PARAMS instead of being dereferenced. Registering is
//! the program's promise that the region stays allocated until it unregisters it.

use std::collections::BTreeMap;
use std::sync::RwLock;

use mooring_core::Result;

use crate::errors::invalid;

/// Registered regions, by start address.
#[derive(Default)]
pub(crate) struct Registered {
    regions: RwLock<BTreeMap<usize, usize>>,
}

impl Registered {
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
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if regions.get(&start) == Some(&len) {
            return Ok(());
        }
        let before = regions.range(..end).next_back();
        if let Some((&s, &l)) = before
            && s + l > start
        {
            return Err(invalid(format!(
                "{len} bytes at {start:#x} overlap the registered buffer of {l} bytes at {s:#x}: unregister it first"
            )));
        }
        regions.insert(start, len);
        Ok(())
    }

    /// Unregisters the region starting at `start`.
    pub(crate) fn unregister(&self, start: usize) -> Result<()> {
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        regions.remove(&start).map(|_| ()).ok_or_else(|| {
            invalid(format!(
                "no buffer is registered at {start:#x} (give the address register_buffer was given)"
            ))
        })
    }

    /// How many bytes from `start` to the end of the registered region containing it.
    pub(crate) fn room_at(&self, start: usize) -> Result<usize> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        match regions.range(..=start).next_back() {
            Some((&s, &l)) if start < s + l => Ok(s + l - start),
            _ => Err(invalid(format!(
                "address {start:#x} is not inside a registered buffer: call register_buffer(ptr, size) first"
            ))),
        }
    }

    /// Checks that `len` bytes at `start` lie inside one registered region.
    pub(crate) fn check(&self, start: usize, len: usize) -> Result<()> {
        let room = self.room_at(start)?;
        if len > room {
            return Err(invalid(format!(
                "{len} bytes at {start:#x} run past the end of its registered buffer ({room} bytes left there)"
            )));
        }
        Ok(())
    }

    /// Unregisters everything (the client is closing).
    pub(crate) fn clear(&self) {
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}
