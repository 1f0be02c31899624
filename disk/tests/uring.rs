//! The io_uring disk: concurrent round trips, short reads at the end of a file, durability
//! across reopening, the open-file cache across namespace changes, buffered and direct.

#![cfg(all(target_os = "linux", not(madsim)))]

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use mooring_disk::{AlignedBuf, IoMode, UringDisk};
use mooring_proto::disk::Disk;

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
            let data = AlignedBuf::copy_of(&pattern(i, size), a);
            disk.write_at("d/blocks", (i * size) as u64, &data)
                .await
                .unwrap();
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
            let mut buf = AlignedBuf::new(size, a);
            let n = disk
                .read_at("d/blocks", (i * size) as u64, &mut buf)
                .await
                .unwrap();
            assert_eq!(n, size);
            assert!(buf[..] == pattern(i, size)[..], "block {i}");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // The whole file in one read, and a read straddling the end.
    let total = BLOCKS * size;
    let mut all = AlignedBuf::new(total + 3 * size, a);
    assert_eq!(disk.read_at("d/blocks", 0, &mut all).await.unwrap(), total);
    for i in 0..BLOCKS {
        assert!(all[i * size..(i + 1) * size] == pattern(i, size)[..]);
    }
    let mut tail = AlignedBuf::new(2 * size, a);
    let last = ((BLOCKS - 1) * size) as u64;
    assert_eq!(
        disk.read_at("d/blocks", last, &mut tail).await.unwrap(),
        size
    );
    assert!(tail[..size] == pattern(BLOCKS - 1, size)[..]);
    // At and past the end: nothing.
    assert_eq!(
        disk.read_at("d/blocks", total as u64, &mut tail)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        disk.read_at("d/blocks", (total + 8 * size) as u64, &mut tail)
            .await
            .unwrap(),
        0
    );

    // Synced data survives the disk (and its I/O thread) going away.
    drop(disk);
    let disk = open(&dir, mode).unwrap();
    let mut again = AlignedBuf::new(total, a);
    assert_eq!(
        disk.read_at("d/blocks", 0, &mut again).await.unwrap(),
        total
    );
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
    disk.write_at("f", 0, &data).await.unwrap();
    let mut bufs = vec![[0u8; 100]; 32];
    let mut reads = Vec::new();
    for (i, buf) in bufs.iter_mut().enumerate() {
        reads.push(disk.read_at("f", (i * 100) as u64, buf));
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
    assert_eq!(disk.read_at("f", 3150, &mut buf).await.unwrap(), 50);
    assert_eq!(buf[..50], data[3150..]);
    // Writes extend the file; an empty write or read is fine.
    disk.write_at("f", 4000, b"tail").await.unwrap();
    assert_eq!(disk.len("f").await.unwrap(), 4004);
    disk.write_at("f", 0, b"").await.unwrap();
    assert_eq!(disk.read_at("f", 0, &mut []).await.unwrap(), 0);
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
    disk.write_at("a", 0, &big).await.unwrap();
    let mut back = vec![0; big.len()];
    assert_eq!(disk.read_at("a", 0, &mut back).await.unwrap(), big.len());
    assert!(back == big);

    disk.create("b").await.unwrap();
    disk.write_at("b", 0, b"old b").await.unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(disk.read_at("b", 0, &mut buf).await.unwrap(), 5);
    // Renaming over `b` must not leave the old `b` open under that name.
    disk.rename("a", "b").await.unwrap();
    assert_eq!(disk.read_at("b", 0, &mut buf).await.unwrap(), 16);
    assert_eq!(buf[..], big[..16]);
    for name in ["a", "missing"] {
        assert_eq!(
            disk.read_at(name, 0, &mut buf).await.unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            disk.write_at(name, 0, b"x").await.unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
    // Re-creating empties the file.
    disk.create("b").await.unwrap();
    assert_eq!(disk.read_at("b", 0, &mut buf).await.unwrap(), 0);
    disk.write_at("b", 0, b"new").await.unwrap();
    disk.sync("b").await.unwrap();
    assert_eq!(disk.list().await.unwrap(), vec!["b".to_string()]);
    // Removing closes it for the name.
    disk.remove("b").await.unwrap();
    assert_eq!(
        disk.read_at("b", 0, &mut buf).await.unwrap_err().kind(),
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
        disk.read_at("../escape", 0, &mut buf)
            .await
            .unwrap_err()
            .kind(),
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
    let block = AlignedBuf::copy_of(b"x", a);
    assert_eq!(
        disk.write_at("f", 1, &block).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(
        disk.write_at("f", 0, &block[..a / 2])
            .await
            .unwrap_err()
            .kind(),
        io::ErrorKind::InvalidInput
    );
    disk.write_at("f", 0, &block).await.unwrap();
    let mut buf = AlignedBuf::new(a, a);
    assert_eq!(disk.read_at("f", 0, &mut buf).await.unwrap(), a);
    assert_eq!(buf[0], b'x');
}

/// Reads into a registered buffer land straight in it (direct and buffered), chunked and
/// concurrent; reads elsewhere still bounce; both return the file's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_into_the_registered_buffer_land_in_place() {
    for mode in [IoMode::Buffered, IoMode::Direct] {
        let dir = TempDir::new(&format!("fixed-{mode:?}"));
        let Some(probe) = open(&dir, mode) else {
            return;
        };
        let align = probe.alignment();
        drop(probe);
        let mut region = mooring_disk::AlignedBuf::new(4 << 20, 4096);
        let base = std::ptr::NonNull::new(region.as_mut_ptr()).unwrap();
        // SAFETY: `region` outlives `disk` (dropped at the end of this iteration, after it),
        // and every read into it completes before it is reused.
        let disk =
            unsafe { UringDisk::open_with_buffer(&dir.0, mode, Some((base, 4 << 20))) }.unwrap();
        assert!(
            disk.has_registered_buffer(),
            "registration failed (see the log)"
        );
        let sizes = [align, 300 << 10, 1 << 20];
        for (i, &size) in sizes.iter().enumerate() {
            let name = format!("f{i}");
            let data = pattern(i, size);
            disk.create(&name).await.unwrap();
            let block = mooring_disk::AlignedBuf::copy_of(&data, align);
            disk.write_at(&name, 0, &block[..size]).await.unwrap();
        }
        // Concurrent reads into disjoint parts of the registered region.
        let mut parts: Vec<&mut [u8]> = Vec::new();
        let mut rest = &mut region[..];
        for &size in &sizes {
            let (head, tail) = rest.split_at_mut(1 << 20);
            parts.push(&mut head[..size]);
            rest = tail;
        }
        let reads = parts.into_iter().enumerate().map(|(i, part)| {
            let disk = &disk;
            async move {
                let name = format!("f{i}");
                let n = disk.read_at(&name, 0, part).await.unwrap();
                (n, part.to_vec())
            }
        });
        for (i, (n, got)) in futures_util::future::join_all(reads)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(n, sizes[i], "{mode:?} f{i}");
            assert!(got == pattern(i, sizes[i]), "{mode:?} f{i} bytes");
        }
        // A read outside the region bounces and is just as right.
        let mut outside = mooring_disk::AlignedBuf::new(1 << 20, 4096);
        let n = disk.read_at("f2", 0, &mut outside[..]).await.unwrap();
        assert_eq!(n, 1 << 20);
        assert!(outside[..] == pattern(2, 1 << 20)[..]);
        drop(disk);
        drop(region);
    }
}
