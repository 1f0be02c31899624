//! The disk seam: what the SSD tier needs from storage, as a trait the POSIX, io_uring and
//! simulated disks implement, so the same offload code runs on real devices and under the
//! simulator with injected faults.
//!
//! A disk is a flat namespace of files addressed by relative names (`/` separates directory
//! levels; adapters create directories as needed). Data written with [`Disk::write_at`] is
//! visible to reads at once but durable only after [`Disk::sync`] of that file returns: a
//! crash may lose unsynced writes, or keep any prefix of one (a torn write). Namespace changes
//! (create, rename, remove) are durable when they return.

use std::io;

use crate::transport::BoxFuture;

/// Positional file I/O for the SSD tier.
pub trait Disk: Send + Sync {
    /// Alignment that offsets, lengths and buffers of [`Disk::read_at`] and
    /// [`Disk::write_at`] must have (1: any). Direct-I/O adapters report the device's.
    fn alignment(&self) -> usize;

    /// Creates `name` empty, replacing any file of that name.
    fn create<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>>;

    /// Writes all of `data` at `offset`, extending the file if needed.
    fn write_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        data: &'a [u8],
    ) -> BoxFuture<'a, io::Result<()>>;

    /// Reads up to `buf.len()` bytes at `offset`; returns how many (fewer only at the end of
    /// the file).
    fn read_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, io::Result<usize>>;

    /// Makes every write to `name` so far durable.
    fn sync<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>>;

    /// The file's length in bytes.
    fn len<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<u64>>;

    /// Removes `name` (`NotFound` if absent).
    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>>;

    /// Renames `from` to `to`, replacing `to` if it exists.
    fn rename<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, io::Result<()>>;

    /// Every file's name, sorted.
    fn list(&self) -> BoxFuture<'_, io::Result<Vec<String>>>;
}
