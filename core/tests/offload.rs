//! The SSD tier's policy (docs/ssd-tier.md, docs/prefetch.md): offload selection, disk
//! replicas, versioned tombstones, disk eviction, recovery and prefetch, checked against the
//! invariants at every step.

mod common;

use common::*;
use mooring_core::{
    ClientId, DiskReport, DiskSyncAck, ErrorCode, Event, Master, MasterConfig, Medium, Millis,
    ReplicateConfig, SegmentId, SegmentSpec, WriteId,
};

fn one() -> ReplicateConfig {
    ReplicateConfig::single()
}

fn segment_id(f: &Fixture, name: &str) -> SegmentId {
    f.m.segments().iter().find(|s| s.name == name).unwrap().id
}

/// One disk sync from NODE for segment `name`.
fn sync(f: &mut Fixture, name: &str, report: DiskReport) -> DiskSyncAck {
    let id = segment_id(f, name);
    let ack = f.m.disk_sync(NODE, id, report, f.now).unwrap();
    f.check();
    ack
}

/// The (key, write) of every order in `ack`.
fn ordered(ack: &DiskSyncAck) -> Vec<(String, WriteId)> {
    ack.offload
        .iter()
        .map(|o| (o.key.clone(), o.write))
        .collect()
}

fn want(n: u32) -> DiskReport {
    DiskReport {
        want: n,
        ..DiskReport::default()
    }
}

/// Offloads everything queued on `name`; returns the keys written.
fn offload_all(f: &mut Fixture, name: &str) -> Vec<String> {
    let ack = sync(f, name, want(1000));
    let done: Vec<(String, WriteId)> = ordered(&ack);
    sync(
        f,
        name,
        DiskReport {
            offloaded: done.clone(),
            ..DiskReport::default()
        },
    );
    done.into_iter().map(|(k, _)| k).collect()
}

fn media(f: &mut Fixture, key: &str) -> Vec<Medium> {
    f.get(key)
        .unwrap()
        .replicas
        .iter()
        .map(|r| r.medium)
        .collect()
}

/// One 1 MiB segment with a disk, filled with 16 KiB objects past the watermark.
fn full_with_disk() -> (Fixture, Vec<String>) {
    let mut f = Fixture::new(1, MIB);
    sync(&mut f, "seg0", want(0));
    let keys: Vec<String> = (0..62).map(|i| format!("k{i:02}")).collect();
    for k in &keys {
        f.put(A, k, 16 * KIB, &one());
        f.advance(Millis(1));
    }
    (f, keys)
}

#[test]
fn eviction_offloads_first_then_drops_only_memory() {
    let (mut f, keys) = full_with_disk();
    let used = f.used();
    f.tick_after(Millis(10));
    // The pass queued its victims instead of dropping them.
    assert_eq!(
        f.used(),
        used,
        "nothing freed before the node wrote the copies"
    );
    let ack = sync(&mut f, "seg0", want(1000));
    assert!(!ack.offload.is_empty());
    let oldest = &keys[0];
    let order = ack.offload.iter().find(|o| &o.key == oldest).unwrap();
    assert_eq!(order.size, 16 * KIB);
    assert_eq!(
        order.addr,
        f.get(oldest).unwrap().replicas[0].addr,
        "the order points at the memory replica"
    );
    let written: Vec<(String, WriteId)> = ordered(&ack);
    sync(
        &mut f,
        "seg0",
        DiskReport {
            offloaded: written.clone(),
            ..DiskReport::default()
        },
    );
    assert_eq!(f.m.stats().disk_replicas, written.len() as u64);
    // The order's lease protects the copy; once it ends, eviction drops the memory.
    f.tick_after(Millis::from_secs(6));
    assert!(f.used() < used, "memory freed");
    let events = f.m.drain_events();
    let kept = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Evicted {
                    kept_on_disk: true,
                    ..
                }
            )
        })
        .count();
    assert!(kept > 0, "{events:?}");
    assert_eq!(f.m.stats().evicted_to_disk, kept as u64);
    assert_eq!(media(&mut f, oldest), vec![Medium::Disk]);
    assert!(f.m.exist(oldest, f.now).unwrap());
    assert_eq!(f.m.get_size(oldest).unwrap(), 16 * KIB);
    // The object still exists: a put of its key is refused.
    assert_eq!(
        code(f.start(B, oldest, 16 * KIB, &one())),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
}

#[test]
fn offload_runs_ahead_of_eviction_once_a_segment_is_mostly_full() {
    let mut f = Fixture::new(1, MIB);
    sync(&mut f, "seg0", want(0));
    // 36 of 64 blocks: under the 0.6 mark, nothing is offered.
    for i in 0..36 {
        f.put(A, &format!("k{i:02}"), 16 * KIB, &one());
        f.advance(Millis(1));
    }
    assert!(sync(&mut f, "seg0", want(8)).offload.is_empty());
    // 54 of 64: the least recently used go to disk before any eviction is needed.
    for i in 36..54 {
        f.put(A, &format!("k{i:02}"), 16 * KIB, &one());
        f.advance(Millis(1));
    }
    let ack = sync(&mut f, "seg0", want(8));
    let keys: Vec<&str> = ack.offload.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys[..2], ["k00", "k01"], "oldest first: {keys:?}");
    assert_eq!(f.m.stats().evicted_objects, 0);
    let done = ordered(&ack);
    sync(
        &mut f,
        "seg0",
        DiskReport {
            offloaded: done,
            ..DiskReport::default()
        },
    );
    assert_eq!(media(&mut f, "k00"), vec![Medium::Memory, Medium::Disk]);
}

