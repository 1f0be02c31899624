//! A member's standing with the master: it says hello, heartbeats, keeps its segment (if it
//! contributes one) mounted, and knows how long the master will still consider it alive.
//!
//! That last part is a safety rule, not bookkeeping. When the master stops hearing from a
//! client for `client_ttl` it presumes it dead and may hand the blocks of its unfinished
//! writes to someone else. A client cut off from the master but not from the nodes must not
//! keep writing into those blocks, so it stops starting transfers half a TTL after the last
//! heartbeat the master acknowledged (measured from when that heartbeat was *sent*, which is
//! no later than when the master saw it). The other half is the margin for bytes already on
//! the wire (bounded by the transports: TCP's user timeout, RDMA's retry limit).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::{ClientId, HeartbeatAck, HeartbeatStatus, Millis, Result};
use mooring_proto::transport::ControlPlane;
use mooring_proto::wire::{ClusterInfo, Goodbye, Heartbeat, Hello};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::buggify::{self, Site};
use crate::clock::Clock;
use crate::disk_tier::DiskTier;
use crate::node::Node;

/// When this member last proved to the master that it is alive.
#[derive(Debug)]
pub struct MasterContact {
    clock: Clock,
    /// Clock reading (ms) when the latest acknowledged heartbeat was sent.
    last_sent: AtomicU64,
    /// Half the client TTL, in ms: how long after that this member may still write.
    write_window: u64,
}

impl MasterContact {
    /// Contact as of `clock`'s start (a request acknowledged by the master was sent after
    /// it), for a master whose client TTL is `client_ttl`.
    pub fn new(clock: Clock, client_ttl: Millis) -> MasterContact {
        MasterContact {
            clock,
            last_sent: AtomicU64::new(0),
            write_window: client_ttl.as_millis() / 2,
        }
    }

    /// The clock reading to pass to [`MasterContact::acknowledged`] for a heartbeat sent now.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// The master acknowledged a heartbeat sent at `sent`.
    pub fn acknowledged(&self, sent: Millis) {
        self.last_sent
            .fetch_max(sent.as_millis(), Ordering::Relaxed);
    }

    /// How much longer this member may write to nodes (zero: not at all).
    pub fn write_window(&self) -> Duration {
        let until = self.last_sent.load(Ordering::Relaxed) + self.write_window;
        Duration::from_millis(until.saturating_sub(self.clock.now().as_millis()))
    }
}

/// A member of the cluster: a client, a node, or both.
pub struct Presence {
    /// Its id.
    pub id: ClientId,
    /// The master's settings.
    pub info: ClusterInfo,
    /// When it last proved it is alive.
    pub contact: Arc<MasterContact>,
    /// Its segment, if it contributes one.
    pub node: Option<Node>,
    /// The disk tier behind its segment, if it has one.
    pub disk: Option<DiskTier>,
    control: Arc<dyn ControlPlane>,
    heartbeat: Mutex<Option<JoinHandle<()>>>,
}

/// A segment to contribute on joining.
pub struct Contribution {
    /// What to contribute.
    pub config: crate::node::NodeConfig,
    /// The data server exporting it.
    pub server: Arc<dyn mooring_proto::transport::DataServer>,
    /// The segment's name if the config gives none (usually the data endpoint).
    pub default_name: String,
}

impl Presence {
    /// Says hello to the master, mounts `contribution` (if any) and starts heartbeating.
    pub async fn join(
        id: ClientId,
        control: Arc<dyn ControlPlane>,
        contribution: Option<Contribution>,
    ) -> Result<Presence> {
        let clock = Clock::new();
        let info = control.call(Hello { client: id }).await?;
        mooring_transport_tcp::bound_late_writes_for(Duration::from_millis(
            info.client_ttl.as_millis(),
        ));
        let contact = Arc::new(MasterContact::new(clock, info.client_ttl));
        let (node, disk) = match contribution {
            Some(c) => {
                // Its disk is read before anything is mounted: a disk that cannot be read
                // fails the start with nothing left behind. Until the tier serves, the node
                // asks readers of its disk copies to retry rather than telling them it has no
                // disk.
                let opened = match &c.config.disk {
                    Some(config) => {
                        c.server.disk_starting();
                        Some(DiskTier::open(config.clone(), c.config.shared).await?)
                    }
                    None => None,
                };
                // A restarted node may find its name still held by its previous incarnation
                // until the master expires it: wait that long, and a little more.
                let patience = Duration::from_millis(info.client_ttl.as_millis()) * 2;
                let node = Node::start(
                    id,
                    &c.config,
                    control.clone(),
                    c.server.clone(),
                    &c.default_name,
                    patience,
                )
                .await?;
                let disk = match opened {
                    Some(opened) => Some(
                        DiskTier::start(opened, node.clone(), id, control.clone(), c.server)
                            .await?,
                    ),
                    None => None,
                };
                (Some(node), disk)
            }
            None => (None, None),
        };
        let heartbeat = spawn_heartbeat(
            id,
            control.clone(),
            heartbeat_interval(&info),
            node.clone(),
            contact.clone(),
        );
        Ok(Presence {
            id,
            info,
            contact,
            node,
            disk,
            control,
            heartbeat: Mutex::new(Some(heartbeat)),
        })
    }

