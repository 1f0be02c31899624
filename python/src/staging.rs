//! The local buffer: staging space for the copying calls.
//!
//! Mooncake copies the values of `put`, `get` and their kin through a client-side buffer of
//! `local_buffer_size` bytes; with none, they fail. Mooring writes straight from the caller's
//! bytes, but keeps the contract: a copying write reserves its size here for as long as it
//! runs (waiting while other writes use the space), a value larger than the whole buffer is
//! refused, and with a zero-size buffer every copying call is refused, with what to do. The
//! zero-copy calls (`put_from`, `get_into` and their batches) never touch it.

use mooring_core::{Error, ErrorCode, Result};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Space is counted in pages, so a `u32` of permits covers 16 TiB.
const PAGE: u64 = 4096;

/// The staging budget of one client.
pub(crate) struct Staging {
    capacity: u64,
    pages: Semaphore,
}

fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE)
}

impl Staging {
    /// A budget of `capacity` bytes.
    pub(crate) fn new(capacity: u64) -> Staging {
        let count = pages(capacity).min(Semaphore::MAX_PERMITS as u64) as usize;
        Staging {
            capacity,
            pages: Semaphore::new(count),
        }
    }

    /// Checks that a copying call of `bytes` can ever be staged.
    pub(crate) fn check(&self, bytes: u64) -> Result<()> {
        if self.capacity == 0 {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "the local buffer is 0 bytes, so copying calls cannot run: pass local_buffer_size > 0 to setup(), or use put_from/get_into with a registered buffer",
            ));
        }
        if bytes > self.capacity {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{bytes} bytes do not fit the {}-byte local buffer: raise local_buffer_size in setup(), or use put_from/get_into with a registered buffer",
                    self.capacity
                ),
            ));
        }
        Ok(())
    }

    /// Reserves room for `bytes`, waiting while other copying calls hold it.
    pub(crate) async fn reserve(&self, bytes: u64) -> Result<SemaphorePermit<'_>> {
        self.check(bytes)?;
        let count = u32::try_from(pages(bytes).max(1)).unwrap_or(u32::MAX);
        self.pages.acquire_many(count).await.map_err(|_| {
            Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "the client is closing",
            )
        })
    }
}
