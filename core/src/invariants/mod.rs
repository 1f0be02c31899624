//! The core's invariants, as code every test layer calls: unit tests, the proptest model test,
//! the fuzz target, snapshot restore, and the simulation's checks of the master's state.
//!
//! [`check`] verifies the state of a [`Master`] at rest (DESIGN.md invariants 2, 3, 5 and the
//! structural half of 6). Rules about decisions over time (a leased or hard-pinned object is
//! never evicted; soft-pinned objects go only after unpinned ones; readers never see PROCESSING
//! replicas) are judged from events and read results by the reference model in `testkit`.
//!
//! [`check_eviction_order`] judges one decision over time that a driver can check without a
//! model: right after a call that evicted, nothing left evictable ranks before what went.
//!
//! [`Auditor`] checks each call as it is made, for drivers that audit (tests, the simulation):
//! eviction order, the timeouts of the configuration as state invariants (`deadlines`), when
//! released blocks are reused (`reuse`), and that the KV events tell the readable keys
//! (`announced`).
//!
//! The checker never panics, whatever the state: it also vets restored snapshots.

mod announced;
mod audit;
mod deadlines;
mod reuse;

pub use announced::KeyEventLedger;
pub use audit::Auditor;
pub use deadlines::{check_bounds, check_timer_done};
pub use reuse::{ReuseCounts, ReuseLedger};

use std::collections::BTreeMap;
use std::fmt;

use crate::allocator::{OwnershipFault, check_ownership};
use crate::events::Event;
use crate::master::Master;
use crate::object::{EvictionClass, OffloadMark};
use crate::objects::ObjectTable;
use crate::segments::block_len;

/// A broken invariant: which one, and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Short name of the invariant.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {:?} broken: {}", self.invariant, self.detail)
    }
}

impl std::error::Error for Violation {}

fn violation(invariant: &'static str, detail: impl Into<String>) -> Violation {
    Violation {
        invariant,
        detail: detail.into(),
    }
}

/// Checks every at-rest invariant of `master`.
pub fn check(master: &Master) -> Result<(), Violation> {
    check_with(master, Scope::Everything)
}

/// [`check`] of a master being restored from a snapshot, but for what the restore derives
/// from its objects rather than reading it: the key index (built refusing a key held twice),
/// the usage per tenant and the unfinished writes' shares. Those agree with the objects by
/// construction, and the restore builds them while this runs beside it (see
/// [`ObjectTable::derive`]); checking each key against the index would cost a lookup per
/// object, seconds at ten million.
pub(crate) fn check_restored(master: &Master) -> Result<(), Violation> {
    check_with(master, Scope::AllButDerived)
}

/// How much of the state [`check_with`] checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Everything,
    AllButDerived,
}

/// [`check`], over `scope`.
fn check_with(master: &Master, scope: Scope) -> Result<(), Violation> {
    let blocks = master
        .segments
        .check()
        .map_err(|e| violation("allocator", e))?;
    let objects = match scope {
        Scope::Everything => ObjectTable::check,
        Scope::AllButDerived => ObjectTable::check_slots,
    };
    objects(&master.objects).map_err(|e| violation("object-index", e))?;
    check_conservation(master, &blocks)?;
    check_objects(master, scope)?;
    check_holds_and_tasks(master)?;
    check_clients(master)?;
    Ok(())
}