    /// The control plane to the master.
    pub fn control(&self) -> &Arc<dyn ControlPlane> {
        &self.control
    }

    /// The lease TTL as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.info.lease_ttl.as_millis())
    }

    /// Stops heartbeating, unmounts the segment (serving readers for one more lease) and says
    /// goodbye.
    pub async fn leave(&self) -> Result<()> {
        self.stop_heartbeat();
        let left = match &self.node {
            Some(node) => {
                node.shutdown(buggify::timeout(Site::NODE_LINGER, self.lease()))
                    .await
            }
            None => Ok(()),
        };
        // Saying goodbye lets the master forget this member now, not a client TTL later (and
        // quietly: a departure is routine, an expiry is not). Best effort: if the master does
        // not hear it, the member expires as before.
        if let Err(e) = self.control.call(Goodbye { client: self.id }).await {
            debug!("the master did not hear this member's goodbye: {e}");
        }
        left
    }

    fn stop_heartbeat(&self) {
        if let Some(task) = self.heartbeat.lock().expect("heartbeat lock").take() {
            task.abort();
        }
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.stop_heartbeat();
    }
}

/// Heartbeat often enough that two lost heartbeats do not expire the member.
fn heartbeat_interval(info: &ClusterInfo) -> Duration {
    Duration::from_millis((info.client_ttl.as_millis() / 4).max(10))
}

/// Whether `node` must mount again: the master re-registered this member, or does not list
/// the node's segment among this member's (a `Registered` answer may have been lost), or the
/// node is not mounted at all.
fn needs_mount(node: &Node, ack: &HeartbeatAck) -> bool {
    ack.status == HeartbeatStatus::Registered
        || !node
            .segment()
            .is_some_and(|segment| ack.segments.contains(&segment))
}

/// Heartbeats every `interval` (each heartbeat given at most one interval to answer, so a
/// slow master does not silently stretch the period) until aborted. Mounts `node` again
/// whenever it must (see [`needs_mount`]).
fn spawn_heartbeat(
    client: ClientId,
    control: Arc<dyn ControlPlane>,
    interval: Duration,
    node: Option<Node>,
    contact: Arc<MasterContact>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut next = tokio::time::Instant::now();
        loop {
            // The period is drawn each round, so a simulation that calms its buggify down
            // (to check liveness after healing) gets regular heartbeats back.
            let period = buggify::period(Site::HEARTBEAT_INTERVAL, interval);
            next += period;
            tokio::time::sleep_until(next).await;
            // Fell behind (a paused process): resume from now rather than burst.
            next = next.max(tokio::time::Instant::now() - period);
            let sent = contact.now();
            let call = control.call(Heartbeat { client });
            let ack = match tokio::time::timeout(period, call).await {
                Ok(Ok(ack)) => ack,
                Ok(Err(e)) => {
                    warn!("heartbeat failed: {e}");
                    continue;
                }
                Err(_) => {
                    warn!("heartbeat unanswered within {period:?}");
                    continue;
                }
            };
            contact.acknowledged(sent);
            if let Some(node) = &node
                && needs_mount(node, &ack)
            {
                match node.remount().await {
                    Ok(()) => {}
                    Err(e) => warn!("remount failed, retrying at the next heartbeat: {e}"),
                }
            } else {
                debug!(%client, "heartbeat acknowledged");
            }
        }
    })
}
