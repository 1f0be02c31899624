//! How a client reads: which replica first, whether a read stayed inside its lease, and what
//! each way a read can fail means for the next step.
//!
//! Inside its lease a read's bytes cannot be overwritten, evicted or removed (the master
//! promises it), so bytes that fail their checksum then mean a damaged replica: read another.
//! Past the lease the blocks may have been reused under the read, and damage says nothing:
//! the read starts over with a fresh lease. The lease is measured from just before the
//! request for the replica list, and a tenth of it is kept as margin for clock rate
//! differences and the time between the last byte arriving and the check.

use crate::checksum::Checksum;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::SegmentId;
use crate::object::{Medium, ReplicaDescriptor};
use crate::reads::ReplicaList;
use crate::time::Millis;

/// How many times a read is started over (its lease ran out mid-transfer, its hold was
/// dropped, or the copies listed were gone) before the client gives up.
pub const READ_ATTEMPTS: usize = 3;

/// One read's plan: the lease it runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    /// The lease the master granted with the replica list.
    pub lease_ttl: Millis,
}

/// What to do after one attempt at a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadVerdict {
    /// The bytes are the value's: done.
    Done,
    /// Every copy listed was gone from its node: the value may have moved since it was listed
    /// (a prefetch brought it back to memory), so ask the master again. Reported if attempts
    /// run out.
    AskAgain(Error),
    /// The read outlived its lease (or lost its hold): its bytes prove nothing; read again.
    Outlived,
    /// The read failed for good.
    Fail(Error),
}

impl ReadPlan {
    /// The plan for a read under `list`'s lease.
    pub fn for_list(list: &ReplicaList) -> ReadPlan {
        ReadPlan {
            lease_ttl: list.lease_ttl,
        }
    }

    /// How long after asking a read may finish and be trusted: the lease less a tenth.
    pub fn usable_lease(&self) -> Millis {
        Millis(self.lease_ttl.as_millis() - self.lease_ttl.as_millis() / 10)
    }

    /// Whether a read asked for at `asked` and finished at `now` stayed inside its lease.
    pub fn inside_lease(&self, asked: Millis, now: Millis) -> bool {
        now.since(asked) < self.usable_lease()
    }

    /// The verdict on one read attempt: `outcome` of reading the replicas, and whether it
    /// finished inside its lease.
    pub fn judge(outcome: Result<()>, inside_lease: bool) -> ReadVerdict {
        match outcome {
            Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => ReadVerdict::AskAgain(e),
            Err(e) if inside_lease || e.code != ErrorCode::INVALID_REPLICA => ReadVerdict::Fail(e),
            _ if !inside_lease => ReadVerdict::Outlived,
            _ => ReadVerdict::Done,
        }
    }

    /// The verdict on a read under a hold: a hold the master dropped before the read ended
    /// (it took this client for dead) protected nothing, so damage then says nothing either.
    /// Every listed copy gone asks again, as under a lease: a hold keeps the object, not a
    /// disk copy its node may drop, and the value may be in memory by now (a prefetch).
    pub fn judge_held(outcome: Result<()>, hold_kept: bool) -> ReadVerdict {
        match outcome {
            Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => ReadVerdict::AskAgain(e),
            Err(e) if !hold_kept && e.code == ErrorCode::INVALID_REPLICA => ReadVerdict::Outlived,
            Err(e) => ReadVerdict::Fail(e),
            Ok(()) => ReadVerdict::Done,
        }
    }

    /// The error a read reports when every attempt was spent: what made it ask again, if
    /// that happened (`gone`), else that it kept outliving its lease.
    pub fn exhausted(key: &str, gone: Option<Error>) -> Error {
        gone.unwrap_or_else(|| {
            Error::new(
                ErrorCode::LEASE_EXPIRED,
                format!(
                    "reading {key:?} kept outliving its lease, or losing its hold (the master \
                     took this client for dead)"
                ),
            )
        })
    }

    /// Whether a batch read of one key that failed with `error` is worth one fresh single
    /// read: the batch outlived its lease, or every copy listed (`listed`) was gone.
    pub fn read_again(error: &Error, listed: bool) -> bool {
        error.code == ErrorCode::LEASE_EXPIRED
            || (error.code == ErrorCode::OBJECT_NOT_FOUND && listed)
    }

    /// A batch's outcome for one key once the batch outlived its lease: a success or damage
    /// proves nothing, so either becomes `LEASE_EXPIRED` (read again); other errors stand.
    pub fn outlived_batch<T>(outcome: Result<T>) -> Result<T> {
        match outcome {
            Err(e) if e.code != ErrorCode::INVALID_REPLICA => Err(e),
            _ => Err(Error::new(
                ErrorCode::LEASE_EXPIRED,
                "the batch outlived its lease",
            )),
        }
    }
}