/// Checks least-recently-used eviction right after the call that reported `events`, at the
/// master's current time: every object it evicted in LRU order (not to open a contiguous
/// range, not a node's disk eviction) ranks no later than any object still evictable, by
/// tier (copies on disk first, then unpinned, then soft-pinned) and then by last access. A
/// block just written ranks as recent as one just read, so it never goes before an older
/// unpinned, unleased one. Objects waiting for their offload are left out, as eviction
/// leaves them, and so are `protected`: the keys the call itself shielded from its own
/// eviction (an upsert's, while it makes room for the new value).
pub fn check_eviction_order(
    master: &Master,
    events: &[Event],
    protected: &[&str],
) -> Result<(), Violation> {
    let latest_evicted = events
        .iter()
        .filter_map(|event| match event {
            Event::Evicted {
                key,
                soft_pinned,
                bytes,
                contiguous: false,
                kept_on_disk,
                last_access,
            } if *bytes > 0 => Some((
                eviction_tier(*kept_on_disk, *soft_pinned),
                *last_access,
                key,
            )),
            _ => None,
        })
        .max();
    let Some((tier, last_access, key)) = latest_evicted else {
        return Ok(());
    };
    let now = master.now;
    for (_, object) in master.objects.iter() {
        if object.offload() == OffloadMark::Queued
            || protected.contains(&master.objects.key_of(object))
        {
            continue;
        }
        let Some(class) = object.eviction_class(now) else {
            continue;
        };
        let rank = (
            eviction_tier(
                object.has_disk_replica(),
                class == EvictionClass::SoftPinned,
            ),
            object.last_access,
        );
        if rank < (tier, last_access) {
            return Err(violation(
                "eviction-order",
                format!(
                    "{key:?} (tier {tier}, last access {last_access}) was evicted while {:?} \
                     (tier {}, last access {}) stayed",
                    master.objects.key_of(object),
                    rank.0,
                    rank.1
                ),
            ));
        }
    }
    Ok(())
}

/// Eviction's tiers, first taken first.
fn eviction_tier(on_disk: bool, soft_pinned: bool) -> u8 {
    match (soft_pinned, on_disk) {
        (true, _) => 2,
        (false, true) => 0,
        (false, false) => 1,
    }
}

/// Every allocated byte belongs to exactly one replica or discarded entry, and every claim
/// lies on allocated bytes: no leaks, no double ownership (a double free waiting to happen),
/// sizes match.
///
/// The allocators keep books on free space only, so `used` lists allocated space as maximal
/// runs `(segment slot, offset, len)` in address order. Every owner's claim (a replica's block
/// of `block_len(size)` bytes, a discarded block) is sorted the same way, and the claims must
/// tile the runs exactly. It runs on every restore: one sort of the claims, one walk, and an
/// owner is named only when something is wrong.
fn check_conservation(master: &Master, used: &[(u32, u64, u64)]) -> Result<(), Violation> {
    // (segment slot, offset, len, owner): the owner as an object slot, or with the top bit
    // set the position of a discarded block, to be named only in a violation.
    const DISCARDED: u32 = 1 << 31;
    let discarded: Vec<(crate::time::Millis, &crate::discard::DiscardedBlock)> =
        master.discarded.iter().collect();
    let mut claims: Vec<(u32, u64, u64, u32)> = Vec::with_capacity(master.objects.len());
    for (slot, object) in master.objects.iter() {
        let len = block_len(object.size());
        claims.extend(
            object
                .replicas
                .iter()
                .map(|r| (r.segment, r.offset(), len, slot)),
        );
    }
    for (i, (_, block)) in discarded.iter().enumerate() {
        claims.push((block.segment, block.offset, block.len, DISCARDED | i as u32));
    }
    claims.sort_unstable_by_key(|c| (c.0, c.1));
    let name = |owner: u32| {
        if owner & DISCARDED != 0 {
            Owner::Discarded(discarded[(owner & !DISCARDED) as usize].0).name(master)
        } else {
            Owner::Object(owner).name(master)
        }
    };
    check_ownership(used, &claims).map_err(|fault| {
        violation(
            "conservation",
            match fault {
                OwnershipFault::Unowned { region, offset } => {
                    format!("block ({region}, @{offset}) is allocated but owned by nothing (leak)")
                }
                OwnershipFault::NotAllocated {
                    owner,
                    region,
                    offset,
                    len,
                } => format!(
                    "{} points at block ({region}, @{offset}, {len} bytes) which is not allocated \
                 (or is owned twice)",
                    name(owner)
                ),
                OwnershipFault::Twice {
                    region,
                    offset,
                    first,
                    second,
                } => format!(
                    "block ({region}, @{offset}) owned by both {} and {}",
                    name(first),
                    name(second)
                ),
                OwnershipFault::Empty {
                    owner,
                    region,
                    offset,
                } => format!(
                    "{} claims an empty block at ({region}, @{offset})",
                    name(owner)
                ),
            },
        )
    })
}

