//! A whole file mapped read-only: a snapshot restored in place from the page cache, not from a
//! second copy of it in fresh memory (gigabytes for tens of millions of objects; on a VM whose
//! host backs guest memory lazily, first touches of fresh memory are most of a restart).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use mooring_proto::state_dir::WholeFile;

/// A read-only, private mapping of a whole file, unmapped when dropped.
pub(crate) struct MappedFile {
    start: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone: sharing or sending it
// shares or sends immutable bytes.
unsafe impl Send for MappedFile {}
// SAFETY: as above.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Maps all of `file`, its pages read in at once; `None` for an empty file (which cannot
    /// be mapped).
    pub(crate) fn map(file: &File) -> io::Result<Option<MappedFile>> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file too large to map"))?;
        if len == 0 {
            return Ok(None);
        }
        // SAFETY: a fresh mapping (no address asked for) of `len` bytes of an open file,
        // read-only and private; the result is checked before use.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if start == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = NonNull::new(start.cast::<u8>()).expect("mmap never maps at address zero");
        Ok(Some(MappedFile { start, len }))
    }
}

impl WholeFile for MappedFile {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `start` maps `len` readable bytes until `self` is dropped. The files read
        // this way are written whole and renamed into place, never changed or truncated in
        // place, so the bytes stay as mapped.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no borrow of it outlives `self`.
        unsafe {
            libc::munmap(self.start.as_ptr().cast(), self.len);
        }
    }
}
