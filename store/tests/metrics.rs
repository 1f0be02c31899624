//! The master's metrics endpoint as an operator meets it: a real master and node on loopback,
//! scraped over HTTP while the CLI puts, and the figures follow the work.

use std::process::{Command, Stdio};

mod common;

use common::{BIN, Proc, args, http_get as get, sample, start_master_with_scrape_token};

fn put(master: &str, key: &str, file: &std::path::Path) {
    let out = Command::new(BIN)
        .args(["put", "--master", master, key])
        .arg(file)
        .env_remove("MOORING_TOKEN_FILE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn scrapes_follow_the_work_and_need_the_token() {
    let dir = std::env::temp_dir().join(format!("mooring-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("scrape-token");
    std::fs::write(&token_file, "scraper-secret\n").unwrap();
    let (master, metrics) = start_master_with_scrape_token(&token_file);
    let addr = master.announced_addr();
    let (_node, [node_metrics]) = Proc::start_on_free_ports(false, |[node_metrics]| {
        args(&[
            "node",
            "--master",
            &addr,
            "--size",
            "8MiB",
            "--no-prefault",
            "--name",
            "node-a",
            // Over TCP, so its data server moves (and counts) the bytes; a same-host client
            // would otherwise copy them through shared memory.
            "--transports",
            "tcp",
            "--metrics-listen",
            node_metrics,
        ])
    });
    let token = Some("scraper-secret");

    assert_eq!(get(&metrics, "/metrics", None).0, 401);
    assert_eq!(get(&metrics, "/metrics", Some("guess")).0, 401);
    assert_eq!(get(&metrics, "/nothing", token).0, 404);
    let (status, before) = get(&metrics, "/metrics", token);
    assert_eq!(status, 200);
    assert_eq!(sample(&before, "mooring_objects"), Some(0.0), "{before}");
    assert_eq!(sample(&before, "mooring_segments"), Some(1.0));
    // The node keeps a connection to the master (and this scrape is not an RPC connection).
    assert!(
        sample(&before, "mooring_connections") >= Some(1.0),
        "{before}"
    );
    assert_eq!(
        sample(
            &before,
            "mooring_segment_capacity_bytes{segment=\"node-a\"}"
        ),
        Some(8.0 * 1024.0 * 1024.0)
    );

    // Five small puts: the object gauge and the PutStart count follow.
    let small = dir.join("small");
    std::fs::write(&small, b"hello").unwrap();
    for i in 0..5 {
        put(&addr, &format!("small-{i}"), &small);
    }
    let (_, after) = get(&metrics, "/metrics", token);
    assert_eq!(sample(&after, "mooring_objects"), Some(5.0), "{after}");
    let put_starts = sample(
        &after,
        "mooring_rpc_requests_total{kind=\"PutStart\",outcome=\"ok\"}",
    );
    assert!(put_starts >= Some(5.0), "{after}");
    assert!(after.contains("mooring_rpc_duration_seconds_bucket{"));
    assert_eq!(sample(&after, "mooring_evicted_objects_total"), Some(0.0));
    assert_eq!(
        sample(&after, "mooring_objects_by_state{state=\"complete\"}"),
        Some(5.0)
    );
    assert_eq!(
        sample(&after, "mooring_values_bytes{tier=\"memory\"}"),
        Some(25.0)
    );

    // A get takes a lease and is a memory hit; a get of a missing key is a miss.
    let get_key = |key: &str| {
        Command::new(BIN)
            .args(["get", "--master", &addr, key])
            .env_remove("MOORING_TOKEN_FILE")
            .stdin(Stdio::null())
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(get_key("small-0"));
    assert!(!get_key("no-such-key"));
    let (_, read) = get(&metrics, "/metrics", token);
    assert_eq!(
        sample(&read, "mooring_objects_by_state{state=\"leased\"}"),
        Some(1.0),
        "{read}"
    );
    assert!(sample(&read, "mooring_reads_total{tier=\"memory\"}") >= Some(1.0));
    assert!(sample(&read, "mooring_reads_total{tier=\"none\"}") >= Some(1.0));

    // Twelve 1 MiB values into 8 MiB: evictions, and their counter.
    let big = dir.join("big");
    std::fs::write(&big, vec![7u8; 1 << 20]).unwrap();
    for i in 0..12 {
        put(&addr, &format!("big-{i}"), &big);
    }
    let (_, full) = get(&metrics, "/metrics", token);
    assert!(
        sample(&full, "mooring_evicted_objects_total") > Some(0.0),
        "{full}"
    );
    assert!(sample(&full, "mooring_evicted_bytes_total") >= Some(1024.0 * 1024.0));
    assert!(sample(&full, "mooring_used_bytes") > Some(0.0));

    // The JSON the dashboard reads agrees.
    let (status, json) = get(&metrics, "/stats.json", token);
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        stats["objects"].as_f64(),
        sample(&full, "mooring_objects"),
        "{json}"
    );
    assert_eq!(stats["segment_list"][0]["name"], "node-a");

    // `mooring stat --json` prints the same document.
    let out = Command::new(BIN)
        .args(["stat", "--json", "--master", &addr])
        .env_remove("MOORING_TOKEN_FILE")
        .output()
        .unwrap();
    assert!(out.status.success());
    let from_cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(from_cli["objects"], stats["objects"]);
    assert_eq!(from_cli["evicted_objects"], stats["evicted_objects"]);

    // The node's own endpoint counts the bytes it moved.
    let (status, node) = get(&node_metrics, "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        sample(&node, "mooring_node_writes_total") >= Some(17.0),
        "{node}"
    );
    assert!(
        sample(&node, "mooring_node_written_bytes_total") >= Some(12.0 * 1024.0 * 1024.0),
        "{node}"
    );
    assert_eq!(sample(&node, "mooring_node_mounted"), Some(1.0));
    assert!(
        sample(&node, "mooring_node_connections").is_some(),
        "{node}"
    );
    assert_eq!(
        sample(&node, "mooring_node_segment_bytes"),
        Some(8.0 * 1024.0 * 1024.0)
    );
    // (the small puts above were evicted by the big ones)
    put(&addr, "fresh", &small);
    let read = Command::new(BIN)
        .args(["get", "--master", &addr, "fresh"])
        .env_remove("MOORING_TOKEN_FILE")
        .output()
        .unwrap();
    assert_eq!(read.stdout, b"hello");
    let (_, node_after) = get(&node_metrics, "/metrics", None);
    assert!(
        sample(&node_after, "mooring_node_reads_total") > sample(&node, "mooring_node_reads_total"),
        "{node_after}"
    );

    // Nothing a scraper sees opens the data plane: no node endpoint.
    for text in [&full, &json] {
        assert!(
            !text.contains("endpoint") && !text.contains("\"key\""),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