/// Replicas in the order to try them: memory before disk, the reader's own segment (`local`)
/// first, otherwise starting at `rotation` (modulo the count) so load spreads over replicas.
pub fn read_order(
    replicas: &[ReplicaDescriptor],
    local: Option<SegmentId>,
    rotation: usize,
) -> Vec<&ReplicaDescriptor> {
    if replicas.is_empty() {
        return Vec::new();
    }
    let start = rotation % replicas.len();
    let mut order: Vec<&ReplicaDescriptor> =
        replicas[start..].iter().chain(&replicas[..start]).collect();
    order.sort_by_key(|r| (r.medium == Medium::Disk, Some(r.segment) != local));
    order
}

/// The length of the value a replica list describes, checked before anything is allocated or
/// read for it: a list with no replica, or whose replicas disagree, or whose length this
/// process cannot address, is a confused or lying master's, and an error.
pub fn value_len(key: &str, list: &ReplicaList) -> Result<usize> {
    let lying = |what: String| {
        Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("the master described {key:?} {what}"),
        )
    };
    let first = list
        .replicas
        .first()
        .ok_or_else(|| lying("with no replica".into()))?;
    if let Some(other) = list.replicas.iter().find(|r| r.len != first.len) {
        return Err(lying(format!(
            "with replicas of {} and {} bytes",
            first.len, other.len
        )));
    }
    usize::try_from(first.len)
        .ok()
        .filter(|&len| len <= isize::MAX as usize)
        .ok_or_else(|| lying(format!("as {} bytes", first.len)))
}

/// Checks the checksum of the bytes read from `replica` of `key` against the value's: a
/// mismatch means that replica is damaged (`INVALID_REPLICA`; read another).
pub fn verify(
    key: &str,
    replica: &ReplicaDescriptor,
    expected: Checksum,
    got: Checksum,
) -> Result<()> {
    if got == expected {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::INVALID_REPLICA,
        format!(
            "the copy of {key:?} on {} ({:?}) is damaged: its bytes have {got}, the value has \
             {expected}; if no copy is intact, remove the key and put it again",
            replica.segment, replica.medium
        ),
    ))
}

/// What stopped the replicas tried so far, kept so that the error a read reports says most
/// about the object.
#[derive(Debug, Default)]
pub struct ReplicaFailures {
    last: Option<Error>,
    /// A replica failed (the read, if it succeeds, fell back).
    pub any: bool,
}

impl ReplicaFailures {
    /// A replica failed with `error`. Returns whether the failure was a stale copy after
    /// another had already failed: a node without the copy the master listed says little
    /// about the object, so the earlier error is kept.
    pub fn record(&mut self, error: Error) -> bool {
        self.any = true;
        if error.code != ErrorCode::OBJECT_NOT_FOUND || self.last.is_none() {
            self.last = Some(error);
            false
        } else {
            true
        }
    }

    /// The error to report when no replica could be read.
    pub fn into_error(self) -> Error {
        self.last
            .unwrap_or_else(|| Error::new(ErrorCode::REPLICA_IS_NOT_READY, "no readable replica"))
    }
}

