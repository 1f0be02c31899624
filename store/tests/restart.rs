//! A master that keeps its state (`--state-dir`) survives SIGKILL: restarted on the same
//! directory it knows every object it acknowledged, its nodes reconnect without remounting,
//! and every value reads back byte for byte, hard pins included.

use std::time::{Duration, Instant};

use mooring::{Client, ClientConfig};
use mooring_core::ReplicateConfig;

mod common;

use common::{Proc, free_port, start_nodes, value, wait_for_segments};

fn start_master(listen: &str, state: &std::path::Path) -> Proc {
    Proc::start(&[
        "master",
        "--listen",
        listen,
        "--client-ttl",
        "2s",
        "--state-dir",
        state.to_str().unwrap(),
        // Small, so the run also crosses snapshots and journal generations.
        "--snapshot-after",
        "16KiB",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_restarts_knowing_every_acknowledged_object() {
    let state = std::env::temp_dir().join(format!("mooring-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut master = start_master(&listen, &state);
    let mut nodes = start_nodes(&listen, 3, "32MiB");
    let writer = Client::connect(ClientConfig::new(listen.clone()))
        .await
        .unwrap();
    wait_for_segments(&writer, 3).await;
    // Two replicas: the weights outlive the node that will not return.
    let pinned = ReplicateConfig {
        with_hard_pin: true,
        ..ReplicateConfig::replicas(2)
    };
    writer
        .put("weights", &value(999, 100_000), &pinned)
        .await
        .unwrap();
    let sizes = |i: u64| 1 + (i as usize * 7919) % 60_000;
    for i in 0..200u64 {
        writer
            .put(
                &format!("k{i}"),
                &value(i, sizes(i)),
                &ReplicateConfig::single(),
            )
            .await
            .unwrap();
    }
    writer.remove("k7").await.unwrap();

    // Where each object lives: node2 will not come back.
    let on_node2: std::collections::BTreeSet<String> = {
        let endpoints = writer.segments().await.unwrap();
        let node2 = endpoints.iter().find(|s| s.name == "node2").unwrap().id;
        let mut keys = std::collections::BTreeSet::new();
        for i in 0..200u64 {
            let key = format!("k{i}");
            if let Ok(list) = writer.replicas(&key).await
                && list.replicas.iter().all(|r| r.segment == node2)
            {
                keys.insert(key);
            }
        }
        keys
    };
    assert!(!on_node2.is_empty(), "no object landed on node2");

    master.kill();
    nodes[2].kill();
    let snapshots = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("snapshot-"))
        .count();
    assert!(snapshots >= 1, "no snapshot in {}", state.display());
    let _master = start_master(&listen, &state);

    let reader = Client::connect(ClientConfig::new(listen.clone()))
        .await
        .unwrap();
    let report = reader.report().await.unwrap();
    assert_eq!(report.stats.objects, 200, "{report:?}");
    assert_eq!(report.census.hard_pinned, 1);
    assert_eq!(report.stats.segments, 3, "the nodes' segments came back");
    // node2 never returns: after the client TTL its segment and the objects only it held
    // are dropped; the other nodes kept heartbeating and keep theirs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while reader.report().await.unwrap().stats.segments > 2 {
        assert!(
            Instant::now() < deadline,
            "node2's segment was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = reader.report().await.unwrap();
    assert_eq!(
        report.stats.objects,
        200 - on_node2.len() as u64,
        "{report:?}"
    );
    assert_eq!(
        reader.get("weights").await.unwrap(),
        value(999, 100_000),
        "the hard-pinned value"
    );
    for i in 0..200u64 {
        let key = format!("k{i}");
        let got = reader.get(&key).await;
        if i == 7 || on_node2.contains(&key) {
            assert!(got.is_err(), "{key} was removed, or lived only on node2");
        } else {
            assert_eq!(got.unwrap(), value(i, sizes(i)), "k{i}");
        }
    }
    // The writer from before the kill carries on.
    writer
        .put("after", b"restart", &ReplicateConfig::single())
        .await
        .unwrap();
    assert_eq!(reader.get("after").await.unwrap(), b"restart");
    let _ = std::fs::remove_dir_all(&state);
}
