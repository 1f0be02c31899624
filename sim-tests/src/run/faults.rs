//! Applying the fault plan: each fault as it falls due, what undoes it when its time is up
//! ([`Heal`]), crash orders served at a client's write steps, and healing everything at the
//! end of the workload.

use std::sync::atomic::Ordering;
use std::time::Duration;

use madsim::net::NetSim;
use madsim::task::NodeId;
use mooring_transport_sim::NetFaults;

use super::{CRASH_ORDER_PATIENCE, Supervisor};
use crate::coverage;
use crate::plan::{Fault, JournalFault, Member, Transport};
use crate::stranger::{self, stranger_ip};
use crate::world::{CrashOrder, World, ip};

/// Something to undo when a fault's time is up.
#[derive(Clone, Debug)]
pub(super) enum Heal {
    Restart(NodeId),
    /// A process that only ever lived for the fault (the stranger) goes for good.
    Stop(NodeId),
    Unblock(Member, Member),
    Unlag(Member, Member),
    Quiet,
    Resume(NodeId),
    DiskQuiet(usize),
    /// A node's disk starts failing this share of operations (as a node restarts on it);
    /// a later `DiskQuiet` ends it.
    DiskFailing(usize, f64),
    /// The master's state directory has room again.
    MasterDiskRoom,
    /// The master's state directory's syncs work again.
    MasterSyncsWork,
    /// A split leader is back in touch (see [`Supervisor::split_leader`]).
    Rejoin(NodeId, Option<NodeId>, Option<NodeId>),
}

impl Supervisor {
    fn block(&self, from: Member, to: Member) {
        if self.world.plan.transport == Transport::Rdma {
            let (from, to) = (ip(from).to_string(), ip(to).to_string());
            self.world.fabric.block(&from, &to);
        }
        match self.world.plan.transport {
            Transport::Sim | Transport::Rdma | Transport::Shm => {
                self.world.net.block(ip(from), ip(to))
            }
            Transport::Tcp => NetSim::current().clog_link(self.nodes.id(from), self.nodes.id(to)),
        }
    }

    fn unblock(&self, from: Member, to: Member) {
        if self.world.plan.transport == Transport::Rdma {
            let (from, to) = (ip(from).to_string(), ip(to).to_string());
            self.world.fabric.unblock(&from, &to);
        }
        match self.world.plan.transport {
            Transport::Sim | Transport::Rdma | Transport::Shm => {
                self.world.net.unblock(ip(from), ip(to))
            }
            Transport::Tcp => NetSim::current().unclog_link(self.nodes.id(from), self.nodes.id(to)),
        }
    }

