//! Model-based test: random operation sequences run against the master while the testkit's
//! reference model and byte-level memory judge every result and event, and the invariant
//! checker runs after every step (in the style of quinn-proto's `random_interaction` tests).

use mooring_core::testkit::{Harness, Op, Pin};
use proptest::prelude::*;

fn pin() -> impl Strategy<Value = Pin> {
    prop_oneof![
        5 => Just(Pin::None),
        1 => Just(Pin::Soft),
        1 => any::<u16>().prop_map(Pin::SoftTtl),
        1 => Just(Pin::Unpin),
        2 => Just(Pin::Hard),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0u8..3;
    let k = 0u8..12;
    prop_oneof![
        8 => any::<u16>().prop_map(|ms| Op::Advance { ms }),
        2 => Just(Op::Tick),
        4 => Just(Op::TickIfDue),
        2 => c.clone().prop_map(|client| Op::Heartbeat { client }),
        1 => c.clone().prop_map(|client| Op::Goodbye { client }),
        1 => (c.clone(), 0u8..4, any::<u8>()).prop_map(|(client, segment, kib)| Op::Mount { client, segment, kib }),
        1 => (c.clone(), 0u8..4).prop_map(|(client, segment)| Op::Unmount { client, segment }),
        10 => (c.clone(), k.clone(), any::<u16>(), any::<u8>(), pin(), proptest::option::of(0u8..4))
            .prop_map(|(client, key, size, replicas, pin, prefer)| Op::Put { client, key, size, replicas, pin, prefer }),
        6 => (c.clone(), k.clone(), any::<u16>(), any::<u8>(), pin(), proptest::option::of(0u8..4))
            .prop_map(|(client, key, size, replicas, pin, prefer)| Op::Upsert { client, key, size, replicas, pin, prefer }),
        10 => (c.clone(), any::<u8>(), any::<bool>()).prop_map(|(client, grant, partial)| Op::Transfer { client, grant, partial: partial && grant % 4 == 0 }),
        8 => (c.clone(), any::<u8>()).prop_map(|(client, grant)| Op::End { client, grant }),
        1 => (c.clone(), any::<u8>()).prop_map(|(client, grant)| Op::Revoke { client, grant }),
        1 => (c.clone(), any::<u8>()).prop_map(|(client, grant)| Op::Abort { client, grant }),
        10 => (k.clone(), any::<bool>()).prop_map(|(key, keep)| Op::Get { key, keep }),
        4 => any::<u8>().prop_map(|read| Op::ReadLate { read }),
        3 => k.clone().prop_map(|key| Op::Exist { key }),
        1 => any::<u8>().prop_map(|prefix| Op::Query { prefix }),
        3 => k.clone().prop_map(|key| Op::Remove { key }),
        1 => Just(Op::RemoveAll),
        1 => any::<u8>().prop_map(|prefix| Op::RemoveByRegex { prefix }),
        2 => (c.clone(), k.clone()).prop_map(|(client, key)| Op::Hold { client, key }),
        2 => (c.clone(), any::<u8>(), any::<bool>()).prop_map(|(client, hold, foreign)| Op::Release { client, hold, foreign: foreign && hold % 3 == 0 }),
        2 => (c.clone(), k.clone(), 0u8..4).prop_map(|(client, key, target)| Op::Copy { client, key, target }),
        1 => (c.clone(), k.clone(), 0u8..4, 0u8..4).prop_map(|(client, key, source, target)| Op::Move { client, key, source, target }),
        2 => (c.clone(), any::<u8>()).prop_map(|(client, task)| Op::TaskTransfer { client, task }),
        2 => (c.clone(), any::<u8>()).prop_map(|(client, task)| Op::TaskEnd { client, task }),
        1 => (c.clone(), any::<u8>()).prop_map(|(client, task)| Op::TaskRevoke { client, task }),
        1 => Just(Op::Snapshot),
        1 => any::<u8>().prop_map(|kind| Op::BadInput { kind }),
        8 => (0u8..4, prop_oneof![6 => 0u8..5, 1 => 128u8..133], any::<u8>()).prop_map(|(segment, want, dice)| Op::DiskSync {
            segment,
            want,
            fail: dice % 16 == 0,
            evict: dice % 8 == 1,
        }),
    ]
}

/// `ops` (a step may expand to several) after remounting the harness's three segments at
/// 16 KiB each, so a dozen keys keep the pool full.
fn on_small_pools(ops: Vec<Vec<Op>>) -> Vec<Op> {
    (0..3u8)
        .flat_map(|n| {
            [
                Op::Unmount {
                    client: n,
                    segment: n,
                },
                Op::Mount {
                    client: n,
                    segment: n,
                    kib: 16,
                },
            ]
        })
        .chain(ops.into_iter().flatten())
        .collect()
}

/// Fails unless every path in `required` was reached in `total`.
fn assert_reached(required: &[&str], total: &std::collections::BTreeMap<&'static str, u64>) {
    let missing: Vec<&str> = required
        .iter()
        .copied()
        .filter(|w| !total.contains_key(w))
        .collect();
    assert!(
        missing.is_empty(),
        "never reached {missing:?}; coverage {total:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("MOORING_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256),
        max_shrink_iters: 20_000,
        .. ProptestConfig::default()
    })]

    #[test]
    fn random_interaction(seed in any::<u64>(), ops in prop::collection::vec(op(), 1..400)) {
        let mut harness = Harness::new(seed);
        if let Err(e) = harness.run(&ops) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// The random interactions above must actually reach every interesting path; otherwise the
/// model test could pass by never trying anything.
#[test]
fn random_interaction_reaches_every_path() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    use std::collections::BTreeMap;

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let strategy = (any::<u64>(), prop::collection::vec(op(), 300..400));
    let mut total: BTreeMap<&'static str, u64> = BTreeMap::new();
    for _ in 0..300 {
        let (seed, ops) = strategy.new_tree(&mut runner).expect("generate").current();
        let mut harness = Harness::new(seed);
        harness.run(&ops).expect("deterministic cases pass");
        for (what, n) in harness.coverage() {
            *total.entry(what).or_default() += n;
        }
    }
    let required = [
        "create",
        "start-over-share",
        "preempt",
        "start-refused",
        "start-no-room-or-busy",
        "upsert-in-place",
        "upsert-copy-on-write",
        "upsert-new-size",
        "zombie-write",
        "end",
        "end-superseded",
        "end-illegal-client",
        "revoke",
        "read",
        "late-read",
        "late-read-of-replaced-value",
        "remove",
        "remove-leased",
        "remove-refused",
        "hold",
        "copy",
        "move",
        "task-end",
        "task-abandoned",
        "snapshot",
        "remount",
        "client-expired",
        "client-left",
        "object-lost",
        "write-timeout",
        "writer-dead",
        "write-preempted",
        "write-aborted",
        "abort",
        "evict",
        "evict-soft-pinned",
        "evict-to-disk",
        "read-disk",
        "disk-order",
        "disk-order-late",
        "disk-order-failed",
        "disk-offloaded",
        "disk-offload-stale",
        "disk-evict",
        "disk-evict-object",
        "disk-tombstone-carried-out",
        "disk-copy-departed",
        "disk-ghost",
        "disk-recovery-report",
        "disk-recovered",
        "disk-recovered-adopted",
        "disk-recovered-refused",
    ];
    eprintln!("coverage over 300 runs: {total:?}");
    assert_reached(&required, &total);
}

