//! Re-replication: objects that lost memory replicas with a segment get them back.
//!
//! When a segment goes (its node left or died), every complete object that kept at least one
//! complete replica, but fewer than it had, is queued with the count it had. Storage nodes
//! ask for repair work in the background ([`Master::take_repairs`]); each grant is an
//! ordinary copy task from a surviving replica to segments placed as a put's would be, so
//! reads, leases and eviction treat it like any copy. A repair that finds no room, or whose
//! object is busy (being written, or already copying), waits in the queue for the next ask;
//! one whose object was removed, replaced or is back at its count leaves the queue; a repair
//! task that fails goes back in. Objects with no replica left cannot be repaired: they are
//! counted as lost when their segment goes (`Stats::lost_objects`).

use smallvec::SmallVec;

use crate::ids::{ClientId, WriteId};
use crate::master::Master;
use crate::object::Replica;
use crate::placement::place;
use crate::replication::{CopyGrant, TaskKind, TaskPlan, Tasks};
use crate::time::Millis;

/// An object waiting for replicas: which one (its slot and write, in case the slot is
/// reused) and how many complete memory replicas it should have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Repair {
    pub slot: u32,
    pub write: WriteId,
    pub wanted: u8,
    /// Repair tasks for it that failed so far.
    pub failures: u8,
    /// Not handed out again before this (a failed repair backs off).
    pub not_before: Millis,
}

impl Repair {
    /// A repair of the object in `slot` (its write `write`) back to `wanted` replicas.
    pub(crate) fn new(slot: u32, write: WriteId, wanted: u8) -> Repair {
        Repair {
            slot,
            write,
            wanted,
            failures: 0,
            not_before: Millis::ZERO,
        }
    }

    /// The same repair after one more failure at `now`: tried again after a second, doubling
    /// up to a minute (a source that stays unreadable — damaged, or on a node that restarted
    /// but is not yet taken for gone — is not hammered).
    pub(crate) fn failed(self, now: Millis) -> Repair {
        let failures = self.failures.saturating_add(1);
        let backoff = Millis(1000u64 << failures.min(6)).min(Millis::from_secs(60));
        Repair {
            failures,
            not_before: now + backoff,
            ..self
        }
    }
}

/// What one queued repair came to.
enum Step {
    /// A copy task began.
    Started(String, CopyGrant),
    /// Not now (no room, or the object is busy): keep it queued.
    Later,
    /// Nothing left to do.
    Done,
}

impl Tasks {
    /// Queues `repair` behind those already waiting.
    pub(crate) fn queue_repair(&mut self, repair: Repair) {
        self.next_repair += 1;
        self.repairs.insert(self.next_repair, repair);
    }
}

impl Master {
    /// Starts up to `max` repair copies for `client` to carry out, each a copy task it must
    /// end, revoke or abort like any other; with the key each is for. Empty when nothing is
    /// waiting or nothing can be placed.
    pub fn take_repairs(
        &mut self,
        client: ClientId,
        max: usize,
        now: Millis,
    ) -> Vec<(String, CopyGrant)> {
        let now = self.advance(now);
        self.touch(client, now);
        let mut started = Vec::new();
        let mut later = Vec::new();
        for _ in 0..self.tasks.repairs.len() {
            if started.len() >= max {
                break;
            }
            let Some((_, repair)) = self.tasks.repairs.pop_first() else {
                break;
            };
            match self.start_repair(client, repair, now) {
                Step::Started(key, grant) => started.push((key, grant)),
                Step::Later => later.push(repair),
                Step::Done => {}
            }
        }
        for repair in later {
            self.tasks.queue_repair(repair);
        }
        started
    }

    /// Repairs waiting.
    pub fn repairs_waiting(&self) -> usize {
        self.tasks.repairs.len()
    }

    fn start_repair(&mut self, client: ClientId, repair: Repair, now: Millis) -> Step {
        let Some(object) = self.objects.get(repair.slot) else {
            return Step::Done;
        };
        if object.write_id() != repair.write {
            return Step::Done;
        }
        if object.writing() || object.task().is_some() || repair.not_before > now {
            return Step::Later;
        }
        let complete: SmallVec<[Replica; 2]> = object
            .replicas
            .iter()
            .filter(|r| r.is_complete())
            .copied()
            .collect();
        let missing = usize::from(repair.wanted).saturating_sub(complete.len());
        let Some(&source) = complete.first() else {
            return Step::Done;
        };
        if missing == 0 {
            return Step::Done;
        }
        let excluded: SmallVec<[u32; 4]> = object.replicas.iter().map(|r| r.segment).collect();
        let (size, key) = (object.size(), self.objects.key_of(object).to_string());
        let placed = place(
            &mut self.segments,
            &mut self.rng,
            size,
            missing,
            &[],
            &excluded,
        );
        if placed.is_empty() {
            return Step::Later;
        }
        let targets = placed.into_iter().collect();
        let plan = TaskPlan {
            client,
            slot: repair.slot,
            source,
            targets,
            kind: TaskKind::Copy,
            repair: Some(repair),
        };
        let grant = self.open_task(plan, now);
        Step::Started(key, grant)
    }
}
