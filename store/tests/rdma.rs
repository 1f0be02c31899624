//! A real master and nodes on loopback whose segments are also served over RDMA, here on the
//! software HCA (no device on this machine): clients put and get through one-sided
//! READ/WRITE, the queue pairs set up through the nodes' authenticated data servers; a node
//! without RDMA sits in the same cluster; a node whose device dies is read around.

use std::sync::Arc;
use std::time::Duration;

use mooring::{Client, Contribution, NodeConfig, RunningMaster, StandaloneNode, random_client_id};
use mooring_core::{ErrorCode, MasterConfig, ReplicateConfig};
use mooring_proto::auth::Credential;
use mooring_proto::transport::DataServer;
use mooring_transport_rdma::model::{Fabric, ModelVerbs};
use mooring_transport_rdma::{RdmaClient, RdmaConfig, RdmaDataPlane, RdmaDataServer, RdmaServer};
use mooring_transport_tcp::{
    DataPlaneConfig, LocalSegments, TcpControlPlane, TcpDataPlane, TcpDataServer,
};

const NODE_SIZE: u64 = 32 << 20;

struct Cluster {
    master: RunningMaster,
    token: Option<Credential>,
    fabric: Fabric,
    nodes: Vec<(StandaloneNode, Option<u16>)>,
}

impl Cluster {
    /// A master and `rdma_nodes` nodes serving TCP and RDMA, plus `tcp_nodes` serving TCP
    /// only.
    async fn start(rdma_nodes: usize, tcp_nodes: usize) -> Cluster {
        let token = Some(mooring::token::generate());
        let master = RunningMaster::start("127.0.0.1:0", MasterConfig::default(), token.clone())
            .await
            .unwrap();
        let mut cluster = Cluster {
            master,
            token,
            fabric: Fabric::new(),
            nodes: Vec::new(),
        };
        for i in 0..rdma_nodes + tcp_nodes {
            cluster.add_node(i, i < rdma_nodes).await;
        }
        cluster
    }

    async fn add_node(&mut self, i: usize, rdma: bool) {
        let id = random_client_id();
        let tcp = TcpDataServer::start(
            "127.0.0.1:0",
            None,
            Arc::new(LocalSegments::default()),
            random_client_id().0 as u64,
            Duration::ZERO,
            self.token.clone(),
        )
        .await
        .unwrap();
        let (server, lid): (Arc<dyn DataServer>, _) = if rdma {
            let device = self
                .fabric
                .device(&format!("node{i}"), ModelVerbs::caps(1 << 30));
            let lid = device.lid();
            let rdma = Arc::new(RdmaServer::new(Arc::new(device), 64));
            (Arc::new(RdmaDataServer::new(tcp.clone(), rdma)), Some(lid))
        } else {
            (tcp.clone(), None)
        };
        let contribution = Contribution {
            config: NodeConfig {
                name: Some(format!("node-{i}")),
                size: NODE_SIZE,
                prefault: false,
                shared: false,
                shm_group: None,
                disk: None,
            },
            server,
            default_name: tcp.endpoint().to_string(),
        };
        let node = StandaloneNode::with_transport(id, self.control(id), contribution)
            .await
            .unwrap();
        self.nodes.push((node, lid));
    }

    fn control(&self, id: mooring_core::ClientId) -> Arc<TcpControlPlane> {
        TcpControlPlane::new(
            self.master.addr.to_string(),
            Duration::from_secs(10),
            Duration::ZERO,
            self.token.clone(),
            id,
        )
    }

    /// A client reaching nodes over RDMA where they serve it (`required`: only there).
    async fn client(&self, required: bool) -> Client {
        let id = random_client_id();
        let tcp = TcpDataPlane::new(
            Arc::new(LocalSegments::default()),
            DataPlaneConfig {
                token: self.token.clone(),
                identity: id.0,
                ..DataPlaneConfig::default()
            },
        );
        let device = self.fabric.device("client", ModelVerbs::caps(1 << 30));
        let rdma = RdmaClient::new(Arc::new(device), RdmaConfig::default());
        let data = Arc::new(RdmaDataPlane::new(rdma, tcp, required));
        Client::with_transport(id, self.control(id), data, None)
            .await
            .unwrap()
    }
}

fn value(key: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 2_654_435_761 + key as u64) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_and_gets_move_over_rdma_and_the_data_servers_carry_no_bulk() {
    let cluster = Cluster::start(2, 0).await;
    let client = cluster.client(true).await;
    let sizes = [1, 4096, 100_000, 3 << 20];
    for (k, len) in sizes.iter().enumerate() {
        let key = format!("rdma/{k}");
        client
            .put(&key, &value(k, *len), &ReplicateConfig::replicas(2))
            .await
            .unwrap();
    }
    let reader = cluster.client(true).await;
    for (k, len) in sizes.iter().enumerate() {
        let got = reader.get(&format!("rdma/{k}")).await.unwrap();
        assert_eq!(got, value(k, *len), "key {k}");
    }
    let moved = cluster.fabric.counts();
    assert!(moved.executed >= 8, "{moved:?}");
    for (node, _) in &cluster.nodes {
        let counts = node.node().counts();
        assert_eq!(
            (counts.reads, counts.writes),
            (0, 0),
            "bulk bytes went through {}'s data server",
            node.node().name()
        );
    }
    client.close().await.unwrap();
    reader.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_cluster_is_reached_per_node_and_rdma_only_clients_say_why_not() {
    let cluster = Cluster::start(1, 1).await;
    let auto = cluster.client(false).await;
    for k in 0..8 {
        auto.put(
            &format!("mixed/{k}"),
            &value(k, 50_000),
            &ReplicateConfig::replicas(2),
        )
        .await
        .unwrap();
    }
    for k in 0..8 {
        assert_eq!(
            auto.get(&format!("mixed/{k}")).await.unwrap(),
            value(k, 50_000)
        );
    }
    assert!(
        cluster.fabric.counts().executed > 0,
        "the RDMA node was used"
    );
    let tcp_node = &cluster.nodes[1].0;
    assert!(tcp_node.node().counts().writes > 0, "the TCP node was used");
    // A client that requires RDMA cannot write to the TCP-only node: with two replicas
    // every put needs it, and the error says what to change.
    let strict = cluster.client(true).await;
    let err = strict
        .put(
            "mixed/strict",
            &value(99, 1000),
            &ReplicateConfig::replicas(2),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "{err}");
    assert!(err.to_string().contains("does not serve RDMA"), "{err}");
    auto.close().await.unwrap();
    strict.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_device_dies_is_read_around() {
    let cluster = Cluster::start(2, 0).await;
    let client = cluster.client(true).await;
    for k in 0..6 {
        client
            .put(
                &format!("dies/{k}"),
                &value(k, 20_000),
                &ReplicateConfig::replicas(2),
            )
            .await
            .unwrap();
    }
    let dead_lid = cluster.nodes[0].1.unwrap();
    cluster.fabric.kill(dead_lid);
    // A new client cannot even connect a queue pair to the dead node; the writer's queue
    // pairs to it exceed their retries. Both read every key from the surviving replica.
    let reader = cluster.client(true).await;
    for c in [&reader, &client] {
        for k in 0..6 {
            assert_eq!(
                c.get(&format!("dies/{k}")).await.unwrap(),
                value(k, 20_000),
                "key {k} read from the surviving replica"
            );
        }
    }
    let counts = cluster.fabric.counts();
    assert!(counts.retry_exceeded > 0, "{counts:?}");
    client.close().await.unwrap();
    reader.close().await.unwrap();
}
