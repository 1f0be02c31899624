//! The disk seam: what the SSD tier needs from storage, as a trait the POSIX, io_uring and
//! simulated disks implement, so the same offload code runs on real devices and under the
//! simulator with injected faults.
//!
//! A disk is a flat namespace of files addressed by relative names (`/` separates directory
//! levels; adapters create directories as needed). Data written with [`Disk::write_at`] is
//! visible to reads at once but durable only after [`Disk::sync`] of that file returns: a
//! crash may lose unsynced writes, or keep any prefix of one (a torn write). Namespace changes
//! (create, rename, remove) are durable when they return.
//!
//! **Owned buffers.** Transfers take an [`IoBuf`] by value and hand it back with the result,
//! as foyer's I/O engine does: the engine owns the buffer until the device is done with it,
//! even if the caller's future is dropped first (an io_uring read keeps running in the
//! kernel; the engine drops the buffer only after its completion). So a buffer is never
//! reused, or freed, while the device may still write into it, and callers need no unsafe
//! contract. An [`IoBuf`] is either an aligned heap allocation or memory lent by someone else
//! (a slot of the node's staging buffer), whose owner goes back to the lender only when the
//! buffer is dropped.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::any::Any;
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::transport::BoxFuture;

/// What keeps lent memory valid and, when dropped, gives it back to its lender.
pub type Lender = Box<dyn Any + Send + Sync>;

/// A byte buffer a disk transfer owns while it runs: an aligned heap allocation
/// ([`IoBuf::new`]) or memory lent by its owner ([`IoBuf::lend`]). It has a capacity and a
/// length (at most the capacity): transfers write and read the first `len()` bytes. All of
/// its bytes are always initialized (heap buffers start zeroed).
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    backing: Backing,
}

enum Backing {
    /// Allocated here with this layout.
    Heap(Layout),
    /// Someone else's memory, valid while the lender lives (`None` once taken back).
    Lent(Option<Lender>),
}

// SAFETY: an IoBuf is the only user of its bytes (heap: it owns them; lent: `lend`'s contract
// gives it exclusive access), like a Vec<u8>, and a lender is Send + Sync.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// `len` bytes rounded up to `align` (a power of two; 0 or 1: any), zeroed, at an address
    /// that is a multiple of `align`, as `O_DIRECT` transfers require.
    pub fn new(len: usize, align: usize) -> IoBuf {
        let align = align.max(1);
        assert!(
            align.is_power_of_two(),
            "alignment {align} is not a power of two"
        );
        let len = len.div_ceil(align) * align;
        let layout = Layout::from_size_align(len.max(align), align).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf {
            ptr,
            len,
            cap: len,
            backing: Backing::Heap(layout),
        }
    }

    /// A copy of `data`, zero-padded to a multiple of `align`.
    pub fn copy_of(data: &[u8], align: usize) -> IoBuf {
        let mut buf = IoBuf::new(data.len(), align);
        buf[..data.len()].copy_from_slice(data);
        buf
    }

    /// `cap` bytes of someone else's memory at `ptr`, kept valid by `lender`, which is
    /// dropped with the buffer (or handed back by [`IoBuf::take_lender`]).
    ///
    /// # Safety
    ///
    /// Until `lender` is dropped or taken back, the `cap` bytes at `ptr` must be valid for
    /// reads and writes, initialized, and used by nothing but this buffer (no reference to
    /// them elsewhere, no other transfer into them).
    pub unsafe fn lend(ptr: NonNull<u8>, cap: usize, lender: Lender) -> IoBuf {
        IoBuf {
            ptr,
            len: cap,
            cap,
            backing: Backing::Lent(Some(lender)),
        }
    }

    /// The lender of a lent buffer, taken back without dropping it (the memory stays the
    /// lender's, e.g. a staging slot now loaded for its reader); a heap buffer comes back as
    /// `Err`.
    pub fn take_lender(mut self) -> Result<Lender, IoBuf> {
        if let Backing::Lent(lender) = &mut self.backing {
            return Ok(lender.take().expect("a lent buffer has its lender"));
        }
        Err(self)
    }

    /// The address of the first byte (no reference to the bytes is made).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The address of the first byte, for a device to write through: no reference to the bytes
    /// is made, so it stays valid while another part of the buffer is being written.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes the buffer can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length transfers use (the bytes stay as they are).
    ///
    /// # Panics
    ///
    /// If `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "length {len} past the capacity {}",
            self.cap
        );
        self.len = len;
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points at `cap >= len` initialized bytes this buffer alone uses.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // SAFETY: allocated by `new` with exactly this layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) }
        }
        // A lent buffer drops its lender (if not taken back), which gives the memory back.
    }
}

