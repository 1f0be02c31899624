//! The file-per-key backend on every disk: round trips, restart and recovery, and damaged or
//! unfinished files dropped, never served.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use mooring_disk::{FilePerKey, IoMode, PosixDisk};
use mooring_proto::disk::{Disk, write_copy};
use mooring_transport_sim::disk::{DiskFaults, SimDisk};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("mooring-fpk-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn value(i: usize) -> Vec<u8> {
    (0..(i * 977) % 20_000 + 1)
        .map(|b| (b * 31 + i) as u8)
        .collect()
}

/// Writes, reads, replaces and removes; then a new instance on the same disk recovers
/// exactly what is there.
async fn round_trip_and_restart(disk: Arc<dyn Disk>) {
    let store = FilePerKey::new(disk.clone());
    for i in 0..20 {
        store
            .put(&format!("prefix/{i}"), 1, &value(i))
            .await
            .unwrap();
    }
    store.put("prefix/3", 2, b"replaced").await.unwrap();
    assert!(store.remove("prefix/4").await.unwrap());
    assert!(!store.remove("prefix/4").await.unwrap());
    let replaced = store.get("prefix/3").await.unwrap().unwrap();
    assert_eq!(
        (replaced.version, &replaced.value[..]),
        (2, &b"replaced"[..])
    );
    assert_eq!(
        store.get("prefix/5").await.unwrap().unwrap().value,
        value(5)
    );
    assert_eq!(store.get("absent").await.unwrap(), None);
    // A deletion names a write: an older one leaves the newer value in place.
    assert!(!store.remove_version("prefix/3", 1).await.unwrap());
    assert!(store.remove_version("prefix/6", 1).await.unwrap());
    assert_eq!(store.get("prefix/6").await.unwrap(), None);

    let restarted = FilePerKey::new(disk);
    let found = restarted.recover().await.unwrap();
    assert!(found.dropped.is_empty(), "{:?}", found.dropped);
    let mut keys: Vec<(String, u64, u64)> = found
        .objects
        .into_iter()
        .map(|held| (held.key, held.version, held.len))
        .collect();
    keys.sort();
    let mut expected: Vec<(String, u64, u64)> = (0..20)
        .filter(|&i| i != 4 && i != 6)
        .map(|i| {
            if i == 3 {
                (format!("prefix/{i}"), 2, 8)
            } else {
                (format!("prefix/{i}"), 1, value(i).len() as u64)
            }
        })
        .collect();
    expected.sort();
    assert_eq!(keys, expected);
    assert_eq!(
        restarted.get("prefix/7").await.unwrap().unwrap().value,
        value(7)
    );
}

#[tokio::test]
async fn posix_buffered_round_trip_and_restart() {
    let dir = TempDir::new("rt-buffered");
    round_trip_and_restart(Arc::new(PosixDisk::open(&dir.0, IoMode::Buffered).unwrap())).await;
}

#[tokio::test]
async fn posix_direct_round_trip_and_restart() {
    let dir = TempDir::new("rt-direct");
    match PosixDisk::open(&dir.0, IoMode::Direct) {
        Ok(disk) => round_trip_and_restart(Arc::new(disk)).await,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            eprintln!("skipping the direct-I/O round trip: {e}")
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_direct_round_trip_and_restart() {
    let dir = TempDir::new("rt-uring");
    match mooring_disk::UringDisk::open(&dir.0, IoMode::Direct) {
        Ok(disk) => round_trip_and_restart(Arc::new(disk)).await,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            eprintln!("skipping the io_uring round trip: {e}")
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn simulated_round_trip_and_restart() {
    round_trip_and_restart(Arc::new(SimDisk::with_alignment(3, 4096))).await;
}

#[tokio::test]
async fn truncated_and_bit_flipped_files_are_dropped_not_served() {
    let dir = TempDir::new("damage");
    let disk = Arc::new(PosixDisk::open(&dir.0, IoMode::Buffered).unwrap());
    let store = FilePerKey::new(disk.clone());
    for key in ["intact", "truncated", "flipped", "emptied"] {
        store.put(key, 1, &value(key.len() * 100)).await.unwrap();
    }
    let path = |key: &str| dir.0.join(FilePerKey::file_name(key));
    let len = std::fs::metadata(path("truncated")).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path("truncated"))
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let mut bytes = std::fs::read(path("flipped")).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x04;
    std::fs::write(path("flipped"), &bytes).unwrap();
    std::fs::write(path("emptied"), b"").unwrap();
    // A write that never got renamed into place.
    disk.create("tmp/0000000000000000.9").await.unwrap();

    for key in ["truncated", "flipped", "emptied"] {
        let err = store.get(key).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{key}: {err}");
    }
    let found = FilePerKey::new(disk.clone()).recover().await.unwrap();
    let objects: Vec<(&str, u64, u64)> = found
        .objects
        .iter()
        .map(|held| (held.key.as_str(), held.version, held.len))
        .collect();
    assert_eq!(objects, vec![("intact", 1, value(600).len() as u64)]);
    assert_eq!(found.dropped.len(), 4, "{:?}", found.dropped);
    assert!(found.dropped.iter().any(|(_, why)| why.contains("torn")));
    assert!(
        found
            .dropped
            .iter()
            .any(|(_, why)| why.contains("checksum"))
    );
    // Dropped files are gone: the keys read as absent now, not as damaged.
    assert_eq!(store.get("flipped").await.unwrap(), None);
    assert_eq!(
        disk.list().await.unwrap(),
        vec![FilePerKey::file_name("intact")]
    );
}

/// Crashes with torn and lost unsynced writes, many times over: after each, recovery never
/// reports an object whose bytes are not exactly the last value put.
#[tokio::test]
async fn crashes_never_leave_a_wrong_value_behind() {
    for seed in 0..40 {
        let disk = Arc::new(SimDisk::new(seed));
        disk.set_faults(DiskFaults {
            torn_on_crash: 0.5,
            lost_on_crash: 0.5,
            ..DiskFaults::default()
        });
        let store = FilePerKey::new(disk.clone());
        let mut last = std::collections::BTreeMap::new();
        for round in 0..6usize {
            for k in 0..4 {
                let key = format!("k{k}");
                let v = value(round * 7 + k + seed as usize);
                store.put(&key, round as u64, &v).await.unwrap();
                last.insert(key, v);
            }
            // A put cut short by the crash: its tmp file is unsynced.
            disk.create("tmp/ffffffffffffffff.0").await.unwrap();
            write_copy(disk.as_ref(), "tmp/ffffffffffffffff.0", 0, b"half a record")
                .await
                .unwrap();
            disk.crash();
            let found = FilePerKey::new(disk.clone()).recover().await.unwrap();
            for held in &found.objects {
                let key = &held.key;
                assert_eq!(held.len, last[key].len() as u64, "seed {seed}: {key}");
                assert_eq!(held.version, round as u64, "seed {seed}: {key}");
                assert_eq!(&store.get(key).await.unwrap().unwrap().value, &last[key]);
            }
            // Every put was synced and renamed before the crash, so all survive.
            assert_eq!(found.objects.len(), 4, "seed {seed}: {found:?}");
        }
    }
}
