//! A look at each recovery scan from outside the tier: a simulation checks what the backend
//! reported against the disk's own bytes, read without the backend's code (the backends'
//! recoveries are where a slip loses or invents values, and reads recheck every record, so a
//! slip there shows nowhere else). Also the coverage paths each backend's recovery reached.

use std::sync::Arc;

use mooring_disk::Recovered;

use super::DiskBackend;
use crate::coverage::{self, Path};

/// Where a recovery scan is.
pub enum RecoveryStage<'a> {
    /// About to scan: nothing of this tier's has touched the disk yet.
    Scanning,
    /// Scanned, with what the backend found and kept (the disk now as recovery left it).
    Recovered(&'a Recovered),
}

/// Called at each [`RecoveryStage`] of the tier's recovery scan (see
/// [`super::DiskTierConfig::watch`]).
#[derive(Clone)]
pub struct RecoveryWatch(pub Arc<dyn Fn(RecoveryStage<'_>) + Send + Sync>);

impl std::fmt::Debug for RecoveryWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecoveryWatch")
    }
}

/// Counts the coverage paths a recovery by `backend` that found `recovered` reached.
pub(super) fn hit_paths(backend: DiskBackend, recovered: &Recovered) {
    let (dropped, checked) = match backend {
        DiskBackend::Bucket => (Path::RECOVERY_DROPPED_BUCKET, Path::RECOVERY_CHECKED_BUCKET),
        DiskBackend::FilePerKey => (
            Path::RECOVERY_DROPPED_FILE_PER_KEY,
            Path::RECOVERY_CHECKED_FILE_PER_KEY,
        ),
        DiskBackend::OffsetFile => (
            Path::RECOVERY_DROPPED_OFFSET_FILE,
            Path::RECOVERY_CHECKED_OFFSET_FILE,
        ),
    };
    if !recovered.dropped.is_empty() {
        coverage::hit(Path::RECOVERY_DROPPED);
        coverage::hit(dropped);
    }
    if !recovered.dropped.is_empty() || !recovered.objects.is_empty() {
        coverage::hit(checked);
    }
}
