//! Criterion benchmarks of the core, with the targets from the core's issue:
//!
//! - allocator alloc+free pairs: >= 10 M/s
//! - PutStart+PutEnd pairs with 1,000,000 resident objects: >= 1 M/s
//! - GetReplicaList with 1,000,000 resident objects: >= 2 M/s
//! - one eviction pass over 1,000,000 objects: < 50 ms
//!
//! Run: `cargo bench -p mooring-benches --bench core`. Throughput is reported in elements/s.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
#[allow(unused_imports)]
use mooring_benches::malloc_conf as _;
use mooring_benches::{CLIENT, VALUE, filled_master, key};
use mooring_core::allocator::OffsetAllocator;
use mooring_core::rng::Rng;
use mooring_core::{Checksum, MasterConfig, Millis, ReplicateConfig};

const RESIDENT: usize = 1_000_000;
const GIB: u64 = 1 << 30;

fn allocator(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocator");
    group.throughput(Throughput::Elements(1));
    // A 64 GiB segment kept about half full of blocks from 4 KiB to 4 MiB; each iteration frees
    // the oldest live block and allocates a new one.
    let mut allocator = OffsetAllocator::new(64 * GIB);
    let mut rng = Rng::seeded(7);
    let sizes: Vec<u64> = (0..4096).map(|_| 4096 << rng.below(11)).collect();
    let mut ring = std::collections::VecDeque::new();
    let mut used = 0;
    let mut i = 0;
    while used < 32 * GIB {
        let a = allocator.allocate(sizes[i % sizes.len()]).expect("fill");
        used += sizes[i % sizes.len()];
        ring.push_back((a.node, sizes[i % sizes.len()]));
        i += 1;
    }
    group.bench_function("alloc+free pair", |b| {
        b.iter(|| {
            let (node, _) = ring.pop_front().expect("ring");
            allocator.free(node);
            let size = sizes[i % sizes.len()];
            i += 1;
            let a = allocator.allocate(black_box(size)).expect("half full");
            ring.push_back((a.node, size));
        })
    });
    group.finish();
}

fn master_ops(c: &mut Criterion) {
    let config = MasterConfig::default();
    // 64 segments of 1 TiB: room for the resident set and every benchmark key.
    let (mut master, now) = filled_master(config, 64, 64 * 1024 * GIB, RESIDENT);
    let replicate = ReplicateConfig::single();
    let mut group = c.benchmark_group("master (1M resident)");
    group.throughput(Throughput::Elements(1));

    let fresh: Vec<String> = (0..200_000)
        .map(|i| format!("bench/fresh/{i:08}"))
        .collect();
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

    let mut rng = Rng::seeded(11);
    let lookups: Vec<String> = (0..1 << 16).map(|_| key(rng.below(RESIDENT))).collect();
    let mut j = 0;
    group.bench_function("GetReplicaList", |b| {
        b.iter(|| {
            j = (j + 1) & ((1 << 16) - 1);
            black_box(master.get_replica_list(&lookups[j], now).expect("get"));
        })
    });
    group.finish();

    // Eviction: the same resident set in a pool sized so it sits just above the watermark.
    let mut group = c.benchmark_group("eviction");
    group.sample_size(10);
    let capacity = (RESIDENT as u64 * VALUE) * 100 / 96;
    let (evicting, now) = filled_master(MasterConfig::default(), 8, capacity, RESIDENT);
    let later = now + Millis::from_secs(1);
    group.bench_function("one pass over 1M objects", |b| {
        b.iter_batched(
            || evicting.clone(),
            |mut m| {
                m.tick(later);
                assert!(m.stats().evicted_objects > 0);
                m
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, allocator, master_ops);
criterion_main!(benches);
