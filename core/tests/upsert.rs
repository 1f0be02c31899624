//! Hard pin and upsert (docs/upsert.md), walked branch by branch: each step of UpsertStart,
//! cases A, B and C, failures along the way, and our closing of the torn-read window.

mod common;

use common::*;
use mooring_core::{
    DiscardCause, ErrorCode, Event, MasterConfig, Millis, ReplicaStatus, ReplicateConfig,
};

fn one() -> ReplicateConfig {
    ReplicateConfig::single()
}

// ---- UpsertStart: validation -----------------------------------------------------------------

#[test]
fn upsert_start_validates_params() {
    let mut f = Fixture::new(2, MIB);
    assert_eq!(code(f.upsert(A, "", 10, &one())), ErrorCode::INVALID_PARAMS);
    assert_eq!(code(f.upsert(A, "k", 0, &one())), ErrorCode::INVALID_PARAMS);
    assert_eq!(
        code(f.upsert(A, "k", 10, &ReplicateConfig::replicas(0))),
        ErrorCode::INVALID_PARAMS
    );
    let long = "k".repeat(5000);
    let e = f.upsert(A, &long, 10, &one()).unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert!(e.to_string().contains("5000 bytes"), "{e}");
    // A size the object's 40 bits cannot hold is refused, put or upsert, before any space is
    // sought; the largest one it can hold is only refused for want of room.
    let huge = mooring_core::MAX_VALUE_SIZE + 1;
    let e = f.upsert(A, "k", huge, &one()).unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert!(e.to_string().contains("over the limit"), "{e}");
    let e = f.start(A, "k", huge, &one()).unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e}");
    assert_eq!(
        code(f.start(A, "k", mooring_core::MAX_VALUE_SIZE, &one())),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert_eq!(f.m.stats().objects, 0);
}

// ---- UpsertStart: Case A -------------------------------------------------------------------

#[test]
fn case_a_absent_key_behaves_as_put() {
    let mut f = Fixture::new(2, MIB);
    let g = f
        .upsert(A, "w", 4096, &ReplicateConfig::replicas(2))
        .unwrap();
    assert_eq!(g.replicas.len(), 2);
    assert!(
        g.replicas
            .iter()
            .all(|r| r.status == ReplicaStatus::Processing && r.len == 4096)
    );
    assert_ne!(g.replicas[0].segment, g.replicas[1].segment);
    assert_eq!(code(f.get("w")), ErrorCode::REPLICA_IS_NOT_READY);
    f.m.upsert_end(A, "w", g.write_id, sum_of("w"), f.now)
        .unwrap();
    let list = f.get("w").unwrap();
    assert_eq!(addrs(&list.replicas), addrs(&g.replicas));
    assert!(
        list.replicas
            .iter()
            .all(|r| r.status == ReplicaStatus::Complete)
    );
}

#[test]
fn stale_handles_branch_is_case_a_because_unmount_drops_replicas_eagerly() {
    // Mooncake keeps replicas on dead segments ("stale handles") and cleans them up lazily in
    // UpsertStart. Here unmounting drops them at once, so the key is simply gone.
    let mut f = Fixture::new(2, MIB);
    let cfg = one().preferring("seg0");
    f.put(A, "w", 4096, &cfg);
    f.m.unmount_segment(common::NODE, "seg0", f.now).unwrap();
    f.check();
    assert_eq!(code(f.get("w")), ErrorCode::OBJECT_NOT_FOUND);
    let g = f.upsert(A, "w", 4096, &one()).unwrap();
    assert_eq!(g.replicas.len(), 1);
}

// ---- UpsertStart: replication task -----------------------------------------------------------

#[test]
fn replication_task_blocks_upsert() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "w", 4096, &one().preferring("seg0"));
    let copy =
        f.m.copy_start(B, "w", &["seg1".to_string()], f.now)
            .unwrap();
    f.check();
    assert_eq!(
        code(f.upsert(A, "w", 4096, &one())),
        ErrorCode::OBJECT_HAS_REPLICATION_TASK
    );
    assert_eq!(code(f.remove("w")), ErrorCode::OBJECT_HAS_REPLICATION_TASK);
    f.m.task_end(B, copy.task, f.now).unwrap();
    f.check();
    assert_eq!(f.get("w").unwrap().replicas.len(), 2);
    assert!(f.upsert(A, "w", 4096, &one()).is_ok());
}

// ---- UpsertStart: preemption -----------------------------------------------------------------

