//! The auditor ([`invariants::Auditor`]): it passes a master that keeps its timing promises,
//! and names a block reused too soon or a deadline left undone. A master that breaks a
//! promise is made from two masters fed the same calls with different settings: the auditor
//! learns the promise from the first and watches the second break it.

mod common;

use common::*;
use mooring_core::invariants::{Auditor, ReuseLedger, check_timer_done};
use mooring_core::{MasterConfig, Millis, ReplicateConfig};

fn one() -> ReplicateConfig {
    ReplicateConfig::single()
}

fn with_grace(grace: u64) -> Fixture {
    let config = MasterConfig {
        lease_grace: Millis(grace),
        ..MasterConfig::default()
    };
    Fixture::with_config(config, 1, 64 * KIB)
}

/// Runs one call on `f` and shows the result to `auditor`.
fn audited<T>(f: &mut Fixture, auditor: &mut Auditor, call: impl FnOnce(&mut Fixture) -> T) -> T {
    let out = call(f);
    let events = f.m.drain_events();
    let key_changes = f.m.drain_key_changes();
    if let Err(v) = auditor.after_call(&f.m, &events, &key_changes, &[]) {
        panic!("{v}");
    }
    out
}

#[test]
fn a_master_that_keeps_its_promises_passes_every_step() {
    let mut f = Fixture::new(1, 64 * KIB);
    let mut auditor = Auditor::new();
    audited(&mut f, &mut auditor, |f| f.put(A, "k", 4 * KIB, &one()));
    audited(&mut f, &mut auditor, |f| f.get("k").unwrap());
    // Leased: the upsert copies beside the readers; their blocks wait out lease and grace.
    let g = audited(&mut f, &mut auditor, |f| {
        f.upsert(B, "k", 4 * KIB, &one()).unwrap()
    });
    audited(&mut f, &mut auditor, |f| f.end(B, "k", g.write_id).unwrap());
    for _ in 0..20 {
        audited(&mut f, &mut auditor, |f| {
            f.tick_after(Millis(500));
            f.get("k").unwrap();
            let g = f.upsert(A, "k", 4 * KIB, &one()).unwrap();
            f.end(A, "k", g.write_id).unwrap();
        });
        if let Err(v) = auditor.after_timer(&f.m) {
            panic!("{v}");
        }
    }
    let counts = auditor.reuse_counts();
    assert!(counts.after_readers > 0, "{counts:?}");
    assert!(auditor.first_violation().is_none());
}

#[test]
fn an_in_place_overwrite_inside_the_grace_is_named() {
    // The same calls on two masters: `promised` has a grace of a second, `breaking` none.
    let (mut promised, mut breaking) = (with_grace(1_000), with_grace(0));
    let mut ledger = ReuseLedger::default();
    for f in [&mut promised, &mut breaking] {
        f.put(A, "k", 4 * KIB, &one());
        f.get("k").unwrap();
    }
    ledger.observe(&promised.m, &[]).unwrap();
    // Just after the lease: `breaking` overwrites in place, inside `promised`'s grace.
    breaking.advance(MasterConfig::default().lease_ttl + Millis(10));
    breaking.upsert(B, "k", 4 * KIB, &one()).unwrap();
    let events = breaking.m.drain_events();
    let v = ledger
        .observe(&breaking.m, &events)
        .expect_err("reused inside the grace");
    assert_eq!(v.invariant, "block-reuse");
    assert!(v.detail.contains("readers of its value"), "{v}");
}

#[test]
fn a_discarded_writers_block_reused_before_its_delay_is_named() {
    let config = |release: u64| MasterConfig {
        put_start_discard_timeout: Millis(2_000),
        put_start_release_timeout: Millis(release),
        // One put fills the pool here.
        unfinished_put_share: 1.0,
        ..MasterConfig::default()
    };
    // `promised` keeps a zombie's blocks until its last byte can have landed (the write fence:
    // a 5 s window plus 2 s late landing after the start); `breaking`, with a release timeout
    // of 3 s, frees them at 3 s.
    let mut promised = Fixture::with_config(config(600_000), 1, 8 * KIB);
    let mut breaking = Fixture::with_config(config(3_000), 1, 8 * KIB);
    for f in [&mut promised, &mut breaking] {
        f.start(A, "k", 8 * KIB, &one()).unwrap();
    }
    let mut ledger = ReuseLedger::default();
    ledger.observe(&promised.m, &[]).unwrap();
    // A keeps heartbeating (alive) but never ends: the write is discarded at 2 s. The ledger
    // learns the delay from `promised`'s configuration; `breaking` frees the block at 3 s.
    for f in [&mut promised, &mut breaking] {
        f.tick_after(Millis(2_000));
    }
    let discarded = promised.m.drain_events();
    ledger.observe(&promised.m, &discarded).unwrap();
    breaking.tick_after(Millis(1_010));
    breaking.start(B, "other", 8 * KIB, &one()).unwrap();
    let v = ledger
        .observe(&breaking.m, &[])
        .expect_err("reused before the release delay");
    assert!(v.detail.contains("abandoned writer"), "{v}");
    // `promised` frees it once the fence says the last byte landed, not ten minutes later.
    promised.tick_after(Millis(4_990));
    assert!(promised.start(B, "other", 8 * KIB, &one()).is_err());
    promised.tick_after(Millis(20));
    promised.start(B, "other", 8 * KIB, &one()).unwrap();
    let events = promised.m.drain_events();
    ledger.observe(&promised.m, &events).unwrap();
}

#[test]
fn a_write_past_its_discard_timeout_is_named_until_the_timer_runs() {
    let mut f = Fixture::new(1, 64 * KIB);
    f.start(A, "k", 4 * KIB, &one()).unwrap();
    check_timer_done(&f.m).unwrap();
    let discard = MasterConfig::default().put_start_discard_timeout;
    f.advance(discard);
    // Any call moves the master's clock without running its timed duties.
    f.m.heartbeat(A, f.now);
    let v = check_timer_done(&f.m).expect_err("the write outlived its discard timeout");
    assert_eq!(v.invariant, "write-discard-timeout");
    f.m.tick(f.now);
    check_timer_done(&f.m).unwrap();
}
