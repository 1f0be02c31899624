//! A standalone storage node: a process that contributes a segment and nothing else, kept
//! mounted by its own heartbeat (`mooring node`).

use std::sync::Arc;
use std::time::Duration;

use mooring_core::{ClientId, Result};
use mooring_proto::auth::Credential;
use mooring_proto::transport::ControlPlane;
use mooring_transport_tcp::LocalSegments;

use crate::buggify::{self, Site};
use crate::client::connect::{SegmentConfig, client_id_for, contribution, control_plane};
use crate::client::presence::{Contribution, Presence};
use crate::node::Node;

/// A standalone storage node: a segment kept mounted by its own heartbeat.
pub struct StandaloneNode {
    presence: Presence,
    node: Node,
    metrics: Option<tokio::task::JoinHandle<()>>,
}

impl StandaloneNode {
    /// Starts serving `segment` to the master at `master` over TCP, proving `token` to the
    /// master and requiring it of readers and writers.
    pub async fn start(
        master: &str,
        id: Option<ClientId>,
        segment: &SegmentConfig,
        local: Arc<LocalSegments>,
        token: Option<Credential>,
    ) -> Result<StandaloneNode> {
        let id = id.unwrap_or_else(|| client_id_for(token.as_ref()));
        let control = control_plane(
            master,
            buggify::timeout(Site::NODE_RPC_TIMEOUT, Duration::from_secs(10)),
            token.clone(),
            id,
        )?;
        let contribution = contribution(segment, token, local).await?;
        StandaloneNode::with_transport(id, control, contribution).await
    }

    /// Starts serving `contribution` to the master behind `control`.
    pub async fn with_transport(
        id: ClientId,
        control: Arc<dyn ControlPlane>,
        contribution: Contribution,
    ) -> Result<StandaloneNode> {
        let presence = Presence::join(id, control, Some(contribution)).await?;
        let node = presence.node.clone().ok_or_else(|| {
            mooring_core::Error::new(
                mooring_core::ErrorCode::INTERNAL_ERROR,
                "joined without the segment it was started to contribute",
            )
        })?;
        Ok(StandaloneNode {
            presence,
            node,
            metrics: None,
        })
    }

    /// The segment.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Serves the node's metrics over HTTP on `listen` (`/metrics`, Prometheus text),
    /// requiring `bearer` of every request if given; returns the bound address.
    pub async fn serve_metrics(
        &mut self,
        listen: &str,
        bearer: Option<String>,
    ) -> Result<std::net::SocketAddr> {
        let node = self.node.clone();
        let disk = self.presence.disk.as_ref().map(|tier| {
            Arc::new(tier.usage_reader()) as Arc<dyn Fn() -> (usize, u64) + Send + Sync>
        });
        let handler: crate::ops::http::Handler = Arc::new(move |request| match request.path {
            "/metrics" => crate::ops::http::Response::ok(
                "text/plain; version=0.0.4; charset=utf-8",
                crate::ops::metrics::node_text(&node, disk.as_ref().map(|usage| usage())),
            ),
            _ => crate::ops::http::Response::error(404, "no such page: try /metrics"),
        });
        let (addr, task) = crate::ops::http::serve(listen, handler, bearer, &[]).await?;
        self.metrics = Some(task);
        Ok(addr)
    }

    /// Unmounts cleanly: stops heartbeating, unmounts, serves readers for a lease, stops.
    pub async fn shutdown(self) -> Result<()> {
        if let Some(task) = &self.metrics {
            task.abort();
        }
        self.presence.leave().await
    }
}