/// Whether the pull of a disk copy staged at `asked`, finished at `now`, came inside the
/// staging slot's TTL: the node may reuse the slot after it, so later bytes may be another
/// value's.
pub fn staged_in_time(asked: Millis, now: Millis, slot_ttl: Millis) -> bool {
    now.since(asked) < slot_ttl
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::ReplicaStatus;

    fn replica(segment: u64, medium: Medium) -> ReplicaDescriptor {
        ReplicaDescriptor {
            segment: SegmentId(segment),
            addr: 0,
            len: 10,
            status: ReplicaStatus::Complete,
            medium,
        }
    }

    fn code(e: ErrorCode) -> Error {
        Error::new(e, "x")
    }

    #[test]
    fn memory_before_disk_local_first_then_rotating() {
        let rs = [
            replica(1, Medium::Memory),
            replica(2, Medium::Memory),
            replica(3, Medium::Memory),
            replica(4, Medium::Disk),
        ];
        let segs = |order: Vec<&ReplicaDescriptor>| -> Vec<u64> {
            order.iter().map(|r| r.segment.0).collect()
        };
        assert_eq!(segs(read_order(&rs, None, 0)), [1, 2, 3, 4]);
        assert_eq!(segs(read_order(&rs, None, 1)), [2, 3, 1, 4]);
        assert_eq!(segs(read_order(&rs, Some(SegmentId(3)), 0)), [3, 1, 2, 4]);
        assert_eq!(segs(read_order(&rs, Some(SegmentId(4)), 7)), [1, 2, 3, 4]);
        assert!(read_order(&[], None, 3).is_empty());
    }

    #[test]
    fn the_lease_keeps_a_tenth_as_margin() {
        let plan = ReadPlan {
            lease_ttl: Millis(1_000),
        };
        assert!(plan.inside_lease(Millis(100), Millis(999)));
        assert!(!plan.inside_lease(Millis(100), Millis(1_000)));
    }

    #[test]
    fn damage_inside_the_lease_fails_and_past_it_reads_again() {
        let damaged = || Err(code(ErrorCode::INVALID_REPLICA));
        assert!(matches!(
            ReadPlan::judge(damaged(), true),
            ReadVerdict::Fail(_)
        ));
        assert_eq!(ReadPlan::judge(damaged(), false), ReadVerdict::Outlived);
        assert_eq!(ReadPlan::judge(Ok(()), false), ReadVerdict::Outlived);
        assert_eq!(ReadPlan::judge(Ok(()), true), ReadVerdict::Done);
        let gone = ReadPlan::judge(Err(code(ErrorCode::OBJECT_NOT_FOUND)), true);
        assert!(matches!(gone, ReadVerdict::AskAgain(_)));
        let refused = ReadPlan::judge(Err(code(ErrorCode::TRANSFER_FAIL)), false);
        assert!(matches!(refused, ReadVerdict::Fail(_)));
        assert_eq!(
            ReadPlan::exhausted("k", None).code,
            ErrorCode::LEASE_EXPIRED
        );
        let ReadVerdict::AskAgain(gone) = gone else {
            unreachable!()
        };
        assert_eq!(
            ReadPlan::exhausted("k", Some(gone)).code,
            ErrorCode::OBJECT_NOT_FOUND
        );
    }

    #[test]
    fn a_dropped_hold_makes_damage_meaningless() {
        let damaged = || Err(code(ErrorCode::INVALID_REPLICA));
        assert_eq!(
            ReadPlan::judge_held(damaged(), false),
            ReadVerdict::Outlived
        );
        assert!(matches!(
            ReadPlan::judge_held(damaged(), true),
            ReadVerdict::Fail(_)
        ));
        assert_eq!(ReadPlan::judge_held(Ok(()), false), ReadVerdict::Done);
    }

    #[test]
    fn a_held_read_whose_listed_copies_are_gone_asks_again() {
        for kept in [true, false] {
            let gone = ReadPlan::judge_held(Err(code(ErrorCode::OBJECT_NOT_FOUND)), kept);
            assert!(matches!(gone, ReadVerdict::AskAgain(_)), "{gone:?}");
        }
        let refused = ReadPlan::judge_held(Err(code(ErrorCode::TRANSFER_FAIL)), true);
        assert!(matches!(refused, ReadVerdict::Fail(_)));
    }

    #[test]
    fn an_outlived_batch_keeps_only_errors_that_are_not_damage() {
        assert_eq!(
            ReadPlan::outlived_batch(Ok(3)).unwrap_err().code,
            ErrorCode::LEASE_EXPIRED
        );
        let damaged: Result<()> = Err(code(ErrorCode::INVALID_REPLICA));
        assert_eq!(
            ReadPlan::outlived_batch(damaged).unwrap_err().code,
            ErrorCode::LEASE_EXPIRED
        );
        let gone: Result<()> = Err(code(ErrorCode::OBJECT_NOT_FOUND));
        assert_eq!(
            ReadPlan::outlived_batch(gone).unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        assert!(ReadPlan::read_again(&code(ErrorCode::LEASE_EXPIRED), false));
        assert!(ReadPlan::read_again(
            &code(ErrorCode::OBJECT_NOT_FOUND),
            true
        ));
        assert!(!ReadPlan::read_again(
            &code(ErrorCode::OBJECT_NOT_FOUND),
            false
        ));
    }

    #[test]
    fn a_lying_list_is_refused_before_anything_is_allocated() {
        let list = |replicas: Vec<ReplicaDescriptor>| ReplicaList {
            replicas,
            lease_ttl: Millis(1),
            checksum: Checksum::EMPTY,
        };
        assert_eq!(
            value_len("k", &list(vec![replica(1, Medium::Memory)])).unwrap(),
            10
        );
        assert!(value_len("k", &list(vec![])).is_err());
        let mut other = replica(2, Medium::Memory);
        other.len = 11;
        assert!(value_len("k", &list(vec![replica(1, Medium::Memory), other])).is_err());
    }

    #[test]
    fn a_stale_copy_does_not_hide_what_stopped_the_others() {
        let mut failures = ReplicaFailures::default();
        assert!(!failures.record(code(ErrorCode::INVALID_REPLICA)));
        assert!(failures.record(code(ErrorCode::OBJECT_NOT_FOUND)));
        assert!(failures.any);
        assert_eq!(failures.into_error().code, ErrorCode::INVALID_REPLICA);
        assert_eq!(
            ReplicaFailures::default().into_error().code,
            ErrorCode::REPLICA_IS_NOT_READY
        );
    }

    #[test]
    fn checksums_and_staging_slots() {
        let r = replica(1, Medium::Memory);
        let sum = Checksum::of(b"value");
        assert!(verify("k", &r, sum, sum).is_ok());
        let damaged = verify("k", &r, sum, Checksum::EMPTY).unwrap_err();
        assert_eq!(damaged.code, ErrorCode::INVALID_REPLICA);
        assert!(staged_in_time(Millis(10), Millis(19), Millis(10)));
        assert!(!staged_in_time(Millis(10), Millis(20), Millis(10)));
    }
}
