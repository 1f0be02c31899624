//! A storage node: memory contributed to the pool.
//!
//! The node maps its segment, exports it on the data plane, mounts it with the master and
//! keeps it mounted: if a heartbeat finds the master has forgotten this client (it was
//! presumed dead), the node remounts under a fresh access key, so descriptors handed out for
//! the old mount can no longer write into it. On clean shutdown it unmounts, then keeps serving
//! reads for one lease TTL (readers may still hold descriptors), then stops.

pub mod disk_tier;
pub mod memory;
pub mod preflight;
pub mod standalone;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::client::MountRetry;
use mooring_core::{ClientId, Millis, Result, SegmentId, SegmentSpec};
use mooring_proto::transport::{ControlPlane, DataServer, NodeAddr, SegmentMemory};
use mooring_proto::wire::{MountSegment, UnmountSegment};
use tracing::{debug, info, warn};

use crate::buggify::{self, Site};
use crate::clock::Clock;

use crate::node::memory::segment_memory;

/// What a node contributes.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The segment's name; unique in the cluster (defaults to the data endpoint).
    pub name: Option<String>,
    /// Bytes contributed.
    pub size: u64,
    /// Touch every page at startup so transfers never page-fault.
    pub prefault: bool,
    /// Back the segment (and the disk tier's staging buffer) with shared memory that clients
    /// on this host map (the node serves shm).
    pub shared: bool,
    /// Besides this process's own user, the group whose members' processes may map the
    /// shared memory (by gid); every other local user is refused at the socket.
    pub shm_group: Option<u32>,
    /// A disk tier behind the segment (docs/ssd-tier.md), if any.
    pub disk: Option<crate::node::disk_tier::DiskTierConfig>,
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
    /// Held while a mount is under way, so mounts follow one another. Two at once would
    /// each export the memory under a key of its own, and shared memory holds one key: the
    /// later export replaces the earlier, and the master could be left with a mount whose
    /// key nothing serves.
    mounting: tokio::sync::Mutex<()>,
}

impl Node {
    /// Maps `config.size` bytes, exports them through `server` and mounts them. A name still
    /// held by another client (typically this node's previous incarnation, not yet expired)
    /// or an unreachable master is retried for up to `patience`.
    pub async fn start(
        client: ClientId,
        config: &NodeConfig,
        control: Arc<dyn ControlPlane>,
        server: Arc<dyn DataServer>,
        default_name: &str,
        patience: Duration,
    ) -> Result<Node> {
        let memory = segment_memory(config.size as usize, config.prefault, config.shared)?;
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
                mounting: tokio::sync::Mutex::new(()),
            }),
        };
        let patience = buggify::timeout(Site::NODE_MOUNT_PATIENCE, patience);
        let clock = Clock::new();
        let mut retry = MountRetry::new(Millis(patience.as_millis() as u64), clock.now());
        loop {
            let one_at_a_time = node.inner.mounting.lock().await;
            let mounted = node.mount().await;
            drop(one_at_a_time);
            match mounted {
                Ok(()) => return Ok(node),
                Err(e) => match retry.after(&e, clock.now()) {
                    Some(wait) => {
                        let wait = Duration::from_millis(wait.as_millis());
                        info!(name = %node.name(), "cannot mount yet, retrying in {wait:?}: {e}");
                        tokio::time::sleep(wait).await;
                    }
                    None => return Err(e),
                },
            }
        }
    }

    /// Whether the segment is mounted (as far as this node knows).
    pub fn is_mounted(&self) -> bool {
        self.inner.mount.lock().expect("mount lock").is_some()
    }

    /// The segment's memory (the node reads it locally to offload).
    pub fn memory(&self) -> &SegmentMemory {
        &self.inner.memory
    }

    /// What the node's data server has served since it started.
    pub fn counts(&self) -> mooring_proto::serve::DataCounts {
        self.inner.server.counts()
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
            rdma_key: addr.rdma_key,
        };
        let reply = inner
            .control
            .call(MountSegment {
                client: inner.client,
                spec,
            })
            .await;
        match reply {
            Ok(id) => {
                info!(name = %inner.name, %id, bytes = inner.memory.len(), endpoint = %addr.endpoint, "segment mounted");
                let previous = inner.mount.lock().expect("mount lock").replace((addr, id));
                if let Some((old, _)) = previous {
                    inner.server.unexport(old.key);
                }
                Ok(())
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
        let _one_at_a_time = self.inner.mounting.lock().await;
        self.remount_now().await
    }

    /// [`Node::remount`] if the mounted segment is still `seen` once any mount under way has
    /// ended: the heartbeat judged `seen`, and a mount that ended meanwhile (one that left
    /// nothing mounted while it waited for the master) did what it asked for.
    pub async fn remount_from(&self, seen: Option<SegmentId>) -> Result<()> {
        let _one_at_a_time = self.inner.mounting.lock().await;
        if self.segment() != seen {
            debug!(name = %self.inner.name, "mounted again meanwhile; no remount");
            return Ok(());
        }
        self.remount_now().await
    }

    async fn remount_now(&self) -> Result<()> {
        warn!(name = %self.inner.name, "master forgot this node; remounting");
        // The old key stops working before the memory is offered again: once the master
        // takes the new mount, it hands the same ranges to new writers, and a transfer for
        // the old mount (a late writer's, a reader's) must not land in them or read them.
        let old = self.inner.mount.lock().expect("mount lock").take();
        if let Some((old, _)) = old {
            self.inner.server.unexport(old.key);
        }
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
            .call(UnmountSegment {
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
        unmounted
    }
}
