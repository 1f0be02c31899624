//! Segment memory in a sealed memfd: the node maps it once and hands the descriptor to
//! clients on its host, which map the same pages.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::transport::SegmentMemory;

/// The seals a segment's memfd carries: its size is fixed for good, so no holder of the
/// descriptor can make another's mapping fault by truncating it.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Bytes after a segment in its memfd: a page whose first 8-byte-aligned word holds the
/// data-server key the segment is exported under now (0: none). A client checks it around every transfer, so a
/// mapping received for an earlier mount stops working the moment the node exports the memory
/// anew (a remount, after which the master hands its ranges to other writers), as the earlier
/// key stops working on every other transport.
const CONTROL: usize = 4096;

/// A node's segment in shared memory.
pub struct SharedMemory {
    fd: OwnedFd,
    map: Mapping,
}

impl SharedMemory {
    /// `len` bytes of fresh shared memory, optionally with every page touched now.
    pub fn new(len: usize, prefault: bool) -> Result<SharedMemory> {
        if len == 0 {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "segment size is zero",
            ));
        }
        let fd = memfd(len + CONTROL)?;
        let map = Mapping::new(fd.as_fd(), len + CONTROL)?;
        if prefault {
            map.prefault();
        }
        Ok(SharedMemory { fd, map })
    }

    /// The memfd (to hand to clients on this host).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A segment view kept alive by this memory.
    pub fn into_segment(self) -> SegmentMemory {
        let (ptr, len) = (self.map.ptr, self.map.data_len());
        // SAFETY: the mapping lives until the last clone of the owner drops.
        unsafe { SegmentMemory::new(ptr, len, Arc::new(self)) }
    }
}

/// The owner of `memory` if it is shared memory (its descriptor can be handed out).
pub(crate) fn shared(memory: &SegmentMemory) -> Option<&SharedMemory> {
    let owner: &(dyn std::any::Any + Send + Sync) = &**memory.owner();
    owner.downcast_ref::<SharedMemory>()
}

/// The word holding the key `memory` is exported under, if it is shared memory (the node's
/// or a client's mapping of it).
fn export_word(memory: &SegmentMemory) -> Option<&AtomicU64> {
    let owner: &(dyn std::any::Any + Send + Sync) = &**memory.owner();
    let map = match owner.downcast_ref::<SharedMemory>() {
        Some(shared) => &shared.map,
        None => owner.downcast_ref::<Mapping>()?,
    };
    Some(map.export_word())
}

/// Records that `memory` is exported under `key` from now on.
pub(crate) fn set_export_key(memory: &SegmentMemory, key: u64) {
    if let Some(word) = export_word(memory) {
        word.store(key, Ordering::Release);
    }
}

/// Records that `memory` is no longer exported under `key` (if that is still its key).
pub(crate) fn clear_export_key(memory: &SegmentMemory, key: u64) {
    if let Some(word) = export_word(memory) {
        let _ = word.compare_exchange(key, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The key the node exports `memory` under now (0: none), if it is shared memory.
pub(crate) fn export_key(memory: &SegmentMemory) -> Option<u64> {
    export_word(memory).map(|word| word.load(Ordering::Acquire))
}

fn last_os_error(what: &str) -> Error {
    Error::new(
        ErrorCode::INTERNAL_ERROR,
        format!("{what}: {}", std::io::Error::last_os_error()),
    )
}

/// A sealed memfd of `len` bytes.
fn memfd(len: usize) -> Result<OwnedFd> {
    // SAFETY: the name is a NUL-terminated literal; the result is checked.
    let raw = unsafe {
        libc::memfd_create(
            c"mooring-segment".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return Err(last_os_error("cannot create a memfd for the segment"));
    }
    // SAFETY: `raw` is a descriptor this call just opened and nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = libc::off_t::try_from(len)
        .map_err(|_| Error::new(ErrorCode::INVALID_PARAMS, "segment size too large"))?;
    // SAFETY: plain syscalls on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(last_os_error(&format!(
            "cannot size the segment's memfd to {len} bytes (is /dev/shm's limit lower?)"
        )));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(last_os_error("cannot seal the segment's memfd"));
    }
    Ok(fd)
}

