//! Shared setup for Mooring's benchmarks: masters pre-filled with many resident objects.

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

/// A master with `segments` segments totalling `capacity` bytes and `objects` complete
/// objects of [`VALUE`] bytes, all lease-expired at the returned time.
pub fn filled_master(
    config: MasterConfig,
    segments: u64,
    capacity: u64,
    objects: usize,
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
        let k = key(i);
        let grant = master
            .put_start(CLIENT, &k, VALUE, &config, now)
            .expect("fill");
        master
            .put_end(CLIENT, &k, grant.write_id, Checksum::of(k.as_bytes()), now)
            .expect("fill");
    }
    (master, now + Millis(1))
}