    pub(super) fn apply(&mut self, now: Duration, fault: &Fault) {
        let until = now + fault.lasts();
        match *fault {
            Fault::KillNode { node, .. } => {
                let id = self.nodes.storage[node].id();
                self.handle.kill(id);
                // Whatever its disk had not synced is torn or lost with it.
                if let Some(disk) = self.world.disks.get(node) {
                    disk.crash();
                }
                self.heals.push((until, Heal::Restart(id)));
            }
            Fault::CrashClient {
                client,
                mid_write,
                down_for,
            } => {
                let id = self.nodes.clients[client].id();
                if mid_write {
                    self.world.orders().insert(id, CrashOrder::default());
                    self.armed.insert(id, (now, down_for));
                } else {
                    self.handle.kill(id);
                    self.heals.push((until, Heal::Restart(id)));
                }
            }
            Fault::Partition {
                from,
                to,
                both_ways,
                ..
            } => {
                self.block(from, to);
                self.heals.push((until, Heal::Unblock(from, to)));
                if both_ways {
                    self.block(to, from);
                    self.heals.push((until, Heal::Unblock(to, from)));
                }
            }
            Fault::Isolate { member, .. } => {
                for other in self.nodes.members() {
                    if other != member {
                        self.block(member, other);
                        self.block(other, member);
                        self.heals.push((until, Heal::Unblock(member, other)));
                        self.heals.push((until, Heal::Unblock(other, member)));
                    }
                }
            }
            Fault::Noise {
                loss,
                duplicate,
                corrupt,
                max_delay,
                ..
            } => {
                match self.world.plan.transport {
                    Transport::Sim | Transport::Rdma | Transport::Shm => {
                        self.world.net.set_faults(NetFaults {
                            loss,
                            duplicate,
                            corrupt,
                            max_delay,
                        })
                    }
                    Transport::Tcp => {
                        NetSim::current().update_config(|c| c.packet_loss_rate = loss)
                    }
                }
                self.heals.push((until, Heal::Quiet));
            }
            Fault::Lag { from, to, by, .. } => {
                self.world.net.lag(ip(from), ip(to), by);
                self.heals.push((until, Heal::Unlag(from, to)));
            }
            Fault::PauseNode { node, .. } => {
                let id = self.nodes.storage[node].id();
                self.handle.pause(id);
                self.heals.push((until, Heal::Resume(id)));
            }
            Fault::KillMaster { journal, .. } => {
                // What the master reported before it died is the history's; its successor
                // replays its journal without reporting it again.
                self.record_gone();
                // In a group, the kill takes whichever master leads.
                let id = match (&self.nodes.group, self.world.leader()) {
                    (Some((standby, _)), Some(1)) => standby.id(),
                    _ => self.nodes.master.id(),
                };
                if self.nodes.group.is_some()
                    && self.world.leader().is_some()
                    && self.world.plan.transport == Transport::Sim
                {
                    *self
                        .coverage
                        .entry(crate::coverage::LEADER_KILLED_SIM)
                        .or_default() += 1;
                }
                self.handle.kill(id);
                match journal {
                    JournalFault::Kill => {}
                    JournalFault::PowerLoss => self.world.master_power_loss(now.as_nanos() as u64),
                    JournalFault::FlipSynced { pick } => self.world.flip_synced_journal_bit(pick),
                }
                self.heals.push((until, Heal::Restart(id)));
            }
            Fault::MasterDiskFull { .. } => {
                self.world.master_disk_full(true);
                self.heals.push((until, Heal::MasterDiskRoom));
            }
            Fault::SplitLeader { standby, etcd, .. } => {
                if let Some(heal) = self.split_leader(standby, etcd) {
                    self.heals.push((until, heal));
                }
            }
            Fault::MasterSyncFails { .. } => {
                self.world.master_syncs_fail(true);
                self.heals.push((until, Heal::MasterSyncsWork));
            }
            Fault::Stranger { .. } => {
                let world = self.world.clone();
                let stranger = self
                    .handle
                    .create_node()
                    .name("stranger")
                    .ip(stranger_ip())
                    .init(move || stranger::knock(world.clone()))
                    .build();
                self.heals.push((until, Heal::Stop(stranger.id())));
            }
            Fault::DiskErrors { node, rate, .. } => {
                let disk = &self.world.disks[node];
                disk.set_faults(World::disk_faults(&self.world.plan, rate));
                self.heals.push((until, Heal::DiskQuiet(node)));
            }
            Fault::RotMemory { node, pick } => self.rot_memory(node, pick),
            Fault::Remount { node } => {
                if self.remount(node) {
                    let path = coverage::remounted(self.world.plan.transport);
                    *self.coverage.entry(path).or_default() += 1;
                }
            }
            Fault::RotEveryCopy { node, pick } => self.rot_every_copy(node, pick),
            Fault::RotDisk { node, pick } => self.rot_disk(node, pick),
            Fault::RotRecord { node, pick } => self.rot_record(node, pick),
            Fault::KillNodeMidDiskWrite {
                node,
                change,
                down_for,
                failing,
            } => self.arm_disk_kill(now, node, change, down_for, failing),
        }
    }

    fn heal(&mut self, heal: &Heal) {
        match *heal {
            Heal::Restart(id) => {
                // madsim's restart alone keeps the old incarnation's sockets bound (only kill
                // closes them), and a second scheduled restart may find the node running.
                self.handle.kill(id);
                self.handle.restart(id);
            }
            Heal::Unblock(from, to) => self.unblock(from, to),
            Heal::Unlag(from, to) => self.world.net.unlag(ip(from), ip(to)),
            Heal::Quiet => match self.world.plan.transport {
                Transport::Sim | Transport::Rdma | Transport::Shm => {
                    self.world.net.set_faults(NetFaults::default())
                }
                Transport::Tcp => NetSim::current().update_config(|c| c.packet_loss_rate = 0.0),
            },
            Heal::Resume(id) => self.handle.resume(id),
            Heal::Stop(id) => self.handle.kill(id),
            Heal::DiskQuiet(node) => {
                self.world.disks[node].set_faults(World::disk_faults(&self.world.plan, 0.0))
            }
            Heal::DiskFailing(node, rate) => {
                self.world.disks[node].set_faults(World::disk_faults(&self.world.plan, rate))
            }
            Heal::MasterDiskRoom => self.world.master_disk_full(false),
            Heal::Rejoin(leader, standby, etcd) => self.cut(leader, standby, etcd, false),
            Heal::MasterSyncsWork => {
                // The disk works again, and the master whose journal stopped is restarted
                // on it (as an operator restarts it after the alarm).
                self.world.master_syncs_fail(false);
                self.record_gone();
                let id = self.nodes.master.id();
                self.handle.kill(id);
                self.handle.restart(id);
            }
        }
    }

    pub(super) fn heal_due(&mut self, now: Duration) {
        let (due, later): (Vec<_>, Vec<_>) = self.heals.drain(..).partition(|(at, _)| *at <= now);
        self.heals = later;
        for (_, heal) in due {
            self.heal(&heal);
        }
    }

