//! Standby masters on a real etcd (Debian's `etcd-server`, started here on loopback): the
//! leader is SIGKILLed, a standby takes over, every acknowledged object (a hard pin among them)
//! still reads, and the same clients and nodes carry on; the killed master comes back as a
//! standby and takes over in turn when the second leader dies.
//!
//! Needs a build with `--features etcd` and the `etcd` binary; skips with the reason without.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mooring::{Client, ClientConfig};
use mooring_core::ReplicateConfig;

mod common;

use common::{Proc, args, free_port, http_get, sample, start_nodes, value, wait_for_segments};

/// A real etcd on loopback, deleted with its data when dropped.
struct Etcd {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Etcd {
    /// Starts etcd on fresh ports, again on others if it exits (a port another test took
    /// between our finding it free and etcd binding it).
    fn start() -> Etcd {
        for _ in 0..3 {
            if let Some(etcd) = Etcd::try_start() {
                return etcd;
            }
        }
        panic!("etcd did not start in three tries (see the etcd.log files in the temp dir)");
    }

    fn try_start() -> Option<Etcd> {
        let (client, peer) = (free_port(), free_port());
        let dir =
            std::env::temp_dir().join(format!("mooring-etcd-{}-{client}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.with_extension("log")).unwrap();
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut child = Command::new("etcd")
            .args([
                "--name",
                "test",
                "--data-dir",
                dir.join("data").to_str().unwrap(),
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("test={peer_url}"),
                "--log-level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", client)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                eprintln!("etcd exited ({status}) on ports {client}/{peer}; trying others");
                let _ = std::fs::remove_dir_all(&dir);
                return None;
            }
            assert!(Instant::now() < deadline, "etcd never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(dir.with_extension("log"));
        Some(Etcd { child, dir, url })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn skip_reason() -> Option<String> {
    if !cfg!(feature = "etcd") {
        return Some(
            "this build has no etcd support (run with `--features etcd`, which needs protoc)"
                .into(),
        );
    }
    if Command::new("etcd").arg("--version").output().is_err() {
        return Some("no etcd binary (install Debian's etcd-server)".into());
    }
    None
}

/// The arguments of a group master listening on `listen`, serving its metrics on `metrics`.
fn master_args(listen: &str, metrics: &str, etcd: &str, state: &std::path::Path) -> Vec<String> {
    args(&[
        "master",
        "--listen",
        listen,
        "--metrics-listen",
        metrics,
        "--etcd",
        etcd,
        "--cluster",
        "ha-test",
        "--client-ttl",
        "5s",
        "--state-dir",
        state.to_str().unwrap(),
        // Small, so standbys also copy snapshots and follow journal generations.
        "--snapshot-after",
        "64KiB",
    ])
}

/// A group master on fresh loopback ports: the process, its address, its metrics address.
fn start_master(etcd: &str, state: &std::path::Path) -> (Proc, String, String) {
    let (master, [listen, metrics]) = Proc::start_on_free_ports(true, |[listen, metrics]| {
        master_args(listen, metrics, etcd, state)
    });
    (master, listen, metrics)
}

/// A killed master started again on its own addresses (which clients know), retried while
/// the port is briefly taken.
fn restart_master(listen: &str, metrics: &str, etcd: &str, state: &std::path::Path) -> Proc {
    let mut last = String::new();
    for _ in 0..10 {
        let args = master_args(listen, metrics, etcd, state);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match Proc::try_start(&args) {
            Ok(master) => return master,
            Err(why) => last = why,
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("{last}")
}

/// Whether the master at `addr` leads now: a standby refuses at once, and the probe does not
/// wait for an election.
async fn leads(addr: &str) -> bool {
    let probe = mooring_transport_tcp::TcpControlPlane::new(
        addr,
        Duration::from_millis(500),
        Duration::ZERO,
        None,
        mooring::random_client_id(),
    );
    let probe: std::sync::Arc<dyn mooring_proto::transport::ControlPlane> = probe;
    probe.call(mooring_proto::wire::GetStats {}).await.is_ok()
}

/// The in-sync set recorded in etcd.
#[cfg(feature = "etcd")]
async fn in_sync(etcd: &str) -> Vec<String> {
    let mut client = etcd_client::Client::connect([etcd], None).await.unwrap();
    let got = client.get("/mooring/ha-test/in-sync", None).await.unwrap();
    got.kvs()
        .first()
        .map(|kv| {
            String::from_utf8_lossy(kv.value())
                .lines()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(not(feature = "etcd"))]
async fn in_sync(_etcd: &str) -> Vec<String> {
    unreachable!("skipped without etcd support")
}

/// Waits until both masters are recorded in sync (a standby can take over only then).
async fn wait_in_sync(etcd: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while in_sync(etcd).await.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the standby never caught up: in sync {:?}",
            in_sync(etcd).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills the leader of `masters` and waits until `client` is served again; returns the
/// index of the master that was killed and how long the group was without a leader.
async fn kill_leader(
    masters: &mut [Option<Proc>; 2],
    addrs: &[String; 2],
    client: &Client,
) -> (usize, Duration) {
    let mut leader = None;
    for (i, addr) in addrs.iter().enumerate() {
        if masters[i].is_some() && leads(addr).await {
            leader = Some(i);
        }
    }
    let leader = leader.expect("one master leads");
    masters[leader].as_mut().unwrap().kill();
    let killed = Instant::now();
    // The same client carries on: its calls go to whichever master leads.
    let deadline = killed + Duration::from_secs(30);
    loop {
        if client.report().await.is_ok() && leads(&addrs[1 - leader]).await {
            break;
        }
        assert!(Instant::now() < deadline, "no standby took over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (leader, killed.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_from_a_killed_leader_with_every_acknowledged_object() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let etcd = Etcd::start();
    let base = std::env::temp_dir().join(format!("mooring-ha-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dirs = [base.join("a"), base.join("b")];
    let (first_master, first_addr, first_metrics) = start_master(&etcd.url, &dirs[0]);
    let (second_master, second_addr, second_metrics) = start_master(&etcd.url, &dirs[1]);
    let addrs = [first_addr, second_addr];
    let metrics = [first_metrics, second_metrics];
    let mut masters = [Some(first_master), Some(second_master)];
    let group = addrs.join(",");
    let _nodes = start_nodes(&group, 3, "32MiB");
    let client = Client::connect(ClientConfig::new(group.clone()))
        .await
        .unwrap();
    wait_for_segments(&client, 3).await;
    // A client that knows only where etcd is (Mooncake's `etcd://` form) finds the leader.
    let via_etcd = Client::connect(ClientConfig::new(etcd_address(&etcd)))
        .await
        .unwrap();
    let pinned = ReplicateConfig {
        with_hard_pin: true,
        ..ReplicateConfig::replicas(2)
    };
    client
        .put("weights", &value(999, 100_000), &pinned)
        .await
        .unwrap();
    let size = |i: u64| 1 + (i as usize * 7919) % 60_000;
    for i in 0..200u64 {
        client
            .put(
                &format!("k{i}"),
                &value(i, size(i)),
                &ReplicateConfig::single(),
            )
            .await
            .unwrap();
    }
    client.remove("k7").await.unwrap();
    wait_in_sync(&etcd.url).await;

    // Each master serves metrics: the leader its figures, the standby that it stands by and
    // whom it follows.
    let scraped = |i: usize| {
        sample(
            &http_get(&metrics[i], "/metrics", None).1,
            "mooring_master_leading",
        )
    };
    let leader = (0..2)
        .find(|&i| scraped(i) == Some(1.0))
        .expect("one master says it leads");
    let page = http_get(&metrics[leader], "/metrics", None).1;
    assert_eq!(sample(&page, "mooring_objects"), Some(200.0), "{page}");
    assert_eq!(
        scraped(1 - leader),
        Some(0.0),
        "the standby says it stands by"
    );
    let (status, standby) = http_get(&metrics[1 - leader], "/stats.json", None);
    assert_eq!(status, 200);
    let standby: serde_json::Value = serde_json::from_str(&standby).unwrap();
    assert_eq!(standby["role"], "standby", "{standby}");
    assert_eq!(standby["leader"], addrs[leader].as_str(), "{standby}");

    let check = |client: Client, upto: u64| async move {
        assert_eq!(
            client.get("weights").await.unwrap(),
            value(999, 100_000),
            "the hard-pinned value"
        );
        for i in 0..upto {
            let got = client.get(&format!("k{i}")).await;
            if i == 7 {
                assert!(got.is_err(), "k7 was removed");
            } else {
                assert_eq!(got.unwrap(), value(i, size(i)), "k{i}");
            }
        }
        let report = client.report().await.unwrap();
        assert_eq!(report.stats.objects, upto, "{report:?}");
        assert_eq!(report.census.hard_pinned, 1);
        assert_eq!(report.stats.segments, 3, "the nodes stayed mounted");
    };

    let (first, failover) = kill_leader(&mut masters, &addrs, &client).await;
    eprintln!("first failover: {} ms", failover.as_millis());
    check(client.clone(), 200).await;
    // The etcd client found the new leader too.
    check(via_etcd.clone(), 200).await;
    let page = http_get(&metrics[1 - first], "/metrics", None).1;
    assert_eq!(sample(&page, "mooring_master_leading"), Some(1.0), "{page}");
    assert_eq!(sample(&page, "mooring_objects"), Some(200.0), "{page}");
    // The group goes on taking writes.
    for i in 200..260u64 {
        client
            .put(
                &format!("k{i}"),
                &value(i, size(i)),
                &ReplicateConfig::single(),
            )
            .await
            .unwrap();
    }

    // The killed master returns with its old directory: it must not lead from it (it lacks
    // the writes above), but copies the new leader's state and takes over in turn.
    masters[first] = Some(restart_master(
        &addrs[first],
        &metrics[first],
        &etcd.url,
        &dirs[first],
    ));
    wait_in_sync(&etcd.url).await;
    let (second, failover) = kill_leader(&mut masters, &addrs, &client).await;
    assert_eq!(second, 1 - first);
    eprintln!("second failover: {} ms", failover.as_millis());
    check(client.clone(), 260).await;
    let _ = std::fs::remove_dir_all(&base);
}

/// `etcd://HOST:PORT/ha-test`: where clients find the test group's masters.
fn etcd_address(etcd: &Etcd) -> String {
    format!("etcd://{}/ha-test", etcd.url.trim_start_matches("http://"))
}

/// Without `--features etcd` too: clients find masters through etcd's plain JSON gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_address_with_no_master_behind_it_is_refused_with_what_to_check() {
    if Command::new("etcd").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no etcd binary (install Debian's etcd-server)");
        return;
    }
    let etcd = Etcd::start();
    let config = ClientConfig::new(etcd_address(&etcd));
    let started = Instant::now();
    let refused = Client::connect(config)
        .await
        .err()
        .expect("no master campaigns");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once, not at the timeout"
    );
    let text = refused.to_string();
    assert!(
        text.contains("no master of group \"ha-test\" campaigns") && text.contains("--cluster"),
        "{text}"
    );
    // Something that is not etcd at all.
    let port = free_port();
    let refused = Client::connect(ClientConfig::new(format!("etcd://127.0.0.1:{port}")))
        .await
        .err()
        .expect("nothing listens");
    assert!(refused.to_string().contains("cannot connect"), "{refused}");
}

/// Sends `signal` to etcd (SIGSTOP freezes it: the leader's renewals go unanswered).
fn signal(etcd: &Etcd, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &etcd.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_stops_granting_and_leads_again_once_it_returns() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let etcd = Etcd::start();
    let dir = std::env::temp_dir().join(format!("mooring-ha-fence-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (_master, addr, _) = start_master(&etcd.url, &dir);
    // A node started before the master is elected waits for it.
    let _nodes = start_nodes(&addr, 1, "16MiB");
    let client = Client::connect(ClientConfig::new(addr.clone()))
        .await
        .unwrap();
    wait_for_segments(&client, 1).await;
    for i in 0..20u64 {
        client
            .put(
                &format!("k{i}"),
                &value(i, 1000),
                &ReplicateConfig::single(),
            )
            .await
            .unwrap();
    }

    signal(&etcd, "-STOP");
    let frozen = Instant::now();
    // Its lease can no longer be renewed: it must stop granting before etcd could expire it.
    while leads(&addr).await {
        assert!(
            frozen.elapsed() < Duration::from_secs(10),
            "the leader went on serving without its lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "stopped granting {} ms after etcd froze (lease 2 s)",
        frozen.elapsed().as_millis()
    );
    let refused = client
        .put("refused", &value(1, 10), &ReplicateConfig::single())
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("standby") || refused.to_string().contains("lease"),
        "{refused}"
    );

    signal(&etcd, "-CONT");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !leads(&addr).await {
        assert!(Instant::now() < deadline, "the master never led again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..20u64 {
        assert_eq!(client.get(&format!("k{i}")).await.unwrap(), value(i, 1000));
    }
    client
        .put("after", &value(2, 10), &ReplicateConfig::single())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
