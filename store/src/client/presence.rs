//! A member's standing with the master: it says hello, heartbeats, keeps its segment (if it
//! contributes one) mounted, and knows how long the master will still consider it alive.
//!
//! That last part is a safety rule, not bookkeeping: a member cut off from the master but not
//! from the nodes must stop writing before the master may give its blocks to someone else.
//! The rule and its timing are `mooring_core::client::WriteWindow`'s; this module feeds it
//! the send time of every request the master answers, and `mooring_core::client::Membership`
//! says how often to heartbeat and when to mount again.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use mooring_core::client::{FenceRule, Membership, WriteWindow};
use mooring_core::{ClientId, Millis, Result};
use mooring_proto::transport::ControlPlane;
use mooring_proto::wire::{ClusterInfo, Goodbye, Heartbeat, Hello};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::buggify::{self, Site};
use crate::clock::Clock;
use crate::node::Node;
use crate::node::disk_tier::DiskTier;

/// When this member last proved to the master that it is alive, and so how long it may write
/// (see [`WriteWindow`]).
#[derive(Debug)]
pub struct MasterContact {
    clock: Clock,
    window: Mutex<WriteWindow>,
}

impl MasterContact {
    /// Contact as of `clock`'s start (the hello, sent after it, was answered), under `rule`.
    pub fn new(clock: Clock, rule: FenceRule) -> MasterContact {
        MasterContact {
            clock,
            window: Mutex::new(WriteWindow::new(rule, Millis::ZERO)),
        }
    }

    /// The clock reading to pass to [`MasterContact::acknowledged`] for a request sent now,
    /// and to [`MasterContact::fence`] for a write starting now.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// The master answered a request sent at `sent`.
    pub fn acknowledged(&self, sent: Millis) {
        let now = self.clock.now();
        self.window
            .lock()
            .expect("write window lock")
            .acknowledged(sent, now);
    }

    /// How much longer a write of `size` bytes that started at `started` may transfer (zero:
    /// not at all).
    pub fn fence(&self, started: Millis, size: u64) -> Duration {
        let now = self.clock.now();
        let fence = self
            .window
            .lock()
            .expect("write window lock")
            .fence(started, size, now);
        Duration::from_millis(fence.as_millis())
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
        let rule = FenceRule::new(info.client_ttl, info.put_start_release_timeout);
        mooring_transport_tcp::bound_late_writes(Duration::from_millis(
            rule.late_landing().as_millis(),
        ));
        let contact = Arc::new(MasterContact::new(clock, rule));
        let membership = membership(&info);
        // Heartbeats start with the hello: mapping a large segment, or reading a disk, can
        // take longer than the master waits for a member's first heartbeat (ten seconds for
        // 1.4 GB of first-touched memory on a busy VM), and a member that expired while
        // joining would lose the segment it then mounts.
        let mounted = Arc::new(OnceLock::new());
        let heartbeat = HeartbeatTask(Some(spawn_heartbeat(
            id,
            control.clone(),
            duration(membership.heartbeat_interval()),
            mounted.clone(),
            contact.clone(),
        )));
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
                let patience = duration(membership.mount_patience());
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
                let _ = mounted.set(node.clone());
                (Some(node), disk)
            }
            None => (None, None),
        };
        Ok(Presence {
            id,
            info,
            contact,
            node,
            disk,
            control,
            heartbeat: Mutex::new(heartbeat.keep()),
        })
    }

    /// The control plane to the master.
    pub fn control(&self) -> &Arc<dyn ControlPlane> {
        &self.control
    }

    /// How long a leaving node keeps serving readers.
    fn linger(&self) -> Duration {
        duration(membership(&self.info).linger())
    }

    /// Stops heartbeating, unmounts the segment (serving readers for one more lease) and says
    /// goodbye.
    pub async fn leave(&self) -> Result<()> {
        self.stop_heartbeat();
        let left = match &self.node {
            Some(node) => {
                node.shutdown(buggify::timeout(Site::NODE_LINGER, self.linger()))
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

/// A member's timing under the master's settings.
fn membership(info: &ClusterInfo) -> Membership {
    Membership::new(info.client_ttl, info.lease_ttl)
}

fn duration(ms: Millis) -> Duration {
    Duration::from_millis(ms.as_millis())
}

/// A heartbeat task that stops when dropped, unless kept: a join that fails part way stops
/// heartbeating for the member it gave up on.
struct HeartbeatTask(Option<JoinHandle<()>>);

impl HeartbeatTask {
    /// The task, no longer stopped by this guard.
    fn keep(mut self) -> Option<JoinHandle<()>> {
        self.0.take()
    }
}

impl Drop for HeartbeatTask {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// Heartbeats every `interval` (each heartbeat given at most one interval to answer, so a
/// slow master does not silently stretch the period) until aborted. Once the member's node
/// has mounted (`mounted` set), mounts it again whenever it must (see
/// [`Membership::needs_mount`]); before that, the node's start mounts it.
fn spawn_heartbeat(
    client: ClientId,
    control: Arc<dyn ControlPlane>,
    interval: Duration,
    mounted: Arc<OnceLock<Node>>,
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
            let node = mounted.get();
            let seen = node.and_then(Node::segment);
            if let Some(node) = node
                && Membership::needs_mount(seen, &ack)
            {
                match node.remount_from(seen).await {
                    Ok(()) => {}
                    Err(e) => warn!("remount failed, retrying at the next heartbeat: {e}"),
                }
            } else {
                debug!(%client, "heartbeat acknowledged");
            }
        }
    })
}
