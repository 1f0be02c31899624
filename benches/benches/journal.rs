//! The master's put path with and without its journal (`mooring master --state-dir`):
//! PutStart+PutEnd pairs through `MasterService::answer`, which is what each RPC connection
//! calls, with 256 pairs in flight (`MOORING_BENCH_IN_FLIGHT`) on two worker threads. With the journal on, each answer
//! waits until its record is synced, so this measures group commit: how many pairs one
//! `fdatasync` covers decides the rate. No network: the master's own cost. The pool is
//! bounded ([`pool_bytes`]) and filled before measuring: each put evicts an older object.
//! With the journal on, the bench also runs (untimed) until a generation begins in a retired
//! journal's file, as in a master that has run a while.
//!
//! Run: `cargo bench -p mooring-benches --bench journal`. The journal lives under
//! `target/journal-bench` (set `MOORING_BENCH_DIR` to measure another device).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mooring::master::MasterService;
use mooring_benches::service::{Pairs, mounted, put_pairs};
use mooring_benches::{bench_dir, bench_runtime};
use mooring_core::MasterConfig;

/// Pairs in flight at once (`MOORING_BENCH_IN_FLIGHT` to try others).
fn in_flight() -> usize {
    std::env::var("MOORING_BENCH_IN_FLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}
/// The pool's size: 4 GiB (`MOORING_BENCH_POOL_GIB` to try others), room for about a
/// million of the bench's 4 KiB objects. Once it is full, each put evicts an older object,
/// as in a cache at work: the table, and so each snapshot, stays the same size.
fn pool_bytes() -> u64 {
    let gib: u64 = std::env::var("MOORING_BENCH_POOL_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    gib << 30
}
/// Each object's size.
const OBJECT_SIZE: u64 = 4096;
/// Pairs per timed batch.
const BATCH: u64 = 20_000;

fn journal_on_and_off(c: &mut Criterion) {
    let runtime = bench_runtime();
    let dir = bench_dir("journal-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let mut group = c.benchmark_group("put_start_end_pairs");
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    let config = MasterConfig::default();
    let services = [
        (
            "journal_off",
            MasterService::new(config.clone()).expect("a master"),
        ),
        (
            "journal_on",
            MasterService::persistent(&dir, config, mooring::master::journal::SNAPSHOT_AFTER)
                .expect("a master with a journal"),
        ),
    ];
    for (name, service) in &services {
        mounted(service, pool_bytes());
        let pairs = Pairs {
            next: Arc::new(AtomicU64::new(0)),
            object_size: OBJECT_SIZE,
            key: |i| format!("k{i}"),
            in_flight: in_flight(),
            upsert: false,
        };
        let next = &pairs.next;
        let batch = || put_pairs(&runtime, service, &pairs, BATCH);
        let mut filled = false;
        group.bench_function(*name, |b| {
            // A cache at work is full: measure it evicting, with the journal past its first
            // generations (untimed).
            if !filled {
                let objects = pool_bytes() / OBJECT_SIZE;
                eprintln!("{name}: filling the pool ({objects} objects) before measuring");
                while next.load(Ordering::Relaxed) < objects {
                    batch();
                }
                // A master's first generations begin in new files, whose syncs also carry
                // the zeros written ahead of the records; from the first generation that
                // begins in a retired journal's file on, none do. Measure that steady state.
                if service.journal_counts().is_some() {
                    eprintln!("{name}: running until a generation reuses a retired journal");
                    let limit = next.load(Ordering::Relaxed) + 40 * objects;
                    while service
                        .journal_counts()
                        .is_some_and(|c| c.reused_files == 0)
                    {
                        assert!(
                            next.load(Ordering::Relaxed) < limit,
                            "no generation reused a retired journal's file"
                        );
                        batch();
                    }
                }
                filled = true;
            }
            b.iter_custom(|iters| (0..iters).map(|_| batch()).sum())
        });
    }
    group.finish();
    for (name, service) in &services {
        if let Some(c) = service.journal_counts() {
            let per_sync = |n: u64| n as f64 / c.syncs.max(1) as f64;
            eprintln!(
                "{name}: {} records in {} syncs ({:.0} records, {:.0} µs writing and syncing, \
                 {:.0} µs waking per sync); {} syncs over 1 ms took {:.1} s of the {:.1} s \
                 syncing; {} generations began in reused files",
                c.records,
                c.syncs,
                per_sync(c.records),
                per_sync(c.sync_micros),
                per_sync(c.wake_micros),
                c.slow_syncs,
                c.slow_sync_micros as f64 / 1e6,
                c.sync_micros as f64 / 1e6,
                c.reused_files,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, journal_on_and_off);
criterion_main!(benches);