/// A segment received from a node: checks that `fd` is a sealed memfd of at least `len`
/// bytes, then maps it. A descriptor that fails the checks is refused, since a mapping past
/// the end of a file (or of one that may shrink) faults when touched.
pub(crate) fn map_received(fd: OwnedFd, len: usize) -> Result<SegmentMemory> {
    let refuse = |why: String| {
        Error::new(
            ErrorCode::TRANSFER_FAIL,
            format!("the node's shared memory cannot be used: {why}"),
        )
    };
    // SAFETY: a plain syscall on a descriptor we own.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(refuse("its memfd is not sealed against shrinking".into()));
    }
    // SAFETY: `stat` is plain data filled by the kernel.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on a descriptor we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(refuse(format!(
            "fstat: {}",
            std::io::Error::last_os_error()
        )));
    }
    let Some(total) = len.checked_add(CONTROL).filter(|_| len > 0) else {
        return Err(refuse(format!("the offer says {len} bytes")));
    };
    if (stat.st_size as u64) < total as u64 {
        return Err(refuse(format!(
            "it holds {} bytes, the offer says {len} (and {CONTROL} after them)",
            stat.st_size
        )));
    }
    let map = Arc::new(Mapping::new(fd.as_fd(), total)?);
    // Populating a page the node never touched would allocate it, charged to this process
    // (its container's memory limit): only a segment the node backed in full (it prefaulted)
    // is populated, which then costs this process page tables only.
    if fully_backed(&stat, total) {
        populate_in_background(Arc::downgrade(&map));
    }
    let (ptr, len) = (map.ptr, map.data_len());
    // SAFETY: the mapping lives until the last clone of the owner drops (the descriptor may
    // close now: a mapping keeps its pages).
    Ok(unsafe { SegmentMemory::new(ptr, len, map) })
}

/// Whether the memfd `stat` describes has memory behind each of its first `len` bytes.
fn fully_backed(stat: &libc::stat, len: usize) -> bool {
    // `st_blocks` counts 512-byte units of memory the file holds.
    (stat.st_blocks as u64).saturating_mul(512) >= len as u64
}

/// Bytes populated at a time in the background.
const POPULATE_STEP: usize = 64 << 20;

/// Fills in the page tables of a fresh mapping on a helper thread, so transfers do not each
/// take a page fault per 4 KiB the first time they touch a page (shared memory rarely gets
/// huge pages). Stops early if the mapping is dropped; a kernel without
/// `MADV_POPULATE_WRITE` (before 5.14) just leaves the faults to the transfers.
fn populate_in_background(map: std::sync::Weak<Mapping>) {
    if cfg!(madsim) {
        // The simulation runs on one thread: its transfers take the faults.
        return;
    }
    let _ = std::thread::Builder::new()
        .name("mooring-shm-populate".into())
        .spawn(move || {
            let mut offset = 0;
            loop {
                let Some(map) = map.upgrade() else { return };
                if offset >= map.len {
                    return;
                }
                let len = POPULATE_STEP.min(map.len - offset);
                // SAFETY: a range inside the live mapping (held by `map` for the call).
                let done = unsafe {
                    libc::madvise(
                        map.ptr.as_ptr().add(offset).cast(),
                        len,
                        libc::MADV_POPULATE_WRITE,
                    )
                };
                if done != 0 {
                    return;
                }
                offset += len;
            }
        });
}

