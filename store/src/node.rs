//! A storage node: memory contributed to the pool.
//!
//! The node maps its segment, exports it on the data plane, mounts it with the master and
//! keeps it mounted: if a heartbeat finds the master has forgotten this client (it was
//! presumed dead), the node remounts under a fresh access key, so descriptors handed out for
//! the old mount can no longer write into it. On clean shutdown it unmounts, then keeps serving
//! reads for one lease TTL (readers may still hold descriptors), then stops.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::transport::{ControlPlane, DataServer, NodeAddr, SegmentMemory};
use mooring_core::wire::{MasterRequest, Reply};
use mooring_core::{ClientId, Error, ErrorCode, HeartbeatStatus, Result, SegmentId, SegmentSpec};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::memory::MappedMemory;

/// What a node contributes.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The segment's name; unique in the cluster (defaults to the data endpoint).
    pub name: Option<String>,
    /// Bytes contributed.
    pub size: u64,
    /// Touch every page at startup so transfers never page-fault.
    pub prefault: bool,
}

/// A mounted segment and the machinery keeping it mounted.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    client: ClientId,
    name: String,
    memory: SegmentMemory,
    server: Arc<dyn DataServer>,
    control: Arc<dyn ControlPlane>,
    mount: Mutex<Option<(NodeAddr, SegmentId)>>,
}

impl Node {
    /// Maps `config.size` bytes, exports them through `server` and mounts them.
    pub async fn start(
        client: ClientId,
        config: &NodeConfig,
        control: Arc<dyn ControlPlane>,
        server: Arc<dyn DataServer>,
        default_name: &str,
    ) -> Result<Node> {
        let memory = MappedMemory::new(config.size as usize, config.prefault)?.into_segment();
        let node = Node {
            inner: Arc::new(NodeInner {
                client,
                name: config
                    .name
                    .clone()
                    .unwrap_or_else(|| default_name.to_string()),
                memory,
                server,
                control,
                mount: Mutex::new(None),
            }),
        };
        node.mount().await?;
        Ok(node)
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The current mount's segment id.
    pub fn segment(&self) -> Option<SegmentId> {
        self.inner
            .mount
            .lock()
            .expect("mount lock")
            .as_ref()
            .map(|m| m.1)
    }

    /// Exports the memory under a fresh key and mounts it.
    async fn mount(&self) -> Result<()> {
        let inner = &self.inner;
        let addr = inner.server.export(inner.memory.clone())?;
        let spec = SegmentSpec {
            name: inner.name.clone(),
            base: inner.memory.base(),
            size: inner.memory.len() as u64,
            endpoint: addr.endpoint.to_string(),
            key: addr.key,
        };
        let reply = inner
            .control
            .call(MasterRequest::MountSegment {
                client: inner.client,
                spec,
            })
            .await;
        match reply {
            Ok(Reply::Segment(id)) => {
                info!(name = %inner.name, %id, bytes = inner.memory.len(), endpoint = %addr.endpoint, "segment mounted");
                let previous = inner.mount.lock().expect("mount lock").replace((addr, id));
                if let Some((old, _)) = previous {
                    inner.server.unexport(old.key);
                }
                Ok(())
            }
            Ok(other) => {
                inner.server.unexport(addr.key);
                Err(unexpected(&other))
            }
            Err(e) => {
                inner.server.unexport(addr.key);
                Err(e)
            }
        }
    }

    /// Mounts again after the master forgot this client. Everything stored in the old mount
    /// is already gone from the master's view; the old key stops working.
    pub async fn remount(&self) -> Result<()> {
        warn!(name = %self.inner.name, "master forgot this node; remounting");
        self.mount().await
    }

    /// Unmounts, keeps serving for `linger` (readers holding descriptors finish within their
    /// lease), then stops serving the memory.
    pub async fn shutdown(&self, linger: Duration) -> Result<()> {
        let mount = self.inner.mount.lock().expect("mount lock").take();
        let Some((addr, _)) = mount else {
            return Ok(());
        };
        let unmounted = self
            .inner
            .control
            .call(MasterRequest::UnmountSegment {
                client: self.inner.client,
                name: self.inner.name.clone(),
            })
            .await;
        if let Err(e) = &unmounted {
            warn!(name = %self.inner.name, "unmount failed (the master will drop the segment when this client expires): {e}");
        }
        tokio::time::sleep(linger).await;
        self.inner.server.unexport(addr.key);
        info!(name = %self.inner.name, "segment unmounted");
        unmounted.map(|_| ())
    }
}

/// Heartbeats every `interval` until aborted; remounts `node` whenever the master reports it
/// had forgotten this client.
pub fn spawn_heartbeat(
    client: ClientId,
    control: Arc<dyn ControlPlane>,
    interval: Duration,
    node: Option<Node>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            match control.call(MasterRequest::Heartbeat { client }).await {
                Ok(Reply::Heartbeat(HeartbeatStatus::Known)) => {}
                Ok(Reply::Heartbeat(HeartbeatStatus::Registered)) => {
                    if let Some(node) = &node
                        && let Err(e) = node.remount().await
                    {
                        warn!("remount failed, retrying at the next heartbeat: {e}");
                    }
                }
                Ok(other) => warn!("unexpected heartbeat reply {other:?}"),
                Err(e) => warn!("heartbeat failed: {e}"),
            }
        }
    })
}

/// The error for a reply of the wrong kind (a protocol bug).
pub(crate) fn unexpected(reply: &Reply) -> Error {
    Error::new(
        ErrorCode::INTERNAL_ERROR,
        format!("unexpected reply from the master: {reply:?}"),
    )
}
