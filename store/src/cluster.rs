//! An embedded cluster: a master, storage nodes and clients in one process, talking over
//! real TCP on loopback (transfers to segments in this process are a `memcpy` unless
//! disabled).

use std::sync::Arc;

use mooring_core::{MasterConfig, Result};
use mooring_proto::auth::Credential;
use mooring_transport_tcp::LocalSegments;

use crate::client::Client;
use crate::client::connect::{ClientConfig, SegmentConfig};
use crate::master::RunningMaster;
use crate::node::NodeConfig;
use crate::node::disk_tier::DiskTierConfig;
use crate::node::standalone::StandaloneNode;

/// The shape of an embedded cluster.
#[derive(Clone, Debug)]
pub struct EmbeddedConfig {
    /// The master's policy.
    pub master: MasterConfig,
    /// Storage nodes to start.
    pub nodes: usize,
    /// Bytes each node contributes.
    pub node_size: u64,
    /// Touch node memory at startup.
    pub prefault: bool,
    /// Whether clients `memcpy` to segments of this process (false: always use TCP).
    pub local_memcpy: bool,
    /// A disk tier for every node: node `i` keeps its copies in `dir/node-i`.
    pub disk: Option<DiskTierConfig>,
    /// The cluster token every member proves (by default a fresh one: an embedded cluster
    /// is closed to strangers like any other).
    pub token: Option<Credential>,
}

impl Default for EmbeddedConfig {
    fn default() -> EmbeddedConfig {
        EmbeddedConfig {
            master: MasterConfig::default(),
            nodes: 3,
            node_size: 64 << 20,
            prefault: false,
            local_memcpy: true,
            disk: None,
            token: Some(crate::token::generate()),
        }
    }
}

/// A running embedded cluster.
pub struct EmbeddedCluster {
    /// The master.
    pub master: RunningMaster,
    /// The nodes.
    pub nodes: Vec<StandaloneNode>,
    local: Arc<LocalSegments>,
    config: EmbeddedConfig,
}

impl EmbeddedCluster {
    /// Starts a master and `config.nodes` nodes on 127.0.0.1.
    pub async fn start(config: EmbeddedConfig) -> Result<EmbeddedCluster> {
        let master =
            RunningMaster::start("127.0.0.1:0", config.master.clone(), config.token.clone())
                .await?;
        let local = Arc::new(LocalSegments::default());
        let mut nodes = Vec::new();
        for i in 0..config.nodes {
            let segment = SegmentConfig {
                node: NodeConfig {
                    name: Some(format!("node-{i}")),
                    size: config.node_size,
                    prefault: config.prefault,
                    shared: false,
                    shm_group: None,
                    disk: config.disk.as_ref().map(|disk| DiskTierConfig {
                        dir: disk.dir.join(format!("node-{i}")),
                        ..disk.clone()
                    }),
                },
                listen: "127.0.0.1:0".into(),
                advertise: None,
                rdma_devices: None,
            };
            nodes.push(
                StandaloneNode::start(
                    &master.addr.to_string(),
                    None,
                    &segment,
                    local.clone(),
                    config.token.clone(),
                )
                .await?,
            );
        }
        Ok(EmbeddedCluster {
            master,
            nodes,
            local,
            config,
        })
    }

    /// The cluster token its members prove.
    pub fn token(&self) -> Option<&Credential> {
        self.config.token.as_ref()
    }

    /// The master's address.
    pub fn master_addr(&self) -> String {
        self.master.addr.to_string()
    }

    /// A new pure client of this cluster.
    pub async fn client(&self) -> Result<Client> {
        let mut config = ClientConfig::new(self.master_addr());
        config.data.local_memcpy = self.config.local_memcpy;
        config.token = self.config.token.clone();
        Client::connect_with(config, self.local.clone()).await
    }

    /// Stops every node cleanly (in parallel: each serves readers for a lease after
    /// unmounting), then the master.
    pub async fn shutdown(mut self) -> Result<()> {
        let stops = self.nodes.drain(..).map(StandaloneNode::shutdown);
        let results = futures_util::future::join_all(stops).await;
        self.master.shutdown();
        results.into_iter().collect()
    }
}
