//! What the Python layer passes and takes back: a replicate config as a tuple, a task report
//! as a tuple, and the code a batch reports for each key.

use mooring_core::{Millis, ReplicateConfig, Result, SoftPinAction};

use crate::errors::{invalid, log_failure};

/// A replicate config as the Python layer passes it: (replica_num, soft-pin action (0
/// preserve, 1 enable, 2 disable), soft-pin TTL in ms, hard pin, preferred segments).
pub(super) type ConfigArgs = (u32, u8, Option<u64>, bool, Vec<String>);

pub(super) fn replicate_config(args: ConfigArgs) -> Result<ReplicateConfig> {
    let (replica_num, action, ttl, with_hard_pin, preferred_segments) = args;
    let soft_pin = match action {
        0 => SoftPinAction::Preserve,
        1 => SoftPinAction::Enable,
        2 => SoftPinAction::Disable,
        other => return Err(invalid(format!("unknown soft-pin action {other}"))),
    };
    Ok(ReplicateConfig {
        replica_num,
        soft_pin,
        soft_pin_ttl: ttl.map(Millis),
        with_hard_pin,
        preferred_segments,
    })
}

/// The code a batch reports for `result`: `ok` on success.
pub(super) fn code_of<T>(result: &Result<T>, ok: impl FnOnce(&T) -> i64, call: &str) -> i64 {
    match result {
        Ok(value) => ok(value),
        Err(e) => {
            log_failure(call, e);
            i64::from(e.code.code())
        }
    }
}

/// A task report as the Python layer takes it; see `NativeClient::query_task`.
pub(super) type TaskTuple = (String, &'static str, &'static str, u128, u64, u64, String);
