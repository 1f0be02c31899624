//! Shared setup for Mooring's benchmarks: masters pre-filled with many resident objects, the
//! master's operation rates among them, and a master service filled through its requests.

pub mod service;

use mooring_core::{
    Checksum, ClientId, Master, MasterConfig, Millis, ReplicateConfig, SegmentSpec,
};

/// The benches run on the allocator the `mooring` binary uses: jemalloc, with transparent
/// huge pages for its arenas. A master's metadata is a large, long-lived, randomly accessed
/// heap; on 4 KiB pages (and in a VM, with nested page walks) most lookups pay a TLB miss.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its options from this symbol at startup.
#[allow(non_upper_case_globals)]
#[used]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8; 31] = b"thp:always,metadata_thp:always\0";

/// Where a disk bench keeps its files: `MOORING_BENCH_DIR` (to measure another device) or
/// `target/<name>`.
pub fn bench_dir(name: &str) -> std::path::PathBuf {
    std::env::var_os("MOORING_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../target")
                .join(name)
        })
}

/// The runtime the end-to-end benches drive their clusters with: two workers, as this
/// machine has two cores.
pub fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The client the benches act as.
pub const CLIENT: ClientId = ClientId(1);
/// Value size used for resident objects (a typical KV-cache block is a few KiB to a few MiB).
pub const VALUE: u64 = 16 * 1024;

/// The key of resident object `i`.
pub fn key(i: usize) -> String {
    format!("model-7b/layer-{:02}/block-{i:08}", i % 32)
}

/// The key of resident object `i`, 64 bytes long (the size the master's memory target is
/// stated for).
pub fn key64(i: usize) -> String {
    format!(
        "model-70b-chat/tenant-00/layer-{:02}/kv-block-{i:021}",
        i % 80
    )
}

/// A master with `segments` segments totalling `capacity` bytes and `objects` complete
/// objects of [`VALUE`] bytes, all lease-expired at the returned time.
pub fn filled_master(
    config: MasterConfig,
    segments: u64,
    capacity: u64,
    objects: usize,
) -> (Master, Millis) {
    filled_master_with(config, segments, capacity, objects, VALUE, key)
}

/// [`filled_master`] with objects of `value` bytes named by `key`, reporting its progress
/// on stderr when it fills ten million objects or more.
pub fn filled_master_with(
    config: MasterConfig,
    segments: u64,
    capacity: u64,
    objects: usize,
    value: u64,
    key: fn(usize) -> String,
) -> (Master, Millis) {
    let mut master = Master::new(config).expect("config");
    let now = Millis(1_000);
    for s in 0..segments {
        let spec = SegmentSpec {
            name: format!("node{s}:7000"),
            base: (s + 1) << 44,
            size: capacity / segments,
            endpoint: format!("10.0.0.{s}:7000"),
            key: 7,
            rdma_key: None,
        };
        master.mount_segment(CLIENT, &spec, now).expect("mount");
    }
    let config = ReplicateConfig::single();
    for i in 0..objects {
        if objects >= 10_000_000 && i % 10_000_000 == 0 && i > 0 {
            eprintln!(
                "  filled {} M of {} M objects",
                i / 1_000_000,
                objects / 1_000_000
            );
        }
        let k = key(i);
        let grant = master
            .put_start(CLIENT, &k, value, &config, now)
            .expect("fill");
        master
            .put_end(CLIENT, &k, grant.write_id, Checksum::of(k.as_bytes()), now)
            .expect("fill");
    }
    (master, now + Millis(1))
}

/// This process's resident memory in bytes (`/proc/self/statm`), or 0 where it cannot be
/// read.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// The master's operation rates with `resident` objects named by `key` resident: one
/// criterion group, `master (<label> resident)`, of PutStart+PutEnd pairs of fresh keys
/// (removed again, untimed), and GetReplicaList of random resident keys, one at a time and 32
/// to a request.
pub fn master_ops(
    c: &mut criterion::Criterion,
    label: &str,
    master: &mut Master,
    now: Millis,
    resident: usize,
    key: fn(usize) -> String,
) {
    use std::hint::black_box;
    use std::time::{Duration, Instant};

    let replicate = ReplicateConfig::single();
    let mut group = c.benchmark_group(format!("master ({label} resident)"));
    group.throughput(criterion::Throughput::Elements(1));

    // Fresh keys, as long as the resident ones, and none of them.
    let fresh: Vec<String> = (0..200_000).map(|i| key(resident + i)).collect();
    group.bench_function("PutStart+PutEnd pair", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let batch = left.min(fresh.len());
                let start = Instant::now();
                for k in &fresh[..batch] {
                    let g = master
                        .put_start(CLIENT, k, VALUE, &replicate, now)
                        .expect("put");
                    let sum = Checksum::of(k.as_bytes());
                    master
                        .put_end(CLIENT, k, g.write_id, sum, now)
                        .expect("end");
                }
                elapsed += start.elapsed();
                for k in &fresh[..batch] {
                    master.remove(k, now).expect("remove");
                }
                left -= batch;
            }
            elapsed
        })
    });

    let mut rng = mooring_core::rng::Rng::seeded(11);
    let lookups: Vec<String> = (0..1 << 16).map(|_| key(rng.below(resident))).collect();
    let mut j = 0;
    group.bench_function("GetReplicaList", |b| {
        b.iter(|| {
            j = (j + 1) & ((1 << 16) - 1);
            black_box(master.get_replica_list(&lookups[j], now).expect("get"));
        })
    });
    // As clients ask for a batch get's keys: one request of 32 keys, timed per key.
    group.throughput(criterion::Throughput::Elements(32));
    let mut batch = 0;
    group.bench_function("BatchGetReplicaList of 32 keys", |b| {
        b.iter(|| {
            batch = (batch + 32) & ((1 << 16) - 1);
            let lists = master.batch_get_replica_list(&lookups[batch..batch + 32], now);
            assert!(lists.iter().all(Result::is_ok), "every key is resident");
            black_box(lists);
        })
    });
    group.finish();
}
