//! Readers' loads: a disk copy read straight into a slot of the staging buffer, for the reader
//! to pull with a one-sided read and unstage.

use mooring_core::disk_copies::ReadTicket;
use mooring_core::{Error, ErrorCode, Result};
use mooring_disk::backend::read_len;
use mooring_proto::transport::{BoxFuture, Stager};
use mooring_proto::wire::StagedSlot;
use tracing::warn;

use super::{TierInner, io_error};

/// A read of a disk copy in progress; ends when dropped (also when its stage is cancelled),
/// so an evicted copy's deletion never waits on a read that is gone.
struct Reading<'a> {
    tier: &'a TierInner,
    ticket: Option<ReadTicket>,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.tier.copies().end_read(ticket);
        }
    }
}

impl Stager for TierInner {
    fn stage(&self, object: String, write: u64, size: u64) -> BoxFuture<'_, Result<StagedSlot>> {
        Box::pin(async move {
            let reading = Reading {
                ticket: Some(self.copies().begin_read(&object, write, size)?),
                tier: self,
            };
            let len = read_len(&object, size, self.store.alignment());
            let (slot, addr) = self.allocate_slot(len)?;
            let loaded = self.load_into(&object, write, addr, len).await;
            drop(reading);
            let value = match loaded {
                Ok(value) if value.len() as u64 == size => value,
                Ok(_) => {
                    self.slots().abandon(slot);
                    return Err(Error::new(
                        ErrorCode::OBJECT_NOT_FOUND,
                        format!("the disk copy of {object:?} is of another value"),
                    ));
                }
                Err(e) => {
                    self.slots().abandon(slot);
                    return Err(e);
                }
            };
            let mut slots = self.slots();
            slots.loaded(slot, self.clock.now());
            Ok(StagedSlot {
                key: self.staging.key,
                addr: addr + value.start as u64,
                len: size,
                slot,
                ttl_ms: slots.ttl().as_millis(),
            })
        })
    }

    fn unstage(&self, slot: u64) {
        self.slots().unstage(slot);
    }
}

impl TierInner {
    fn slots(&self) -> std::sync::MutexGuard<'_, mooring_core::staging::StagingSlots> {
        self.staging.slots.lock().expect("slots lock")
    }

    /// A staging slot of `len` bytes, aligned for the disk: (slot id, address). Its TTL
    /// starts when it is loaded.
    fn allocate_slot(&self, len: usize) -> Result<(u64, u64)> {
        let align = self.store.alignment().max(1) as u64;
        let base = self.staging.memory.base();
        let slot = self
            .slots()
            .allocate(len as u64, align, base, self.clock.now())
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::BUFFER_OVERFLOW,
                    format!(
                        "the node's {}-byte staging buffer has no room for {len} bytes; retry shortly or give the node a larger staging buffer",
                        self.staging.memory.len()
                    ),
                )
            })?;
        Ok((slot.id, base + slot.offset))
    }

    /// Reads the record of `object`'s write `version` straight into the staging buffer at
    /// `addr` (`len` bytes) and returns where its value lies, relative to `addr`.
    async fn load_into(
        &self,
        object: &str,
        version: u64,
        addr: u64,
        len: usize,
    ) -> Result<std::ops::Range<usize>> {
        let start = self.staging.memory.range(addr, len as u64).ok_or_else(|| {
            Error::new(ErrorCode::INTERNAL_ERROR, "staging slot outside the buffer")
        })?;
        // SAFETY: the slot is this stage's alone until it is loaded (reclaim and unstage skip
        // slots still loading), and the staging memory lives as long as `self`.
        let buf = unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), len) };
        let read = self.store.read(object, version, buf).await;
        read.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                format!("the disk copy of {object:?} is gone: {e}"),
            ),
            std::io::ErrorKind::InvalidData => {
                if self.copies().forget_damaged(object, version) {
                    warn!(%object, version, "disk copy damaged; dropping it");
                }
                io_error(ErrorCode::FILE_READ_FAIL, "disk copy damaged", e)
            }
            _ => io_error(ErrorCode::FILE_READ_FAIL, "disk read failed", e),
        })
    }
}
