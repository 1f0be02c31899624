//! The SSD tier end to end over loopback TCP: offload, reads through the node's staging
//! buffer, recovery after a node restart, exist-prefetch, and disk eviction under a size limit
//! with readers running.

use std::sync::Arc;
use std::time::Duration;

use mooring::node::disk_tier::{DiskBackend, DiskEviction, DiskTierConfig};
use mooring::{Client, EmbeddedCluster, EmbeddedConfig};
use mooring_core::{ErrorCode, MasterConfig, Medium, Millis, ReplicateConfig};

const VALUE: usize = 256 << 10;

fn value(seed: u64) -> Vec<u8> {
    (0..VALUE)
        .map(|i| (seed.wrapping_mul(0x9E37).wrapping_add(i as u64 * 13) >> 2) as u8)
        .collect()
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("mooring-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A disk tier on `dir` with `backend` (the offset file needs a capacity: 64 MiB unless the
/// test sets one).
fn tier(dir: impl Into<std::path::PathBuf>, backend: DiskBackend) -> DiskTierConfig {
    let mut config = DiskTierConfig::new(dir);
    config.sync_interval = Duration::from_millis(20);
    config.backend = backend;
    if backend == DiskBackend::OffsetFile {
        config.capacity = 64 << 20;
    }
    config
}

/// A standalone 4 MiB node named "node-0" on loopback with `disk`.
fn node_0(disk: DiskTierConfig) -> mooring::SegmentConfig {
    mooring::SegmentConfig {
        node: mooring::NodeConfig {
            name: Some("node-0".into()),
            size: 4 << 20,
            prefault: false,
            shared: false,
            shm_group: None,
            disk: Some(disk),
        },
        listen: "127.0.0.1:0".into(),
        advertise: None,
        rdma_devices: None,
    }
}

/// One 4 MiB node with a disk, write-through offload, short leases.
async fn cluster(
    dir: &TempDir,
    backend: DiskBackend,
    disk: impl FnOnce(&mut DiskTierConfig),
) -> EmbeddedCluster {
    let mut config = tier(&dir.0, backend);
    disk(&mut config);
    EmbeddedCluster::start(EmbeddedConfig {
        nodes: 1,
        node_size: 4 << 20,
        master: MasterConfig {
            lease_ttl: Millis(200),
            offload_write_through: true,
            ..MasterConfig::default()
        },
        disk: Some(config),
        ..EmbeddedConfig::default()
    })
    .await
    .unwrap()
}

/// Puts `keys` values, waiting after each until its copy is on disk (so memory pressure
/// evicts copies, not values).
async fn put_offloaded(client: &Client, keys: std::ops::Range<u64>) {
    for i in keys {
        client
            .put(&format!("k{i}"), &value(i), &ReplicateConfig::single())
            .await
            .unwrap();
        wait_for(client, |s| s.disk_replicas > i).await;
    }
}

async fn wait_for(client: &Client, done: impl Fn(&mooring_core::Stats) -> bool) {
    for _ in 0..500 {
        if done(&client.stats().await.unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out: {:?}", client.stats().await.unwrap());
}

async fn media(client: &Client, key: &str) -> Vec<Medium> {
    let found = client.query_by_regex(&format!("^{key}$")).await.unwrap();
    found[0].1.replicas.iter().map(|r| r.medium).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_evicted_values_are_read_back_from_disk_and_survive_a_node_restart() {
    round_trip_and_restart(DiskBackend::Bucket).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_per_key_evicted_values_are_read_back_from_disk_and_survive_a_node_restart() {
    round_trip_and_restart(DiskBackend::FilePerKey).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_file_evicted_values_are_read_back_from_disk_and_survive_a_node_restart() {
    round_trip_and_restart(DiskBackend::OffsetFile).await
}

async fn round_trip_and_restart(backend: DiskBackend) {
    let dir = TempDir::new(&format!("disk-roundtrip-{backend:?}"));
    let cluster = cluster(&dir, backend, |_| {}).await;
    let client = cluster.client().await.unwrap();
    // 40 x 256 KiB through a 4 MiB segment: most values end up only on disk.
    put_offloaded(&client, 0..40).await;
    let stats = client.stats().await.unwrap();
    assert!(stats.evicted_objects > 20, "{stats:?}");
    assert_eq!(stats.objects, 40);
    assert_eq!(media(&client, "k0").await, vec![Medium::Disk]);
    for i in 0..40 {
        assert!(
            client.get(&format!("k{i}")).await.unwrap() == value(i),
            "k{i}"
        );
    }
    let mut items: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("k{i}"), vec![0u8; VALUE]))
        .collect();
    let mut refs: Vec<(&str, &mut [u8])> = items
        .iter_mut()
        .map(|(k, b)| (k.as_str(), &mut b[..]))
        .collect();
    for (i, r) in client
        .batch_get_into(&mut refs)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.unwrap(), VALUE);
        assert!(items[i].1 == value(i as u64), "k{i} in the batch");
    }

    // The node goes away: its copies go unreachable with it...
    let master = cluster.master_addr();
    let token = cluster.token().cloned();
    let EmbeddedCluster {
        nodes,
        master: running,
        ..
    } = cluster;
    for node in nodes {
        node.shutdown().await.unwrap();
    }
    assert_eq!(
        client.get("k0").await.unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    // ...and a node started on the same directory registers them again.
    let segment = node_0(tier(dir.0.join("node-0"), backend));
    let local = Arc::new(mooring_transport_tcp::LocalSegments::default());
    let node = mooring::StandaloneNode::start(&master, None, &segment, local, token)
        .await
        .unwrap();
    wait_for(&client, |s| s.disk_replicas >= 40).await;
    for i in 0..40 {
        let got = client.get(&format!("k{i}")).await.unwrap();
        assert!(got == value(i), "k{i} after restart");
    }
    // exist(prefetch) promotes a disk-only value into memory.
    assert_eq!(media(&client, "k1").await, vec![Medium::Disk]);
    assert!(client.exist_prefetch("k1").await.unwrap());
    assert_eq!(
        media(&client, "k1").await,
        vec![Medium::Memory, Medium::Disk]
    );
    assert!(client.get("k1").await.unwrap() == value(1));
    assert!(!client.exist_prefetch("absent").await.unwrap());
    node.shutdown().await.unwrap();
    drop(running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_disk_eviction_under_a_size_limit_never_serves_wrong_bytes() {
    disk_eviction(DiskBackend::Bucket).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_per_key_disk_eviction_under_a_size_limit_never_serves_wrong_bytes() {
    disk_eviction(DiskBackend::FilePerKey).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_file_disk_eviction_under_a_size_limit_never_serves_wrong_bytes() {
    disk_eviction(DiskBackend::OffsetFile).await
}

async fn disk_eviction(backend: DiskBackend) {
    let dir = TempDir::new(&format!("disk-evict-{backend:?}"));
    // Room for 8 values on disk; 30 go through it.
    let cluster = cluster(&dir, backend, |d| {
        d.capacity = 8 * VALUE as u64;
        d.eviction = DiskEviction::Fifo;
    })
    .await;
    let writer = cluster.client().await.unwrap();
    let reader = cluster.client().await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut good, mut gone) = (0u64, 0u64);
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i = (i * 7 + 3) % 30;
                match reader.get(&format!("k{i}")).await {
                    Ok(v) => {
                        assert!(v == value(i), "k{i} read wrong bytes");
                        good += 1;
                    }
                    Err(e) => {
                        assert!(
                            matches!(
                                e.code,
                                ErrorCode::OBJECT_NOT_FOUND | ErrorCode::REPLICA_IS_NOT_READY
                            ),
                            "k{i}: {e}"
                        );
                        gone += 1;
                    }
                }
            }
            (good, gone)
        })
    };
    for i in 0..30 {
        // Every value in memory may be leased by the reader at that moment (200 ms leases):
        // the put is then refused with -200 until a lease lapses, and a client backs off.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match writer
                .put(&format!("k{i}"), &value(i), &ReplicateConfig::single())
                .await
            {
                Ok(()) => break,
                Err(e)
                    if e.code == ErrorCode::NO_AVAILABLE_HANDLE
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("k{i}: {e}"),
            }
        }
        // Each value reaches the disk (or was already pushed out of it) before the next.
        wait_for(&writer, |s| s.tasks == 0 && s.disk_replicas >= 1).await;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (good, _gone) = readers.await.unwrap();
    assert!(good > 0);
    let stats = writer.stats().await.unwrap();
    assert!(stats.disk_replicas <= 8, "{stats:?}");
    // 30 values went through 4 MiB of memory and 2 MiB of disk: some are gone, cleanly;
    // every other one reads back exactly.
    let mut gone = 0;
    for i in 0..30 {
        match writer.get(&format!("k{i}")).await {
            Ok(v) => assert!(v == value(i), "k{i} read wrong bytes"),
            Err(e) => {
                assert_eq!(e.code, ErrorCode::OBJECT_NOT_FOUND, "k{i}: {e}");
                gone += 1;
            }
        }
    }
    assert!(gone > 0, "{stats:?}");
    assert!(writer.get("k29").await.unwrap() == value(29));
    cluster.shutdown().await.unwrap();
}

/// A master whose disk sync answers carry, beside its real orders, one no node could carry
/// out: a value of 2^62 bytes (a confused or damaged reply). It remembers every report.
struct HugeOrders {
    inner: Arc<mooring::MasterService>,
    reports: std::sync::Mutex<Vec<mooring_core::DiskReport>>,
}

impl mooring_proto::transport::RpcHandler for HugeOrders {
    fn handle(
        &self,
        request: mooring_proto::wire::MasterRequest,
    ) -> mooring_proto::wire::MasterResponse {
        use mooring_proto::wire::{MasterRequest, Reply};
        if let MasterRequest::DiskSync(sync) = &request {
            self.reports.lock().unwrap().push(sync.report.clone());
        }
        let mut response = self.inner.handle(request);
        if let Ok(Reply::DiskSync(ack)) = &mut response {
            ack.offload.push(mooring_core::OffloadOrder {
                key: "huge".into(),
                write: mooring_core::WriteId(9_999),
                addr: 0,
                size: 1 << 62,
                checksum: mooring_core::Checksum::EMPTY,
            });
        }
        response
    }
}

/// The node refuses an offload order for bytes outside its segment before allocating a
/// buffer of its size, and reports it failed (under the simulation's plant that ignores
/// frame checksums, a damaged order's length aborted the node on its allocation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offload_order_outside_the_segment_is_refused_not_allocated() {
    let dir = TempDir::new("huge-order");
    let handler = Arc::new(HugeOrders {
        inner: mooring::MasterService::new(MasterConfig::default()).unwrap(),
        reports: std::sync::Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let master = listener.local_addr().unwrap().to_string();
    let _server =
        mooring_transport_tcp::spawn_rpc_server(listener, handler.clone(), Duration::ZERO, None)
            .unwrap();
    let segment = node_0(tier(dir.0.join("node-0"), DiskBackend::FilePerKey));
    let local = Arc::new(mooring_transport_tcp::LocalSegments::default());
    let node = mooring::StandaloneNode::start(&master, None, &segment, local, None)
        .await
        .unwrap();
    let refused = ("huge".to_string(), mooring_core::WriteId(9_999));
    let mut reported = false;
    for _ in 0..500 {
        reported = handler
            .reports
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.failed.contains(&refused));
        if reported {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reported, "the impossible order was never reported failed");
    node.shutdown().await.unwrap();
}
