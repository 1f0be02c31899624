//! Peer mode with real processes on loopback: `mooring peer` clusters, written and read
//! through [`PeerGuest`]s (the client the CLI uses for `peer://`), with every byte checked.

use std::time::{Duration, Instant};

mod common;

use common::{Proc, args, issue, run_without_token as run, scratch, value};
use mooring::peer::PeerGuest;
use mooring_core::ErrorCode;
use mooring_core::peer::membership::MemberInfo;
use mooring_proto::wire::{PeerReply, PeerRequest};
use mooring_transport_tcp::PeerLinks;

/// A peer on a free loopback port greeting `seeds`, with `extra` flags; its address.
fn start_peer(seeds: &[&str], extra: &[&str]) -> (Proc, String) {
    let (proc, [addr]) = Proc::start_on_free_ports(false, |[listen]| {
        let mut line = args(&["peer", "--listen", listen, "--size", "32MiB"]);
        if !seeds.is_empty() {
            line.extend(args(&["--seeds", &seeds.join(",")]));
        }
        line.extend(args(extra));
        line
    });
    assert!(proc.line.contains(&addr), "{}", proc.line);
    (proc, addr)
}

fn guest(peer: &str) -> PeerGuest {
    PeerGuest::new(vec![peer.to_string()], None, Duration::from_secs(5)).unwrap()
}

