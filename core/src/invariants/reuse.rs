//! When a block of segment memory may be handed out again, checked where the promise is made.
//!
//! Two kinds of someone may still touch a block after its object lets go of it:
//!
//! - the writer of a write the master abandoned (timed out, preempted, aborted): it may still
//!   be writing, so the block waits until the write fence says its last byte has landed (a
//!   write window and the late-landing bound after the write started, at most
//!   `put_start_release_timeout`), or until the master has declared the writer dead;
//! - readers of a complete value: they may read until their lease ends, so the block waits
//!   until the object's last lease plus `lease_grace`.
//!
//! Later layers (the write fence, checksums, the client's lease margin) hide a block reused
//! too soon from every reader, so a read-based oracle alone never sees such a slip. The
//! ledger watches the master's memory replicas after every call, works out each released
//! block's due time from the configuration by itself (not from the master's discarded list),
//! and reports a block given to another write before that time.
//!
//! Known gap: a copy or move target the task's client revoked is free at once, and an
//! aborted one waits; the ledger cannot tell the two apart from state, so it treats every
//! released task target as free at once.

use std::collections::BTreeMap;

use super::{Violation, violation};
use crate::client::fence::SLOWEST_WRITE_RATE;
use crate::events::{DiscardCause, Event};
use crate::ids::{ClientId, SegmentId, TaskId, WriteId};
use crate::master::Master;
use crate::segments::block_len;
use crate::time::Millis;

/// One memory block as an object holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Holding {
    /// Its segment and offset.
    place: (SegmentId, u64),
    write: WriteId,
    /// The copy or move that placed it, while it is that task's target.
    task: Option<TaskId>,
    len: u64,
    complete: bool,
    writer: ClientId,
    /// When the write (or task) filling it started.
    started: Millis,
    /// From when no reader of its value can be reading (zero: never leased).
    readers_done: Millis,
}

impl Holding {
    /// Whether `other` is the same block of the same write (write ids are unique): a status
    /// change, not a reuse.
    fn same_use(&self, other: &Holding) -> bool {
        self.place == other.place
            && self.write == other.write
            && self.task == other.task
            && self.len == other.len
    }
}

/// A released block that must not be reused before `free_from`.
#[derive(Clone, Debug)]
struct Claim {
    len: u64,
    free_from: Millis,
    /// For an abandoned write: the writer, whose death frees the block early.
    writer: Option<ClientId>,
    /// The master has declared that writer dead (for good: a writer that comes back has its
    /// old writes fenced).
    writer_dead: bool,
    /// The write that held it.
    write: WriteId,
    why: &'static str,
}

/// What the ledger has checked, for coverage reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReuseCounts {
    /// Blocks reused after an abandoned write's release delay ran out.
    pub after_writer_delay: u64,
    /// Blocks reused early because the abandoned write's writer was declared dead.
    pub after_writer_death: u64,
    /// Blocks reused after a leased value's readers were done (lease plus grace).
    pub after_readers: u64,
}

/// The memory blocks the master's objects held at the last call, and the released blocks not
/// yet free.
#[derive(Default)]
pub struct ReuseLedger {
    /// By place, as of the last call.
    held: Vec<Holding>,
    /// The buffer the next call's holdings are gathered in.
    next: Vec<Holding>,
    /// [`layout_digest`] as of the last call: most calls change no replica and no lease.
    digest: u64,
    claims: BTreeMap<(SegmentId, u64), Claim>,
    counts: ReuseCounts,
}

