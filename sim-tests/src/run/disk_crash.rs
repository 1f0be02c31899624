//! Node kills caught partway through a disk write: the node's disk is armed to stop at a
//! change ([`SimDisk::stop_before`](mooring_transport_sim::disk::SimDisk::stop_before)), and
//! once it has stopped (or waited too long) the node is killed, its disk crashes with that
//! write unsynced, and the node restarts on it after its time down.

use std::time::Duration;

use super::Supervisor;
use super::faults::Heal;

/// A crash point that finds no change within this long kills the node anyway (an idle
/// node, or one that was down): its restart still recovers a disk in use.
const DISK_KILL_PATIENCE: Duration = Duration::from_secs(2);

/// A kill waiting for its node's disk to reach its crash point.
pub(super) struct DiskKill {
    node: usize,
    armed_at: Duration,
    down_for: Duration,
    /// The share of operations the disk fails from the restart, and for how long.
    failing: Option<(f64, Duration)>,
}

impl Supervisor {
    /// Arms node `node`'s disk to stop before its `change`-th change from now; the node is
    /// killed once it has ([`Supervisor::serve_disk_kills`]).
    pub(super) fn arm_disk_kill(
        &mut self,
        now: Duration,
        node: usize,
        change: u32,
        down_for: Duration,
        failing: Option<(f64, Duration)>,
    ) {
        // One crash point per disk: a second waits for the first.
        if self.disk_kills.iter().any(|k| k.node == node) {
            return;
        }
        self.world.disks[node].stop_before(change);
        self.disk_kills.push(DiskKill {
            node,
            armed_at: now,
            down_for,
            failing,
        });
    }

    /// Kills the nodes whose disks stopped at their crash points (or waited too long).
    pub(super) fn serve_disk_kills(&mut self, now: Duration) {
        let (ready, waiting): (Vec<DiskKill>, Vec<DiskKill>) = std::mem::take(&mut self.disk_kills)
            .into_iter()
            .partition(|k| {
                self.world.disks[k.node].stopped() || now >= k.armed_at + DISK_KILL_PATIENCE
            });
        self.disk_kills = waiting;
        for kill in ready {
            self.kill_on_disk(now, kill);
        }
    }

    /// Kills every node still waiting for its crash point (everything heals now).
    pub(super) fn kill_waiting_on_disks(&mut self, now: Duration) {
        for kill in std::mem::take(&mut self.disk_kills) {
            self.kill_on_disk(now, kill);
        }
    }

    fn kill_on_disk(&mut self, now: Duration, kill: DiskKill) {
        let disk = &self.world.disks[kill.node];
        tracing::info!(
            node = kill.node,
            stopped = disk.stopped(),
            "killing a node at its disk's crash point"
        );
        let id = self.nodes.storage[kill.node].id();
        self.handle.kill(id);
        // Lifts the crash point too.
        disk.crash();
        let back = now + kill.down_for;
        if let Some((rate, lasts)) = kill.failing {
            self.heals.push((back, Heal::DiskFailing(kill.node, rate)));
            self.heals.push((back + lasts, Heal::DiskQuiet(kill.node)));
        }
        self.heals.push((back, Heal::Restart(id)));
    }
}
