//! Criterion benchmarks of the core, with the targets from the core's issue:
//!
//! - allocator alloc+free pairs: >= 10 M/s
//! - PutStart+PutEnd pairs with 1,000,000 resident objects: >= 1 M/s
//! - GetReplicaList with 1,000,000 resident objects: >= 2 M/s
//! - one eviction pass over 1,000,000 objects: < 50 ms
//!
//! Run: `cargo bench -p mooring-benches --bench core`. Throughput is reported in elements/s.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
#[allow(unused_imports)]
use mooring_benches::malloc_conf as _;
use mooring_benches::{VALUE, filled_master, key};
use mooring_core::allocator::OffsetAllocator;
use mooring_core::rng::Rng;
use mooring_core::{MasterConfig, Millis};

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
        used += a.len;
        ring.push_back(a);
        i += 1;
    }
    group.bench_function("alloc+free pair", |b| {
        b.iter(|| {
            allocator.free(ring.pop_front().expect("ring"));
            let size = sizes[i % sizes.len()];
            i += 1;
            ring.push_back(allocator.allocate(black_box(size)).expect("half full"));
        })
    });
    group.finish();
}

fn master_ops(c: &mut Criterion) {
    // 64 segments of 1 TiB: room for the resident set and every benchmark key.
    let (mut master, now) = filled_master(MasterConfig::default(), 64, 64 * 1024 * GIB, RESIDENT);
    mooring_benches::master_ops(c, "1M", &mut master, now, RESIDENT, key);
    drop(master);

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
