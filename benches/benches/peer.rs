//! Criterion benchmarks of peer mode's directory, at the size the peer-mode issue names:
//!
//! - metadata per directory entry at 10 million entries: goal at most 100 bytes beside the
//!   key (printed before the timings, from the shard's own heap accounting);
//! - lookups in a shard of 10 million entries, and re-publishes of entries it holds;
//! - finding a key's owners on a ring of 64 peers.
//!
//! Run: `cargo bench -p mooring-benches --bench peer` (about 2 GB of memory for the shard).
//! `MOORING_BENCH_PEER_ENTRIES` sets another size.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
#[allow(unused_imports)]
use mooring_benches::malloc_conf as _;
use mooring_core::Checksum;
use mooring_core::peer::directory::{DirectoryShard, Location, Stamp};
use mooring_core::peer::ring::{DEFAULT_VNODES, Ring, RingMember};

const PEERS: usize = 64;

fn entries() -> usize {
    std::env::var("MOORING_BENCH_PEER_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000)
}

fn peer_name(i: usize) -> String {
    format!("10.0.{}.{}:7100", i / 8, i % 8)
}

fn key(i: usize) -> String {
    format!("kv/model-7b/tp0/layer-{:02}/block-{i:09}", i % 32)
}

fn location(i: usize, clock: u64) -> Location {
    Location {
        peer: peer_name(i % PEERS).into(),
        offset: (i as u64) << 16,
        len: 64 * 1024,
        stamp: Stamp {
            clock,
            writer: (i % PEERS) as u64,
        },
        checksum: Checksum(i as u32),
        resident: true,
    }
}

fn directory(c: &mut Criterion) {
    let entries = entries();
    let mut shard = DirectoryShard::new();
    let mut key_bytes = 0;
    for i in 0..entries {
        let key = key(i);
        key_bytes += key.len();
        shard
            .publish(&peer_name(i % PEERS), &key, location(i, i as u64), true)
            .expect("a fresh entry");
    }
    let per_entry = (shard.heap_bytes() - key_bytes) as f64 / entries as f64;
    eprintln!(
        "peer directory: {entries} entries, {per_entry:.1} bytes each beside the key \
         (goal: at most 100)"
    );
    let mut group = c.benchmark_group(format!("peer directory ({entries} entries)"));
    group.throughput(Throughput::Elements(1));
    let keys: Vec<String> = (0..4096)
        .map(|n| key(n * (entries / 4096).max(1)))
        .collect();
    let mut n = 0;
    group.bench_function("lookup", |b| {
        b.iter(|| {
            n += 1;
            black_box(shard.lookup(&keys[n % keys.len()]))
        })
    });
    let mut clock = entries as u64;
    group.bench_function("re-publish of a held entry", |b| {
        b.iter(|| {
            n += 1;
            clock += 1;
            let i = (n * 7919) % entries;
            let published = shard.publish(&peer_name(i % PEERS), &key(i), location(i, clock), true);
            black_box(published.is_ok())
        })
    });
    group.finish();
}

fn ring(c: &mut Criterion) {
    let ring = Ring::new(
        (0..PEERS).map(|i| RingMember {
            name: peer_name(i).into(),
            weight: 1,
        }),
        DEFAULT_VNODES,
    );
    let keys: Vec<String> = (0..4096).map(key).collect();
    let mut group = c.benchmark_group("peer ring (64 peers)");
    group.throughput(Throughput::Elements(1));
    let mut n = 0;
    group.bench_function("owners of a key (2 of them)", |b| {
        b.iter(|| {
            n += 1;
            black_box(ring.owners(&keys[n % keys.len()], 2))
        })
    });
    group.finish();
}

criterion_group!(benches, ring, directory);
criterion_main!(benches);
