//! Criterion benchmarks of the SSD tier's disk path (the SSD-tier issue's target is an
//! SSD-hit get of 1 MiB objects at >= 1.7 GB/s through the whole read path; this measures the
//! disk part alone: the file-per-key backend reading checksummed 1 MiB records with O_DIRECT).
//!
//! Run: `cargo bench -p mooring-benches --bench disk`. Files go under `target/disk-bench`
//! (set `MOORING_BENCH_DIR` to measure another device). Throughput is reported in bytes/s.

use std::io;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mooring_benches::{bench_dir, bench_runtime};
use mooring_disk::{FilePerKey, IoMode, PosixDisk, UringDisk};
use mooring_proto::disk::Disk;

const OBJECTS: usize = 256;
const SIZE: usize = 1 << 20;

fn file_per_key_gets(c: &mut Criterion) {
    bench_adapter(c, "posix", |dir| {
        PosixDisk::open(dir, IoMode::Direct).map(|d| Arc::new(d) as Arc<dyn Disk>)
    });
    bench_adapter(c, "io_uring", |dir| {
        UringDisk::open(dir, IoMode::Direct).map(|d| Arc::new(d) as Arc<dyn Disk>)
    });
}

fn bench_adapter(
    c: &mut Criterion,
    adapter: &str,
    open: impl FnOnce(&std::path::Path) -> io::Result<Arc<dyn Disk>>,
) {
    let runtime = bench_runtime();
    let dir = bench_dir("disk-bench").join(adapter);
    let _ = std::fs::remove_dir_all(&dir);
    let disk = match open(&dir) {
        Ok(disk) => disk,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            eprintln!("skipping the {adapter} disk bench: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let store = FilePerKey::new(disk);
    let value: Vec<u8> = (0..SIZE).map(|i| (i * 7) as u8).collect();
    runtime.block_on(async {
        for i in 0..OBJECTS {
            store
                .put(&format!("obj/{i}"), 1, &value)
                .await
                .expect("put");
        }
    });
    let mut group = c.benchmark_group("file_per_key");
    group.throughput(Throughput::Bytes(SIZE as u64));
    let mut i = 0;
    group.bench_function(format!("get_1MiB_direct_{adapter}"), |b| {
        b.iter(|| {
            i = (i + 1) % OBJECTS;
            let got = runtime
                .block_on(store.get(&format!("obj/{i}")))
                .expect("get")
                .expect("present");
            assert_eq!(got.value.len(), SIZE);
        })
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, file_per_key_gets);
criterion_main!(benches);
