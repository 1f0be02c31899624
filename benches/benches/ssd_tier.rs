//! The SSD tier through the whole read path, on an embedded cluster over loopback TCP (no
//! in-process memcpy): a get of a 1 MiB object whose only copy is on a node's disk (master
//! RPC, the node stages it from disk with O_DIRECT, the reader pulls it, unstages), and a get
//! of an object `exist_prefetch` promoted back into memory, next to a plain memory hit; and a
//! batched get of eight disk-only objects, which the nodes stage concurrently.
//!
//! Run: `cargo bench -p mooring-benches --bench ssd_tier`. The disk lives under
//! `target/ssd-bench` (set `MOORING_BENCH_DIR` to measure another device).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mooring::node::disk_tier::{DiskIo, DiskTierConfig};
use mooring::{Client, EmbeddedCluster, EmbeddedConfig};
use mooring_benches::{bench_dir, bench_runtime};
use mooring_core::{MasterConfig, Medium, Millis, ReplicateConfig};

const SIZE: usize = 1 << 20;
const OBJECTS: u64 = 96;
/// Keys per batched get.
const BATCH: usize = 8;

async fn media(client: &Client, key: &str) -> Vec<Medium> {
    let found = client
        .query_by_regex(&format!("^{key}$"))
        .await
        .expect("query");
    found[0].1.replicas.iter().map(|r| r.medium).collect()
}

fn ssd_tier(c: &mut Criterion) {
    // io_uring first: it also measures the memory hits and the prefetched get.
    ssd_tier_with(c, DiskIo::Uring);
    ssd_tier_with(c, DiskIo::Posix);
}

fn ssd_tier_with(c: &mut Criterion, io: DiskIo) {
    let io_name = match io {
        DiskIo::Uring => "io_uring",
        DiskIo::Posix => "posix",
    };
    let runtime = bench_runtime();
    let dir = bench_dir("ssd-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let mut disk = DiskTierConfig::new(&dir);
    disk.direct = true;
    disk.io = io;
    disk.sync_interval = Duration::from_millis(10);
    let (cluster, client, on_disk, in_memory) = runtime.block_on(async {
        let cluster = EmbeddedCluster::start(EmbeddedConfig {
            nodes: 1,
            node_size: 32 << 20,
            prefault: true,
            local_memcpy: false,
            master: MasterConfig {
                lease_ttl: Millis(200),
                offload_write_through: true,
                ..MasterConfig::default()
            },
            disk: Some(disk),
            ..EmbeddedConfig::default()
        })
        .await
        .expect("cluster");
        let client = cluster.client().await.expect("client");
        let value: Vec<u8> = (0..SIZE).map(|i| (i * 7) as u8).collect();
        for i in 0..OBJECTS {
            client
                .put(&format!("obj/{i}"), &value, &ReplicateConfig::single())
                .await
                .expect("put");
            while client.stats().await.expect("stats").disk_replicas <= i {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let mut on_disk = Vec::new();
        let mut in_memory = Vec::new();
        for i in 0..OBJECTS {
            let key = format!("obj/{i}");
            match media(&client, &key).await.as_slice() {
                [Medium::Disk] => on_disk.push(key),
                _ => in_memory.push(key),
            }
        }
        (cluster, client, on_disk, in_memory)
    });
    assert!(on_disk.len() > 32, "{} objects only on disk", on_disk.len());
    let mut group = c.benchmark_group("ssd_tier");
    group.throughput(Throughput::Bytes(SIZE as u64));
    group.sample_size(50);
    let mut next = 0;
    group.bench_function(format!("ssd_hit_get_1mib/{io_name}"), |b| {
        b.iter(|| {
            let key = &on_disk[next % on_disk.len()];
            next += 1;
            let got = runtime.block_on(client.get(key)).expect("get");
            assert_eq!(got.len(), SIZE);
        })
    });
    // Eight disk-only keys in one batch: staged concurrently, so the disk sees them at once.
    group.throughput(Throughput::Bytes((BATCH * SIZE) as u64));
    group.bench_function(format!("ssd_hit_batch_get_{BATCH}x1mib/{io_name}"), |b| {
        b.iter(|| {
            let keys: Vec<&str> = (0..BATCH)
                .map(|_| {
                    next += 1;
                    on_disk[next % on_disk.len()].as_str()
                })
                .collect();
            let got = runtime.block_on(client.batch_get(&keys));
            for value in got {
                assert_eq!(value.expect("get").len(), SIZE);
            }
        })
    });
    group.throughput(Throughput::Bytes(SIZE as u64));
    if io == DiskIo::Posix {
        group.finish();
        runtime.block_on(cluster.shutdown()).expect("shutdown");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let memory_key = in_memory.last().expect("one in memory").clone();
    group.bench_function("dram_hit_get_1mib", |b| {
        b.iter(|| {
            let got = runtime.block_on(client.get(&memory_key)).expect("get");
            assert_eq!(got.len(), SIZE);
        })
    });
    let promoted = on_disk[0].clone();
    runtime.block_on(async {
        assert!(client.exist_prefetch(&promoted).await.expect("exist"));
        assert_eq!(media(&client, &promoted).await[0], Medium::Memory);
    });
    group.bench_function("get_after_prefetch_1mib", |b| {
        b.iter(|| {
            let got = runtime.block_on(client.get(&promoted)).expect("get");
            assert_eq!(got.len(), SIZE);
        })
    });
    group.finish();
    runtime.block_on(cluster.shutdown()).expect("shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, ssd_tier);
criterion_main!(benches);