/// Churn of complete objects of mixed sizes (some hard-pinned, some read recently): the shape
/// under which LRU eviction leaves holes and large values need a window eviction. Judged by the
/// same model; this test also requires that window evictions happen.
fn churn_op() -> impl Strategy<Value = Vec<Op>> {
    let c = 0u8..3;
    prop_oneof![
        6 => (c.clone(), 0u8..12, any::<u16>(), pin()).prop_map(|(client, key, size, pin)| vec![
            Op::Upsert { client, key, size, replicas: 0, pin, prefer: None },
            Op::End { client, grant: 0 },
        ]),
        2 => (0u8..12).prop_map(|key| vec![Op::Get { key, keep: false }]),
        2 => any::<u16>().prop_map(|ms| vec![Op::Advance { ms: ms % 200 }, Op::TickIfDue]),
        1 => (0u8..3).prop_map(|client| vec![Op::Heartbeat { client }]),
    ]
}

#[test]
fn random_churn_exercises_window_eviction() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = (any::<u64>(), prop::collection::vec(churn_op(), 100..200));
    let mut windows = 0;
    for _ in 0..300 {
        let (seed, ops) = strategy.new_tree(&mut runner).expect("generate").current();
        // Shrink the pool to 3 x 20 KiB so a dozen keys of up to 24 KiB keep it full.
        let mut ops = on_small_pools(ops);
        ops.push(Op::Tick);
        let mut harness = Harness::new(seed);
        if let Err(e) = harness.run(&ops) {
            panic!("seed {seed}: {e}");
        }
        windows += harness.coverage().get("evict-window").copied().unwrap_or(0);
    }
    assert!(windows > 0, "no window eviction in 60 churn runs");
}

