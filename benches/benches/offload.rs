//! Offload keeping up with eviction under a write-heavy workload (docs/ssd-tier.md): one node
//! with 64 MiB of memory and a disk tier takes a stream of fresh 1 MiB puts, so every put
//! evicts. First a paced stream (128 MiB/s), then an unthrottled one that criterion times.
//! After each it prints how many evictions left a disk copy (the rest were dropped because
//! their offload had not happened in time). Offload keeps up when the two counts match.
//!
//! Run: `cargo bench -p mooring-benches --bench offload`. The disk lives under
//! `target/offload-bench` (set `MOORING_BENCH_DIR` to measure another device).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mooring::node::disk_tier::DiskTierConfig;
use mooring::{EmbeddedCluster, EmbeddedConfig};
use mooring_benches::{bench_dir, bench_runtime};
use mooring_core::{MasterConfig, Millis, ReplicateConfig};

const SIZE: usize = 1 << 20;

fn offload_under_write_pressure(c: &mut Criterion) {
    let runtime = bench_runtime();
    let dir = bench_dir("offload-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let mut disk = DiskTierConfig::new(&dir);
    disk.direct = true;
    disk.capacity = 1 << 30;
    disk.sync_interval = Duration::from_millis(10);
    let (cluster, client) = runtime.block_on(async {
        let cluster = EmbeddedCluster::start(EmbeddedConfig {
            nodes: 1,
            node_size: 64 << 20,
            prefault: true,
            local_memcpy: false,
            master: MasterConfig {
                lease_ttl: Millis(200),
                ..MasterConfig::default()
            },
            disk: Some(disk),
            ..EmbeddedConfig::default()
        })
        .await
        .expect("cluster");
        let client = cluster.client().await.expect("client");
        (cluster, client)
    });
    let value: Vec<u8> = (0..SIZE).map(|i| (i * 13) as u8).collect();
    let put = |key: &str| {
        // Puts refused while eviction waits for offload are retried, as a client would.
        loop {
            match runtime.block_on(client.put(key, &value, &ReplicateConfig::single())) {
                Ok(()) => break,
                Err(e) if e.code == mooring_core::ErrorCode::NO_AVAILABLE_HANDLE => {
                    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(1)).await })
                }
                Err(e) => panic!("put: {e}"),
            }
        }
    };
    let report = |phase: &str, before: &mooring_core::Stats| {
        let now = runtime.block_on(client.stats()).expect("stats");
        let evicted = now.evicted_objects - before.evicted_objects;
        let kept = now.evicted_to_disk - before.evicted_to_disk;
        eprintln!(
            "offload, {phase}: {evicted} evictions, {kept} of them left a disk copy ({:.1}%)",
            100.0 * kept as f64 / evicted.max(1) as f64
        );
        now
    };
    // Paced: 1 MiB every 8 ms.
    let start = runtime.block_on(client.stats()).expect("stats");
    let began = std::time::Instant::now();
    for i in 0..768u32 {
        put(&format!("paced/{i}"));
        let due = began + Duration::from_millis(8) * (i + 1);
        std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    }
    let paced = report("paced at 128 MiB/s", &start);
    let mut group = c.benchmark_group("offload");
    group.throughput(Throughput::Bytes(SIZE as u64));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    let mut next = 0u64;
    group.bench_function("put_1mib_evicting_into_disk_tier", |b| {
        b.iter(|| {
            next += 1;
            put(&format!("stream/{next}"));
        })
    });
    group.finish();
    report(&format!("unthrottled ({next} puts)"), &paced);
    runtime.block_on(cluster.shutdown()).expect("shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, offload_under_write_pressure);
criterion_main!(benches);
