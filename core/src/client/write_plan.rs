//! How a client writes: retrying a start the master refused as busy, grouping a batch's
//! transfers per node, and ending or aborting each write after its transfers.
//!
//! A failed write is aborted, never revoked: a transfer that timed out or lost its connection
//! may still land on the node, and an abort frees the key at once while keeping the blocks out
//! of reuse until the release timeout (a revoke would free them at once).

use std::collections::BTreeMap;

use crate::checksum::Checksum;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::SegmentId;
use crate::put::PutGrant;
use crate::time::Millis;

/// The first wait before retrying a start refused as busy.
const FIRST_BACKOFF: Millis = Millis(5);

/// Retries of a write start refused with `OBJECT_REPLICA_BUSY` (readers hold the value and
/// there is no room for a fresh copy yet): with doubling backoff, at most a quarter lease
/// apart, for up to two lease TTLs. By then the readers' leases have ended or their blocks
/// can be evicted, so a refusal after that is not going to pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyRetry {
    give_up_at: Millis,
    backoff: Millis,
    longest: Millis,
}

impl BusyRetry {
    /// Retries for a write first tried at `now`, under a lease TTL of `lease_ttl`.
    pub fn new(lease_ttl: Millis, now: Millis) -> BusyRetry {
        BusyRetry::giving_up_after(lease_ttl, BusyRetry::patience(lease_ttl), now)
    }

    /// How long a busy start is retried: two lease TTLs.
    pub fn patience(lease_ttl: Millis) -> Millis {
        Millis(lease_ttl.as_millis() * 2)
    }

    /// As [`BusyRetry::new`], giving up `patience` after `now` (a simulation shortens it).
    pub fn giving_up_after(lease_ttl: Millis, patience: Millis, now: Millis) -> BusyRetry {
        BusyRetry {
            give_up_at: now + patience,
            backoff: FIRST_BACKOFF,
            longest: Millis((lease_ttl.as_millis() / 4).max(1)),
        }
    }

    /// The start was refused with `error` at `now`: how long to wait before trying again, or
    /// `None` to report the error.
    pub fn after(&mut self, error: &Error, now: Millis) -> Option<Millis> {
        if error.code != ErrorCode::OBJECT_REPLICA_BUSY || now >= self.give_up_at {
            return None;
        }
        let wait = self.backoff;
        self.backoff = Millis(self.backoff.as_millis() * 2)
            .min(self.longest)
            .max(Millis(1));
        Some(wait)
    }
}

/// How a write ends after its transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// Every replica has the value: end it, with the checksum of what was written.
    End(Checksum),
    /// A transfer failed or may still land: abort (the blocks stay out of reuse until the
    /// release timeout).
    Abort,
}

/// One batch of writes, planned per node.
#[derive(Debug)]
pub struct WritePlan<N> {
    /// Per node: (job index, remote address) of every replica it holds.
    pub per_node: BTreeMap<N, Vec<(usize, u64)>>,
    /// Per job: the checksum every replica reported so far, or what failed it.
    outcomes: Vec<Result<Option<Checksum>>>,
}

impl<N: Ord + Clone> WritePlan<N> {
    /// Plans `grants` (one per job), with `node_of` resolving a segment to its node (`None`:
    /// no longer mounted, which fails that job).
    pub fn new(grants: &[&PutGrant], node_of: impl Fn(SegmentId) -> Option<N>) -> WritePlan<N> {
        let mut per_node: BTreeMap<N, Vec<(usize, u64)>> = BTreeMap::new();
        let mut outcomes = vec![Ok(None); grants.len()];
        for (job, grant) in grants.iter().enumerate() {
            for replica in &grant.replicas {
                match node_of(replica.segment) {
                    Some(node) => per_node.entry(node).or_default().push((job, replica.addr)),
                    None => outcomes[job] = Err(super::segment_gone(replica.segment)),
                }
            }
        }
        WritePlan { per_node, outcomes }
    }

    /// A node's transfers ended: `outcome` is the checksum of each of its `(job, address)`
    /// writes in order, or what failed them all.
    pub fn landed(&mut self, ops: &[(usize, u64)], outcome: Result<Vec<Checksum>>) {
        let sums = outcome.and_then(|sums| {
            if sums.len() == ops.len() {
                Ok(sums)
            } else {
                Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("{} checksums for {} writes", sums.len(), ops.len()),
                ))
            }
        });
        match sums {
            Ok(sums) => {
                for (&(job, _), sum) in ops.iter().zip(sums) {
                    self.outcomes[job] = match &self.outcomes[job] {
                        // Every replica must receive the same bytes.
                        Ok(Some(seen)) if *seen != sum => Err(Error::new(
                            ErrorCode::WRITE_FAIL,
                            "the value changed while it was being written; put it again",
                        )),
                        Ok(_) => Ok(Some(sum)),
                        Err(e) => Err(e.clone()),
                    };
                }
            }
            Err(e) => {
                for &(job, _) in ops {
                    self.outcomes[job] = Err(e.clone());
                }
            }
        }
    }

    /// Each job's checksum (of a value with no replica: the empty value's), or its error.
    pub fn outcomes(self) -> Vec<Result<Checksum>> {
        self.outcomes
            .into_iter()
            .map(|r| r.map(|sum| sum.unwrap_or(Checksum::EMPTY)))
            .collect()
    }
}

