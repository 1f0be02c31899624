//! Mooncake's conventions: a put of a key that exists, and the names of replica statuses.

use mooring_core::{ErrorCode, ReplicaStatus, Result};

/// Mooncake's put convention: a put of a key that already exists keeps the stored value and
/// succeeds (Mooncake's client logs it at debug level); `upsert` is the call that replaces.
pub(super) fn put_outcome(result: Result<()>) -> Result<()> {
    match result {
        Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => {
            tracing::debug!("already stored, kept as it is: {e}");
            Ok(())
        }
        other => other,
    }
}

/// Mooncake's name for a replica status.
pub(super) fn status_name(status: ReplicaStatus) -> &'static str {
    match status {
        ReplicaStatus::Processing => "PROCESSING",
        ReplicaStatus::Complete => "COMPLETE",
    }
}