#[test]
fn preemption_path_other_client_gets_illegal_client() {
    // A is mid-put, B upserts; A's End fails; A's buffers are released only after the release
    // timeout.
    let mut f = Fixture::new(2, MIB);
    let a = f.start(A, "w", 4096, &one()).unwrap();
    let used_by_a = f.used();
    let b = f.upsert(B, "w", 4096, &one()).unwrap();
    assert_ne!(
        addrs(&a.replicas),
        addrs(&b.replicas),
        "preemption allocates fresh space"
    );
    let events = f.m.drain_events();
    assert!(events.iter().any(|e| matches!(
        e,
        Event::WriteDiscarded {
            cause: DiscardCause::Preempted,
            ..
        }
    )));
    assert_eq!(code(f.end(A, "w", a.write_id)), ErrorCode::ILLEGAL_CLIENT);
    f.end(B, "w", b.write_id).unwrap();
    assert_eq!(
        f.m.stats().discarded_blocks,
        1,
        "A's block waits out the release timeout"
    );
    assert_eq!(f.used(), 2 * used_by_a);
    f.tick_after(MasterConfig::default().put_start_release_timeout);
    assert_eq!(f.m.stats().discarded_blocks, 0);
    assert_eq!(f.used(), used_by_a);
}

#[test]
fn preemption_path_same_client_gets_object_not_found() {
    let mut f = Fixture::new(2, MIB);
    let first = f.start(A, "w", 4096, &one()).unwrap();
    let second = f.upsert(A, "w", 8192, &one()).unwrap();
    assert_eq!(
        code(f.end(A, "w", first.write_id)),
        ErrorCode::OBJECT_NOT_FOUND
    );
    f.end(A, "w", second.write_id).unwrap();
    assert_eq!(f.get("w").unwrap().replicas[0].len, 8192);
}

#[test]
fn preempting_an_in_place_upsert_loses_the_old_value_it_was_overwriting() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "w", 4096, &one());
    f.advance(Millis::from_secs(6)); // no lease
    let b = f.upsert(A, "w", 4096, &one()).unwrap(); // in place: no complete replica left
    let c = f.upsert(B, "w", 4096, &one()).unwrap(); // preempts: case A, fresh buffers
    assert_ne!(addrs(&b.replicas), addrs(&c.replicas));
    assert_eq!(code(f.get("w")), ErrorCode::REPLICA_IS_NOT_READY);
}

// ---- UpsertStart: busy -----------------------------------------------------------------------

#[test]
fn held_reads_make_upsert_busy() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "w", 4096, &one());
    let (hold, _) = f.m.acquire_hold(B, "w", f.now).unwrap();
    f.check();
    for size in [4096, 8192] {
        let e = f.upsert(A, "w", size, &one()).unwrap_err();
        assert_eq!(e.code, ErrorCode::OBJECT_REPLICA_BUSY);
        assert!(e.to_string().contains("held read"), "{e}");
    }
    f.m.release_hold(B, hold, f.now).unwrap();
    f.check();
    assert!(f.upsert(A, "w", 4096, &one()).is_ok());
}

// ---- Case B ----------------------------------------------------------------------------------

#[test]
fn case_b_same_size_reuses_buffers_and_refreshes_owner_and_start() {
    // Same size, nobody reading: overwritten in place.
    let mut f = Fixture::new(2, MIB);
    let old = f.put(A, "w", 4096, &ReplicateConfig::replicas(2));
    f.advance(Millis::from_secs(6));
    let used = f.used();
    let new = f
        .upsert(B, "w", 4096, &ReplicateConfig::replicas(1))
        .unwrap();
    assert_eq!(
        addrs(&new.replicas),
        addrs(&old.replicas),
        "same buffers, replica_num ignored"
    );
    assert!(
        new.replicas
            .iter()
            .all(|r| r.status == ReplicaStatus::Processing)
    );
    assert_eq!(f.used(), used, "no extra memory");
    assert_eq!(code(f.get("w")), ErrorCode::REPLICA_IS_NOT_READY);
    assert_eq!(
        code(f.end(A, "w", old.write_id)),
        ErrorCode::ILLEGAL_CLIENT,
        "client id refreshed"
    );
    // put_start_time refreshed: the discard timeout counts from the upsert.
    f.tick_after(Millis::from_secs(29));
    f.end(B, "w", new.write_id).unwrap();
    assert_eq!(addrs(&f.get("w").unwrap().replicas), addrs(&old.replicas));
}

