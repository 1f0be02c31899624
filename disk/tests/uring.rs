//! The io_uring disk: concurrent round trips, short reads at the end of a file, durability
//! across reopening, the open-file cache across namespace changes, buffered and direct.

#![cfg(all(target_os = "linux", not(madsim)))]

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mooring_disk::{IoBuf, IoMode, UringDisk};
use mooring_proto::disk::Disk;
use mooring_proto::transport::{MemoryOwner, SegmentMemory};

/// A fresh directory for one test, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "mooring-uring-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The disk, or `None` (with the reason printed) if io_uring or direct I/O is unavailable.
fn open(dir: &TempDir, mode: IoMode) -> Option<UringDisk> {
    match UringDisk::open(&dir.0, mode) {
        Ok(disk) => Some(disk),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("opening {}: {e}", dir.0.display()),
    }
}

/// Copying reads and writes through owned buffers, for brevity.
trait Copying: Disk {
    async fn rd(&self, name: &str, offset: u64, dest: &mut [u8]) -> io::Result<usize> {
        let mut buf = IoBuf::new(dest.len(), self.alignment());
        buf.set_len(dest.len());
        let (buf, read) = self.read_at(name, offset, buf).await;
        let n = read?;
        dest[..n].copy_from_slice(&buf[..n]);
        Ok(n)
    }

    async fn wr(&self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut buf = IoBuf::copy_of(data, self.alignment());
        buf.set_len(data.len());
        self.write_at(name, offset, buf).await.1
    }
}

impl<T: Disk + ?Sized> Copying for T {}

/// Block `i`'s content: `size` bytes that differ from every other block's.
fn pattern(i: usize, size: usize) -> Vec<u8> {
    (0..size)
        .map(|j| (i * 31 + j * 7 + j / 251) as u8)
        .collect()
}

