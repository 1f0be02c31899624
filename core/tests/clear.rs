//! Mooncake's BatchQueryIp and BatchReplicaClear: a client's hosts, and clearing a client's
//! own objects whole or on one segment.

mod common;

use common::*;
use mooring_core::{ClientId, ErrorCode, Millis, ReplicateConfig};

#[test]
fn a_clients_hosts_are_its_segments_hosts_without_repeats() {
    let mut f = Fixture::new(2, MIB);
    let hosts = f.m.client_hosts(&[NODE, A]);
    assert_eq!(
        hosts,
        vec![(NODE, vec!["seg0".to_string(), "seg1".to_string()])],
        "A mounted nothing: left out"
    );
    f.mount("seg2", MIB);
    assert_eq!(f.m.client_hosts(&[NODE])[0].1.len(), 3);
    assert!(f.m.client_hosts(&[ClientId(77)]).is_empty());
}

#[test]
fn only_the_writers_unleased_objects_are_cleared_whole() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "mine", 10 * KIB, &ReplicateConfig::replicas(2));
    f.put(B, "theirs", 10 * KIB, &ReplicateConfig::single());
    f.put(A, "read", 10 * KIB, &ReplicateConfig::single());
    f.get("read").unwrap();
    let keys: Vec<String> = ["mine", "theirs", "read", "missing"]
        .map(String::from)
        .to_vec();
    let cleared = f.m.batch_replica_clear(&keys, A, None, f.now).unwrap();
    f.check();
    assert_eq!(
        cleared,
        vec!["mine".to_string()],
        "B's object and a leased one stay"
    );
    assert_eq!(code(f.get("mine")), ErrorCode::OBJECT_NOT_FOUND);
    assert!(f.get("theirs").is_ok());
    // Once the lease is over, the read object goes too.
    f.advance(Millis::from_secs(10));
    let cleared = f.m.batch_replica_clear(&keys, A, None, f.now).unwrap();
    assert_eq!(cleared, vec!["read".to_string()]);
    f.check();
}

#[test]
fn clearing_on_a_segment_drops_that_replica_and_an_only_replica_takes_the_object() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "two", 10 * KIB, &ReplicateConfig::replicas(2));
    f.put(A, "one", 10 * KIB, &ReplicateConfig::single());
    let one_on = f.get("one").unwrap().replicas[0].segment;
    f.advance(Millis::from_secs(10));
    let name =
        f.m.segments()
            .into_iter()
            .find(|s| s.id == one_on)
            .unwrap()
            .name;
    let keys = vec!["two".to_string(), "one".to_string()];
    let cleared =
        f.m.batch_replica_clear(&keys, A, Some(&name), f.now)
            .unwrap();
    f.check();
    assert_eq!(cleared, keys);
    let left = f.get("two").unwrap().replicas;
    assert_eq!(left.len(), 1, "one replica of two left");
    assert_ne!(left[0].segment, one_on);
    assert_eq!(code(f.get("one")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(
        code(f.m.batch_replica_clear(&keys, A, Some("nowhere"), f.now)),
        ErrorCode::SEGMENT_NOT_FOUND
    );
}