/// Waits until a value put through each of `peers` is read back through every other one:
/// they see each other and agree on the ring. Returns how many probe values each of them
/// took (they stay, as any value does).
async fn wait_until_joined(peers: &[&str]) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut round = 0u64;
    let mut taken = vec![0; peers.len()];
    loop {
        round += 1;
        let mut all = true;
        for (i, writer) in peers.iter().enumerate() {
            let key = format!("probe/{round}/{i}");
            // A peer still joining refuses clients (RPC_FAIL): not joined yet.
            if guest(writer)
                .put(&key, key.clone().into_bytes())
                .await
                .is_err()
            {
                all = false;
                continue;
            }
            taken[i] += 1;
            for reader in peers {
                let read = guest(reader).get(&key).await;
                all &= matches!(read, Ok(Some(value)) if value == key.as_bytes());
            }
        }
        if all {
            return taken;
        }
        assert!(Instant::now() < deadline, "{peers:?} never joined up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The keys written, each with the peer it was written through and its value.
struct Written(Vec<(String, usize, Vec<u8>)>);

impl Written {
    /// `count` values of sizes from 1 byte to 300 KiB, written round-robin through `peers`.
    async fn through(peers: &[&str], tag: &str, count: usize) -> Written {
        let mut written = Vec::new();
        for i in 0..count {
            let writer = i % peers.len();
            let len = [1, 100, 4096, 65_537, 300 << 10][i % 5];
            let key = format!("{tag}/{i}");
            let bytes = value(i as u64 + 7, len);
            guest(peers[writer]).put(&key, bytes.clone()).await.unwrap();
            written.push((key, writer, bytes));
        }
        Written(written)
    }

    /// Reads every key through `reader`: a value written through a peer in `alive` must be
    /// found, byte for byte; any other may be missing, but never other bytes.
    async fn check(&self, reader: &str, alive: &[usize]) {
        let reader = guest(reader);
        for (key, writer, bytes) in &self.0 {
            let read = reader.get(key).await.unwrap();
            match read {
                Some(read) => assert!(read == *bytes, "{key}: other bytes"),
                None => assert!(
                    !alive.contains(writer),
                    "{key}, held by a live peer, was not found"
                ),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_peer_cluster_survives_a_kill_and_a_join_with_every_byte_checked() {
    let (mut first, a) = start_peer(&[], &[]);
    let (_second, b) = start_peer(&[&a], &[]);
    let (_third, c) = start_peer(&[&a], &[]);
    wait_until_joined(&[&a, &b, &c]).await;
    let written = Written::through(&[&a, &b, &c], "kv", 60).await;
    for reader in [&a, &b, &c] {
        written.check(reader, &[0, 1, 2]).await;
    }

    // SIGKILL of the seed: with two directory replicas, every value the survivors hold is
    // still found, at once (the other owner answers) and after the ring changes.
    first.kill();
    written.check(&b, &[1, 2]).await;
    written.check(&c, &[1, 2]).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    written.check(&b, &[1, 2]).await;
    written.check(&c, &[1, 2]).await;

    // A peer joining takes its shards: nothing becomes unfindable, through it or others.
    let (_fourth, d) = start_peer(&[&b], &[]);
    wait_until_joined(&[&b, &c, &d]).await;
    for reader in [&b, &c, &d] {
        written.check(reader, &[1, 2]).await;
    }
    let later = Written::through(&[&d, &b], "after-join", 20).await;
    later.check(&c, &[0, 1]).await;

    // Removal: gone through every peer; a rewrite is the newest value everywhere.
    let (key, _, _) = &written.0[1];
    assert!(guest(&c).remove(key).await.unwrap());
    let (rewritten, _, _) = &written.0[2];
    guest(&d).put(rewritten, b"newer".to_vec()).await.unwrap();
    for reader in [&b, &c, &d] {
        assert_eq!(guest(reader).get(key).await.unwrap(), None);
        assert_eq!(
            guest(reader).get(rewritten).await.unwrap().as_deref(),
            Some(&b"newer"[..])
        );
    }
    assert!(!guest(&b).remove(key).await.unwrap(), "already removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_works_against_a_peer_cluster_and_refuses_what_it_cannot_do() {
    let (_first, a) = start_peer(&[], &[]);
    let (_second, b) = start_peer(&[&a], &[]);
    wait_until_joined(&[&a, &b]).await;
    let master = format!("peer://{a},{b}");
    let cli = |line: &[&str]| {
        let mut full = line.to_vec();
        full.extend(["--master", &master]);
        run(&full)
    };
    let put = cli(&["put", "cli/key", "--value", "hello peers"]);
    assert!(put.status.success(), "{put:?}");
    let got = cli(&["get", "cli/key"]);
    assert_eq!(got.stdout, b"hello peers", "{got:?}");
    let removed = cli(&["rm", "cli/key"]);
    assert!(removed.status.success(), "{removed:?}");
    let missing = cli(&["get", "cli/key"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("OBJECT_NOT_FOUND"),
        "{missing:?}"
    );
    for refused in [
        cli(&["ls"]),
        cli(&["rm", "--all"]),
        cli(&["put", "k", "--value", "v", "--replicas", "2"]),
    ] {
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && stderr.contains("UNAVAILABLE_IN_CURRENT_MODE"),
            "{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_credential_cannot_act_as_a_peer_and_strangers_are_refused() {
    let dir = scratch("peer-roles");
    let secret = dir.join("token");
    assert!(
        run(&["token", "new", secret.to_str().unwrap()])
            .status
            .success()
    );
    let token = ["--token-file", secret.to_str().unwrap()];
    let (_first, a) = start_peer(&[], &token);
    let client = issue(&secret, "reader", "client", &dir.join("client"));
    let timeout = Duration::from_secs(5);

    // A client credential reads and writes.
    let member = PeerGuest::new(vec![a.clone()], Some(client.clone()), timeout).unwrap();
    member.put("roles/k", b"v".to_vec()).await.unwrap();
    assert_eq!(
        member.get("roles/k").await.unwrap().as_deref(),
        Some(&b"v"[..])
    );

    // It cannot greet as a peer, so it cannot publish into the directory.
    let id = mooring::client_id_for(Some(&client)).0;
    let links = PeerLinks::new(None, Some(client), id, timeout);
    let hello = PeerRequest::Hello {
        me: MemberInfo {
            name: "127.0.0.1:1".into(),
            address: "127.0.0.1:1".into(),
            data_endpoint: "127.0.0.1:2".into(),
            data_key: 1,
            data_base: 0,
            weight: 1,
        },
        known: Vec::new(),
    };
    let refused = links.call(&a, &hello).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::ILLEGAL_CLIENT, "{refused}");
    let directory = PeerRequest::Directory {
        messages: Vec::new(),
    };
    let refused = links.call(&a, &directory).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::ILLEGAL_CLIENT, "{refused}");

    // A node credential greets only as its own name.
    let node = issue(&secret, "peer-9", "node", &dir.join("node"));
    let id = mooring::client_id_for(Some(&node)).0;
    let links = PeerLinks::new(None, Some(node), id, timeout);
    let refused = links.call(&a, &hello).await.unwrap_err();
    assert!(
        refused.to_string().contains("must be its credential's"),
        "{refused}"
    );

    // No token: refused at the handshake.
    let stranger = PeerGuest::new(vec![a.clone()], None, timeout).unwrap();
    assert!(stranger.get("roles/k").await.is_err());
    match PeerLinks::new(None, None, 3, timeout)
        .call(
            &a,
            &PeerRequest::Get {
                key: "roles/k".into(),
            },
        )
        .await
    {
        Ok(PeerReply::Value { value }) => panic!("a stranger read {value:?}"),
        other => assert!(other.is_err()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_serves_its_metrics() {
    let (_peer, [listen, metrics]) = Proc::start_on_free_ports(false, |[listen, metrics]| {
        args(&[
            "peer",
            "--listen",
            listen,
            "--size",
            "32MiB",
            "--metrics-listen",
            metrics,
        ])
    });
    guest(&listen)
        .put("metrics/k", b"value".to_vec())
        .await
        .unwrap();
    assert!(guest(&listen).get("metrics/k").await.unwrap().is_some());
    let (status, text) = common::http_get(&metrics, "/metrics", None);
    assert_eq!(status, 200, "{text}");
    let value_of = |name: &str| common::sample(&text, name);
    assert_eq!(value_of("mooring_peer_puts_total"), Some(1.0), "{text}");
    assert_eq!(value_of("mooring_peer_hits_total"), Some(1.0), "{text}");
    assert_eq!(value_of("mooring_peer_values"), Some(1.0), "{text}");
    // Alone on its ring, the peer owns every entry.
    assert_eq!(
        value_of("mooring_peer_directory_entries"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(value_of("mooring_peer_members"), Some(1.0), "{text}");
    // One put and one read, each timed.
    assert_eq!(
        value_of("mooring_peer_put_latency_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value_of("mooring_peer_get_latency_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert!(value_of("mooring_peer_get_latency_seconds_sum").is_some_and(|s| s > 0.0));
    assert_eq!(
        value_of("mooring_peer_pool_bytes"),
        Some((32 << 20) as f64),
        "{text}"
    );
}

/// A peer that leaves (a store's `close()`, or `mooring peer` stopped by SIGTERM) says
/// goodbye: the others drop it from their rings at once, not after its silence, so readers
/// and removals are not sent to it in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_leaves_is_off_every_ring_at_once() {
    use mooring::peer::PeerClient;

    let (_seed, a) = start_peer(&[], &[]);
    let (mut process, b) = start_peer(&[&a], &[]);
    let join = |listen: &'static str| {
        let seeds = vec![a.clone()];
        async move {
            PeerClient::connect(seeds, listen, 8 << 20, None, Duration::from_secs(5))
                .await
                .unwrap()
        }
    };
    let (watcher, leaver) = (join("127.0.0.1:0").await, join("127.0.0.1:0").await);
    let PeerClient::Member(watching) = &watcher else {
        panic!("a client with a pool runs a peer");
    };
    let members = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        async move {
            while watching.members().len() != n {
                assert!(Instant::now() < deadline, "{:?}", watching.members());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Instant::now()
        }
    };
    members(4).await;
    wait_until_joined(&[&a, &b]).await;

    // A store's close: its peer leaves; a value it held is gone, and a removal through
    // the seed right after reaches every owner.
    leaver
        .put("held-by-the-leaver", b"gone with it")
        .await
        .unwrap();
    watcher.put("kept", b"kept").await.unwrap();
    let left_at = Instant::now();
    leaver.close().await;
    let off = members(3).await;
    assert!(
        off - left_at < Duration::from_secs(2),
        "dropped only after its silence"
    );
    assert_eq!(guest(&a).get("held-by-the-leaver").await.unwrap(), None);
    assert!(guest(&a).remove("kept").await.unwrap());
    assert_eq!(watcher.get("kept").await.unwrap(), None);

    // `mooring peer` stopped by SIGTERM leaves too.
    let pid = process.child.id().to_string();
    let stopped_at = Instant::now();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let off = members(2).await;
    assert!(
        off - stopped_at < Duration::from_secs(2),
        "SIGTERM: no goodbye"
    );
    let _ = process.child.wait();
    watcher.close().await;
}

/// A client that needs a master (LMCache's connector, `mooring bench`) refuses a peer
/// cluster's address with a code and a message that says what serves it.
#[tokio::test]
async fn a_master_client_refuses_a_peer_address() {
    let refused = mooring::Client::connect(mooring::ClientConfig::new("peer://127.0.0.1:1"))
        .await
        .err()
        .expect("refused");
    assert_eq!(refused.code, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
    assert!(refused.to_string().contains("mooring.store"), "{refused}");
}

/// A peer with a small pool and a disk tier: values evicted from memory stay readable from
/// disk (a read through another peer promotes them back), byte for byte; `exists` on one only
/// on disk answers yes and brings it back; and the metrics say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_evicted_to_disk_are_promoted_back_with_every_byte_checked() {
    let dir = scratch("peer-disk");
    let disk = dir.join("disk");
    let (_first, first) = start_peer(&[], &[]);
    let (_small, [small, metrics]) = Proc::start_on_free_ports(false, |[listen, metrics]| {
        let mut line = args(&[
            "peer", "--listen", listen, "--size", "2MiB", "--seeds", &first,
        ]);
        line.extend(args(&[
            "--disk-dir",
            disk.to_str().unwrap(),
            "--disk-size",
            "64MiB",
        ]));
        line.extend(args(&["--metrics-listen", metrics]));
        line
    });
    let probes_on_small = wait_until_joined(&[&first, &small]).await[1];
    // Eight times the small peer's pool, written through it: most of it leaves memory.
    let values: Vec<(String, Vec<u8>)> = (0..64)
        .map(|i| (format!("disk/{i}"), value(i + 11, (256 << 10) + i as usize)))
        .collect();
    // The writer keeps at most four values' copies pending (half the small peer's pool): a
    // value evicted before its copy is complete is dropped, as a cache may, and on a busy
    // machine the puts would otherwise outrun the copies.
    for (i, (key, bytes)) in values.iter().enumerate() {
        guest(&small).put(key, bytes.clone()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let copied = (probes_on_small + i + 1).saturating_sub(4) as f64;
        while Instant::now() < deadline {
            let (_, text) = common::http_get(&metrics, "/metrics", None);
            if common::sample(&text, "mooring_peer_disk_values").is_some_and(|n| n >= copied) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Copies are written behind the puts: wait until the disk holds every value, beside the
    // probes that saw the peers join (a value evicted from memory before its copy is
    // complete is dropped, as a cache may).
    let deadline = Instant::now() + Duration::from_secs(20);
    let on_disk = (64 + probes_on_small) as f64;
    loop {
        let (_, text) = common::http_get(&metrics, "/metrics", None);
        if common::sample(&text, "mooring_peer_disk_values").is_some_and(|n| n >= on_disk) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the copies never completed: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The first values written are on disk only by now; exists warms one of them.
    let exists = guest(&first).exists(&["disk/0".into()]).await.unwrap();
    assert_eq!(exists, [true]);
    for (key, bytes) in &values {
        let read = guest(&first).get(key).await.unwrap();
        assert!(
            read.as_ref() == Some(bytes),
            "{key}: missing or other bytes"
        );
    }
    let (_, text) = common::http_get(&metrics, "/metrics", None);
    let promotes = common::sample(&text, "mooring_peer_promotes_total").unwrap_or(0.0);
    assert!(promotes >= 56.0, "most values came back from disk: {text}");
    let held = common::sample(&text, "mooring_peer_values").unwrap_or(0.0);
    assert!(held >= 64.0, "no value was lost: {text}");
    let files = walk_files(&disk);
    assert!(files >= 64, "one file a copy: {files}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Files under `dir`, at any depth.
fn walk_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.file_type().is_ok_and(|t| t.is_dir()) {
                true => walk_files(&e.path()),
                false => 1,
            })
            .sum()
    })
}

/// A disk directory that cannot be created leaves the peer without a disk tier, with a
/// warning, rather than refusing to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_directory_that_cannot_be_made_leaves_the_peer_serving_from_memory() {
    let dir = scratch("peer-bad-disk");
    let blocker = dir.join("file");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let inside = blocker.join("disk");
    let (peer, addr) = start_peer(&[], &["--disk-dir", inside.to_str().unwrap()]);
    guest(&addr).put("k", b"v".to_vec()).await.unwrap();
    assert_eq!(
        guest(&addr).get("k").await.unwrap().as_deref(),
        Some(&b"v"[..])
    );
    assert!(peer.line.contains("without a disk tier"), "{}", peer.line);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Peers on one host read each other's pools through shared memory (a memcpy, nothing
/// served over TCP); a peer serving only TCP is read over the network, byte for byte either
/// way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn co_located_peers_read_each_other_through_shared_memory() {
    let with_metrics = |extra: &'static [&'static str], seeds: Vec<String>| {
        Proc::start_on_free_ports(false, move |[listen, metrics]| {
            let mut line = args(&["peer", "--listen", listen, "--size", "32MiB"]);
            line.extend(args(&["--metrics-listen", metrics]));
            if !seeds.is_empty() {
                line.extend(args(&["--seeds", &seeds.join(",")]));
            }
            line.extend(args(extra));
            line
        })
    };
    let (_a, [a, a_metrics]) = with_metrics(&[], vec![]);
    let (_b, b) = start_peer(&[&a], &[]);
    let (_c, [c, c_metrics]) = with_metrics(&["--transports", "tcp"], vec![a.clone()]);
    wait_until_joined(&[&a, &b, &c]).await;
    let served = |metrics: &str| {
        let (_, text) = common::http_get(metrics, "/metrics", None);
        common::sample(&text, "mooring_peer_reads_served_total").expect("the metric")
    };
    let on_a = value(5, 300 << 10);
    let on_c = value(6, 300 << 10);
    guest(&a).put("shm/a", on_a.clone()).await.unwrap();
    guest(&c).put("shm/c", on_c.clone()).await.unwrap();
    let (a_before, c_before) = (served(&a_metrics), served(&c_metrics));
    for _ in 0..3 {
        assert_eq!(guest(&b).get("shm/a").await.unwrap(), Some(on_a.clone()));
        assert_eq!(guest(&b).get("shm/c").await.unwrap(), Some(on_c.clone()));
    }
    assert_eq!(
        served(&a_metrics),
        a_before,
        "a's pool is read through shared memory"
    );
    assert!(
        served(&c_metrics) >= c_before + 3.0,
        "c serves only TCP: every read of its pool goes over the network"
    );
}