/// Churn with disks: small pools whose nodes sync their disks often, so objects are offloaded,
/// evicted to disk, read from disk, evicted from disk, and recovered when a node restarts
/// (remounts its segment). Judged by the same model; requires those paths.
fn disk_churn_op() -> impl Strategy<Value = Vec<Op>> {
    let c = 0u8..3;
    prop_oneof![
        6 => (c.clone(), 0u8..12, any::<u16>(), pin()).prop_map(|(client, key, size, pin)| vec![
            Op::Upsert { client, key, size, replicas: 0, pin, prefer: None },
            Op::Transfer { client, grant: 0, partial: false },
            Op::End { client, grant: 0 },
        ]),
        3 => (0u8..12).prop_map(|key| vec![Op::Get { key, keep: false }]),
        1 => (0u8..12).prop_map(|key| vec![Op::Remove { key }]),
        4 => (0u8..3, 0u8..5, any::<u8>()).prop_map(|(segment, want, dice)| vec![Op::DiskSync {
            segment,
            want,
            fail: dice % 32 == 0,
            evict: dice % 8 == 1,
        }]),
        2 => any::<u16>().prop_map(|ms| vec![Op::Advance { ms: ms % 200 }, Op::TickIfDue]),
        1 => (0u8..3).prop_map(|client| vec![Op::Heartbeat { client }]),
        // A node restarts: it mounts its segment again, then its disk reports what it holds.
        1 => (0u8..3, any::<u8>()).prop_map(|(n, kib)| vec![
            Op::Mount { client: n, segment: n, kib: 12 + kib % 8 },
            Op::DiskSync { segment: n, want: 2, fail: false, evict: false },
        ]),
    ]
}

#[test]
fn random_disk_churn_exercises_the_disk_tier() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use std::collections::BTreeMap;

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = (
        any::<u64>(),
        prop::collection::vec(disk_churn_op(), 100..200),
    );
    let mut total: BTreeMap<&'static str, u64> = BTreeMap::new();
    for _ in 0..300 {
        let (seed, ops) = strategy.new_tree(&mut runner).expect("generate").current();
        let ops = on_small_pools(ops);
        let mut harness = Harness::new(seed);
        if let Err(e) = harness.run(&ops) {
            panic!("seed {seed}: {e}");
        }
        for (what, n) in harness.coverage() {
            *total.entry(what).or_default() += n;
        }
    }
    eprintln!("disk churn coverage over 300 runs: {total:?}");
    let required = [
        "evict-to-disk",
        "read-disk",
        "disk-offloaded",
        "disk-evict",
        "disk-evict-object",
        "disk-tombstone-carried-out",
        "disk-recovered-adopted",
        "disk-recovered-refused",
    ];
    assert_reached(&required, &total);
}
