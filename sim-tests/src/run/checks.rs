//! The oracle's checks each tick: the objects the master let go of handed to the history,
//! the master's invariants, and a scrub of every memory replica against its checksum.

use mooring_core::{Checksum, Event, SegmentId, invariants};

use super::Supervisor;
use crate::coverage;
use crate::history::GoneWhy;

impl Supervisor {
    /// Hands the history every object the master let go of on its own since the last tick,
    /// and counts what the master did.
    pub(super) fn record_gone(&mut self) {
        let events = self.world.take_master_events();
        let mut history = self.world.history();
        for (when, event) in events {
            let at = when.duration_since(self.world.start);
            *self.coverage.entry(coverage::of_event(&event)).or_default() += 1;
            match event {
                // A node's disk copy going (its eviction or damage) frees no memory.
                Event::Evicted {
                    key,
                    kept_on_disk: false,
                    bytes: 0,
                    ..
                } => history.gone(&key, at, GoneWhy::DiskDropped),
                Event::Evicted {
                    key,
                    kept_on_disk: false,
                    ..
                } => history.gone(&key, at, GoneWhy::Evicted),
                Event::ObjectLost { key, .. } | Event::ReadableCopyLost { key, .. } => {
                    history.gone(&key, at, GoneWhy::Lost)
                }
                Event::WriteDiscarded {
                    key,
                    object_removed: true,
                    ..
                } => history.gone(&key, at, GoneWhy::Discarded),
                _ => {}
            }
        }
    }

    /// Judges what each master that took over since the last tick held as it did, against
    /// the changes acknowledged before (the history has every event the old leader reported
    /// by now: [`Supervisor::record_gone`] runs first).
    pub(super) fn judge_takeovers(&mut self) {
        for takeover in self.world.take_takeovers() {
            let (judged, found) = takeover.judge(&self.world.history());
            if judged > 0 {
                *self
                    .coverage
                    .entry(coverage::FAILOVER_VERIFIED)
                    .or_default() += 1;
            }
            for violation in found {
                self.world.history().violation(violation);
            }
        }
    }

    pub(super) fn check_invariants(&self) {
        let granting = self.world.granting();
        if granting.len() > 1 {
            self.world.history().violation(format!(
                "masters {granting:?} grant at once at {:?}",
                self.world.now()
            ));
        }
        if let Some(master) = self.world.master()
            && let Err(violation) = master.inspect(invariants::check)
        {
            self.world.history().violation(format!(
                "master invariant broken at {:?}: {violation}",
                self.world.now()
            ));
        }
        if let Some(master) = self.world.master()
            && let Some(violation) = master.audit_failure()
        {
            self.world
                .history()
                .violation(format!("master audit: {violation}"));
        }
    }

    /// Checks that the master still holds what the history says it must (see
    /// [`crate::history::Standing`]): every key with an acknowledged write that nothing may
    /// have taken still has its object, a hard pin nothing cleared is still on it, and no
    /// eviction took a hard-pinned object.
    pub(super) fn check_standing(&mut self) {
        let Some(master) = self.world.master() else {
            return;
        };
        let now = self.world.now();
        let mut history = self.world.history();
        for key in &self.world.keys {
            let standing = history.standing(key, now);
            if standing == Default::default() {
                continue;
            }
            let held = master.inspect(|m| m.audit_hard_pin(key));
            if standing.hard_pinned_by.is_some() && standing.must_exist != standing.hard_pinned_by {
                *self
                    .coverage
                    .entry(coverage::PIN_KEPT_THROUGH_WRITE)
                    .or_default() += 1;
            }
            let problem = match (standing, held) {
                (
                    crate::history::Standing {
                        evicted_while_pinned: Some(at),
                        hard_pinned_by: Some(v),
                        ..
                    },
                    _,
                ) => Some(format!(
                    "was evicted at {at:?} though version {v} hard-pinned it"
                )),
                (
                    crate::history::Standing {
                        must_exist: Some(v),
                        ..
                    },
                    None,
                ) => Some(format!(
                    "is gone from the master, though version {v} was acknowledged and nothing \
                     (a remove, an unfinished upsert, an eviction, a loss with a node, a \
                     discard) may have taken it since"
                )),
                (
                    crate::history::Standing {
                        hard_pinned_by: Some(v),
                        ..
                    },
                    Some(false),
                ) => Some(format!(
                    "lost its hard pin, though version {v} asked for one and nothing removed \
                     the object since"
                )),
                _ => None,
            };
            if let Some(problem) = problem {
                history.violation(format!("at {now:?} {key:?} {problem}"));
                return;
            }
        }
    }

    /// Checks every complete memory replica the master lists against the value's checksum,
    /// reading the bytes straight out of the node's memory: damage that no read happened to
    /// meet (a late write landing on reused blocks, blocks freed under a live object, a read
    /// that fell back past a damaged replica) is caught where it lies. Keys whose memory was
    /// rotted on purpose are skipped.
    pub(super) fn scrub(&self) {
        let Some(master) = self.world.master() else {
            return;
        };
        let nodes: Vec<(SegmentId, mooring::Node)> = (0..self.world.plan.shape.nodes)
            .filter_map(|i| {
                let node = self.world.node(i)?;
                Some((node.segment()?, node))
            })
            .collect();
        for key in &self.world.keys {
            if self.world.history().was_rotted(key) {
                continue;
            }
            let Some((replicas, checksum)) = master.inspect(|m| m.audit_memory_replicas(key))
            else {
                continue;
            };
            for replica in replicas {
                let Some((_, node)) = nodes.iter().find(|(s, _)| *s == replica.segment) else {
                    continue;
                };
                let mut bytes = vec![0u8; replica.len as usize];
                let found = node.memory().copy_out(replica.addr, &mut bytes);
                if !found || Checksum::of(&bytes) != checksum {
                    self.world.history().violation(format!(
                        "scrub at {:?}: {key:?}'s complete replica on {} at {:#x} ({} bytes) {}",
                        self.world.now(),
                        replica.segment,
                        replica.addr,
                        replica.len,
                        if found {
                            "fails the value's checksum"
                        } else {
                            "lies outside the node's memory"
                        }
                    ));
                }
            }
        }
    }
}