impl Default for IoBuf {
    /// An empty heap buffer.
    fn default() -> IoBuf {
        IoBuf::new(0, 1)
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.backing {
            Backing::Heap(_) => "heap",
            Backing::Lent(_) => "lent",
        };
        write!(
            f,
            "IoBuf({kind}, {:#x}, {} of {} bytes)",
            self.ptr.as_ptr() as usize,
            self.len,
            self.cap
        )
    }
}

/// A transfer's result and its buffer, handed back.
///
/// If an engine cannot know whether the device still uses a buffer (an io_uring ring that
/// failed with transfers in flight), it keeps the buffer forever rather than hand it back,
/// and returns an empty one with the error: lent memory then never goes back to its lender.
pub type IoResult<B, T> = (B, io::Result<T>);

/// Positional file I/O for the SSD tier.
pub trait Disk: Send + Sync {
    /// Alignment that offsets, lengths and buffers of [`Disk::read_at`] and
    /// [`Disk::write_at`] must have (1: any). Direct-I/O adapters report the device's.
    fn alignment(&self) -> usize;

    /// Creates `name` empty, replacing any file of that name.
    fn create<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>>;

    /// Writes all of `buf` (its `len()` bytes) at `offset`, extending the file if needed, and
    /// hands `buf` back.
    fn write_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, ()>>;

    /// Writes `bufs` back to back from `offset` (each one's length must keep the alignment),
    /// and hands them back. The default writes them one at a time; engines that can have
    /// several in flight do.
    fn write_all_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        bufs: Vec<IoBuf>,
    ) -> BoxFuture<'a, IoResult<Vec<IoBuf>, ()>> {
        Box::pin(async move {
            let mut back = Vec::with_capacity(bufs.len());
            let mut at = offset;
            let mut result = Ok(());
            for buf in bufs {
                if result.is_err() {
                    back.push(buf);
                    continue;
                }
                let len = buf.len() as u64;
                let (buf, written) = self.write_at(name, at, buf).await;
                back.push(buf);
                at += len;
                result = written;
            }
            (back, result)
        })
    }

    /// Reads up to `buf.len()` bytes at `offset` into `buf`; hands it back with how many
    /// (fewer only at the end of the file).
    fn read_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, usize>>;

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

/// Writes a copy of `data` at `offset` (through a buffer aligned for `disk`): for small
/// writes and tests, where one copy does not matter. `data.len()` must keep the alignment.
pub async fn write_copy(disk: &dyn Disk, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
    let mut buf = IoBuf::copy_of(data, disk.alignment());
    buf.set_len(data.len());
    disk.write_at(name, offset, buf).await.1
}

/// Reads up to `dest.len()` bytes at `offset` into `dest` (through a buffer aligned for
/// `disk`) and returns how many: for small reads and tests. `dest.len()` must keep the
/// alignment.
pub async fn read_copy(
    disk: &dyn Disk,
    name: &str,
    offset: u64,
    dest: &mut [u8],
) -> io::Result<usize> {
    let mut buf = IoBuf::new(dest.len(), disk.alignment());
    buf.set_len(dest.len());
    let (buf, read) = disk.read_at(name, offset, buf).await;
    let n = read?;
    dest[..n].copy_from_slice(&buf[..n]);
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn heap_buffers_round_up_and_align() {
        let buf = IoBuf::copy_of(b"hello", 512);
        assert_eq!(buf.len(), 512);
        assert_eq!(buf.as_ptr() as usize % 512, 0);
        assert_eq!(&buf[..5], b"hello");
        assert!(buf[5..].iter().all(|&b| b == 0));
        assert_eq!(IoBuf::new(0, 4096).len(), 0);
        let mut buf = buf;
        buf.set_len(5);
        assert_eq!(&buf[..], b"hello");
        assert_eq!(buf.capacity(), 512);
        assert!(buf.take_lender().is_err());
    }

    /// A lender that records whether it was dropped.
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn lent_buffers_give_their_memory_back_when_dropped_unless_taken_back() {
        let mut memory = vec![7u8; 64];
        let ptr = NonNull::new(memory.as_mut_ptr()).unwrap();
        let dropped = Arc::new(AtomicBool::new(false));
        // SAFETY: `memory` outlives the buffer and is not touched while it lives.
        let mut buf = unsafe { IoBuf::lend(ptr, 64, Box::new(Flag(dropped.clone()))) };
        buf[0] = 1;
        drop(buf);
        assert!(dropped.load(Ordering::SeqCst));
        assert_eq!(memory[0], 1);

        let kept = Arc::new(AtomicBool::new(false));
        let ptr = NonNull::new(memory.as_mut_ptr()).unwrap();
        // SAFETY: as above.
        let buf = unsafe { IoBuf::lend(ptr, 64, Box::new(Flag(kept.clone()))) };
        let lender = buf.take_lender().expect("lent");
        assert!(!kept.load(Ordering::SeqCst), "taken back, not dropped");
        assert!(lender.downcast::<Flag>().is_ok());
        assert!(kept.load(Ordering::SeqCst));
    }
}