    /// Resumes, when their time is up, the members that paused themselves.
    pub(super) fn serve_pause_orders(&mut self, now: Duration) {
        for (id, lasts) in self.world.take_pause_orders() {
            self.heals.push((now + lasts, Heal::Resume(id)));
        }
    }

    /// Remounts storage node `node` from its own process, as its heartbeat loop would;
    /// whether it was up to do so.
    fn remount(&mut self, node: usize) -> bool {
        let Some(storage) = self.world.node(node) else {
            return false;
        };
        self.nodes.storage[node].spawn(async move {
            if let Err(e) = storage.remount().await {
                tracing::info!("remount failed: {e}");
            }
        });
        true
    }

    /// Takes away the targets of moves whose clients are about to end them (see
    /// [`crate::world::TaskOrder`]).
    pub(super) fn serve_task_orders(&mut self) {
        let triggered: Vec<(NodeId, usize)> = self
            .world
            .task_orders()
            .iter()
            .filter(|(_, order)| order.triggered)
            .map(|(id, order)| (*id, order.node))
            .collect();
        for (id, node) in triggered {
            self.world.task_orders().remove(&id);
            if self.remount(node) {
                *self
                    .coverage
                    .entry(coverage::TASK_TARGET_TAKEN)
                    .or_default() += 1;
            }
        }
    }

    /// Kills clients that reached their crash point (or waited too long for one).
    pub(super) fn serve_crash_orders(&mut self, now: Duration) {
        let ready: Vec<NodeId> = self
            .armed
            .iter()
            .filter(|(id, (armed_at, _))| {
                let triggered = self.world.orders().get(id).is_some_and(|o| o.triggered);
                triggered || now >= *armed_at + CRASH_ORDER_PATIENCE
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            let (_, down_for) = self.armed.remove(&id).expect("armed");
            self.world.orders().remove(&id);
            self.handle.kill(id);
            self.heals.push((now + down_for, Heal::Restart(id)));
        }
    }

    /// Heals everything now, including faults whose time is not up.
    pub(super) fn heal_all(&mut self) {
        let now = self.world.now();
        mooring::buggify::calm();
        self.world.healed.store(true, Ordering::Relaxed);
        // The HCA stops failing too.
        self.world
            .fabric
            .set_rates(mooring_transport_rdma::model::FaultRates::default(), 0);
        self.world.task_orders().clear();
        for (id, (_, _)) in std::mem::take(&mut self.armed) {
            self.world.orders().remove(&id);
            // An armed client that parked itself is stuck in its hold: restart it.
            self.handle.kill(id);
            self.heals.push((now, Heal::Restart(id)));
        }
        self.kill_waiting_on_disks(now);
        self.serve_pause_orders(now);
        let heals = std::mem::take(&mut self.heals);
        for (_, heal) in &heals {
            self.heal(heal);
        }
        self.world.net.heal();
    }
}

impl Supervisor {
    /// Cuts the group's leader off from its standby (if `standby`) and etcd (if `etcd`):
    /// what heals it. Nothing in a run without a group or before anyone leads.
    fn split_leader(&mut self, standby: bool, etcd: bool) -> Option<Heal> {
        let (second, etcd_node) = self.nodes.group.as_ref()?;
        let (first, second) = (self.nodes.master.id(), second.id());
        let (leader, other) = match self.world.leader()? {
            0 => (first, second),
            _ => (second, first),
        };
        let standby = standby.then_some(other);
        let etcd = etcd.then(|| etcd_node.id());
        self.cut(leader, standby, etcd, true);
        Some(Heal::Rejoin(leader, standby, etcd))
    }

    /// Cuts (or restores) the links between master `a` and master `b`, and between `a` and
    /// `etcd`.
    fn cut(&self, a: NodeId, b: Option<NodeId>, etcd: Option<NodeId>, cut: bool) {
        let net = NetSim::current();
        let pairs: Vec<(NodeId, NodeId)> = b.into_iter().chain(etcd).map(|x| (a, x)).collect();
        for (x, y) in pairs {
            for (from, to) in [(x, y), (y, x)] {
                if cut {
                    net.clog_link(from, to);
                } else {
                    net.unclog_link(from, to);
                }
            }
        }
        // Over datagrams the masters follow each other on the simulated network.
        if let Some(b) = b
            && self.world.plan.transport.datagrams()
        {
            let ip = |id: NodeId| {
                let k = usize::from(id != self.nodes.master.id());
                crate::world::group_master_addr(k).ip()
            };
            for (from, to) in [(a, b), (b, a)] {
                if cut {
                    self.world.net.block(ip(from), ip(to));
                } else {
                    self.world.net.unblock(ip(from), ip(to));
                }
            }
        }
    }
}