impl ReuseLedger {
    /// Takes in the master's state after a call that reported `events`; an error names a block
    /// handed out before its due time.
    pub fn observe(&mut self, master: &Master, events: &[Event]) -> Result<(), Violation> {
        self.mark_dead_writers(master);
        let digest = layout_digest(master);
        if digest == self.digest && !self.held.is_empty() {
            return Ok(());
        }
        self.digest = digest;
        let mut held = std::mem::take(&mut self.next);
        holdings(master, &mut held);
        // Both lists are sorted by place: walk them together.
        let (mut i, mut j) = (0, 0);
        let mut released = Vec::new();
        let mut fresh = Vec::new();
        while i < self.held.len() || j < held.len() {
            match (self.held.get(i), held.get(j)) {
                (Some(was), Some(now)) if was.same_use(now) => {
                    i += 1;
                    j += 1;
                }
                (Some(was), Some(now)) if was.place <= now.place => {
                    released.push(i);
                    i += 1;
                    if was.place == now.place {
                        fresh.push(j);
                        j += 1;
                    }
                }
                (Some(_), Some(_)) | (None, Some(_)) => {
                    fresh.push(j);
                    j += 1;
                }
                (Some(_), None) => {
                    released.push(i);
                    i += 1;
                }
                (None, None) => unreachable!("the loop stops when both lists are walked"),
            }
        }
        let mut found = Ok(());
        for &i in &released {
            let was = &self.held[i];
            if let Err(v) = check_departed_writer(master, was, events)
                && found.is_ok()
            {
                found = Err(v);
            }
            self.claims
                .insert(was.place, claim_for(master, was, events));
        }
        if !self.claims.is_empty() {
            // Claims on a segment that went away lapse with it; a claim with no delay (a
            // revoked write's block) is no claim.
            let mounted: Vec<SegmentId> = master.segments.iter().map(|(_, s)| s.id).collect();
            self.claims.retain(|(segment, _), claim| {
                mounted.contains(segment) && claim.free_from > Millis::ZERO
            });
            self.mark_dead_writers(master);
        }
        for &j in &fresh {
            if let Err(v) = self.check_new_use(master, &held[j])
                && found.is_ok()
            {
                found = Err(v);
            }
        }
        self.next = std::mem::replace(&mut self.held, held);
        found
    }

    /// Notes each claim whose abandoned writer the master has declared dead.
    fn mark_dead_writers(&mut self, master: &Master) {
        for claim in self.claims.values_mut() {
            if claim.writer.is_some_and(|w| !master.clients.is_live(w)) {
                claim.writer_dead = true;
            }
        }
    }

    /// What the ledger has checked so far.
    pub fn counts(&self) -> ReuseCounts {
        self.counts
    }

    fn check_new_use(&mut self, master: &Master, holding: &Holding) -> Result<(), Violation> {
        if self.claims.is_empty() {
            return Ok(());
        }
        let (segment, offset) = holding.place;
        let now = master.now;
        let end = offset + holding.len;
        let overlapping: Vec<(u64, Claim)> = self
            .claims
            .range((segment, 0)..(segment, end))
            .filter(|((_, at), claim)| at + claim.len > offset)
            .map(|((_, at), claim)| (*at, claim.clone()))
            .collect();
        // Each claim is settled by the first new use of its bytes.
        for (at, _) in &overlapping {
            self.claims.remove(&(segment, *at));
        }
        for (at, claim) in overlapping {
            if claim.free_from <= now {
                match claim.writer {
                    Some(_) => self.counts.after_writer_delay += 1,
                    None => self.counts.after_readers += 1,
                }
                continue;
            }
            if claim.writer_dead {
                self.counts.after_writer_death += 1;
                continue;
            }
            return Err(violation(
                "block-reuse",
                format!(
                    "write {:?} got bytes {offset}..{end} of segment {segment} at {now}, but \
                     bytes {at}..{} held write {:?} and may not be reused before {} ({})",
                    holding.write,
                    at + claim.len,
                    claim.write,
                    claim.free_from,
                    claim.why
                ),
            ));
        }
        Ok(())
    }
}

/// A digest of every replica's place, write, status and its object's lease: equal digests
/// (almost surely) mean nothing the ledger tracks changed.
fn layout_digest(master: &Master) -> u64 {
    let mut digest = 0u64;
    for (_, object) in master.objects.iter() {
        let object_part = object
            .write_id()
            .0
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(
                object
                    .lease_expiry
                    .as_millis()
                    .wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
            )
            .wrapping_add(
                u64::from(object.leased())
                    ^ (object.task().map_or(0, |t| t.0) | u64::from(object.prefetch()) << 63)
                        .rotate_left(17),
            );
        for replica in &object.replicas {
            let place = (u64::from(replica.segment) << 56)
                ^ replica.offset()
                ^ u64::from(replica.is_complete()) << 55;
            // A sum: the order objects are visited in does not matter.
            digest = digest.wrapping_add(
                (object_part ^ place)
                    .wrapping_mul(0xFF51_AFD7_ED55_8CCD)
                    .rotate_left(31),
            );
        }
    }
    digest
}