#[test]
fn without_a_disk_eviction_drops_objects() {
    let mut f = Fixture::new(1, MIB);
    for i in 0..62 {
        f.put(A, &format!("k{i:02}"), 16 * KIB, &one());
    }
    let used = f.used();
    f.tick_after(Millis(10));
    assert!(f.used() < used);
    assert_eq!(code(f.get("k00")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn failed_offloads_are_evicted_without_a_copy() {
    let (mut f, keys) = full_with_disk();
    f.tick_after(Millis(10));
    let ack = sync(&mut f, "seg0", want(1000));
    let failed: Vec<(String, WriteId)> = ordered(&ack);
    sync(
        &mut f,
        "seg0",
        DiskReport {
            failed,
            ..DiskReport::default()
        },
    );
    // The order's lease made them recently used; later passes queue older objects. Fail
    // every order: a failed object is never ordered again, and is evicted like any other.
    let failed_keys: Vec<String> = failed_keys(&ack);
    for _ in 0..100 {
        f.tick_after(Millis(200));
        let ack = sync(&mut f, "seg0", want(1000));
        for order in &ack.offload {
            assert!(
                !failed_keys.contains(&order.key),
                "{} ordered again",
                order.key
            );
        }
        let failed = ordered(&ack);
        sync(
            &mut f,
            "seg0",
            DiskReport {
                failed,
                ..DiskReport::default()
            },
        );
    }
    assert_eq!(code(f.get(&keys[0])), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(f.m.stats().disk_replicas, 0);
}

fn failed_keys(ack: &DiskSyncAck) -> Vec<String> {
    ack.offload.iter().map(|o| o.key.clone()).collect()
}

#[test]
fn write_through_queues_every_completed_write() {
    let mut f = write_through();
    f.put(A, "a", 4 * KIB, &one());
    f.put(A, "b", 4 * KIB, &one());
    assert_eq!(offload_all(&mut f, "seg0"), vec!["a", "b"]);
    assert_eq!(media(&mut f, "a"), vec![Medium::Memory, Medium::Disk]);
    // Already on disk: a second sync orders nothing.
    assert!(sync(&mut f, "seg0", want(10)).offload.is_empty());
}

/// Found by the Python suite: a burst of puts into a full segment took objects still waiting
/// for their disk copy (the window pass ignored the queue the LRU pass respects), and their
/// values were lost.
#[test]
fn a_put_that_finds_no_room_never_takes_objects_waiting_for_their_disk_copy() {
    let mut f = write_through();
    // The 1 MiB segment full of 16 KiB objects, each queued for its copy, none written yet.
    let keys: Vec<String> = (0..64).map(|i| format!("k{i:02}")).collect();
    for k in &keys {
        f.put(A, k, 16 * KIB, &one());
        f.advance(Millis(1));
    }
    let refused = f.start(B, "new", 16 * KIB, &one()).unwrap_err();
    assert_eq!(refused.code, ErrorCode::NO_AVAILABLE_HANDLE);
    assert!(
        refused
            .to_string()
            .contains("64 objects wait for their nodes to copy them"),
        "{refused}"
    );
    for k in &keys {
        assert!(f.m.exist(k, f.now).unwrap(), "{k} lost");
    }
    // Once the node wrote the copies and their orders' leases ended, the put makes room by
    // dropping memory only.
    assert_eq!(offload_all(&mut f, "seg0").len(), keys.len());
    f.advance(Millis::from_secs(6));
    f.put(B, "new", 16 * KIB, &one());
    for k in &keys {
        assert!(f.m.exist(k, f.now).unwrap(), "{k} lost");
    }
    assert!(f.m.stats().evicted_to_disk > 0);
}

#[test]
fn a_report_for_a_replaced_value_becomes_a_tombstone() {
    let mut f = write_through();
    f.put(A, "k", 4 * KIB, &one());
    let ack = sync(&mut f, "seg0", want(10));
    let old = ack.offload[0].write;
    // The value changes while the node writes the copy.
    f.tick_after(Millis::from_secs(6));
    let g = f.upsert(A, "k", 4 * KIB, &one()).unwrap();
    f.end(A, "k", g.write_id).unwrap();
    let ack = sync(
        &mut f,
        "seg0",
        DiskReport {
            offloaded: vec![("k".into(), old)],
            want: 10,
            ..DiskReport::default()
        },
    );
    assert_eq!(ack.delete, vec![("k".to_string(), old)]);
    assert_eq!(media(&mut f, "k"), vec![Medium::Memory]);
    // The new value is queued (write-through) and goes out in this same ack.
    assert_eq!(ack.offload.len(), 1);
    assert_eq!(ack.offload[0].write, g.write_id);
    let ack = sync(
        &mut f,
        "seg0",
        DiskReport {
            deleted: vec![("k".into(), old)],
            offloaded: vec![("k".into(), g.write_id)],
            ..DiskReport::default()
        },
    );
    assert!(ack.delete.is_empty());
    assert_eq!(f.m.stats().disk_tombstones, 0);
    assert_eq!(media(&mut f, "k"), vec![Medium::Memory, Medium::Disk]);
}

/// Fills memory with `size`-byte hard-pinned objects (which nothing can evict) until a put
/// fails.
fn fill_pinned(f: &mut Fixture, prefix: &str, size: u64) {
    let pinned = ReplicateConfig::single().hard_pinned();
    for i in 0.. {
        let key = format!("{prefix}{i}");
        match f.start(A, &key, size, &pinned) {
            Ok(g) => f.end(A, &key, g.write_id).unwrap(),
            Err(_) => break,
        }
    }
}

/// Makes `key` a disk-only object on seg0 (the fixture's only segment so far): written,
/// offloaded (write-through), then evicted from memory by hard-pinned filler that leaves
/// no other candidate. Mounts seg1 (empty) afterwards.
fn disk_only(f: &mut Fixture, key: &str) -> WriteId {
    let g = f.put(A, key, 4 * KIB, &one());
    assert_eq!(offload_all(f, "seg0"), vec![key.to_string()]);
    let pinned = ReplicateConfig::single().hard_pinned();
    for i in 0..61 {
        f.put(A, &format!("{key}-fill{i}"), 16 * KIB, &pinned);
    }
    f.tick_after(Millis::from_secs(6));
    assert_eq!(media(f, key), vec![Medium::Disk]);
    if f.m.segments().len() == 1 {
        f.mount("seg1", MIB);
    }
    g.write_id
}

fn write_through() -> Fixture {
    let config = MasterConfig {
        offload_write_through: true,
        ..MasterConfig::default()
    };
    let mut f = Fixture::with_config(config, 1, MIB);
    sync(&mut f, "seg0", want(0));
    f
}

#[test]
fn removing_a_disk_only_object_tombstones_its_copy() {
    let mut f = write_through();
    let w = disk_only(&mut f, "k");
    f.advance(Millis::from_secs(6));
    f.remove("k").unwrap();
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    let ack = sync(&mut f, "seg0", want(0));
    assert_eq!(ack.delete, vec![("k".to_string(), w)]);
    // A node restarting before it deleted the file does not bring the value back.
    let ack = sync(
        &mut f,
        "seg0",
        DiskReport {
            recovered: vec![("k".into(), w, 4 * KIB, sum_of("k"))],
            ..DiskReport::default()
        },
    );
    assert_eq!(ack.delete, vec![("k".to_string(), w)]);
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn upserting_a_disk_only_object_allocates_memory_and_retires_the_copy() {
    let mut f = write_through();
    let w = disk_only(&mut f, "k");
    let g = f.upsert(B, "k", 4 * KIB, &one()).unwrap();
    assert_eq!(g.replicas.len(), 1);
    assert_eq!(code(f.get("k")), ErrorCode::REPLICA_IS_NOT_READY);
    f.end(B, "k", g.write_id).unwrap();
    assert_eq!(media(&mut f, "k"), vec![Medium::Memory]);
    assert_eq!(
        sync(&mut f, "seg0", want(0)).delete,
        vec![("k".to_string(), w)]
    );
}

#[test]
fn a_remount_reregisters_intact_copies_and_a_lost_node_takes_its_copies() {
    let mut f = write_through();
    let w = disk_only(&mut f, "k");
    // The node is presumed dead: its segment and the disk copies on it go.
    f.advance(Millis::from_secs(11));
    f.m.heartbeat(A, f.now);
    f.m.tick(f.now);
    f.check();
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(f.m.stats().disk_replicas, 0);
    // It comes back under a new id and registers what its disk holds.
    let node2 = ClientId(0x90DF);
    let spec = SegmentSpec {
        name: "seg0".into(),
        base: 0x9000_0000_0000,
        size: MIB,
        endpoint: "seg0:7001".into(),
        key: 8,
        rdma_key: None,
    };
    let id = f.m.mount_segment(node2, &spec, f.now).unwrap();
    let report = DiskReport {
        recovered: vec![
            ("k".into(), w, 4 * KIB, sum_of("k")),
            ("".into(), w, 1, sum_of("")),
        ],
        ..DiskReport::default()
    };
    let ack = f.m.disk_sync(node2, id, report, f.now).unwrap();
    f.check();
    assert_eq!(
        ack.delete,
        vec![(String::new(), w)],
        "an invalid key is refused"
    );
    assert_eq!(media(&mut f, "k"), vec![Medium::Disk]);
    assert_eq!(
        f.m.get_replica_list("k", f.now).unwrap().replicas[0].segment,
        id
    );
    // Later writes get higher write ids than any recovered one.
    let g = f.put(A, "new", 4 * KIB, &one());
    assert!(g.write_id > w);
    // Only the owner may sync a segment's disk.
    assert_eq!(
        code(f.m.disk_sync(A, id, DiskReport::default(), f.now)),
        ErrorCode::ILLEGAL_CLIENT
    );
}

fn mount_as_a(f: &mut Fixture, name: &str) {
    let spec = SegmentSpec {
        name: name.into(),
        base: 0xA000_0000_0000,
        size: MIB,
        endpoint: format!("{name}:7000"),
        key: 9,
        rdma_key: None,
    };
    f.m.mount_segment(A, &spec, f.now).unwrap();
    f.check();
}

/// The node holding `k`'s only (disk) copy is presumed dead; returns a spec to mount its
/// segment again under a new owner.
fn lose_the_node(f: &mut Fixture) -> SegmentSpec {
    // A (who stays) contributes memory that outlives the node.
    if !f.m.segments().iter().any(|s| s.name == "a-mem") {
        mount_as_a(f, "a-mem");
    }
    f.advance(Millis::from_secs(11));
    f.m.heartbeat(A, f.now);
    f.m.tick(f.now);
    f.check();
    SegmentSpec {
        name: "seg0".into(),
        base: 0x9000_0000_0000,
        size: MIB,
        endpoint: "seg0:7001".into(),
        key: 8,
        rdma_key: None,
    }
}

#[test]
fn a_departed_copy_of_a_key_written_again_never_comes_back() {
    let mut f = write_through();
    let w = disk_only(&mut f, "k");
    let spec = lose_the_node(&mut f);
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    // While the node is away the key is written again and removed.
    f.put(A, "k", 4 * KIB, &one());
    f.remove("k").unwrap();
    f.check();
    let node2 = ClientId(0x90DF);
    let id = f.m.mount_segment(node2, &spec, f.now).unwrap();
    let report = DiskReport {
        recovered: vec![("k".into(), w, 4 * KIB, sum_of("k"))],
        ..DiskReport::default()
    };
    let ack = f.m.disk_sync(node2, id, report, f.now).unwrap();
    f.check();
    assert_eq!(
        ack.delete,
        vec![("k".to_string(), w)],
        "the old copy is deleted"
    );
    assert_eq!(
        code(f.get("k")),
        ErrorCode::OBJECT_NOT_FOUND,
        "not resurrected"
    );
}

/// `k` with two replicas, one on A's segment (A stays), and a disk copy on seg0's node, which
/// is then lost; returns `k`'s write and the spec to mount seg0 again.
fn offloaded_then_node_lost(f: &mut Fixture) -> (WriteId, SegmentSpec) {
    mount_as_a(f, "a-mem");
    let g = f.put(A, "k", 4 * KIB, &ReplicateConfig::replicas(2));
    assert_eq!(offload_all(f, "seg0"), vec!["k".to_string()]);
    let spec = lose_the_node(f);
    assert_eq!(media(f, "k"), vec![Medium::Memory]);
    (g.write_id, spec)
}

#[test]
fn a_departed_copy_of_a_value_still_in_memory_is_deleted_on_return() {
    let mut f = write_through();
    let (write, spec) = offloaded_then_node_lost(&mut f);
    f.advance(Millis::from_secs(6));
    f.remove("k").unwrap();
    let node2 = ClientId(0x90DF);
    let id = f.m.mount_segment(node2, &spec, f.now).unwrap();
    let report = DiskReport {
        recovered: vec![("k".into(), write, 4 * KIB, sum_of("k"))],
        ..DiskReport::default()
    };
    let ack = f.m.disk_sync(node2, id, report, f.now).unwrap();
    f.check();
    assert_eq!(ack.delete, vec![("k".to_string(), write)]);
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn an_offload_report_from_before_a_remount_does_not_revive_a_condemned_copy() {
    // Seed 5384 of the shared-memory simulation: the node's report that it wrote the copy
    // failed while the master forgot the node; it came again with the remount's recovery.
    let mut f = write_through();
    let (write, spec) = offloaded_then_node_lost(&mut f);
    let node2 = ClientId(0x90DF);
    let id = f.m.mount_segment(node2, &spec, f.now).unwrap();
    let copy = ("k".to_string(), write);
    let report = DiskReport {
        offloaded: vec![copy.clone()],
        recovered: vec![("k".into(), write, 4 * KIB, sum_of("k"))],
        want: 10,
        ..DiskReport::default()
    };
    let ack = f.m.disk_sync(node2, id, report, f.now).unwrap();
    f.check();
    assert_eq!(ack.delete, vec![copy.clone()], "the old mount's copy goes");
    assert_eq!(
        media(&mut f, "k"),
        vec![Medium::Memory],
        "and is not listed as the value's disk copy"
    );
    assert!(
        ack.offload.is_empty(),
        "no order for a write whose copy is being deleted"
    );
    // Once the node confirms the deletion, the value may be offloaded there again.
    let ack =
        f.m.disk_sync(
            node2,
            id,
            DiskReport {
                deleted: vec![copy],
                ..DiskReport::default()
            },
            f.now,
        )
        .unwrap();
    f.check();
    assert!(ack.delete.is_empty());
}

#[test]
fn evicting_the_last_copy_from_disk_while_a_copy_task_runs_takes_the_object() {
    // Seed 9611: a repair copied the value from a memory replica that then went with its
    // node; the node's disk evicted the only other copy. The copy's target alone is no value.
    let mut f = write_through();
    mount_as_a(&mut f, "a-mem");
    let g = f.put(A, "k", 4 * KIB, &ReplicateConfig::replicas(2));
    // The node writes the copy, but goes before it reports it.
    let ordered_copy = ordered(&sync(&mut f, "seg0", want(10)));
    assert_eq!(ordered_copy, vec![("k".to_string(), g.write_id)]);
    let spec = lose_the_node(&mut f);
    // seg0's node comes back and its disk copy of the current value is adopted.
    let node2 = ClientId(0x90DF);
    let disk_seg = f.m.mount_segment(node2, &spec, f.now).unwrap();
    let recovered = DiskReport {
        recovered: vec![("k".into(), g.write_id, 4 * KIB, sum_of("k"))],
        ..DiskReport::default()
    };
    f.m.disk_sync(node2, disk_seg, recovered, f.now).unwrap();
    f.check();
    assert_eq!(media(&mut f, "k"), vec![Medium::Memory, Medium::Disk]);
    // B copies it from A's memory to C's segment; A then goes.
    let c = ClientId(0xC);
    let spec_c = SegmentSpec {
        name: "c-mem".into(),
        base: 0xC000_0000_0000,
        size: MIB,
        endpoint: "c-mem:7000".into(),
        key: 10,
        rdma_key: None,
    };
    f.m.mount_segment(c, &spec_c, f.now).unwrap();
    f.m.heartbeat(B, f.now);
    f.m.copy_start(B, "k", &["c-mem".into()], f.now).unwrap();
    f.check();
    f.advance(Millis::from_secs(11));
    for alive in [node2, c, B] {
        f.m.heartbeat(alive, f.now);
    }
    f.m.tick(f.now);
    f.check();
    assert_eq!(
        media(&mut f, "k"),
        vec![Medium::Disk],
        "readable from disk alone"
    );
    // The disk evicts it: nothing readable is left, and the task's target is no value.
    let evicted = DiskReport {
        evicted: vec![("k".into(), g.write_id)],
        ..DiskReport::default()
    };
    f.m.disk_sync(node2, disk_seg, evicted, f.now).unwrap();
    f.check();
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
}

#[test]
fn a_disk_seen_before_has_its_unreported_copies_deleted_a_new_disk_has_them_adopted() {
    let mut f = write_through();
    // seg0's disk has synced with this master: a copy it never reported (written just before
    // a crash, say) may be of a value since overwritten and evicted, so it goes.
    let recovered = |key: &str| DiskReport {
        recovered: vec![(key.into(), WriteId(999), 4 * KIB, sum_of(key))],
        ..DiskReport::default()
    };
    let ack = sync(&mut f, "seg0", recovered("unreported"));
    assert_eq!(ack.delete, vec![("unreported".to_string(), WriteId(999))]);
    assert_eq!(code(f.get("unreported")), ErrorCode::OBJECT_NOT_FOUND);
    // A disk this master has never synced with holds copies from before its time: adopted.
    f.mount("seg1", MIB);
    let ack = sync(&mut f, "seg1", recovered("older"));
    assert!(ack.delete.is_empty());
    assert_eq!(media(&mut f, "older"), vec![Medium::Disk]);
}

#[test]
fn a_recovered_copy_never_replaces_a_newer_value() {
    let mut f = write_through();
    f.put(A, "k", 4 * KIB, &one());
    let ack = sync(
        &mut f,
        "seg0",
        DiskReport {
            recovered: vec![("k".into(), WriteId(999), 4 * KIB, sum_of("k"))],
            want: 0,
            ..DiskReport::default()
        },
    );
    assert_eq!(ack.delete, vec![("k".to_string(), WriteId(999))]);
    assert_eq!(media(&mut f, "k"), vec![Medium::Memory]);
}

#[test]
fn disk_eviction_is_reported_before_the_files_go() {
    let mut f = write_through();
    let w = disk_only(&mut f, "gone");
    let both = f.put(
        A,
        "both",
        4 * KIB,
        &ReplicateConfig::single().preferring("seg0"),
    );
    // The fill was queued too (write-through): write every copy.
    offload_all(&mut f, "seg0");
    assert_eq!(media(&mut f, "both"), vec![Medium::Memory, Medium::Disk]);
    sync(
        &mut f,
        "seg0",
        DiskReport {
            evicted: vec![
                ("gone".into(), w),
                ("both".into(), WriteId(both.write_id.0 + 1000)),
            ],
            ..DiskReport::default()
        },
    );
    // The disk-only object is gone; a report naming another write changes nothing.
    assert_eq!(code(f.get("gone")), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(media(&mut f, "both"), vec![Medium::Memory, Medium::Disk]);
}

/// "k" only on seg0's disk, and B's prefetch of it into A's segment "a-mem" begun.
fn prefetching_into_a_mem() -> (Fixture, mooring_core::PrefetchGrant) {
    let mut f = write_through();
    disk_only(&mut f, "k");
    mount_as_a(&mut f, "a-mem");
    let (_, grant) =
        f.m.exist_prefetch(B, "k", &["a-mem".to_string()], f.now)
            .unwrap();
    (f, grant.expect("promoted"))
}

#[test]
fn a_prefetch_whose_target_segment_leaves_keeps_the_disk_copy() {
    let (mut f, p) = prefetching_into_a_mem();
    assert_eq!(p.grant.replicas[0].segment, segment_id(&f, "a-mem"));
    f.m.unmount_segment(A, "a-mem", f.now).unwrap();
    f.check();
    assert_eq!(media(&mut f, "k"), vec![Medium::Disk]);
    assert_eq!(f.m.stats().writing, 0);
    // A late end of the promotion changes nothing (ends are idempotent for the write id).
    let _ = f.end(B, "k", p.grant.write_id);
    f.check();
    assert_eq!(media(&mut f, "k"), vec![Medium::Disk]);
}

#[test]
fn prefetch_promotes_a_disk_only_object_into_the_preferred_segment() {
    let mut f = write_through();
    disk_only(&mut f, "k");
    let (exists, grant) =
        f.m.exist_prefetch(B, "k", &["seg1".to_string()], f.now)
            .unwrap();
    f.check();
    assert!(exists);
    let p = grant.expect("a disk-only object is promoted");
    assert_eq!(p.source.medium, Medium::Disk);
    assert_eq!(p.grant.replicas.len(), 1);
    assert_eq!(p.grant.replicas[0].segment, segment_id(&f, "seg1"));
    // While it is promoted, readers still get the disk copy; a second probe does not start
    // another promotion.
    assert_eq!(media(&mut f, "k"), vec![Medium::Disk]);
    let (_, again) = f.m.exist_prefetch(A, "k", &[], f.now).unwrap();
    assert!(again.is_none());
    f.end(B, "k", p.grant.write_id).unwrap();
    assert_eq!(media(&mut f, "k"), vec![Medium::Memory, Medium::Disk]);
    assert_eq!(f.m.stats().prefetches, 1);
    let (_, in_memory) = f.m.exist_prefetch(A, "k", &[], f.now).unwrap();
    assert!(in_memory.is_none());
    assert_eq!(
        f.m.exist_prefetch(A, "none", &[], f.now).unwrap(),
        (false, None)
    );
}

#[test]
fn an_upsert_during_prefetch_wins_and_the_prefetch_cannot_end() {
    let mut f = write_through();
    let w = disk_only(&mut f, "k");
    let (_, grant) = f.m.exist_prefetch(B, "k", &[], f.now).unwrap();
    let p = grant.unwrap();
    let g = f.upsert(A, "k", 8 * KIB, &one()).unwrap();
    assert!(f.end(B, "k", p.grant.write_id).is_err());
    f.end(A, "k", g.write_id).unwrap();
    assert_eq!(f.m.get_size("k").unwrap(), 8 * KIB);
    assert_eq!(media(&mut f, "k"), vec![Medium::Memory]);
    assert!(
        sync(&mut f, "seg0", want(0))
            .delete
            .contains(&("k".to_string(), w))
    );
}

#[test]
fn a_revoked_prefetch_leaves_the_disk_copy() {
    let mut f = write_through();
    disk_only(&mut f, "k");
    let (_, grant) = f.m.exist_prefetch(B, "k", &[], f.now).unwrap();
    let p = grant.unwrap();
    f.m.put_revoke(B, "k", p.grant.write_id, f.now).unwrap();
    f.check();
    assert_eq!(media(&mut f, "k"), vec![Medium::Disk]);
}

#[test]
fn a_prefetch_that_finds_no_memory_still_answers_exists() {
    let mut f = write_through();
    disk_only(&mut f, "k");
    fill_pinned(&mut f, "p", 64 * KIB);
    fill_pinned(&mut f, "q", 4 * KIB);
    let (exists, grant) = f.m.exist_prefetch(B, "k", &[], f.now).unwrap();
    assert!(exists);
    assert!(grant.is_none());
    assert_eq!(f.m.stats().prefetch_failures, 1);
    assert!(
        f.m.drain_events()
            .iter()
            .any(|e| matches!(e, Event::PrefetchFailed { .. }))
    );
}

#[test]
fn snapshots_carry_the_disk_tier() {
    let mut f = write_through();
    disk_only(&mut f, "k");
    f.put(A, "q", 4 * KIB, &one());
    f.remove("k").unwrap_err(); // leased by the last get
    let bytes = f.m.snapshot();
    let mut restored = Master::restore(f.m.config().clone(), &bytes, f.now).unwrap();
    assert_eq!(restored.state_fingerprint(), f.m.state_fingerprint());
    let media: Vec<Medium> = restored
        .get_replica_list("k", f.now)
        .unwrap()
        .replicas
        .iter()
        .map(|r| r.medium)
        .collect();
    assert_eq!(media, vec![Medium::Disk]);
}

/// Regression (found by the model test's disk tier): a hold outlives its object when the
/// object's node goes away, and recovery re-creates the object with the same write id, often
/// in the same slot. The old hold must not attach to the adopted object (its hold count was
/// 0 while the hold table said 1, and releasing the hold would underflow it).
#[test]
fn a_hold_on_a_lost_object_does_not_attach_to_its_recovered_copy() {
    let mut f = write_through();
    let g = f.put(A, "k", 4 * KIB, &one());
    assert_eq!(offload_all(&mut f, "seg0"), vec!["k".to_string()]);
    let (hold, _) = f.m.acquire_hold(A, "k", f.now).unwrap();
    f.check();
    // The node goes away with the only copies: the object is lost, its disk copy a ghost.
    f.m.unmount_segment(NODE, "seg0", f.now).unwrap();
    f.check();
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    f.mount("seg0", MIB);
    // The node restarts and reports its copy: adopted, with the same write id.
    sync(
        &mut f,
        "seg0",
        DiskReport {
            recovered: vec![("k".into(), g.write_id, 4 * KIB, sum_of("k"))],
            ..DiskReport::default()
        },
    );
    assert_eq!(media(&mut f, "k"), vec![Medium::Disk]);
    // Releasing the old hold is fine and leaves the new object unheld: it can be removed.
    f.m.release_hold(A, hold, f.now).unwrap();
    f.check();
    f.advance(Millis::from_secs(6));
    f.remove("k").unwrap();
}

#[test]
fn a_read_of_a_disk_only_object_counts_as_a_disk_hit() {
    let mut f = write_through();
    disk_only(&mut f, "k");
    let before = f.m.stats().reads;
    f.get("k").unwrap();
    let after = f.m.stats().reads;
    assert_eq!(after.disk, before.disk + 1);
    assert_eq!(after.memory, before.memory);
    let census = f.m.census(f.now);
    assert_eq!(census.disk_only, 1);
    assert!(census.disk_bytes >= 4 * KIB, "{census:?}");
}

/// "k" only on seg0's disk, a prefetch of it into memory begun, and then the node's report
/// that it dropped the disk copy meanwhile (seed 2477).
fn prefetch_whose_disk_copy_went() -> (Fixture, mooring_core::PrefetchGrant) {
    let mut f = write_through();
    let w = disk_only(&mut f, "k");
    let (exists, grant) = f.m.exist_prefetch(A, "k", &[], f.now).unwrap();
    assert!(exists);
    let grant = grant.expect("a prefetch into memory");
    sync(
        &mut f,
        "seg0",
        DiskReport {
            evicted: vec![("k".into(), w)],
            ..DiskReport::default()
        },
    );
    f.check();
    (f, grant)
}

#[test]
fn a_prefetch_must_bring_back_the_known_value_even_after_its_disk_copy_went() {
    let (mut f, grant) = prefetch_whose_disk_copy_went();
    // Bytes damaged on their way are still refused: the master knows the value's checksum.
    assert_eq!(
        code(f.m.put_end(
            A,
            "k",
            grant.grant.write_id,
            mooring_core::Checksum::of(b"damaged"),
            f.now
        )),
        ErrorCode::INVALID_WRITE
    );
    // The value itself is accepted.
    f.m.put_end(A, "k", grant.grant.write_id, sum_of("k"), f.now)
        .unwrap();
    f.check();
    assert_eq!(f.get("k").unwrap().checksum, sum_of("k"));
}

/// Asserts that `events` say "k" has nothing readable while its prefetch runs.
fn assert_readable_copy_lost(events: &[Event]) {
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::ReadableCopyLost { key, .. } if &**key == "k")),
        "{events:?}"
    );
}

#[test]
fn a_disk_copy_dropped_under_a_prefetch_is_reported_as_unreadable_at_once() {
    let (mut f, _) = prefetch_whose_disk_copy_went();
    // Readers find nothing from now on (seed 1040 with held reads weighted up): the event
    // that says so must come with the report, not when the prefetch fails later.
    assert!(!f.m.exist("k", f.now).unwrap());
    let events = f.m.drain_events();
    assert_readable_copy_lost(&events);
}

#[test]
fn revoking_a_refused_prefetch_of_a_dropped_disk_copy_reports_the_value_gone() {
    let (mut f, grant) = prefetch_whose_disk_copy_went();
    f.m.drain_events();
    f.m.put_revoke(A, "k", grant.grant.write_id, f.now).unwrap();
    f.check();
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    let events = f.m.drain_events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::WriteDiscarded {
                object_removed: true,
                cause: mooring_core::DiscardCause::PrefetchRevoked,
                ..
            }
        )),
        "{events:?}"
    );
}

#[test]
fn a_prefetch_whose_disk_copy_leaves_with_its_node_says_so_and_may_still_bring_it_back() {
    let (mut f, p) = prefetching_into_a_mem();
    f.m.drain_events();
    // The node holding the only (disk) copy goes silent; A and the prefetching B stay.
    f.advance(Millis::from_secs(11));
    f.m.heartbeat(A, f.now);
    f.m.heartbeat(B, f.now);
    f.m.tick(f.now);
    f.check();
    let events = f.m.drain_events();
    assert_readable_copy_lost(&events);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ObjectLost { key, .. } if &**key == "k")),
        "the write in progress keeps the object"
    );
    assert!(!f.m.exist("k", f.now).unwrap(), "nothing readable now");
    // The prefetch had read the bytes: ending it brings the value back.
    f.end(B, "k", p.grant.write_id).unwrap();
    f.check();
    assert_eq!(media(&mut f, "k"), vec![Medium::Memory]);
}

