//! Rare paths the services went down, counted in simulation builds only, so a simulation run
//! can show which of them it exercised (`scripts/sim.sh ci` sums them over its seeds and
//! holds each to a floor). In production builds [`hit`] compiles away.
//!
//! Like [`crate::buggify`], the counts live in a thread-local: each simulation runs on its
//! own thread.

/// A path worth knowing a simulation reached. Paths are constants, so a typo is a compile
/// error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Path(&'static str);

impl Path {
    /// A get read a value from a node's disk copy.
    pub const READ_FROM_DISK: Path = Path("read from a disk copy");
    /// A get succeeded from another replica after one failed (or was damaged).
    pub const READ_FELL_BACK: Path = Path("read fell back to another replica");
    /// A read outlived its lease and asked again.
    pub const READ_OUTLIVED_LEASE: Path = Path("read outlived its lease");
    /// A node evicted copies from its disk to make room.
    pub const NODE_DISK_EVICTION: Path = Path("node evicted from its disk");
    /// A node found a disk copy damaged when staging it and dropped it.
    pub const DISK_COPY_DAMAGED: Path = Path("disk copy found damaged");
    /// A node's staging buffer ran full: it reclaimed slots whose readers outstayed their
    /// TTL, or refused the load.
    pub const STAGING_FULL: Path = Path("staging buffer ran full");
    /// A held read ended after its lease would have (only the hold protected it).
    pub const HELD_PAST_LEASE: Path = Path("held read outlasted its lease");
    /// A held read lost its hold (the master took its client for dead) and read again.
    pub const HOLD_LAPSED: Path = Path("held read lost its hold");
    /// The master refused a prefetch whose bytes did not match the value's checksum.
    pub const PREFETCH_REFUSED: Path = Path("damaged prefetch refused");
    /// A reader asked a node for a disk copy it holds at another write (an old replica
    /// list meeting a rewritten key).
    pub const DISK_OTHER_VERSION: Path = Path("disk read of a replaced version");
    /// As [`Path::DISK_OTHER_VERSION`], the two versions of the same length (only the
    /// version tells them apart).
    pub const DISK_OTHER_VERSION_SAME_SIZE: Path =
        Path("disk read of a replaced version, same size");
    /// A read's replica said "not found" (a stale disk copy) after another replica failed
    /// otherwise: the read reports the other failure.
    pub const STALE_COPY_AFTER_FAILURE: Path = Path("stale copy after a failed replica");
    /// Every copy a get was listed was gone from its node (a disk copy the node dropped
    /// after the master listed it): the get asked the master again.
    pub const LISTED_COPY_GONE: Path = Path("listed copies gone, asked again");
    /// A writer's fence was closed before its transfers began: the master had not answered it
    /// recently enough, or its answers broke off for a TTL since the write started.
    pub const WRITE_FENCED: Path = Path("write fenced before its transfers");
    /// A master restarted on its state directory and replayed its journal.
    pub const MASTER_RECOVERED: Path = Path("master recovered from its journal");
    /// A master's journal ended in a torn or damaged record no sync mark vouched for: the
    /// tail after the last sync, dropped as unacknowledged.
    pub const JOURNAL_TORN_TAIL: Path = Path("journal tail torn by a crash, dropped");
    /// A master refused to start: its journal was damaged before records it had synced.
    pub const JOURNAL_DAMAGE_REFUSED: Path = Path("damaged journal refused at start");
    /// A master's state directory was full: records held, changes refused.
    pub const JOURNAL_FULL: Path = Path("state directory full, changes refused");
    /// A master's journal could not sync: it stopped acknowledging changes (fail-stop).
    pub const JOURNAL_FAILED: Path = Path("journal sync failed, master stopped changes");
    /// A node's repair agent copied back a replica lost with a segment.
    pub const REPLICA_REPAIRED: Path = Path("replica lost with a node repaired");
    /// A repair copy failed (its source unreadable or damaged, a target gone): the master
    /// queued it again, with a backoff.
    pub const REPAIR_FAILED: Path = Path("repair copy failed and was queued again");
    /// A node's recovery scan dropped records it could not trust.
    pub const RECOVERY_DROPPED: Path = Path("recovery dropped records");
    /// As [`Path::RECOVERY_DROPPED`], by the bucket backend.
    pub const RECOVERY_DROPPED_BUCKET: Path = Path("recovery dropped records (bucket)");
    /// As [`Path::RECOVERY_DROPPED`], by the file-per-key backend.
    pub const RECOVERY_DROPPED_FILE_PER_KEY: Path = Path("recovery dropped records (file per key)");
    /// As [`Path::RECOVERY_DROPPED`], by the offset-file backend.
    pub const RECOVERY_DROPPED_OFFSET_FILE: Path = Path("recovery dropped records (offset file)");
    /// A node's recovery scan found records on its disk (kept or dropped), by the bucket
    /// backend: a restart on a disk in use.
    pub const RECOVERY_CHECKED_BUCKET: Path = Path("recovery checked records (bucket)");
    /// As [`Path::RECOVERY_CHECKED_BUCKET`], by the file-per-key backend.
    pub const RECOVERY_CHECKED_FILE_PER_KEY: Path = Path("recovery checked records (file per key)");
    /// As [`Path::RECOVERY_CHECKED_BUCKET`], by the offset-file backend.
    pub const RECOVERY_CHECKED_OFFSET_FILE: Path = Path("recovery checked records (offset file)");
    /// A standby master took over from its copy of the leader's state.
    pub const STANDBY_TOOK_OVER: Path = Path("standby took over from its copy");
    /// A member holding a valid credential tried to act as another member or beyond its
    /// roles, and the master refused it (the simulation's insider).
    pub const INSIDER_REFUSED: Path = Path("insider refused at the master");
    /// A same-host writer was held mid-copy until its blocks could be handed out again (the
    /// simulation's hold; the writer's fence must stop the rest).
    pub const SHM_WRITE_HELD: Path = Path("same-host write held mid-copy past its release");
    /// A same-host client's write to a node it could not map was held before it went over
    /// the other transport, until its blocks could be handed out again (the simulation's
    /// hold; the writer's window must not start again when it does).
    pub const SHM_FALLBACK_HELD: Path =
        Path("same-host client's write held before going over TCP past its release");
    /// A node's receipt of a write was held while the node remounted its segment (the
    /// simulation's hold; the node must refuse the rest).
    pub const NODE_WRITE_HELD_REMOUNTED: Path = Path("write held at its node across a remount");
    /// A standby fell behind and was recorded out of sync by the leader.
    pub const STANDBY_DROPPED: Path = Path("standby fell behind and was dropped");

    /// The path's name, as the simulation prints it.
    pub fn name(self) -> &'static str {
        self.0
    }
}

/// Counts one pass down `path` (simulation builds only).
#[inline]
pub fn hit(path: Path) {
    #[cfg(madsim)]
    sim::hit(path);
    let _ = path;
}

/// The paths passed since the last call on this thread, with how often; empty outside
/// simulation builds.
pub fn take() -> Vec<(&'static str, u64)> {
    #[cfg(madsim)]
    return sim::take();
    #[cfg(not(madsim))]
    Vec::new()
}

#[cfg(madsim)]
mod sim {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    thread_local! {
        static HITS: RefCell<BTreeMap<super::Path, u64>> = const { RefCell::new(BTreeMap::new()) };
    }

    pub(super) fn hit(path: super::Path) {
        HITS.with(|hits| *hits.borrow_mut().entry(path).or_default() += 1);
    }

    pub(super) fn take() -> Vec<(&'static str, u64)> {
        HITS.with(|hits| {
            std::mem::take(&mut *hits.borrow_mut())
                .into_iter()
                .map(|(path, n)| (path.name(), n))
                .collect()
        })
    }
}
