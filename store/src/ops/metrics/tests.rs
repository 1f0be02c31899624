//! The exposition's names and contents.

use std::time::Duration;

use mooring_core::{ErrorCode, SegmentInfo, Stats, StatsReport};

use super::MasterMetrics;
use crate::master::journal::JournalCounts;

#[test]
fn exposition_names_follow_prometheus_conventions() {
    let metrics = MasterMetrics::default();
    metrics.record("PutStart", Ok(()), Duration::from_micros(30));
    metrics.record(
        "GetReplicaList",
        Err(ErrorCode::OBJECT_NOT_FOUND),
        Duration::from_micros(12),
    );
    let report = StatsReport {
        stats: Stats {
            objects: 3,
            capacity: 1 << 20,
            used: 4096,
            evicted_bytes: 77,
            reads: mooring_core::ReadCounts {
                memory: 5,
                disk: 1,
                misses: 2,
            },
            ..Stats::default()
        },
        census: mooring_core::Census {
            leased: 2,
            memory_bytes: 4000,
            ..mooring_core::Census::default()
        },
        tenants: vec![(
            "team-a".into(),
            mooring_core::tenant::Usage {
                objects: 2,
                bytes: 8192,
                disk_bytes: 4096,
            },
        )],
    };
    let segment = SegmentInfo {
        id: mooring_core::SegmentId(1),
        name: "node-a".into(),
        owner: mooring_core::ClientId(9),
        base: 0,
        size: 1 << 20,
        used: 4096,
        endpoint: "10.0.0.9:12345".into(),
        key: 0xdead_beef_1234,
        rdma_key: None,
    };
    let journal = JournalCounts {
        records: 12,
        syncs: 4,
        slow_syncs: 1,
        reused_files: 2,
        ..JournalCounts::default()
    };
    let text = metrics.render(&report, &[segment], 3, Some(journal), false);
    for line in [
        "mooring_objects 3",
        "mooring_connections 3",
        "mooring_capacity_bytes 1048576",
        "mooring_evicted_bytes_total 77",
        "mooring_segment_used_bytes{segment=\"node-a\"} 4096",
        "mooring_rpc_requests_total{kind=\"PutStart\",outcome=\"ok\"} 1",
        "mooring_rpc_requests_total{kind=\"GetReplicaList\",outcome=\"OBJECT_NOT_FOUND\"} 1",
        "mooring_rpc_duration_seconds_count{kind=\"PutStart\"} 1",
        "mooring_objects_by_state{state=\"leased\"} 2",
        "mooring_values_bytes{tier=\"memory\"} 4000",
        "mooring_reads_total{tier=\"memory\"} 5",
        "mooring_reads_total{tier=\"none\"} 2",
        "mooring_journal_records_total 12",
        "mooring_journal_syncs_total 4",
        "mooring_journal_slow_syncs_total 1",
        "mooring_journal_reused_files_total 2",
        "mooring_tenant_objects{tenant=\"team-a\"} 2",
        "mooring_tenant_values_bytes{tenant=\"team-a\"} 8192",
        "mooring_tenant_disk_bytes{tenant=\"team-a\"} 4096",
    ] {
        assert!(text.contains(line), "{line:?} missing from\n{text}");
    }
    // Nothing that grants access: no data-plane key, no endpoint.
    assert!(!text.contains(&format!("{}", 0xdead_beef_1234u64)));
    assert!(!text.contains("10.0.0.9"));
}

/// Mooncake's `/get_all_segments`, which SGLang's `check_server` polls until it is not empty:
/// nothing while no segment is mounted, then one name a line; a standby refuses it.
#[test]
fn get_all_segments_lists_the_mounted_segments_one_a_line() {
    use std::sync::{Arc, Mutex};

    let segment = |id: u64, name: &str| SegmentInfo {
        id: mooring_core::SegmentId(id),
        name: name.into(),
        owner: mooring_core::ClientId(u128::from(id)),
        base: 0,
        size: 1 << 20,
        used: 0,
        endpoint: format!("10.0.0.{id}:12345"),
        key: 7,
        rdma_key: None,
    };
    let mounted: Arc<Mutex<Vec<SegmentInfo>>> = Arc::default();
    let read = {
        let mounted = mounted.clone();
        Arc::new(move || (StatsReport::default(), mounted.lock().unwrap().clone()))
    };
    let pages = super::handler(
        MasterMetrics::default(),
        read,
        Arc::new(|| 0),
        Arc::new(|| None),
        false,
    );

    let empty = pages(&crate::ops::http::Request {
        path: "/get_all_segments",
        query: "",
    });
    assert_eq!(empty.status, 200);
    assert_eq!(empty.content_type, "text/plain; version=0.0.4");
    assert!(
        empty.body.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&empty.body)
    );

    mounted
        .lock()
        .unwrap()
        .extend([segment(1, "node-a"), segment(2, "127.0.0.1:12301")]);
    let listed = pages(&crate::ops::http::Request {
        path: "/get_all_segments",
        query: "",
    });
    assert_eq!(listed.status, 200);
    assert_eq!(
        String::from_utf8(listed.body).unwrap(),
        "node-a\n127.0.0.1:12301\n"
    );

    assert_eq!(super::static_page("/get_all_segments").status, 503);
    assert_eq!(super::static_page("/nothing").status, 404);
}