#[test]
fn case_b_reconciles_soft_pin_and_keeps_hard_pin() {
    let mut f = Fixture::new(1, MIB);
    f.put(A, "w", 4096, &one().hard_pinned());
    f.advance(Millis::from_secs(6));
    let g = f
        .upsert(A, "w", 4096, &one().soft_pinned(Some(Millis(50))))
        .unwrap();
    f.end(A, "w", g.write_id).unwrap();
    // Churn enough puts through the segment that everything evictable goes at least once.
    churn(&mut f, 100, 64 * KIB);
    assert!(f.get("w").is_ok(), "hard pin survives upsert and eviction");
    assert!(f.m.stats().evicted_objects > 0);
}

/// Puts and ends `n` objects of `size` bytes, evicting as needed.
fn churn(f: &mut Fixture, n: usize, size: u64) {
    for i in 0..n {
        let key = format!("churn{i}");
        if let Ok(g) = f.start(B, &key, size, &ReplicateConfig::single()) {
            f.end(B, &key, g.write_id).unwrap();
        }
        f.advance(Millis(10));
    }
}

#[test]
fn case_b_hung_writer_loses_the_object_after_the_discard_timeout() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "w", 4096, &one());
    f.advance(Millis::from_secs(6));
    f.upsert(A, "w", 4096, &one()).unwrap(); // then the client hangs, still heartbeating
    f.tick_after(Millis::from_secs(29));
    assert_eq!(code(f.get("w")), ErrorCode::REPLICA_IS_NOT_READY);
    f.tick_after(Millis::from_secs(1));
    assert_eq!(code(f.get("w")), ErrorCode::OBJECT_NOT_FOUND);
    assert!(f.m.drain_events().iter().any(|e| matches!(
        e,
        Event::WriteDiscarded {
            cause: DiscardCause::Timeout,
            object_removed: true,
            ..
        }
    )));
}

#[test]
fn crashed_writer_is_discarded_when_its_client_expires() {
    let mut f = Fixture::new(2, MIB);
    f.start(A, "w", 4096, &one()).unwrap(); // then the client dies
    f.tick_silent(Millis::from_secs(10));
    assert_eq!(code(f.get("w")), ErrorCode::OBJECT_NOT_FOUND);
    let events = f.m.drain_events();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::ClientExpired { client } if *client == A))
    );
    assert!(events.iter().any(|e| matches!(
        e,
        Event::WriteDiscarded {
            cause: DiscardCause::WriterDead,
            ..
        }
    )));
    // Its writer's fence closed (5 s window plus 2 s late landing) before the client TTL ran
    // out, so its block is free at once.
    assert_eq!(f.m.stats().discarded_blocks, 0);
    assert_eq!(f.used(), 0);
}

#[test]
fn case_b_revoke_loses_the_old_value() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "w", 4096, &one());
    f.advance(Millis::from_secs(6));
    let used_before = f.used();
    let g = f.upsert(A, "w", 4096, &one()).unwrap();
    f.m.upsert_revoke(A, "w", g.write_id, f.now).unwrap();
    f.check();
    assert_eq!(code(f.get("w")), ErrorCode::OBJECT_NOT_FOUND);
    assert!(f.used() < used_before, "revoked buffers are freed at once");
}

// ---- Case C ----------------------------------------------------------------------------------

#[test]
fn case_c_new_size_reallocates_and_releases_old_after_lease() {
    // A new size while a reader holds the old value.
    let mut f = Fixture::new(2, MIB);
    let old = f.put(A, "w", 4096, &one());
    let read = f.get("w").unwrap(); // a reader holds descriptors and a lease
    let g = f.upsert(A, "w", 10_000, &one()).unwrap();
    assert_ne!(addrs(&g.replicas), addrs(&old.replicas));
    assert_eq!(g.replicas[0].len, 10_000);
    assert_eq!(
        f.m.stats().discarded_blocks,
        1,
        "old buffer waits for the reader's lease"
    );
    f.end(A, "w", g.write_id).unwrap();
    assert_eq!(f.get("w").unwrap().replicas[0].len, 10_000);
    f.tick_after(read.lease_ttl + MasterConfig::default().lease_grace);
    assert_eq!(f.m.stats().discarded_blocks, 0);
}

#[test]
fn case_c_without_readers_frees_old_buffers_at_once() {
    let mut f = Fixture::new(1, MIB);
    f.put(A, "w", 4096, &one());
    f.advance(Millis::from_secs(6));
    let g = f.upsert(A, "w", 100, &one()).unwrap();
    assert_eq!(f.m.stats().discarded_blocks, 0);
    assert_eq!(f.used(), 128);
    f.end(A, "w", g.write_id).unwrap();
}

#[test]
fn case_c_allocation_failure_keeps_the_old_value() {
    // Allocating before releasing: a failed upsert leaves the old value readable.
    let mut f = Fixture::new(1, 64 * KIB);
    f.put(A, "w", 4096, &one().hard_pinned());
    let e = f.upsert(A, "w", MIB, &one()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NO_AVAILABLE_HANDLE);
    assert_eq!(f.get("w").unwrap().replicas[0].len, 4096);
}

