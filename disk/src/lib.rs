//! Mooring's SSD tier on real disks.
//!
//! - [`PosixDisk`]: the core's [`Disk`](mooring_proto::disk::Disk) trait over positional
//!   `pread`/`pwrite` on a directory, buffered or with `O_DIRECT` (alignment read from
//!   `statx`, never assumed);
//! - [`UringDisk`]: the same over io_uring (one ring on a dedicated thread, submissions
//!   batched up to the queue depth); `Unsupported` where io_uring is not available, so
//!   callers fall back to [`PosixDisk`];
//! - [`PosixStateDir`]: the master's state directory (journals, snapshots) on a real
//!   directory, owner-only;
//! - [`record`]: the checksummed on-disk record every backend stores, so a torn or corrupt
//!   record is detected and never served;
//! - [`FilePerKey`]: the file-per-key backend (two levels of hashed directories, atomic
//!   replace, recovery scan);
//! - [`Bucket`]: the bucket backend, the default (each put writes one bucket: a data file of
//!   aligned records and a checksummed meta whose rename commits it);
//! - [`OffsetFile`]: the offset-allocator backend (one preallocated `kv_cache.data`, space
//!   managed by the core's offset allocator, the index rebuilt by a recovery scan).
//!
//! Every backend implements [`Backend`] against the `Disk` trait, so the simulated disk drives
//! them too. The node's side of offloading, staging and disk eviction is `mooring::node::disk_tier`;
//! the policy is the core's.

mod aligned;
pub mod backend;
mod bucket;
mod file_per_key;
mod mapped;
mod offset_file;
mod paths;
#[cfg(not(madsim))]
mod posix;
pub mod record;
mod state_dir;
#[cfg(all(target_os = "linux", not(madsim)))]
mod uring;

pub use backend::{Backend, Held, Item, Recovered};
pub use bucket::{BUCKET_BYTES, BUCKET_KEYS, Bucket};
pub use file_per_key::{FilePerKey, Stored};
pub use mooring_proto::disk::IoBuf;
pub use offset_file::{DATA_FILE, OffsetFile};
#[cfg(not(madsim))]
pub use posix::{IoMode, PosixDisk};
pub use record::RecordBuf;
pub use state_dir::PosixStateDir;
#[cfg(all(target_os = "linux", not(madsim)))]
pub use uring::UringDisk;
