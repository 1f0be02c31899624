//! Readers' loads: a disk copy read straight into a slot of the staging buffer (the slot is
//! lent to the disk as the read's buffer), for the reader to pull with a one-sided read and
//! unstage.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use mooring_core::disk_copies::ReadTicket;
use mooring_core::staging::StagingSlots;
use mooring_core::{Error, ErrorCode, Result};
use mooring_disk::IoBuf;
use mooring_disk::backend::read_len;
use mooring_proto::transport::{BoxFuture, SegmentMemory, Stager};
use mooring_proto::wire::StagedSlot;
use tracing::warn;

use super::{TierInner, io_error};
use crate::coverage::{self, Path};

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

/// A staging slot lent to a disk read as its buffer's lender: the read owns the slot until
/// the disk drops the buffer, which gives the slot back, unless the load finished and the
/// slot went to its reader. So a slot is never reused while the disk may still write into it,
/// even if the stage is cancelled mid-read (the disk drops the buffer only once the transfer
/// is over) or the disk fails (an io_uring disk then keeps the buffer for ever, and the slot
/// is never reused).
struct SlotLoan {
    slots: Arc<Mutex<StagingSlots>>,
    id: u64,
    /// Keeps the staging memory mapped while the slot is lent.
    _memory: SegmentMemory,
    /// The load finished and the slot is its reader's.
    loaded: bool,
}

impl Drop for SlotLoan {
    fn drop(&mut self) {
        if !self.loaded {
            // Nothing writes into the slot any more: it is free again.
            lock_slots(&self.slots).abandon(self.id);
        }
    }
}

fn lock_slots(slots: &Mutex<StagingSlots>) -> MutexGuard<'_, StagingSlots> {
    // Every update of the slots completes before the lock is released.
    slots.lock().unwrap_or_else(|e| e.into_inner())
}

impl Stager for TierInner {
    fn stage(&self, object: String, write: u64, size: u64) -> BoxFuture<'_, Result<StagedSlot>> {
        Box::pin(async move {
            let ticket = self.copies().begin_read(&object, write, size);
            if ticket.is_err()
                && let Some(other) = self.copies().get(&object)
            {
                coverage::hit(if other.size == size {
                    Path::DISK_OTHER_VERSION_SAME_SIZE
                } else {
                    Path::DISK_OTHER_VERSION
                });
            }
            let reading = Reading {
                ticket: Some(ticket?),
                tier: self,
            };
            let len = read_len(&object, size, self.store.alignment());
            let (addr, buf) = self.lend_slot(len)?;
            // Straight from the disk into the slot. If this future is dropped meanwhile, the
            // disk keeps the slot's buffer until its transfer is over, then drops it, which
            // gives the slot back.
            let (buf, read) = self.store.read(&object, write, buf).await;
            drop(reading);
            // On error, dropping `buf` gives the slot back (or, if the disk kept it, nothing).
            let value = match self.map_read(&object, write, read) {
                Ok(value) if value.len() as u64 == size => value,
                Ok(_) => {
                    return Err(Error::new(
                        ErrorCode::OBJECT_NOT_FOUND,
                        format!("the disk copy of {object:?} is of another value"),
                    ));
                }
                Err(e) => return Err(e),
            };
            let mut loan = buf
                .take_lender()
                .ok()
                .and_then(|lender| lender.downcast::<SlotLoan>().ok())
                .ok_or_else(|| {
                    Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        "the disk handed back another buffer than the staging slot",
                    )
                })?;
            let mut slots = self.slots();
            slots.loaded(loan.id, self.clock.now());
            loan.loaded = true;
            Ok(StagedSlot {
                key: self.staging.key,
                rdma_key: self.staging.rdma_key,
                addr: addr + value.start as u64,
                len: size,
                slot: loan.id,
                ttl_ms: slots.ttl().as_millis(),
            })
        })
    }

    fn unstage(&self, slot: u64) {
        self.slots().unstage(slot);
    }
}

