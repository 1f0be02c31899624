//! A node the master forgot mounts its memory again under a fresh key. The old key stops
//! working before the new mount is offered to the master: once the master takes the new
//! mount it hands the same ranges to new writers, and a transfer for the old mount (a late
//! writer's, or a reader's) must not land in them or read them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring::master::MasterService;
use mooring::{Node, NodeConfig};
use mooring_core::{ClientId, Error, ErrorCode, MasterConfig, Result};
use mooring_proto::serve::DataService;
use mooring_proto::transport::{
    Answer, BoxFuture, ControlPlane, DataServer, NodeAddr, RpcHandler, SegmentMemory,
};
use mooring_proto::wire::{Hello, MasterRequest, Reply};

const CLIENT: ClientId = ClientId(9);

/// What the node did, in order.
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Log {
    fn push(&self, event: String) {
        self.0.lock().unwrap().push(event);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// The master in-process; refuses mounts while `refuse_mounts` is set, answers them after
/// `mount_delay`, and logs them.
struct Master {
    service: Arc<MasterService>,
    log: Arc<Log>,
    refuse_mounts: Mutex<bool>,
    mount_delay: Mutex<Duration>,
}

impl ControlPlane for Master {
    fn send(&self, request: MasterRequest) -> BoxFuture<'_, Result<Reply>> {
        Box::pin(async move {
            if let MasterRequest::MountSegment(mount) = &request {
                self.log.push(format!("mount key {}", mount.spec.key));
                let delay = *self.mount_delay.lock().unwrap();
                tokio::time::sleep(delay).await;
                if *self.refuse_mounts.lock().unwrap() {
                    return Err(Error::new(
                        ErrorCode::RPC_FAIL,
                        "the mount's reply was lost",
                    ));
                }
            }
            match self.service.answer(request) {
                Answer::Now(response) => response,
                Answer::WhenDurable(response) => response.await,
            }
        })
    }
}

/// A data server that only keeps the export table, and logs exports and unexports.
struct Exports {
    service: DataService,
    log: Arc<Log>,
}

impl DataServer for Exports {
    fn service(&self) -> &DataService {
        &self.service
    }

    fn export(&self, memory: SegmentMemory) -> Result<NodeAddr> {
        let addr = self.service.export(&Arc::from("node:1"), memory);
        self.log.push(format!("export key {}", addr.key));
        Ok(addr)
    }

    fn unexport(&self, key: u64) {
        self.service.unexport(key);
        self.log.push(format!("unexport key {key}"));
    }
}

/// A master, a node mounted on it, and the node's log of exports and mounts (emptied).
async fn mounted_node() -> (Arc<Master>, Node, Arc<Exports>, Arc<Log>) {
    let log = Arc::new(Log::default());
    let master = Arc::new(Master {
        service: MasterService::new(MasterConfig::default()).unwrap(),
        log: log.clone(),
        refuse_mounts: Mutex::new(false),
        mount_delay: Mutex::new(Duration::ZERO),
    });
    let control: Arc<dyn ControlPlane> = master.clone();
    control.call(Hello { client: CLIENT }).await.unwrap();
    let exports = Arc::new(Exports {
        service: DataService::new(1),
        log: log.clone(),
    });
    let config = NodeConfig {
        name: Some("seg".into()),
        size: 1 << 20,
        prefault: false,
        shared: false,
        shm_group: None,
        disk: None,
    };
    let node = Node::start(
        CLIENT,
        &config,
        control,
        exports.clone(),
        "node:1",
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    (master, node, exports, log)
}

#[tokio::test]
async fn the_old_key_stops_working_before_the_memory_is_mounted_again() {
    let (master, node, exports, log) = mounted_node().await;
    let first = log.take();
    assert_eq!(first.len(), 2, "{first:?}");
    let first_key = first[0].strip_prefix("export key ").unwrap().to_string();

    // A remount whose reply is lost: the old key went first, then the new one with the
    // failed mount.
    *master.refuse_mounts.lock().unwrap() = true;
    assert!(node.remount().await.is_err());
    let failed = log.take();
    assert_eq!(failed[0], format!("unexport key {first_key}"), "{failed:?}");
    assert!(failed[1].starts_with("export key "), "{failed:?}");
    let second_key = failed[1].strip_prefix("export key ").unwrap().to_string();
    assert_ne!(second_key, first_key);
    assert_eq!(
        failed[2..],
        [
            format!("mount key {second_key}"),
            format!("unexport key {second_key}")
        ],
        "{failed:?}"
    );
    assert!(!node.is_mounted());

    // The next remount succeeds under a third key, with nothing of the earlier mounts left.
    *master.refuse_mounts.lock().unwrap() = false;
    node.remount().await.unwrap();
    let again = log.take();
    assert_eq!(again.len(), 2, "{again:?}");
    let third_key = again[0].strip_prefix("export key ").unwrap();
    assert_eq!(again[1], format!("mount key {third_key}"));
    assert!(node.is_mounted());
    assert_eq!(exports.service.keys(), [third_key.parse::<u64>().unwrap()]);
}

/// A heartbeat that finds nothing mounted while a remount waits for the master's answer (a
/// fault's, or an earlier heartbeat's) waits for it to end, then leaves the new mount alone:
/// one mount, one key exported, and it is the key the master holds.
#[tokio::test]
async fn a_heartbeats_remount_waits_for_one_under_way_and_then_leaves_it() {
    let (master, node, exports, log) = mounted_node().await;
    log.take();
    *master.mount_delay.lock().unwrap() = Duration::from_millis(100);
    let under_way = tokio::spawn({
        let node = node.clone();
        async move { node.remount().await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let seen = node.segment();
    assert_eq!(seen, None, "nothing is mounted while the remount waits");
    node.remount_from(seen).await.unwrap();
    under_way.await.unwrap().unwrap();
    let events = log.take();
    let mounts: Vec<&String> = events
        .iter()
        .filter(|e| e.starts_with("mount key"))
        .collect();
    assert_eq!(mounts.len(), 1, "{events:?}");
    let key: u64 = mounts[0]
        .strip_prefix("mount key ")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(exports.service.keys(), [key], "{events:?}");
    assert!(node.is_mounted());
}
