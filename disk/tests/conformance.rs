//! Every Disk adapter behaves the same: the POSIX one buffered and direct, and the simulated
//! disk the simulation uses.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use mooring_disk::{AlignedBuf, IoMode, PosixDisk};
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
fn block(disk: &dyn Disk, data: &[u8]) -> AlignedBuf {
    AlignedBuf::copy_of(data, disk.alignment())
}

async fn conformance(disk: &dyn Disk) {
    let a = disk.alignment();
    disk.create("x/y/data").await.unwrap();
    assert_eq!(disk.len("x/y/data").await.unwrap(), 0);
    let first = block(disk, b"first block");
    disk.write_at("x/y/data", 0, &first).await.unwrap();
    let second = block(disk, b"second");
    disk.write_at("x/y/data", first.len() as u64, &second)
        .await
        .unwrap();
    disk.sync("x/y/data").await.unwrap();
    let total = first.len() + second.len();
    assert_eq!(disk.len("x/y/data").await.unwrap(), total as u64);

    let mut back = AlignedBuf::new(total, a);
    assert_eq!(disk.read_at("x/y/data", 0, &mut back).await.unwrap(), total);
    assert_eq!(&back[..11], b"first block");
    assert_eq!(&back[first.len()..first.len() + 6], b"second");
    // Reading past the end returns what is there.
    let mut more = AlignedBuf::new(total + 4 * a.max(512), a);
    assert_eq!(disk.read_at("x/y/data", 0, &mut more).await.unwrap(), total);

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
    let err = disk.write_at("u", 1, b"x").await.unwrap_err();
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