/// A tenant's disk quota bounds the bytes of its values with a disk copy: past it, its values
/// are not offloaded (and a copy ordered before it was reached is deleted when it lands),
/// while another tenant's are; a value that leaves the disk makes room again.
#[test]
fn a_tenant_disk_quota_stops_its_offloads_and_no_one_elses() {
    use mooring_core::tenant::{TenantQuota, stored_key};
    let config = MasterConfig {
        tenant_quotas: vec![TenantQuota {
            tenant: "small".into(),
            disk: 3 * 16 * KIB,
            ..TenantQuota::default()
        }],
        ..MasterConfig::default()
    };
    let mut f = Fixture::with_config(config, 1, MIB);
    sync(&mut f, "seg0", want(0));
    let small = |i: usize| stored_key("small", &format!("k{i:02}")).unwrap();
    let other = |i: usize| stored_key("other", &format!("k{i:02}")).unwrap();
    // Past the watermark, half of each tenant's: eviction queues offloads.
    let mut writes = std::collections::HashMap::new();
    for i in 0..31 {
        writes.insert(small(i), f.put(A, &small(i), 16 * KIB, &one()).write_id);
        f.put(A, &other(i), 16 * KIB, &one());
        f.advance(Millis(1));
    }
    f.tick_after(Millis(10));
    let written = offload_all(&mut f, "seg0");
    let on_disk = |f: &mut Fixture, key: &str| media(f, key).contains(&Medium::Disk);
    let small_on_disk = (0..31).filter(|&i| on_disk(&mut f, &small(i))).count();
    let other_on_disk = (0..31).filter(|&i| on_disk(&mut f, &other(i))).count();
    assert_eq!(
        small_on_disk, 3,
        "the quota holds three 16 KiB values: {written:?}"
    );
    assert!(
        other_on_disk > 3,
        "another tenant is not held to it: {other_on_disk}"
    );
    let usage = f.m.tenant_usage("small");
    assert_eq!(usage.disk_bytes, 3 * 16 * KIB);
    // More memory pressure: eviction queues no more of the tenant's values for the disk.
    f.tick_after(Millis::from_secs(6));
    for i in 31..36 {
        f.put(A, &other(i), 16 * KIB, &one());
        f.advance(Millis(1));
    }
    f.tick_after(Millis(10));
    let ack = sync(&mut f, "seg0", want(1000));
    let small_orders: Vec<_> = ordered(&ack)
        .into_iter()
        .filter(|(k, _)| k.starts_with(&small(0)[..6]))
        .collect();
    assert!(small_orders.is_empty(), "{small_orders:?}");
    sync(
        &mut f,
        "seg0",
        DiskReport {
            offloaded: ordered(&ack),
            ..DiskReport::default()
        },
    );
    // A copy that lands past the quota (ordered before it was reached) is deleted.
    let late = small(30);
    assert!(!on_disk(&mut f, &late));
    let write = writes[&late];
    let ack = sync(
        &mut f,
        "seg0",
        DiskReport {
            offloaded: vec![(late.clone(), write)],
            ..DiskReport::default()
        },
    );
    assert!(!on_disk(&mut f, &late), "not recorded past the quota");
    let next = sync(&mut f, "seg0", want(0));
    assert!(
        ack.delete
            .iter()
            .chain(&next.delete)
            .any(|(k, w)| *k == late && *w == write),
        "its copy is deleted"
    );
    // Removing a value on disk makes room.
    let first = (0..31).map(small).find(|k| on_disk(&mut f, k)).unwrap();
    f.advance(Millis::from_secs(60)); // past the leases the reads above took
    f.remove(&first).unwrap();
    assert_eq!(f.m.tenant_usage("small").disk_bytes, 2 * 16 * KIB);
}
