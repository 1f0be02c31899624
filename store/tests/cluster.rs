//! The cluster as users run it: a master and storage nodes as separate processes on
//! 127.0.0.1, clients in this process, faults injected with SIGKILL and garbage bytes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooring::{Client, ClientConfig};
use mooring_core::{ErrorCode, ReplicateConfig};
use mooring_proto::auth::Handshake;
use mooring_proto::wire::{HEADER_LEN, WireMessage, parse_header};

mod common;

use common::{BIN, Proc, start_nodes, value};

struct Cluster {
    master: Proc,
    addr: String,
    nodes: Vec<Proc>,
}

fn start_cluster(nodes: usize, node_size: &str) -> Cluster {
    let master = Proc::start(&[
        "master",
        "--listen",
        "127.0.0.1:0",
        "--lease-ttl",
        "300ms",
        "--discard-timeout",
        "2s",
        "--release-timeout",
        "3s",
        "--client-ttl",
        "2s",
    ]);
    let addr = master.announced_addr();
    let nodes = start_nodes(&addr, nodes, node_size);
    Cluster {
        master,
        addr,
        nodes,
    }
}

async fn client(addr: &str) -> Client {
    Client::connect(ClientConfig::new(addr)).await.unwrap()
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    limit: Duration,
    mut f: impl FnMut() -> F,
) {
    let deadline = Instant::now() + limit;
    while !f().await {
        assert!(
            Instant::now() < deadline,
            "condition not reached within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_exact_across_nodes_with_distinct_replicas() {
    let cluster = start_cluster(3, "32MiB");
    let c = client(&cluster.addr).await;
    for i in 0..40u64 {
        let v = value(i, 1 + (i as usize * 7919) % 300_000);
        c.put(&format!("k{i}"), &v, &ReplicateConfig::replicas(3))
            .await
            .unwrap();
    }
    let other = client(&cluster.addr).await;
    for i in 0..40u64 {
        let v = value(i, 1 + (i as usize * 7919) % 300_000);
        assert_eq!(other.get(&format!("k{i}")).await.unwrap(), v, "k{i}");
    }
    for (key, list) in other.query_by_regex("^k").await.unwrap() {
        let mut segments: Vec<_> = list.replicas.iter().map(|r| r.segment).collect();
        segments.sort();
        segments.dedup();
        assert_eq!(segments.len(), 3, "{key} replicas on distinct nodes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_survive_the_loss_of_a_replica_node() {
    let mut cluster = start_cluster(3, "32MiB");
    let c = client(&cluster.addr).await;
    for i in 0..30u64 {
        c.put(
            &format!("k{i}"),
            &value(i, 50_000),
            &ReplicateConfig::replicas(2),
        )
        .await
        .unwrap();
    }
    cluster.nodes[0].kill();
    for i in 0..30u64 {
        assert_eq!(
            c.get(&format!("k{i}")).await.unwrap(),
            value(i, 50_000),
            "k{i} right after the kill"
        );
    }
    // After the client TTL the master drops the dead node; every key still has a replica.
    wait_until(Duration::from_secs(10), || async {
        c.stats().await.unwrap().segments == 2
    })
    .await;
    for i in 0..30u64 {
        assert_eq!(c.get(&format!("k{i}")).await.unwrap(), value(i, 50_000));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_under_pressure_keeps_hard_pinned_objects() {
    let cluster = start_cluster(3, "4MiB");
    let c = client(&cluster.addr).await;
    for i in 0..3u64 {
        c.put(
            &format!("weights{i}"),
            &value(100 + i, 1 << 20),
            &ReplicateConfig::single().hard_pinned(),
        )
        .await
        .unwrap();
    }
    for i in 0..200u64 {
        let key = format!("kv{i}");
        c.put(&key, &value(i, 128 << 10), &ReplicateConfig::single())
            .await
            .unwrap();
    }
    let stats = c.stats().await.unwrap();
    assert!(stats.evicted_objects > 100, "{stats:?}");
    for i in 0..3u64 {
        assert_eq!(
            c.get(&format!("weights{i}")).await.unwrap(),
            value(100 + i, 1 << 20)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_put_leaves_the_key_writable_after_the_discard_timeout() {
    let cluster = start_cluster(1, "16MiB");
    let mut hung = Proc::start(&["debug", "hang-put", "--master", &cluster.addr, "doomed"]);
    assert!(hung.line.contains("started put"), "{}", hung.line);
    hung.kill();
    let c = client(&cluster.addr).await;
    let e = c
        .put("doomed", b"mine", &ReplicateConfig::single())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::OBJECT_ALREADY_EXISTS);
    assert_eq!(
        c.get("doomed").await.unwrap_err().code,
        ErrorCode::REPLICA_IS_NOT_READY
    );
    wait_until(Duration::from_secs(10), || async {
        c.put("doomed", b"mine", &ReplicateConfig::single())
            .await
            .is_ok()
    })
    .await;
    assert_eq!(c.get("doomed").await.unwrap(), b"mine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_segment_is_dropped_after_the_client_ttl() {
    let mut cluster = start_cluster(2, "16MiB");
    let c = client(&cluster.addr).await;
    let segments = c.segments().await.unwrap();
    let doomed = segments.iter().find(|s| s.name == "node1").unwrap().id;
    for i in 0..20u64 {
        c.put(
            &format!("k{i}"),
            &value(i, 10_000),
            &ReplicateConfig::single().preferring("node1"),
        )
        .await
        .unwrap();
    }
    cluster.nodes[1].kill();
    let killed = Instant::now();
    wait_until(Duration::from_secs(10), || async {
        c.segments().await.unwrap().iter().all(|s| s.id != doomed)
    })
    .await;
    assert!(
        killed.elapsed() >= Duration::from_millis(1500),
        "dropped before the TTL"
    );
    for i in 0..20u64 {
        assert_eq!(
            c.get(&format!("k{i}")).await.unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
    }
    assert_eq!(c.stats().await.unwrap().lost_objects, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upsert_under_concurrent_reads_is_never_torn() {
    let cluster = start_cluster(2, "32MiB");
    let writer = client(&cluster.addr).await;
    let reader = client(&cluster.addr).await;
    let versions: Vec<Vec<u8>> = (0..6).map(|v| value(1000 + v, 2 << 20)).collect();
    writer
        .put("weights", &versions[0], &ReplicateConfig::replicas(2))
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let read_task = {
        let (reader, versions, stop) = (reader.clone(), versions.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen = [0usize; 6];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match reader.get("weights").await {
                    Ok(v) => {
                        let which = versions.iter().position(|x| *x == v);
                        seen[which.expect("a read returned bytes of no version (torn)")] += 1;
                    }
                    Err(e) => assert_eq!(e.code, ErrorCode::REPLICA_IS_NOT_READY, "{e}"),
                }
            }
            seen
        })
    };
    for version in &versions[1..] {
        tokio::time::sleep(Duration::from_millis(30)).await;
        writer
            .upsert("weights", version, &ReplicateConfig::replicas(2))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = read_task.await.unwrap();
    assert!(seen.iter().sum::<usize>() > 10, "{seen:?}");
    assert_eq!(reader.get("weights").await.unwrap(), versions[5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_to_every_port_is_refused_without_harm() {
    let cluster = start_cluster(2, "16MiB");
    let c = client(&cluster.addr).await;
    c.put("before", b"intact", &ReplicateConfig::replicas(2))
        .await
        .unwrap();
    let mut ports: Vec<String> = vec![cluster.addr.clone()];
    ports.extend(c.segments().await.unwrap().into_iter().map(|s| s.endpoint));
    let mut header = Vec::from(*b"MOOR");
    header.extend_from_slice(&[1, 1, 0, 0]);
    header.extend_from_slice(&7u64.to_le_bytes());
    let mut huge = header.clone();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&0u32.to_le_bytes());
    let mut bad_crc = header.clone();
    bad_crc.extend_from_slice(&8u32.to_le_bytes());
    bad_crc.extend_from_slice(&0xDEAD_BEEFu32.to_le_bytes());
    bad_crc.extend_from_slice(b"12345678");
    let garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        value(7, 100_000),
        huge,
        bad_crc,
        vec![0; 24],
    ];
    for port in &ports {
        for bytes in &garbage {
            let mut s = TcpStream::connect(port).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.write_all(bytes);
            let mut rest = Vec::new();
            // The peer opens with its handshake challenge, then closes the connection instead
            // of answering garbage.
            let _ = s.read_to_end(&mut rest);
            assert!(rest.len() >= HEADER_LEN, "{port} sent no challenge");
            let (head, payload) = rest.split_at(HEADER_LEN);
            let header = parse_header(head.try_into().unwrap()).unwrap();
            let payload = &payload[..header.len as usize];
            assert!(
                matches!(
                    Handshake::from_frame(&header, payload),
                    Ok(Handshake::Challenge { .. })
                ),
                "{port} did not open with a challenge"
            );
            assert_eq!(
                rest.len(),
                HEADER_LEN + payload.len(),
                "{port} answered garbage beyond its challenge"
            );
        }
    }
    assert_eq!(c.get("before").await.unwrap(), b"intact");
    c.put("after", b"fine", &ReplicateConfig::replicas(2))
        .await
        .unwrap();
    assert_eq!(
        client(&cluster.addr).await.get("after").await.unwrap(),
        b"fine"
    );
    let _ = &cluster.master;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_output_into_a_closed_pipe_ends_quietly() {
    // `mooring stat | head -1`: the reader goes away; the CLI must not panic.
    let cluster = start_cluster(1, "16MiB");
    let c = client(&cluster.addr).await;
    for i in 0..3u64 {
        c.put(
            &format!("k{i}"),
            &value(i, 1000),
            &ReplicateConfig::single(),
        )
        .await
        .unwrap();
    }
    for command in [&["stat"][..], &["ls"], &["get", "k0"]] {
        let mut child = Command::new(BIN)
            .args(command)
            .args(["--master", &cluster.addr])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mooring");
        // Close the read end before the CLI has connected, let alone printed.
        drop(child.stdout.take());
        let output = child.wait_with_output().expect("wait for mooring");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !stderr.contains("panicked"),
            "mooring {command:?} panicked on a closed pipe: {stderr}"
        );
        assert!(
            output.status.success(),
            "mooring {command:?} failed on a closed pipe: {:?} {stderr}",
            output.status
        );
    }
    // Listing takes no lease: the listed object can be removed at once.
    let ls = Command::new(BIN)
        .args(["ls", "--master", &cluster.addr])
        .output()
        .expect("mooring ls");
    assert!(String::from_utf8_lossy(&ls.stdout).contains("3 keys"));
    c.remove("k1").await.expect("mooring ls leased k1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_that_would_hurt_are_refused_before_anything_is_mounted() {
    let cluster = start_cluster(2, "16MiB");
    let node = |extra: &[&str]| {
        let output = Command::new(BIN)
            .args(["node", "--master", &cluster.addr, "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("run mooring node");
        (
            output.status,
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    // A segment larger than the machine: refused at once, not prefaulted toward the OOM killer.
    let (status, stderr) = node(&["--size", "64TiB"]);
    assert!(!status.success(), "64 TiB accepted: {stderr}");
    assert!(stderr.contains("exceeds"), "{stderr}");
    // A disk directory that takes no files (procfs, even for root).
    let (status, stderr) = node(&["--size", "16MiB", "--disk-dir", "/proc/self"]);
    assert!(
        !status.success(),
        "an unwritable disk directory accepted: {stderr}"
    );
    assert!(stderr.contains("not writable"), "{stderr}");
    // More disk capacity than the file system has.
    let dir = std::env::temp_dir().join(format!("mooring-cap-{}", std::process::id()));
    let (status, stderr) = node(&[
        "--size",
        "16MiB",
        "--disk-dir",
        dir.to_str().unwrap(),
        "--disk-capacity",
        "100000TiB",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!status.success(), "100,000 TiB of disk accepted: {stderr}");
    assert!(stderr.contains("exceeds the space"), "{stderr}");
    // RDMA asked for where it cannot run: refused with what is missing (here: no kernel
    // support or no device; where a device exists, that the data path is not built yet).
    let (status, stderr) = node(&["--size", "16MiB", "--transports", "tcp,rdma"]);
    assert!(
        !status.success(),
        "RDMA accepted without a usable device: {stderr}"
    );
    assert!(
        stderr.contains("UNAVAILABLE_IN_CURRENT_MODE (-1011)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("RDMA") && !stderr.contains("panicked"),
        "{stderr}"
    );
    let (status, stderr) = node(&["--size", "16MiB", "--transports", "tcp,quic"]);
    assert!(!status.success());
    assert!(stderr.contains("unknown transport \"quic\""), "{stderr}");
    // None of them mounted anything.
    let c = client(&cluster.addr).await;
    assert_eq!(c.segments().await.unwrap().len(), 2);
    // Five replicas asked of two nodes: the CLI says how many were stored.
    let put = Command::new(BIN)
        .args([
            "put",
            "--master",
            &cluster.addr,
            "five",
            "--value",
            "v",
            "--replicas",
            "5",
        ])
        .output()
        .expect("mooring put");
    let stdout = String::from_utf8_lossy(&put.stdout);
    assert!(put.status.success(), "{stdout}");
    assert!(
        stdout.contains("with 2 of the 5 replicas asked"),
        "{stdout}"
    );
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_announce_big_frames_and_stall_cost_little() {
    let cluster = start_cluster(1, "16MiB");
    let node_endpoint = client(&cluster.addr).await.segments().await.unwrap()[0]
        .endpoint
        .clone();
    let pids = [cluster.master.child.id(), cluster.nodes[0].child.id()];
    let before: Vec<u64> = pids.iter().map(|&p| rss(p)).collect();
    // A handshake frame header announcing 16 MiB, then nothing: what used to get a 16 MiB
    // buffer per connection before a single payload byte arrived.
    let mut header = Vec::from(*b"MOOR");
    header.extend_from_slice(&[mooring_proto::wire::WIRE_VERSION, 5, 0, 0]);
    header.extend_from_slice(&0u64.to_le_bytes());
    header.extend_from_slice(&(16u32 << 20).to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    let mut stalled = Vec::new();
    for port in [&cluster.addr, &node_endpoint] {
        for _ in 0..100 {
            let mut s = TcpStream::connect(port).unwrap();
            s.write_all(&header).unwrap();
            s.write_all(&[0u8; 1000]).unwrap();
            stalled.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (pid, before) in pids.iter().zip(before) {
        let grew = rss(*pid).saturating_sub(before);
        assert!(
            grew < 64 << 20,
            "200 stalled connections grew process {pid} by {} MiB",
            grew >> 20
        );
    }
    // Honest clients still get in meanwhile, and the stalled ones are closed by the deadline.
    let c = client(&cluster.addr).await;
    c.put("k", b"v", &ReplicateConfig::single()).await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), b"v");
    tokio::time::sleep(Duration::from_secs(6)).await;
    for mut s in stalled {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        // The challenge, then the close (no hang: read_to_end returns). A server that closes
        // with some of our bytes still unread in its socket makes the kernel answer with a
        // reset rather than an orderly end of stream: that is a close too. Only a timeout is
        // the hang this test is about.
        match s.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("the server did not close the stalled connection: {e}"),
        }
    }
}

/// Damages the bytes of `key`'s replica number `which` in place, as a stray write or a bad
/// DIMM would: an authenticated peer writes garbage over them through the data plane.
async fn damage_replica(addr: &str, key: &str, which: usize) {
    use mooring_proto::transport::{ControlPlane, DataPlane, NodeAddr, WriteOp};
    use mooring_proto::wire::{DescribeSegments, GetReplicaList};
    use mooring_transport_tcp::{DataPlaneConfig, LocalSegments, TcpControlPlane, TcpDataPlane};
    let control = TcpControlPlane::new(
        addr,
        Duration::from_secs(5),
        Duration::ZERO,
        None,
        mooring_core::ClientId(0xBAD),
    );
    let control: &dyn ControlPlane = &*control;
    let list = control
        .call(GetReplicaList { key: key.into() })
        .await
        .unwrap();
    let replica = list.replicas[which];
    let info = control
        .call(DescribeSegments {
            ids: vec![replica.segment],
        })
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    let node = NodeAddr {
        endpoint: info.endpoint.into(),
        key: info.key,
        rdma_key: None,
    };
    let data = TcpDataPlane::new(
        Arc::new(LocalSegments::default()),
        DataPlaneConfig::default(),
    );
    let garbage = vec![0xEE; 64];
    let op = WriteOp {
        addr: replica.addr + replica.len / 2,
        src: &garbage,
    };
    data.write(&node, vec![op], Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_replica_is_never_returned() {
    let cluster = start_cluster(2, "32MiB");
    let c = client(&cluster.addr).await;
    let two = ReplicateConfig::replicas(2);
    for key in ["single", "batched"] {
        c.put(key, &value(7, 300_000), &two).await.unwrap();
        damage_replica(&cluster.addr, key, 0).await;
    }
    // One replica is damaged: every read path returns the intact one.
    for _ in 0..4 {
        assert_eq!(c.get("single").await.unwrap(), value(7, 300_000));
    }
    let batch = c.batch_get(&["batched", "single"]).await;
    for got in batch {
        assert_eq!(got.unwrap(), value(7, 300_000));
    }
    // Both damaged: the read fails and says why, instead of returning wrong bytes.
    damage_replica(&cluster.addr, "single", 1).await;
    let err = c.get("single").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::INVALID_REPLICA, "{err}");
    assert!(err.to_string().contains("damaged"), "{err}");
    let err = c.batch_get(&["single"]).await.remove(0).unwrap_err();
    assert_eq!(err.code, ErrorCode::INVALID_REPLICA, "{err}");
}

/// What a careless or hostile shell user hands the CLI: a key of exactly the longest length
/// (stored, and said so), keys with control characters (escaped by `ls`, never printed raw),
/// and an endless input (refused once it passes the largest segment, never read whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_keys_up_to_the_limit_escapes_them_and_bounds_what_it_reads() {
    let cluster = start_cluster(1, "16MiB");
    let mooring = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .args(["--master", &cluster.addr])
            .stdin(Stdio::null())
            .output()
            .expect("run mooring")
    };
    let longest = "k".repeat(4096);
    let put = mooring(&["put", &longest, "--value", "v"]);
    let said = String::from_utf8_lossy(&put.stdout);
    assert!(
        put.status.success() && said.contains("stored") && said.contains("1 replicas"),
        "a 4096-byte key: {:?} {said} {}",
        put.status,
        String::from_utf8_lossy(&put.stderr)
    );
    // Listed without a lease: removable at once.
    assert!(mooring(&["rm", &longest]).status.success());

    let c = client(&cluster.addr).await;
    c.put("a\nb\x1b[31mc", b"v", &ReplicateConfig::single())
        .await
        .unwrap();
    let ls = mooring(&["ls"]);
    let listed = String::from_utf8_lossy(&ls.stdout);
    assert!(ls.status.success(), "{listed}");
    assert!(
        listed.contains("a\\nb\\u{1b}[31mc") && !listed.contains('\x1b'),
        "control characters printed raw: {listed:?}"
    );

    let endless = mooring(&["put", "zeros", "/dev/zero"]);
    let stderr = String::from_utf8_lossy(&endless.stderr);
    assert!(
        !endless.status.success() && stderr.contains("larger than the largest segment"),
        "put of /dev/zero: {:?} {stderr}",
        endless.status
    );
    assert!(!c.exist("zeros").await.unwrap(), "nothing is stored");
}