#[test]
fn case_c_keeps_hard_pin() {
    let mut f = Fixture::new(1, MIB);
    f.put(A, "w", 4096, &one().hard_pinned());
    f.advance(Millis::from_secs(6));
    let g = f.upsert(A, "w", 8192, &one()).unwrap();
    f.end(A, "w", g.write_id).unwrap();
    f.advance(Millis::from_secs(6));
    churn(&mut f, 100, 32 * KIB);
    f.tick_after(Millis(200));
    assert!(f.get("w").is_ok());
    assert!(f.m.stats().evicted_objects > 0);
    // Remove clears it.
    f.advance(Millis::from_secs(6));
    f.remove("w").unwrap();
}

// ---- the torn-read window --------------------------------------------------------------------

#[test]
fn same_size_upsert_while_leased_writes_fresh_buffers() {
    let mut f = Fixture::new(2, MIB);
    let old = f.put(A, "w", 4096, &one());
    let reader = f.get("w").unwrap(); // lease until now + 5 s
    let g = f.upsert(B, "w", 4096, &one()).unwrap();
    assert_ne!(
        addrs(&g.replicas),
        addrs(&reader.replicas),
        "the reader's bytes are not overwritten"
    );
    assert_eq!(f.m.stats().discarded_blocks, 1);
    assert_eq!(code(f.get("w")), ErrorCode::REPLICA_IS_NOT_READY);
    f.end(B, "w", g.write_id).unwrap();
    assert_eq!(addrs(&f.get("w").unwrap().replicas), addrs(&g.replicas));
    // The old block is reused only after the lease (plus grace).
    f.tick_after(Millis(4_000));
    assert_eq!(f.m.stats().discarded_blocks, 1);
    f.tick_after(Millis(1_200));
    assert_eq!(f.m.stats().discarded_blocks, 0);
    let _ = old;
}

#[test]
fn exist_also_protects_against_in_place_overwrite() {
    let mut f = Fixture::new(2, MIB);
    let old = f.put(A, "w", 4096, &one());
    f.advance(Millis::from_secs(6));
    assert!(f.m.exist("w", f.now).unwrap());
    let g = f.upsert(B, "w", 4096, &one()).unwrap();
    assert_ne!(addrs(&g.replicas), addrs(&old.replicas));
}

#[test]
fn same_size_upsert_while_leased_and_full_is_busy_not_torn() {
    let mut f = Fixture::new(1, 8 * KIB);
    let old = f.put(A, "w", 6000, &one().hard_pinned());
    f.get("w").unwrap();
    let e = f.upsert(B, "w", 6000, &one()).unwrap_err();
    assert_eq!(e.code, ErrorCode::OBJECT_REPLICA_BUSY);
    assert!(e.to_string().contains("lease"), "{e}");
    assert_eq!(
        addrs(&f.get("w").unwrap().replicas),
        addrs(&old.replicas),
        "old value intact"
    );
    f.advance(Millis::from_secs(6));
    let g = f.upsert(B, "w", 6000, &one()).unwrap();
    assert_eq!(
        addrs(&g.replicas),
        addrs(&old.replicas),
        "in place once the lease is over"
    );
}

// ---- batches ---------------------------------------------------------------------------------

#[test]
fn batch_upsert_start_end_revoke_report_per_key() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "a", 100, &one());
    f.advance(Millis::from_secs(6));
    let grants =
        f.m.batch_upsert_start(A, &[("a", 100), ("b", 200), ("", 1)], &one(), f.now);
    f.check();
    assert!(grants[0].is_ok() && grants[1].is_ok());
    assert_eq!(
        grants[2].as_ref().unwrap_err().code,
        ErrorCode::INVALID_PARAMS
    );
    let ends = f.m.batch_upsert_end(
        A,
        &[
            ("a", grants[0].as_ref().unwrap().write_id, sum_of("a")),
            ("zz", grants[1].as_ref().unwrap().write_id, sum_of("zz")),
        ],
        f.now,
    );
    assert!(ends[0].is_ok());
    assert_eq!(
        ends[1].as_ref().unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    let revokes =
        f.m.batch_upsert_revoke(A, &[("b", grants[1].as_ref().unwrap().write_id)], f.now);
    assert!(revokes[0].is_ok());
    f.check();
    assert!(f.get("a").is_ok());
    assert_eq!(code(f.get("b")), ErrorCode::OBJECT_NOT_FOUND);
}
