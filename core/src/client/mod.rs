//! The client's side of the protocol, as pure values that take `now`: the rules a client
//! follows when it writes, reads and stays a member, stated once so that the client library,
//! the model test and the simulation all run the same ones.
//!
//! | module | rule |
//! | --- | --- |
//! | [`fence`] | the write fence: how long a writer may write, and the inequality that keeps a late write out of reused blocks |
//! | [`sender_clock`] | a node's view of a writer's clock: when a write arrived too late to apply |
//! | [`read_plan`] | which replica to read, whether a read stayed inside its lease, what a failed read means |
//! | [`write_plan`] | busy retries, grouping a batch per node, ending or aborting a write |
//! | [`staging_waves`] | cutting a batch that touches device memory into waves that fit a staging slab |
//! | [`membership`] | heartbeat period, when a node mounts again, how long it waits for its name |
//!
//! The client library (`mooring`'s `client` and `presence` modules) drives these values: it
//! reads the clock, moves the bytes and sends the requests; every number and every decision
//! comes from here.

pub mod fence;
pub mod membership;
pub mod read_plan;
pub mod sender_clock;
pub mod staging_waves;
pub mod write_plan;

pub use fence::{FenceRule, WriteWindow};
pub use membership::{Membership, MountRetry};
pub use read_plan::{ReadPlan, ReadVerdict};
pub use sender_clock::SenderClockView;
pub use staging_waves::{StagingWaves, Wave};
pub use write_plan::{BusyRetry, Finish, WritePlan};

use crate::error::{Error, ErrorCode, Result};
use crate::ids::SegmentId;

/// The error of a replica whose segment is no longer mounted.
pub fn segment_gone(id: SegmentId) -> Error {
    Error::new(
        ErrorCode::REPLICA_IS_GONE,
        format!("{id} is no longer mounted"),
    )
}

/// A batch reply's per-key results, checked to be one per key asked: a master that answers
/// another count is confused or lying, and no result can be matched to its key.
pub fn per_key<T>(results: Vec<T>, asked: usize, request: &str) -> Result<Vec<T>> {
    if results.len() == asked {
        Ok(results)
    } else {
        Err(Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!(
                "the master answered {request} for {asked} keys with {} results",
                results.len()
            ),
        ))
    }
}