impl TierInner {
    fn slots(&self) -> MutexGuard<'_, StagingSlots> {
        lock_slots(&self.staging.slots)
    }

    /// A staging slot of `len` bytes, aligned for the disk, lent as a disk buffer: its address
    /// and the buffer. The slot's TTL starts when it is loaded.
    fn lend_slot(&self, len: usize) -> Result<(u64, IoBuf)> {
        let align = self.store.alignment().max(1) as u64;
        let memory = &self.staging.memory;
        let mut slots = self.slots();
        let reclaimed = slots.reclaimed();
        let slot = slots.allocate(len as u64, align, memory.base(), self.clock.now());
        if slot.is_none() || slots.reclaimed() > reclaimed {
            coverage::hit(Path::STAGING_FULL);
        }
        drop(slots);
        let slot = slot.ok_or_else(|| {
                Error::new(
                    ErrorCode::BUFFER_OVERFLOW,
                    format!(
                        "the node's {}-byte staging buffer has no room for {len} bytes; retry shortly or give the node a larger staging buffer",
                        memory.len()
                    ),
                )
            })?;
        let loan = SlotLoan {
            slots: self.staging.slots.clone(),
            id: slot.id,
            _memory: memory.clone(),
            loaded: false,
        };
        let addr = memory.base() + slot.offset;
        let ptr = memory.range(addr, len as u64).ok_or_else(|| {
            Error::new(ErrorCode::INTERNAL_ERROR, "staging slot outside the buffer")
        })?;
        // SAFETY: `StagingSlots` just handed these `len` bytes (inside the slot, checked by
        // `range`) to this load alone: live slots never overlap, no reader knows the slot yet,
        // and it is freed only by `abandon`, which only the loan's drop calls (unstage and TTL
        // reclaim skip slots still loading). The loan keeps the memory mapped (its
        // `SegmentMemory` clone) and goes with the buffer, so the bytes stay valid and
        // unshared for as long as the buffer or its lender lives. Mapped memory is initialized.
        let buf = unsafe { IoBuf::lend(ptr, len, Box::new(loan)) };
        Ok((addr, buf))
    }

    /// The outcome of reading `object`'s write `version` as the tier reports it.
    fn map_read(
        &self,
        object: &str,
        version: u64,
        read: std::io::Result<Range<usize>>,
    ) -> Result<Range<usize>> {
        read.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                format!("the disk copy of {object:?} is gone: {e}"),
            ),
            std::io::ErrorKind::InvalidData => {
                if self.copies().forget_damaged(object, version) {
                    warn!(%object, version, "disk copy damaged; dropping it");
                    coverage::hit(Path::DISK_COPY_DAMAGED);
                }
                io_error(ErrorCode::FILE_READ_FAIL, "disk copy damaged", e)
            }
            _ => io_error(ErrorCode::FILE_READ_FAIL, "disk read failed", e),
        })
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use std::io;
    use std::sync::Arc;
    use std::time::Duration;

    use mooring_core::disk_copies::DiskCopies;
    use mooring_core::{Checksum, Millis, staging::StagingSlots};
    use mooring_disk::{FilePerKey, IoMode, PosixDisk};
    use mooring_proto::disk::{Disk, IoBuf, IoResult};
    use mooring_proto::transport::{BoxFuture, Stager};
    use tokio::sync::Semaphore;

    use super::super::{DiskTierConfig, Staging, TierInner};
    use crate::clock::Clock;
    use crate::node::memory::MappedMemory;

    /// A disk whose reads, like io_uring's, run on their own (a task that owns the buffer)
    /// and finish only when the test lets them, whether or not anyone still waits.
    struct Gated {
        inner: Arc<dyn Disk>,
        gate: Arc<Semaphore>,
    }

    impl Disk for Gated {
        fn alignment(&self) -> usize {
            self.inner.alignment()
        }
        fn create<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
            self.inner.create(name)
        }
        fn write_at<'a>(
            &'a self,
            name: &'a str,
            offset: u64,
            buf: IoBuf,
        ) -> BoxFuture<'a, IoResult<IoBuf, ()>> {
            self.inner.write_at(name, offset, buf)
        }
        fn read_at<'a>(
            &'a self,
            name: &'a str,
            offset: u64,
            buf: IoBuf,
        ) -> BoxFuture<'a, IoResult<IoBuf, usize>> {
            let (inner, gate, name) = (self.inner.clone(), self.gate.clone(), name.to_string());
            let engine = tokio::spawn(async move {
                let _pass = gate.acquire().await.expect("gate open");
                inner.read_at(&name, offset, buf).await
            });
            Box::pin(async move { engine.await.expect("engine task") })
        }
        fn sync<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
            self.inner.sync(name)
        }
        fn len<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<u64>> {
            self.inner.len(name)
        }
        fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
            self.inner.remove(name)
        }
        fn rename<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, io::Result<()>> {
            self.inner.rename(from, to)
        }
        fn list(&self) -> BoxFuture<'_, io::Result<Vec<String>>> {
            self.inner.list()
        }
    }

    /// A stage cancelled mid-read leaves its slot with the disk: the slot is not reused (the
    /// whole staging buffer cannot be allocated) until the disk finishes the read and drops
    /// the buffer; then it is free, and a new stage of the value works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_stage_keeps_its_slot_until_the_disk_is_done() {
        let dir = std::env::temp_dir().join(format!("mooring-stage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let posix: Arc<dyn Disk> = Arc::new(PosixDisk::open(&dir, IoMode::Buffered).unwrap());
        let gate = Arc::new(Semaphore::new(0));
        let disk: Arc<dyn Disk> = Arc::new(Gated {
            inner: posix,
            gate: gate.clone(),
        });
        let store = FilePerKey::new(disk);
        let value: Vec<u8> = (0..100_000).map(|i| (i % 249) as u8).collect();
        store.put("k", 7, &value).await.unwrap();
        let mut copies = DiskCopies::new();
        copies.insert("k".into(), 7, value.len() as u64, Checksum::of(&value), 1);
        const STAGING: usize = 1 << 20;
        let memory = MappedMemory::new(STAGING, false).unwrap().into_segment();
        let tier = TierInner {
            config: DiskTierConfig::new(&dir),
            store: Arc::new(store),
            copies: std::sync::Mutex::new(copies),
            staging: Staging {
                memory: memory.clone(),
                key: 1,
                rdma_key: None,
                slots: Arc::new(std::sync::Mutex::new(StagingSlots::new(
                    STAGING as u64,
                    Millis(60_000),
                ))),
            },
            clock: Clock::new(),
        };
        let whole = |tier: &TierInner| {
            let mut slots = tier.slots();
            let slot = slots.allocate(STAGING as u64, 1, memory.base(), tier.clock.now());
            slot.map(|s| slots.abandon(s.id)).is_some()
        };
        assert!(whole(&tier), "the buffer starts empty");

        // Cancelled while the disk holds the read.
        let stage = tier.stage("k".into(), 7, value.len() as u64);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), stage)
                .await
                .is_err()
        );
        assert_eq!(tier.slots().live(), 1, "the slot is still the disk's");
        assert!(!whole(&tier), "and cannot be handed out again");
        // The disk finishes the read and drops the buffer: the slot comes back.
        gate.add_permits(1);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while tier.slots().live() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the slot never came back"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(whole(&tier));
        // The copy's read ended with the cancelled stage, so it can be read again.
        gate.add_permits(1);
        let staged = tier.stage("k".into(), 7, value.len() as u64).await.unwrap();
        let mut got = vec![0; value.len()];
        assert!(memory.copy_out(staged.addr, &mut got));
        assert!(got == value);
        tier.unstage(staged.slot);
        assert_eq!(tier.slots().live(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
