//! Mooring's SSD tier on real disks.
//!
//! - [`PosixDisk`]: the core's [`Disk`](mooring_core::disk::Disk) trait over positional
//!   `pread`/`pwrite` on a directory, buffered or with `O_DIRECT` (alignment read from
//!   `statx`, never assumed);
//! - [`record`]: the checksummed on-disk record every backend stores, so a torn or corrupt
//!   record is detected and never served;
//! - [`FilePerKey`]: the file-per-key backend (two levels of hashed directories, atomic
//!   replace, recovery scan), written against the `Disk` trait so the simulated disk drives
//!   the same code under madsim.
//!
//! - [`UringDisk`]: the same over io_uring (one ring on a dedicated thread, submissions
//!   batched up to the queue depth); `Unsupported` where io_uring is not available, so
//!   callers fall back to [`PosixDisk`].
//!
//! The node's side of offloading, staging and disk eviction is `mooring::disk_tier`; the policy
//! is the core's. The bucket and offset-allocator backends are not built yet (see the SSD-tier
//! issue's notes).

mod aligned;
pub mod backend;
mod file_per_key;
mod paths;
#[cfg(not(madsim))]
mod posix;
pub mod record;
#[cfg(all(target_os = "linux", not(madsim)))]
mod uring;

pub use aligned::AlignedBuf;
pub use backend::{Backend, Held, Item, Recovered};
pub use file_per_key::{FilePerKey, Stored};
#[cfg(not(madsim))]
pub use posix::{IoMode, PosixDisk};
#[cfg(all(target_os = "linux", not(madsim)))]
pub use uring::UringDisk;
