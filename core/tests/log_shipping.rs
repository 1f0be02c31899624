//! Log shipping: what the leader may acknowledge, and when a standby may take over.

use mooring_core::Millis;
use mooring_core::leadership::LeaderLease;
use mooring_core::log_shipping::{LogPosition, LogShipping, Membership, NEAR};

fn at(generation: u64, offset: u64) -> LogPosition {
    LogPosition { generation, offset }
}

/// Standby `name` was sent the journal up to `position` and says it holds it.
fn ack(log: &mut LogShipping, name: &str, position: LogPosition) -> Membership {
    log.sent(name, position);
    log.acked(name, position)
}

#[test]
fn a_claim_beyond_what_the_leader_sent_counts_only_as_far_as_was_sent() {
    let mut log = LogShipping::new(0, at(1, 100));
    // A standby (or someone using its name) claims the whole journal, and more, having been
    // sent nothing: it is not waited for, let alone in sync.
    assert_eq!(log.acked("b", at(9, u64::MAX)), Membership::Unchanged);
    assert!(log.in_sync().is_empty());
    log.synced(5, at(1, 600), Millis(10));
    assert_eq!(
        log.replicated(),
        5,
        "b holds nothing, and is not waited for"
    );
    // Sent the journal to 1/100: its claim counts that far, and it joins.
    log.sent("b", at(1, 100));
    assert_eq!(log.acked("b", at(9, u64::MAX)), Membership::Unchanged);
    log.sent("b", at(1, 600));
    assert_eq!(
        log.acked("b", at(9, u64::MAX)),
        Membership::Join("b".into())
    );
    log.synced(7, at(1, 900), Millis(11));
    assert_eq!(
        log.replicated(),
        5,
        "7 waits for b, which was sent only to 1/600"
    );
}

#[test]
fn without_standbys_a_sync_is_acknowledged_at_once() {
    let mut log = LogShipping::new(0, at(1, 100));
    log.synced(5, at(1, 600), Millis(10));
    assert_eq!(log.replicated(), 5);
}

#[test]
fn an_in_sync_standby_holds_acknowledgements_until_it_has_the_bytes() {
    let mut log = LogShipping::new(0, at(1, 100));
    assert_eq!(ack(&mut log, "b", at(1, 100)), Membership::Join("b".into()));
    log.synced(5, at(1, 600), Millis(10));
    assert_eq!(log.replicated(), 0, "b does not hold record 5 yet");
    log.synced(9, at(2, 50), Millis(11));
    assert_eq!(ack(&mut log, "b", at(1, 600)), Membership::Unchanged);
    assert_eq!(log.replicated(), 5, "b holds 5, not 9 (next generation)");
    ack(&mut log, "b", at(2, 50));
    assert_eq!(log.replicated(), 9);
}

#[test]
fn a_standby_joins_only_once_it_holds_what_was_acknowledged_without_it() {
    let mut log = LogShipping::new(0, at(1, 100));
    log.synced(3, at(1, 10_000), Millis(1));
    assert_eq!(log.replicated(), 3, "no standby yet: acknowledged alone");
    // Near the newest sync: waited for from now on, but not yet eligible.
    assert_eq!(ack(&mut log, "b", at(1, 9_000)), Membership::Unchanged);
    log.synced(4, at(1, 12_000), Millis(2));
    assert_eq!(log.replicated(), 3, "4 waits for b");
    assert!(log.in_sync().is_empty());
    // It now holds record 3, the last acknowledged without it.
    assert_eq!(
        ack(&mut log, "b", at(1, 10_000)),
        Membership::Join("b".into())
    );
    assert_eq!(log.in_sync(), vec!["b".to_string()]);
    assert_eq!(log.replicated(), 3);
    ack(&mut log, "b", at(1, 12_000));
    assert_eq!(log.replicated(), 4);
}

#[test]
fn a_distant_standby_is_not_waited_for() {
    let mut log = LogShipping::new(0, at(1, 100));
    log.synced(3, at(1, 10 * NEAR), Millis(1));
    assert_eq!(ack(&mut log, "b", at(1, 100)), Membership::Unchanged);
    log.synced(4, at(1, 10 * NEAR + 10), Millis(2));
    assert_eq!(log.replicated(), 4);
    assert!(log.overdue(Millis(5_000), Millis(1_000)).is_empty());
}

#[test]
fn a_standby_that_holds_back_a_sync_too_long_is_overdue_until_dropped() {
    let mut log = LogShipping::new(0, at(1, 100));
    ack(&mut log, "b", at(1, 100));
    ack(&mut log, "c", at(1, 100));
    log.synced(2, at(1, 200), Millis(1_000));
    ack(&mut log, "c", at(1, 200));
    assert!(log.overdue(Millis(1_500), Millis(1_000)).is_empty());
    assert_eq!(
        log.overdue(Millis(2_000), Millis(1_000)),
        vec!["b".to_string()]
    );
    assert_eq!(log.replicated(), 0, "still waiting until b is recorded out");
    log.drop_follower("b");
    assert_eq!(log.replicated(), 2);
    assert_eq!(log.in_sync(), vec!["c".to_string()]);
}

#[test]
fn a_leader_stops_granting_before_its_lease_can_expire() {
    let ttl = Millis::from_secs(2);
    let margin = Millis(300);
    let mut lease = LeaderLease::granted(ttl, margin, Millis(1_000));
    assert!(lease.valid(Millis(2_699)));
    assert!(!lease.valid(Millis(2_700)), "sent at 1 s + 2 s - 0.3 s");
    // A renewal confirmed late counts from when it was sent.
    lease.renewed(Millis(1_500));
    assert_eq!(lease.valid_until(), Millis(3_200));
    // An older renewal confirmed after a newer one changes nothing.
    lease.renewed(Millis(1_200));
    assert_eq!(lease.valid_until(), Millis(3_200));
}