/// How a write whose transfers ended with `transfer` finishes.
pub fn finish(transfer: &Result<Checksum>) -> Finish {
    match transfer {
        Ok(sum) => Finish::End(*sum),
        Err(_) => Finish::Abort,
    }
}

/// Whether an end the master refused with `error` must be followed by an abort: the master
/// refuses bytes it knows to be wrong (`INVALID_WRITE`: a prefetch that does not match the
/// value's checksum), and the write is taken back rather than left to the discard timeout.
pub fn abort_after_refused_end(error: &Error) -> bool {
    error.code == ErrorCode::INVALID_WRITE
}

/// The error every job of a batch gets when the writer's fence is closed before it starts.
pub fn fence_closed() -> Error {
    Error::new(
        ErrorCode::TRANSFER_FAIL,
        "not writing: the write's fence has closed, because the master has not acknowledged \
         this client recently enough to be sure it still considers it alive, or the write's \
         own window (half the client TTL, plus its value at 64 MiB/s) passed before it began \
         (check the network path to the master, or raise the master's --client-ttl)",
    )
}

/// The error of a transfer to `endpoint` cut off at the writer's fence.
pub fn past_fence(endpoint: &str) -> Error {
    Error::new(
        ErrorCode::TRANSFER_FAIL,
        format!(
            "write to {endpoint} passed the writer's fence: it ran past its window (half the \
             client TTL, plus its value at 64 MiB/s) or the master stopped answering; check \
             the network, or raise the master's --client-ttl"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WriteId;
    use crate::object::{Medium, ReplicaDescriptor, ReplicaStatus};

    #[test]
    fn busy_starts_back_off_doubling_up_to_a_quarter_lease_for_two_leases() {
        let lease = Millis(100);
        let mut retry = BusyRetry::new(lease, Millis(1_000));
        let busy = Error::new(ErrorCode::OBJECT_REPLICA_BUSY, "busy");
        let waits: Vec<u64> = (0..5)
            .map(|_| retry.after(&busy, Millis(1_100)).unwrap().as_millis())
            .collect();
        assert_eq!(waits, [5, 10, 20, 25, 25]);
        assert_eq!(retry.after(&busy, Millis(1_200)), None, "two leases passed");
        let other = Error::new(ErrorCode::NO_AVAILABLE_HANDLE, "full");
        assert_eq!(
            BusyRetry::new(lease, Millis::ZERO).after(&other, Millis::ZERO),
            None
        );
    }

    fn grant(segments: &[u64]) -> PutGrant {
        PutGrant {
            write_id: WriteId(1),
            replicas: segments
                .iter()
                .map(|&s| ReplicaDescriptor {
                    segment: SegmentId(s),
                    addr: s * 100,
                    len: 4,
                    status: ReplicaStatus::Processing,
                    medium: Medium::Memory,
                })
                .collect(),
        }
    }

    #[test]
    fn a_batch_is_grouped_per_node_and_replicas_must_agree() {
        let (a, b) = (grant(&[1, 2]), grant(&[2, 3]));
        // Segments 1 and 2 on node "x", 3 unmounted.
        let mut plan = WritePlan::new(&[&a, &b], |s| (s.0 < 3).then_some("x"));
        assert_eq!(plan.per_node["x"], [(0, 100), (0, 200), (1, 200)]);
        let (one, two) = (Checksum::of(b"one"), Checksum::of(b"two"));
        let ops = plan.per_node["x"].clone();
        plan.landed(&ops, Ok(vec![one, two, two]));
        let out = plan.outcomes();
        assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::WRITE_FAIL);
        assert_eq!(
            out[1].as_ref().unwrap_err().code,
            ErrorCode::REPLICA_IS_GONE
        );
    }

    #[test]
    fn a_node_that_answers_the_wrong_count_fails_its_jobs() {
        let a = grant(&[1]);
        let mut plan = WritePlan::new(&[&a], |_| Some(0));
        let ops = plan.per_node[&0].clone();
        plan.landed(&ops, Ok(vec![]));
        assert_eq!(
            plan.outcomes()[0].as_ref().unwrap_err().code,
            ErrorCode::INTERNAL_ERROR
        );
        let ok = WritePlan::new(&[&a], |_| Some(0));
        let mut ok = ok;
        ok.landed(&[(0, 100)], Ok(vec![Checksum::of(b"v")]));
        assert_eq!(ok.outcomes()[0], Ok(Checksum::of(b"v")));
    }

    #[test]
    fn failures_abort_and_refused_ends_are_taken_back() {
        assert_eq!(finish(&Ok(Checksum::EMPTY)), Finish::End(Checksum::EMPTY));
        assert_eq!(finish(&Err(fence_closed())), Finish::Abort);
        assert!(abort_after_refused_end(&Error::new(
            ErrorCode::INVALID_WRITE,
            "x"
        )));
        assert!(!abort_after_refused_end(&Error::new(
            ErrorCode::OBJECT_NOT_FOUND,
            "x"
        )));
        assert!(super::super::per_key(vec![1, 2], 3, "X").is_err());
        assert_eq!(super::super::per_key(vec![1, 2], 2, "X").unwrap(), [1, 2]);
        assert!(past_fence("n:1").to_string().contains("n:1"));
    }
}
