//! Copy and move tasks as an operator runs them: `mooring cp` adds replicas that outlive the
//! original's node, `mooring mv` moves one off a node before it goes.

use std::process::Command;
use std::time::{Duration, Instant};

use mooring::{Client, ClientConfig};
use mooring_core::ReplicateConfig;

mod common;

use common::{BIN, Proc, start_nodes, wait_for_segments};

fn cli(master: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .args(["--master", master])
        .output()
        .unwrap()
}

fn succeeds(master: &str, args: &[&str]) -> String {
    let out = cli(master, args);
    assert!(
        out.status.success(),
        "mooring {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The names of the segments holding `key`'s replicas.
async fn holders(client: &Client, key: &str) -> Vec<String> {
    let segments = client.segments().await.unwrap();
    let list = client.replicas(key).await.unwrap();
    let mut names: Vec<String> = list
        .replicas
        .iter()
        .filter_map(|r| segments.iter().find(|s| s.id == r.segment))
        .map(|s| s.name.clone())
        .collect();
    names.sort();
    names
}

/// A master (client TTL 2 s), three 16 MiB nodes named node0..node2, and a client that sees
/// them mounted.
async fn three_nodes() -> (Proc, String, Vec<Proc>, Client) {
    let master = Proc::start(&["master", "--listen", "127.0.0.1:0", "--client-ttl", "2s"]);
    let addr = master.announced_addr();
    let nodes = start_nodes(&addr, 3, "16MiB");
    let client = Client::connect(ClientConfig::new(addr.clone()))
        .await
        .unwrap();
    wait_for_segments(&client, 3).await;
    (master, addr, nodes, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_outlive_their_source_and_moves_leave_it() {
    let (_master, addr, mut nodes, client) = three_nodes().await;
    let value: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let one = ReplicateConfig::single();
    client.put("copied", &value, &one).await.unwrap();
    client.put("moved", &value, &one).await.unwrap();

    // A copy to every other node: three replicas.
    let source = holders(&client, "copied").await.remove(0);
    let others: Vec<String> = (0..3)
        .map(|i| format!("node{i}"))
        .filter(|n| *n != source)
        .collect();
    let mut args = vec!["cp", "copied"];
    args.extend(others.iter().map(String::as_str));
    assert!(succeeds(&addr, &args).contains("copied copied to"));
    assert_eq!(holders(&client, "copied").await.len(), 3);
    // Copying onto a segment that already holds one is refused with the reason.
    let again = cli(&addr, &["cp", "copied", &others[0]]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("REPLICA_ALREADY_EXISTS"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // A move off the node that holds "moved", to another.
    let from = holders(&client, "moved").await.remove(0);
    let to = (0..3)
        .map(|i| format!("node{i}"))
        .find(|n| *n != from)
        .unwrap();
    succeeds(&addr, &["mv", "moved", &from, &to]);
    assert_eq!(holders(&client, "moved").await, vec![to.clone()]);

    // The original holders go away (all but the move's target): both values are still
    // there, byte for byte.
    let mut doomed = vec![from.clone()];
    if source != to && source != from {
        doomed.push(source.clone());
    }
    for name in &doomed {
        let i: usize = name.trim_start_matches("node").parse().unwrap();
        nodes[i].kill();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.segments().await.unwrap().len() > 3 - doomed.len() {
        assert!(Instant::now() < deadline, "dead nodes never unmounted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(client.get("copied").await.unwrap(), value);
    assert_eq!(client.get("moved").await.unwrap(), value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_lost_with_a_node_are_copied_back_by_the_survivors() {
    let (_master, addr, mut nodes, client) = three_nodes().await;
    let value = |i: usize| -> Vec<u8> { (0..20_000 + i).map(|b| (b * i % 253) as u8).collect() };
    let two = ReplicateConfig::replicas(2);
    for i in 0..60 {
        client.put(&format!("k{i}"), &value(i), &two).await.unwrap();
    }
    nodes[1].kill();
    // The master drops node1 after the client TTL; the survivors copy what it held back to
    // two replicas each.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut short = 0;
        for i in 0..60 {
            let list = client.replicas(&format!("k{i}")).await.unwrap();
            if list.replicas.len() < 2 {
                short += 1;
            }
        }
        if short == 0 && client.segments().await.unwrap().len() == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{short} objects still short of two replicas"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(client.stats().await.unwrap().repairs_waiting, 0);
    // `mooring ls` shows the counts back at two.
    let listing = succeeds(&addr, &["ls", "^k"]);
    assert_eq!(
        listing.lines().filter(|l| l.contains(" 2x ")).count(),
        60,
        "{listing}"
    );
    // And the copies are the values: lose a second node, every value still reads.
    nodes[0].kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.segments().await.unwrap().len() > 1 {
        assert!(Instant::now() < deadline, "node0 never unmounted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..60 {
        assert_eq!(
            client.get(&format!("k{i}")).await.unwrap(),
            value(i),
            "k{i}"
        );
    }
}

/// Mooncake's BatchQueryIp and BatchReplicaClear through a real cluster: the nodes' hosts, and
/// a client clearing its own objects (whole, or a replica on one node) but not another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clears_its_own_objects_and_learns_its_nodes_hosts() {
    let (_master, addr, _nodes, client) = three_nodes().await;
    let owners: Vec<_> = client
        .segments()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.owner)
        .collect();
    let hosts = client.client_hosts(&owners).await.unwrap();
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    assert!(
        hosts
            .iter()
            .all(|(_, h)| h == &vec!["127.0.0.1".to_string()]),
        "{hosts:?}"
    );

    client
        .put("whole", &[1; 1000], &ReplicateConfig::single())
        .await
        .unwrap();
    client
        .put("pair", &[2; 1000], &ReplicateConfig::replicas(2))
        .await
        .unwrap();
    let other = Client::connect(ClientConfig::new(addr)).await.unwrap();
    other
        .put("theirs", &[3; 1000], &ReplicateConfig::single())
        .await
        .unwrap();
    // Reading where "pair" lives would lease it (and a leased object is not cleared): clear it
    // on each node in turn; a node without a replica of it clears nothing.
    let mut on = None;
    for name in ["node0", "node1", "node2"] {
        let cleared = client
            .clear_replicas(&["pair".to_string()], Some(name))
            .await
            .unwrap();
        if cleared == vec!["pair".to_string()] {
            on = Some(name.to_string());
            break;
        }
        assert!(cleared.is_empty(), "{cleared:?}");
    }
    let on = on.expect("one of the nodes held a replica of pair");
    assert_eq!(holders(&client, "pair").await.len(), 1);
    assert!(!holders(&client, "pair").await.contains(&on));
    assert_eq!(client.get("pair").await.unwrap(), vec![2; 1000]);

    let keys = vec!["whole".to_string(), "theirs".to_string()];
    let cleared = client.clear_replicas(&keys, None).await.unwrap();
    assert_eq!(
        cleared,
        vec!["whole".to_string()],
        "another client's object stays"
    );
    assert!(client.get("whole").await.is_err());
    assert_eq!(client.get("theirs").await.unwrap(), vec![3; 1000]);
}

/// Mooncake's CreateCopyTask / CreateMoveTask / QueryTask through a real cluster: the call
/// returns while the copy runs in the background; the master reports it running, then done;
/// a task the master never started is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_tasks_are_reported_until_they_end() {
    use mooring_core::{ErrorCode, TaskAction, TaskId, TaskState};
    let (_master, _addr, _nodes, client) = three_nodes().await;
    let value: Vec<u8> = (0..2_000_000u32).map(|i| (i * 13 % 251) as u8).collect();
    client
        .put("queued", &value, &ReplicateConfig::single())
        .await
        .unwrap();
    let source = holders(&client, "queued").await.remove(0);
    let others: Vec<String> = (0..3)
        .map(|i| format!("node{i}"))
        .filter(|n| *n != source)
        .collect();

    let wait_for_end = async |task: TaskId| loop {
        let report = client.query_task(task).await.unwrap();
        if report.state != TaskState::Running {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    let copy = client.start_copy("queued", &[&others[0]]).await.unwrap();
    let report = wait_for_end(copy).await;
    assert_eq!(report.state, TaskState::Succeeded, "{report:?}");
    assert_eq!(report.action, TaskAction::Copy);
    assert_eq!(report.key, "queued");
    assert!(report.updated >= report.started && report.now >= report.updated);
    assert_eq!(holders(&client, "queued").await.len(), 2);

    let moved = client
        .start_move("queued", &source, &others[1])
        .await
        .unwrap();
    let report = wait_for_end(moved).await;
    assert_eq!(report.state, TaskState::Succeeded, "{report:?}");
    assert_eq!(report.action, TaskAction::Move);
    let mut expected = others.clone();
    expected.sort();
    assert_eq!(holders(&client, "queued").await, expected);
    assert_eq!(client.get("queued").await.unwrap(), value);

    // Refused before anything runs: a segment that already holds a replica.
    let refused = client
        .start_copy("queued", &[&others[0]])
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::REPLICA_ALREADY_EXISTS);
    let unknown = client.query_task(TaskId(987_654)).await.unwrap_err();
    assert_eq!(unknown.code, ErrorCode::OBJECT_NO_REPLICATION_TASK);
    assert!(
        unknown.to_string().contains("never started here"),
        "{unknown}"
    );
}
