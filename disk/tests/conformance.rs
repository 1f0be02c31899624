//! Every Disk adapter behaves the same: the POSIX one buffered and direct, and the simulated
//! disk the simulation uses.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use mooring_disk::{IoBuf, IoMode, PosixDisk};
use mooring_proto::disk::Disk;
use mooring_transport_sim::disk::SimDisk;

/// A fresh directory for one test, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "mooring-disk-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
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

/// `data` as the disk needs it: aligned and padded to its alignment.
fn block(disk: &dyn Disk, data: &[u8]) -> IoBuf {
    IoBuf::copy_of(data, disk.alignment())
}

/// A lender that counts its drops.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

async fn conformance(disk: &dyn Disk) {
    let a = disk.alignment();
    disk.create("x/y/data").await.unwrap();
    assert_eq!(disk.len("x/y/data").await.unwrap(), 0);
    // Owned buffers go in and come back, the same ones.
    let first = block(disk, b"first block");
    let first_at = first.as_ptr();
    let (first, written) = disk.write_at("x/y/data", 0, first).await;
    written.unwrap();
    assert_eq!(first.as_ptr(), first_at, "write_at hands its buffer back");
    let second = block(disk, b"second");
    let (second, written) = disk.write_at("x/y/data", first.len() as u64, second).await;
    written.unwrap();
    disk.sync("x/y/data").await.unwrap();
    let total = first.len() + second.len();
    assert_eq!(disk.len("x/y/data").await.unwrap(), total as u64);

    let back = IoBuf::new(total, a);
    let back_at = back.as_ptr();
    let (back, read) = disk.read_at("x/y/data", 0, back).await;
    assert_eq!(read.unwrap(), total);
    assert_eq!(back.as_ptr(), back_at, "read_at hands its buffer back");
    assert_eq!(&back[..11], b"first block");
    assert_eq!(&back[first.len()..first.len() + 6], b"second");
    // Reading past the end returns what is there.
    let more = IoBuf::new(total + 4 * a.max(512), a);
    let (_, read) = disk.read_at("x/y/data", 0, more).await;
    assert_eq!(read.unwrap(), total);

    // Several buffers back to back in one write, and a read into lent memory, which goes
    // back to its lender once the disk is done with it.
    disk.create("v").await.unwrap();
    let parts = vec![
        block(disk, b"one"),
        block(disk, b"two"),
        block(disk, b"three"),
    ];
    let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    let (parts, written) = disk.write_all_at("v", 0, parts).await;
    written.unwrap();
    assert_eq!(parts.len(), 3, "write_all_at hands every buffer back");
    let whole: usize = lens.iter().sum();
    let mut memory = IoBuf::new(whole, a.max(4096));
    let ptr = std::ptr::NonNull::new(memory.as_mut_ptr()).unwrap();
    let returned = Arc::new(AtomicUsize::new(0));
    // SAFETY: `memory` outlives the lent buffer and is not touched until it is dropped.
    let lent = unsafe { IoBuf::lend(ptr, whole, Box::new(Counted(returned.clone()))) };
    let (lent, read) = disk.read_at("v", 0, lent).await;
    assert_eq!(read.unwrap(), whole);
    assert_eq!(returned.load(Ordering::SeqCst), 0, "still lent");
    drop(lent);
    assert_eq!(returned.load(Ordering::SeqCst), 1, "given back");
    assert_eq!(&memory[..3], b"one");
    assert_eq!(&memory[lens[0]..lens[0] + 3], b"two");
    assert_eq!(&memory[lens[0] + lens[1]..lens[0] + lens[1] + 5], b"three");
    disk.remove("v").await.unwrap();

    // More buffers than one vectored write takes, of different sizes, back to back.
    disk.create("w").await.unwrap();
    let unit = a.max(8);
    let parts: Vec<IoBuf> = (0..1100)
        .map(|i| {
            let mut part = IoBuf::new(unit * (1 + i % 3), a);
            part.fill((i % 251) as u8);
            part
        })
        .collect();
    let whole: usize = parts.iter().map(|p| p.len()).sum();
    let (parts, written) = disk.write_all_at("w", unit as u64, parts).await;
    written.unwrap();
    let (back, read) = disk.read_at("w", unit as u64, IoBuf::new(whole, a)).await;
    assert_eq!(read.unwrap(), whole);
    let mut at = 0;
    for (i, part) in parts.iter().enumerate() {
        assert!(
            back[at..at + part.len()]
                .iter()
                .all(|&b| b == (i % 251) as u8),
            "part {i}"
        );
        at += part.len();
    }
    disk.remove("w").await.unwrap();

    disk.create("z").await.unwrap();
    disk.rename("x/y/data", "z").await.unwrap();
    assert_eq!(disk.len("z").await.unwrap(), total as u64);
    assert_eq!(
        disk.len("x/y/data").await.unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    disk.create("a/b").await.unwrap();
    assert_eq!(
        disk.list().await.unwrap(),
        vec!["a/b".to_string(), "z".to_string()]
    );
    disk.remove("z").await.unwrap();
    assert_eq!(
        disk.remove("z").await.unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    assert_eq!(disk.list().await.unwrap(), vec!["a/b".to_string()]);
}

#[tokio::test]
async fn posix_buffered() {
    let dir = TempDir::new("buffered");
    let disk = PosixDisk::open(&dir.0, IoMode::Buffered).unwrap();
    assert_eq!(disk.alignment(), 1);
    conformance(&disk).await;
}

#[tokio::test]
async fn posix_direct() {
    let dir = TempDir::new("direct");
    let disk = match PosixDisk::open(&dir.0, IoMode::Direct) {
        Ok(disk) => disk,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            eprintln!("skipping the direct-I/O conformance test: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert!(disk.alignment().is_power_of_two() && disk.alignment() > 1);
    conformance(&disk).await;
    // Direct I/O refuses unaligned transfers with a clear error instead of EINVAL.
    disk.create("u").await.unwrap();
    let buf = IoBuf::copy_of(b"x", disk.alignment());
    let (buf, written) = disk.write_at("u", 1, buf).await;
    let err = written.unwrap_err();
    assert_eq!(buf.len(), disk.alignment(), "a refused buffer comes back");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("aligned"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_buffered_and_direct() {
    for (tag, mode) in [
        ("uring-buffered", IoMode::Buffered),
        ("uring-direct", IoMode::Direct),
    ] {
        let dir = TempDir::new(tag);
        match mooring_disk::UringDisk::open(&dir.0, mode) {
            Ok(disk) => conformance(&disk).await,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                eprintln!("skipping the {tag} conformance test: {e}")
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn simulated() {
    conformance(&SimDisk::new(1)).await;
    conformance(&SimDisk::with_alignment(2, 512)).await;
}

#[tokio::test]
async fn posix_refuses_names_outside_its_directory() {
    let dir = TempDir::new("names");
    let disk: Arc<dyn Disk> = Arc::new(PosixDisk::open(&dir.0, IoMode::Buffered).unwrap());
    for bad in ["../escape", "/etc/passwd", "a//b", ""] {
        assert_eq!(
            disk.create(bad).await.unwrap_err().kind(),
            io::ErrorKind::InvalidInput,
            "{bad:?}"
        );
    }
}

/// The POSIX adapter's blocking task owns the buffer: a read whose future is dropped before
/// the task runs still runs later, into the buffer, which goes back to its lender only then.
#[test]
fn posix_dropped_read_keeps_its_buffer_until_done() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = TempDir::new("posix-dropped");
        let disk = PosixDisk::open(&dir.0, IoMode::Buffered).unwrap();
        disk.create("f").await.unwrap();
        let data: Vec<u8> = (0..8192).map(|i| (i % 241) as u8).collect();
        disk.write_at("f", 0, IoBuf::copy_of(&data, 1))
            .await
            .1
            .unwrap();
        // Hold the only blocking thread, so the read waits in the queue.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::task::spawn_blocking(move || held.recv());
        let mut memory = IoBuf::new(8192, 4096);
        let ptr = std::ptr::NonNull::new(memory.as_mut_ptr()).unwrap();
        let returned = Arc::new(AtomicUsize::new(0));
        // SAFETY: `memory` outlives the lent buffer and is not touched until it is given back.
        let lent = unsafe { IoBuf::lend(ptr, 8192, Box::new(Counted(returned.clone()))) };
        let read = disk.read_at("f", 0, lent);
        let timed_out = tokio::time::timeout(std::time::Duration::from_millis(100), read).await;
        assert!(timed_out.is_err(), "the read waits for the blocking thread");
        assert_eq!(returned.load(Ordering::SeqCst), 0, "the task still owns it");
        release.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while returned.load(Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "never given back");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        assert!(
            memory[..] == data[..],
            "the read ran into the buffer after all"
        );
    });
}