/// A shared, writable mapping of a memfd.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value; concurrent access discipline is the protocol's
// (see SegmentMemory).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping> {
        // SAFETY: a shared mapping of `len` bytes of a descriptor checked to be that long; no
        // address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_os_error(&format!(
                "cannot map {len} bytes of shared memory"
            )));
        }
        // SAFETY: the range just mapped. Huge pages are a hint (shmem may refuse them).
        unsafe {
            libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
        }
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned null"),
            len,
        })
    }

    /// Bytes before the control page: the segment's own.
    fn data_len(&self) -> usize {
        self.len - CONTROL
    }

    /// The control page's export-key word: its first 8 bytes at an offset that is a
    /// multiple of 8 (a segment may be any number of bytes long, an atomic must be aligned).
    fn export_word(&self) -> &AtomicU64 {
        let at = self.data_len().next_multiple_of(8);
        // SAFETY: every mapping is of a segment and its control page (`len` includes it), and
        // `at` is at most 7 bytes into that page, so `at..at + 8` lies inside the mapping; the
        // mapping starts page-aligned, so the word is 8-byte aligned. It is only ever
        // accessed atomically, by this process and by others mapping the same memfd.
        unsafe { &*self.ptr.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// Touches one byte per page so the kernel backs the whole range now.
    fn prefault(&self) {
        for offset in (0..self.len).step_by(4096) {
            // SAFETY: offset < len, inside the mapping; volatile so it is not optimised away.
            unsafe { self.ptr.as_ptr().add(offset).write_volatile(0) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `new`; no view outlives the owner.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
        fd.try_clone_to_owned().unwrap()
    }

    #[test]
    fn a_second_mapping_sees_the_same_bytes() {
        let memory = SharedMemory::new(1 << 20, true).unwrap();
        let fd = dup(memory.fd());
        let node = memory.into_segment();
        assert!(shared(&node).is_some());
        let client = map_received(fd, 1 << 20).unwrap();
        assert!(node.copy_in(node.base() + 4096, b"same pages"));
        let mut got = [0u8; 10];
        assert!(client.copy_out(client.base() + 4096, &mut got));
        assert_eq!(&got, b"same pages");
        assert!(client.copy_in(client.base() + 8, b"back"));
        let mut back = [0u8; 4];
        assert!(node.copy_out(node.base() + 8, &mut back));
        assert_eq!(&back, b"back");
    }

    #[test]
    fn only_a_segment_the_node_backed_in_full_is_populated_by_clients() {
        let stat = |memory: &SharedMemory| {
            // SAFETY: plain data, filled by the kernel for a descriptor we hold.
            let mut stat: libc::stat = unsafe { std::mem::zeroed() };
            assert_eq!(
                unsafe { libc::fstat(memory.fd().as_raw_fd(), &mut stat) },
                0
            );
            stat
        };
        let total = (1 << 20) + CONTROL;
        let prefaulted = SharedMemory::new(1 << 20, true).unwrap();
        assert!(fully_backed(&stat(&prefaulted), total));
        let sparse = SharedMemory::new(1 << 20, false).unwrap();
        assert!(!fully_backed(&stat(&sparse), total));
        let segment = sparse.into_segment();
        assert!(segment.copy_in(segment.base(), &[1u8; 8192]));
        let touched = shared(&segment).unwrap();
        assert!(!fully_backed(&stat(touched), total), "two pages of many");
    }

    #[test]
    fn a_segment_of_any_length_has_an_aligned_export_word() {
        for len in [1, 7, 1001, (1 << 16) + 3] {
            let memory = SharedMemory::new(len, false).unwrap();
            let fd = dup(memory.fd());
            let node = memory.into_segment();
            let word = export_word(&node).expect("shared memory has one");
            assert_eq!(std::ptr::from_ref(word).addr() % 8, 0, "{len}-byte segment");
            let client = map_received(fd, len).unwrap();
            set_export_key(&node, 5);
            assert_eq!(export_key(&client), Some(5), "{len}-byte segment");
        }
    }

    #[test]
    fn a_client_mapping_sees_the_key_the_node_exports_under_now() {
        let memory = SharedMemory::new(1 << 16, false).unwrap();
        let fd = dup(memory.fd());
        let node = memory.into_segment();
        let client = map_received(fd, 1 << 16).unwrap();
        assert_eq!(
            client.len(),
            1 << 16,
            "the control page is not the segment's"
        );
        assert_eq!(export_key(&client), Some(0));
        set_export_key(&node, 11);
        assert_eq!(export_key(&client), Some(11));
        clear_export_key(&node, 7);
        assert_eq!(
            export_key(&client),
            Some(11),
            "only the current key is cleared"
        );
        set_export_key(&node, 12);
        clear_export_key(&node, 11);
        assert_eq!(export_key(&client), Some(12), "a remount's key stays");
        clear_export_key(&node, 12);
        assert_eq!(export_key(&client), Some(0));
        // Writing the whole segment leaves the key alone.
        assert!(client.copy_in(client.base(), &vec![0xFF; 1 << 16]));
        set_export_key(&node, 13);
        assert!(client.copy_in(client.base(), &vec![0xEE; 1 << 16]));
        assert_eq!(export_key(&node), Some(13));
        assert!(!client.copy_in(client.base() + 1, &vec![0; 1 << 16]));
    }

    #[test]
    fn unsealed_short_or_foreign_descriptors_are_refused() {
        let memory = SharedMemory::new(8192, false).unwrap();
        let err = map_received(dup(memory.fd()), 16384).err().unwrap();
        assert!(err.to_string().contains("the offer says 16384"), "{err}");
        assert!(map_received(dup(memory.fd()), 0).is_err());
        // SAFETY: a plain memfd without seals.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just opened.
        let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizing our own memfd.
        assert_eq!(unsafe { libc::ftruncate(unsealed.as_raw_fd(), 8192) }, 0);
        let err = map_received(unsealed, 8192).err().unwrap();
        assert!(err.to_string().contains("not sealed"), "{err}");
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(map_received(OwnedFd::from(file), 4096).is_err());
        assert!(SharedMemory::new(0, false).is_err());
        let owner = Arc::new(std::sync::Mutex::new(vec![0u8; 64]));
        let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
        // SAFETY: the vector lives as long as its owner handle.
        let private = unsafe { SegmentMemory::new(ptr, 64, owner.clone()) };
        assert!(
            shared(&private).is_none(),
            "only memfd-backed memory is handed out"
        );
        assert!(shared(&memory.into_segment()).is_some());
    }
}
