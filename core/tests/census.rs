//! What an operator sees counted: objects by state (the census) and reads by tier.

mod common;

use common::*;
use mooring_core::{ErrorCode, Millis, ReplicateConfig};

#[test]
fn the_census_follows_writes_pins_and_leases() {
    let mut f = Fixture::new(1, MIB);
    f.put(A, "plain", 100, &ReplicateConfig::single());
    let pinned = ReplicateConfig {
        with_hard_pin: true,
        ..ReplicateConfig::single()
    };
    f.put(A, "pinned", 200, &pinned);
    let census = f.m.census(f.now);
    assert_eq!((census.complete, census.writing), (2, 0));
    assert_eq!(census.hard_pinned, 1);
    assert_eq!(census.leased, 0);
    assert_eq!(census.memory_bytes, 300);
    f.get("plain").unwrap();
    assert_eq!(f.m.census(f.now).leased, 1);
    // Once the lease has run out the object is no longer counted as leased.
    let after_lease = f.now + f.m.config().lease_ttl + Millis(1);
    assert_eq!(f.m.census(after_lease).leased, 0);
    f.start(A, "half", 50, &ReplicateConfig::single()).unwrap();
    let census = f.m.census(f.now);
    assert_eq!((census.complete, census.writing), (2, 1));
    // Bytes being written are not yet a value's.
    assert_eq!(census.memory_bytes, 300);
}

#[test]
fn reads_are_counted_by_tier() {
    let mut f = Fixture::new(1, MIB);
    f.put(A, "k", 100, &ReplicateConfig::single());
    f.get("k").unwrap();
    f.get("k").unwrap();
    assert_eq!(code(f.get("missing")), ErrorCode::OBJECT_NOT_FOUND);
    let reads = f.m.stats().reads;
    assert_eq!((reads.memory, reads.disk, reads.misses), (2, 0, 1));
}