/// Every memory replica's block, sorted by segment and offset, into `held`.
fn holdings(master: &Master, held: &mut Vec<Holding>) {
    held.clear();
    let grace = master.config.lease_grace;
    for (slot, object) in master.objects.iter() {
        let task = object.task();
        let task_started = task.and_then(|t| master.tasks.get(t)).map(|t| t.started);
        for replica in &object.replicas {
            let complete = replica.is_complete();
            // A PROCESSING replica of an object not being written is a copy's target.
            let target = !complete && !object.writing();
            let Some(segment) = master.segments.get(replica.segment) else {
                continue;
            };
            held.push(Holding {
                place: (segment.id, replica.offset()),
                write: object.write_id(),
                task: if target { task } else { None },
                len: block_len(object.size()),
                complete,
                writer: master.objects.writer(slot),
                started: match (target, task_started) {
                    (true, Some(at)) => at,
                    _ => object.put_start(),
                },
                readers_done: if object.leased() {
                    object.lease_expiry + grace
                } else {
                    Millis::ZERO
                },
            });
        }
    }
    held.sort_unstable_by_key(|h| h.place);
}

/// When the last byte of a write started at `started` can have landed, worked out here from
/// the fence's parts rather than asked of the rule the master uses
/// (`FenceRule::writes_land_by`), so a slip there is a reuse here.
/// The block's length stands in for the value's size: never shorter, so never an earlier
/// bound than the master's.
fn last_landing(master: &Master, started: Millis, len: u64) -> Millis {
    let rule = master.config.fence_rule();
    let moving = Millis(len.saturating_mul(1_000).div_ceil(SLOWEST_WRITE_RATE));
    let window_then_late = rule.write_window() + moving + rule.late_landing() + Millis(1);
    started + window_then_late.min(master.config.put_start_release_timeout)
}

/// A write abandoned because its writer died or left must be that writer's: another client's
/// departure does not end a present client's write. (A client that said goodbye is still
/// live until its silence reaches the TTL, but no longer present.)
fn check_departed_writer(
    master: &Master,
    was: &Holding,
    events: &[Event],
) -> Result<(), Violation> {
    let departed = events.iter().any(|e| {
        matches!(e, Event::WriteDiscarded {
            write,
            cause: DiscardCause::WriterDead | DiscardCause::WriterLeft,
            ..
        } if *write == was.write)
    });
    if departed && !was.complete && was.task.is_none() && master.clients.is_present(was.writer) {
        return Err(violation(
            "departed-writer",
            format!(
                "write {:?} was abandoned as its writer's departure, but its writer {} is present",
                was.write, was.writer
            ),
        ));
    }
    Ok(())
}

/// The claim on a block its object let go of in the call that reported `events`.
fn claim_for(master: &Master, was: &Holding, events: &[Event]) -> Claim {
    let abandoned = !was.complete
        && was.task.is_none()
        && events
            .iter()
            .any(|e| matches!(e, Event::WriteDiscarded { write, .. } if *write == was.write));
    if abandoned {
        Claim {
            len: was.len,
            free_from: last_landing(master, was.started, was.len),
            writer: Some(was.writer),
            writer_dead: false,
            write: was.write,
            why: "its abandoned writer may still be writing",
        }
    } else if was.complete {
        Claim {
            len: was.len,
            free_from: was.readers_done,
            writer: None,
            writer_dead: false,
            write: was.write,
            why: "readers of its value may still be reading",
        }
    } else {
        // Revoked by its writer (or a task target): nothing will touch it.
        Claim {
            len: was.len,
            free_from: Millis::ZERO,
            writer: None,
            writer_dead: false,
            write: was.write,
            why: "revoked",
        }
    }
}