/// Many concurrent writes then reads of distinct blocks (more than the queue depth, so
/// batches fill), a read straddling and one past the end, sync, and a reopen.
async fn round_trips(mode: IoMode) {
    let dir = TempDir::new(&format!("{mode:?}"));
    let Some(disk) = open(&dir, mode) else {
        return;
    };
    let disk = Arc::new(disk);
    let a = disk.alignment();
    let size = 4096usize.div_ceil(a) * a;
    const BLOCKS: usize = 100;
    disk.create("d/blocks").await.unwrap();

    let mut tasks = Vec::new();
    for i in 0..BLOCKS {
        let disk = disk.clone();
        tasks.push(tokio::spawn(async move {
            let data = IoBuf::copy_of(&pattern(i, size), a);
            let (data, written) = disk.write_at("d/blocks", (i * size) as u64, data).await;
            written.unwrap();
            assert!(data[..] == pattern(i, size)[..], "the buffer comes back");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    disk.sync("d/blocks").await.unwrap();
    assert_eq!(disk.len("d/blocks").await.unwrap(), (BLOCKS * size) as u64);

    let mut tasks = Vec::new();
    for i in (0..BLOCKS).rev() {
        let disk = disk.clone();
        tasks.push(tokio::spawn(async move {
            let buf = IoBuf::new(size, a);
            let (buf, read) = disk.read_at("d/blocks", (i * size) as u64, buf).await;
            let n = read.unwrap();
            assert_eq!(n, size);
            assert!(buf[..] == pattern(i, size)[..], "block {i}");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // The whole file in one read, and a read straddling the end.
    let total = BLOCKS * size;
    let mut all = IoBuf::new(total + 3 * size, a);
    assert_eq!(disk.rd("d/blocks", 0, &mut all).await.unwrap(), total);
    for i in 0..BLOCKS {
        assert!(all[i * size..(i + 1) * size] == pattern(i, size)[..]);
    }
    let mut tail = IoBuf::new(2 * size, a);
    let last = ((BLOCKS - 1) * size) as u64;
    assert_eq!(disk.rd("d/blocks", last, &mut tail).await.unwrap(), size);
    assert!(tail[..size] == pattern(BLOCKS - 1, size)[..]);
    // At and past the end: nothing.
    assert_eq!(
        disk.rd("d/blocks", total as u64, &mut tail).await.unwrap(),
        0
    );
    assert_eq!(
        disk.rd("d/blocks", (total + 8 * size) as u64, &mut tail)
            .await
            .unwrap(),
        0
    );

    // Synced data survives the disk (and its I/O thread) going away.
    drop(disk);
    let disk = open(&dir, mode).unwrap();
    let mut again = IoBuf::new(total, a);
    assert_eq!(disk.rd("d/blocks", 0, &mut again).await.unwrap(), total);
    assert!(again[..] == all[..total]);
    let on_disk = std::fs::read(dir.0.join("d/blocks")).unwrap();
    assert!(on_disk[..] == all[..total]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_round_trips() {
    round_trips(IoMode::Buffered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_round_trips() {
    round_trips(IoMode::Direct).await;
}

/// 32 concurrent reads of one file, polled together in one task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_in_one_task() {
    let dir = TempDir::new("join");
    let Some(disk) = open(&dir, IoMode::Buffered) else {
        return;
    };
    disk.create("f").await.unwrap();
    let data: Vec<u8> = (0..32 * 100).map(|i| (i % 253) as u8).collect();
    disk.wr("f", 0, &data).await.unwrap();
    let mut bufs = vec![[0u8; 100]; 32];
    let mut reads = Vec::new();
    for (i, buf) in bufs.iter_mut().enumerate() {
        reads.push(Box::pin(disk.rd("f", (i * 100) as u64, buf)));
    }
    // Poll all of them together, so they are in flight at once.
    let mut done = Vec::new();
    let mut pending: Vec<_> = reads.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        for slot in pending.iter_mut() {
            if let Some(read) = slot
                && let std::task::Poll::Ready(n) = read.as_mut().poll(cx)
            {
                done.push(n.unwrap());
                *slot = None;
            }
        }
        if pending.iter().all(Option::is_none) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    drop(pending);
    assert_eq!(done, vec![100; 32]);
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(buf[..], data[i * 100..(i + 1) * 100]);
    }
    // A short read at the end of the file, unaligned (buffered).
    let mut buf = [0u8; 100];
    assert_eq!(disk.rd("f", 3150, &mut buf).await.unwrap(), 50);
    assert_eq!(buf[..50], data[3150..]);
    // Writes extend the file; an empty write or read is fine.
    disk.wr("f", 4000, b"tail").await.unwrap();
    assert_eq!(disk.len("f").await.unwrap(), 4004);
    disk.wr("f", 0, b"").await.unwrap();
    assert_eq!(disk.rd("f", 0, &mut []).await.unwrap(), 0);
}

/// A large transfer, and the open-file cache across remove, rename and create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_changes_invalidate_open_files() {
    let dir = TempDir::new("namespace");
    let Some(disk) = open(&dir, IoMode::Buffered) else {
        return;
    };
    let big: Vec<u8> = (0..8 << 20).map(|i: usize| (i / 4096 + i) as u8).collect();
    disk.create("a").await.unwrap();
    disk.wr("a", 0, &big).await.unwrap();
    let mut back = vec![0; big.len()];
    assert_eq!(disk.rd("a", 0, &mut back).await.unwrap(), big.len());
    assert!(back == big);

    disk.create("b").await.unwrap();
    disk.wr("b", 0, b"old b").await.unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(disk.rd("b", 0, &mut buf).await.unwrap(), 5);
    // Renaming over `b` must not leave the old `b` open under that name.
    disk.rename("a", "b").await.unwrap();
    assert_eq!(disk.rd("b", 0, &mut buf).await.unwrap(), 16);
    assert_eq!(buf[..], big[..16]);
    for name in ["a", "missing"] {
        assert_eq!(
            disk.rd(name, 0, &mut buf).await.unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            disk.wr(name, 0, b"x").await.unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
    // Re-creating empties the file.
    disk.create("b").await.unwrap();
    assert_eq!(disk.rd("b", 0, &mut buf).await.unwrap(), 0);
    disk.wr("b", 0, b"new").await.unwrap();
    disk.sync("b").await.unwrap();
    assert_eq!(disk.list().await.unwrap(), vec!["b".to_string()]);
    // Removing closes it for the name.
    disk.remove("b").await.unwrap();
    assert_eq!(
        disk.rd("b", 0, &mut buf).await.unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    assert_eq!(
        disk.sync("b").await.unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    assert_eq!(
        disk.remove("b").await.unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    assert_eq!(
        disk.rd("../escape", 0, &mut buf).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert!(disk.list().await.unwrap().is_empty());
}

/// Direct I/O refuses unaligned transfers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_needs_alignment() {
    let dir = TempDir::new("direct-align");
    let Some(disk) = open(&dir, IoMode::Direct) else {
        return;
    };
    let a = disk.alignment();
    assert!(a > 1 && a.is_power_of_two());
    disk.create("f").await.unwrap();
    let block = IoBuf::copy_of(b"x", a);
    assert_eq!(
        disk.wr("f", 1, &block).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        disk.wr("f", 0, &block[..a / 2]).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    disk.wr("f", 0, &block).await.unwrap();
    let mut buf = IoBuf::new(a, a);
    assert_eq!(disk.rd("f", 0, &mut buf).await.unwrap(), a);
    assert_eq!(buf[0], b'x');
}

/// A lender that records when it is dropped (its memory given back).
struct Returned(Arc<AtomicBool>);

impl Drop for Returned {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `len` bytes of `memory` at `offset`, lent as a buffer whose lender marks `returned`.
fn lend(memory: &SegmentMemory, offset: usize, len: usize, returned: &Arc<AtomicBool>) -> IoBuf {
    let ptr = memory
        .range(memory.base() + offset as u64, len as u64)
        .unwrap();
    let lender = (memory.clone(), Returned(returned.clone()));
    // SAFETY: each test lends disjoint ranges, touched by nothing else while lent; the lender
    // keeps the memory alive.
    unsafe { IoBuf::lend(ptr, len, Box::new(lender)) }
}

/// Heap memory as segment memory, as the staging buffer is.
fn segment(len: usize) -> SegmentMemory {
    let mut memory = IoBuf::new(len, 4096);
    let ptr = std::ptr::NonNull::new(memory.as_mut_ptr()).unwrap();
    let owner: MemoryOwner = Arc::new(std::sync::Mutex::new(memory));
    // SAFETY: the heap allocation lives as long as `owner` (moving the IoBuf into the Arc does
    // not move its bytes).
    unsafe { SegmentMemory::new(ptr, len, owner) }
}

/// Reads into a registered buffer land straight in it (direct and buffered), chunked and
/// concurrent; reads elsewhere go straight into their own buffers; both return the file's
/// bytes, and every lent buffer goes back to its lender once the read is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_into_the_registered_buffer_land_in_place() {
    for mode in [IoMode::Buffered, IoMode::Direct] {
        let dir = TempDir::new(&format!("fixed-{mode:?}"));
        let Some(probe) = open(&dir, mode) else {
            return;
        };
        let align = probe.alignment();
        drop(probe);
        let region = segment(4 << 20);
        let disk = UringDisk::open_with_buffer(&dir.0, mode, Some(region.clone())).unwrap();
        assert!(
            disk.has_registered_buffer(),
            "registration failed (see the log)"
        );
        let sizes = [align, 300 << 10, 1 << 20];
        for (i, &size) in sizes.iter().enumerate() {
            let name = format!("f{i}");
            disk.create(&name).await.unwrap();
            let mut block = IoBuf::copy_of(&pattern(i, size), align);
            block.set_len(size);
            disk.write_at(&name, 0, block).await.1.unwrap();
        }
        // Concurrent reads into disjoint parts of the registered region.
        let returned: Vec<Arc<AtomicBool>> = sizes.iter().map(|_| Arc::default()).collect();
        let reads = sizes.iter().enumerate().map(|(i, &size)| {
            let disk = &disk;
            let buf = lend(&region, i << 20, size, &returned[i]);
            async move { disk.read_at(&format!("f{i}"), 0, buf).await }
        });
        for (i, (buf, n)) in futures_util::future::join_all(reads)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(n.unwrap(), sizes[i], "{mode:?} f{i}");
            assert!(buf[..] == pattern(i, sizes[i])[..], "{mode:?} f{i} bytes");
            assert!(!returned[i].load(Ordering::SeqCst), "still the caller's");
            drop(buf);
            assert!(returned[i].load(Ordering::SeqCst), "given back");
        }
        // A read outside the region goes straight into its own buffer and is just as right.
        let (outside, n) = disk.read_at("f2", 0, IoBuf::new(1 << 20, 4096)).await;
        assert_eq!(n.unwrap(), 1 << 20);
        assert!(outside[..] == pattern(2, 1 << 20)[..]);
        drop(disk);
    }
}

/// A read whose future is dropped mid-transfer keeps its buffer until the kernel has finished
/// with it: a lent staging slot is given back only then, never while the kernel may still
/// write into it. The read is from a FIFO, so it stays in flight until the test writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_read_keeps_its_buffer_until_the_kernel_is_done() {
    for registered in [true, false] {
        let dir = TempDir::new(&format!("dropped-{registered}"));
        let region = segment(1 << 20);
        let buffer = registered.then(|| region.clone());
        let disk = match UringDisk::open_with_buffer(&dir.0, IoMode::Buffered, buffer) {
            Ok(disk) => disk,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(disk.has_registered_buffer(), registered);
        let fifo = dir.0.join("fifo");
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);

        let returned = Arc::new(AtomicBool::new(false));
        let buf = lend(&region, 4096, 4096, &returned);
        let read = disk.read_at("fifo", 0, buf);
        // Long enough to open the FIFO and submit the read, which then waits for data.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), read)
                .await
                .is_err(),
            "the read cannot finish before the FIFO has data"
        );
        // The future is gone; the read is not.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !returned.load(Ordering::SeqCst),
            "the slot was given back while the kernel may still write into it"
        );
        // Data arrives (all 4096 bytes: a buffered read continues after a short one until the
        // end of the file, which a FIFO open for writing never reaches): the kernel completes
        // the read into the slot, then the I/O thread drops the buffer, which gives the slot
        // back.
        let late: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        writer.write_all(&late).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !returned.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < deadline, "never given back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut landed = vec![0u8; 4096];
        assert!(region.copy_out(region.base() + 4096, &mut landed));
        assert!(landed == late, "the late read landed in the slot");
        drop(disk);
    }
}