/// What owns a block, named only in a violation's message.
#[derive(Clone, Copy)]
enum Owner {
    /// A replica of the object in this slot.
    Object(u32),
    /// A discarded block, released at this time.
    Discarded(crate::time::Millis),
}

impl Owner {
    fn name(self, master: &Master) -> String {
        match self {
            Owner::Object(slot) => match master.objects.get(slot) {
                Some(object) => format!("object {:?}", master.objects.key_of(object)),
                None => format!("object slot {slot}"),
            },
            Owner::Discarded(release_at) => format!("discarded block due {release_at}"),
        }
    }
}

/// Per-object shape: replicas on distinct segments, statuses consistent with the write/task
/// state, every write tracked for the discard timeout.
fn check_objects(master: &Master, scope: Scope) -> Result<(), Violation> {
    let mut writing = 0u64;
    let mut disk_replicas = 0u64;
    let discard_timeout = master.config.put_start_discard_timeout;
    let deadline = master.next_deadline();
    // Looked up once per queued object: a search each, not a scan of every queue (a restart
    // with a large offload backlog would otherwise check in quadratic time).
    let queued = master.disks.queued_sorted();
    for (slot, object) in master.objects.iter() {
        let key = master.objects.key_of(object);
        if object.replicas.is_empty() && (object.writing() || !object.has_disk_replica()) {
            return Err(violation("object-shape", format!("{key:?} has no replica")));
        }
        if master.disks.has_ghost(key) {
            return Err(violation(
                "disk-ghost",
                format!(
                    "{key:?} exists, yet a departed node's older copy of it could still be adopted"
                ),
            ));
        }
        if object.has_disk_replica() {
            disk_replicas += 1;
            let Some(segment) = master
                .segments
                .get(object.disk())
                .filter(|_| master.disks.has_disk(object.disk()))
            else {
                return Err(violation(
                    "disk-replica",
                    format!(
                        "{key:?} has a disk copy on segment slot {}, which is not mounted or has no disk",
                        object.disk()
                    ),
                ));
            };
            if master
                .disks
                .is_tombstoned(&segment.name, key, object.write_id())
            {
                return Err(violation(
                    "disk-replica",
                    format!(
                        "{key:?}'s disk copy on {} is listed, yet its node is told to delete it",
                        segment.name
                    ),
                ));
            }
        }
        if object.offload() == OffloadMark::Queued
            && queued.binary_search(&(slot, object.write_id())).is_err()
        {
            return Err(violation(
                "disk-replica",
                format!("{key:?} is marked queued for offload but is in no queue"),
            ));
        }
        if object.size() == 0 {
            return Err(violation("object-shape", format!("{key:?} has size 0")));
        }
        for (i, replica) in object.replicas.iter().enumerate() {
            if master.segments.get(replica.segment).is_none() {
                return Err(violation(
                    "object-shape",
                    format!(
                        "{key:?} has a replica on unmounted segment slot {}",
                        replica.segment
                    ),
                ));
            }
            if object.replicas[..i]
                .iter()
                .any(|r| r.segment == replica.segment)
            {
                return Err(violation(
                    "distinct-segments",
                    format!(
                        "{key:?} has two replicas on segment slot {}",
                        replica.segment
                    ),
                ));
            }
        }
        let processing = object.replicas.iter().filter(|r| r.is_processing()).count();
        if object.writing() {
            writing += 1;
            if processing != object.replicas.len() {
                return Err(violation(
                    "object-shape",
                    format!("{key:?} is being written but has complete replicas"),
                ));
            }
            if object.task().is_some() {
                return Err(violation(
                    "object-shape",
                    format!("{key:?} is being written and replicated at once"),
                ));
            }
            let due = object.put_start() + discard_timeout;
            if !master.writes.contains(due, slot, object.write_id()) {
                return Err(violation(
                    "liveness",
                    format!("write of {key:?} is not tracked for its discard timeout"),
                ));
            }
            if deadline.is_none_or(|d| d > due) {
                return Err(violation(
                    "liveness",
                    format!("next_deadline {deadline:?} is after {key:?}'s discard at {due}"),
                ));
            }
        } else if object.task().is_none() && processing > 0 {
            return Err(violation(
                "object-shape",
                format!("{key:?} has PROCESSING replicas but no write or task"),
            ));
        } else if processing == object.replicas.len() && !object.has_disk_replica() {
            return Err(violation(
                "object-shape",
                format!("{key:?} has no complete replica and no write in progress"),
            ));
        }
    }
    let counters = &master.counters;
    let have_disk_copy = "objects have a disk copy";
    check_counter(
        "disk-replica",
        have_disk_copy,
        disk_replicas,
        counters.disk_replicas,
    )?;
    if scope == Scope::Everything {
        check_derived(master)?;
    }
    let being_written = "objects being written";
    check_counter(
        "object-shape",
        being_written,
        writing,
        counters.writing_objects,
    )
}

