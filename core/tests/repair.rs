//! Re-replication: objects that lost a replica with a segment are queued, and repair copies
//! handed to nodes bring them back to their count.

mod common;

use common::*;
use mooring_core::{ReplicateConfig, SegmentId};

fn holders(f: &mut Fixture, key: &str) -> Vec<SegmentId> {
    let mut segments: Vec<SegmentId> = f
        .get(key)
        .unwrap()
        .replicas
        .iter()
        .map(|r| r.segment)
        .collect();
    segments.sort();
    segments
}

fn name_of(f: &Fixture, id: SegmentId) -> String {
    f.m.segments()
        .into_iter()
        .find(|s| s.id == id)
        .unwrap()
        .name
}

#[test]
fn a_lost_replica_is_copied_back_from_the_survivor() {
    let mut f = Fixture::new(3, MIB);
    f.put(A, "two", 4096, &ReplicateConfig::replicas(2));
    f.put(A, "one", 4096, &ReplicateConfig::single());
    let gone = holders(&mut f, "two")[0];
    let gone_name = name_of(&f, gone);
    f.m.unmount_segment(NODE, &gone_name, f.now).unwrap();
    f.check();
    // "two" kept one of two; "one" either kept its only replica or was lost: nothing to repair.
    assert_eq!(f.m.stats().repairs_waiting, 1);
    let grants = f.m.take_repairs(B, 8, f.now);
    f.check();
    assert_eq!(grants.len(), 1);
    let (key, grant) = &grants[0];
    assert_eq!(key, "two");
    assert_eq!(grant.targets.len(), 1);
    let left = holders(&mut f, "two");
    assert!(
        !left.contains(&grant.targets[0].segment),
        "a target beside the survivor"
    );
    assert_eq!(grant.checksum, sum_of("two"));
    f.m.task_end(B, grant.task, f.now).unwrap();
    f.check();
    assert_eq!(holders(&mut f, "two").len(), 2);
    assert_eq!(f.m.stats().repairs_waiting, 0);
    assert!(f.m.take_repairs(B, 8, f.now).is_empty());
}

#[test]
fn a_failed_repair_waits_for_the_next_ask_and_one_without_room_waits_for_room() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "two", 4096, &ReplicateConfig::replicas(2));
    let gone = holders(&mut f, "two")[0];
    let gone_name = name_of(&f, gone);
    f.m.unmount_segment(NODE, &gone_name, f.now).unwrap();
    // One segment left, and it holds the survivor: nowhere to copy to.
    assert!(f.m.take_repairs(B, 8, f.now).is_empty());
    assert_eq!(f.m.stats().repairs_waiting, 1);
    f.mount("seg9", MIB);
    let grants = f.m.take_repairs(B, 8, f.now);
    assert_eq!(grants.len(), 1);
    // The node carrying it out fails midway: the repair goes back in the queue.
    f.m.task_abort(B, grants[0].1.task, f.now).unwrap();
    f.check();
    assert_eq!(f.m.stats().repairs_waiting, 1);
    // ...after a backoff: not at once.
    assert!(f.m.take_repairs(B, 8, f.now).is_empty());
    f.advance(mooring_core::Millis::from_secs(2));
    let again = f.m.take_repairs(B, 8, f.now);
    assert_eq!(again.len(), 1);
    f.m.task_end(B, again[0].1.task, f.now).unwrap();
    assert_eq!(holders(&mut f, "two").len(), 2);
    // A removed object leaves the queue without a copy.
    f.put(A, "three", 4096, &ReplicateConfig::replicas(3));
    let seg9 =
        f.m.segments()
            .into_iter()
            .find(|s| s.name == "seg9")
            .unwrap();
    f.m.unmount_segment(NODE, &seg9.name, f.now).unwrap();
    assert!(f.m.stats().repairs_waiting >= 1);
    f.advance(mooring_core::Millis::from_secs(6));
    f.remove("three").unwrap();
    f.remove("two").unwrap();
    assert!(f.m.take_repairs(B, 8, f.now).is_empty());
    assert_eq!(f.m.stats().repairs_waiting, 0);
}