/// A counter the master keeps (`kept`) against the objects it counts (`counted`).
fn check_counter(
    invariant: &'static str,
    what: &str,
    counted: u64,
    kept: u64,
) -> Result<(), Violation> {
    match counted == kept {
        true => Ok(()),
        false => Err(violation(
            invariant,
            format!("{counted} {what}, counter says {kept}"),
        )),
    }
}

/// What the object table and the master keep derived from the objects, against the objects:
/// usage per tenant and the unfinished writes' shares.
fn check_derived(master: &Master) -> Result<(), Violation> {
    let mut usage = crate::tenant::TenantUsage::default();
    for (_, object) in master.objects.iter() {
        let key = master.objects.key_of(object);
        usage.add(key, object.size());
        if object.disk() != crate::object::NO_DISK {
            usage.count_disk(key, object.size(), true);
        }
    }
    if &usage != master.objects.tenants() {
        return Err(violation(
            "tenant-usage",
            format!(
                "objects and bytes per tenant are {:?}, the table counts {:?}",
                usage.iter().collect::<Vec<_>>(),
                master.objects.tenants().iter().collect::<Vec<_>>()
            ),
        ));
    }
    if master.unfinished != crate::quota::Unfinished::rebuild(&master.objects) {
        return Err(violation(
            "unfinished-share",
            "the unfinished puts counted against members differ from the writes in progress"
                .to_string(),
        ));
    }
    Ok(())
}

/// Hold counts match the hold table; task markers match the task table.
fn check_holds_and_tasks(master: &Master) -> Result<(), Violation> {
    let mut held: BTreeMap<u32, u32> = BTreeMap::new();
    for (_, hold) in master.holds.iter() {
        if master
            .objects
            .get(hold.slot)
            .is_some_and(|o| o.write_id() == hold.write)
        {
            *held.entry(hold.slot).or_default() += 1;
        }
    }
    for (slot, object) in master.objects.iter() {
        let expected = held.get(&slot).copied().unwrap_or(0);
        if object.holds() != expected {
            return Err(violation(
                "holds",
                format!(
                    "{:?} counts {} holds, the hold table has {expected}",
                    master.objects.key_of(object),
                    object.holds()
                ),
            ));
        }
        if let Some(task) = object.task() {
            let matches = master
                .tasks
                .iter()
                .any(|(&id, t)| id == task && t.slot == slot && t.write == object.write_id());
            if !matches {
                return Err(violation(
                    "tasks",
                    format!(
                        "{:?} marks {task} which is not running on it",
                        master.objects.key_of(object)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Every mounted segment belongs to a live client.
fn check_clients(master: &Master) -> Result<(), Violation> {
    for &slot in &master.segments.mounted {
        if let Some(segment) = master.segments.get(slot)
            && !master.clients.is_live(segment.owner)
        {
            return Err(violation(
                "membership",
                format!(
                    "segment {:?} belongs to dead client {}",
                    segment.name, segment.owner
                ),
            ));
        }
    }
    Ok(())
}
