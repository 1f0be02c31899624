//! The master's timeouts as state invariants, each worked out from the configuration alone.
//!
//! [`check_bounds`] holds after every call: no lease reaches further than `lease_ttl` from
//! now, and no soft pin further than its own TTL. [`check_timer_done`] holds after each turn
//! of the driver's timer (which runs `tick` when `next_deadline` says so): nothing whose time
//! has come is left undone — no write outlives `put_start_discard_timeout`, no silent client
//! outlives `client_ttl`, no discarded block outlives its release time. A slip in how a
//! deadline is recorded or found then shows at once, not only when a reader happens to meet
//! its effect.

use super::{Violation, violation};
use crate::master::Master;

/// Checks the bounds every call keeps: leases and soft pins reach no further than their TTLs.
pub fn check_bounds(master: &Master) -> Result<(), Violation> {
    let now = master.now;
    let lease_ttl = master.config.lease_ttl;
    for (_, object) in master.objects.iter() {
        if object.lease_expiry > now + lease_ttl {
            return Err(violation(
                "lease-bound",
                format!(
                    "{:?}'s lease runs to {}, past now ({now}) plus the lease TTL ({lease_ttl})",
                    master.objects.key_of(object),
                    object.lease_expiry
                ),
            ));
        }
        let pin_ttl = object.soft_pin_ttl();
        if object.soft_pin_expiry() > now + pin_ttl {
            return Err(violation(
                "soft-pin-bound",
                format!(
                    "{:?}'s soft pin runs to {}, past now ({now}) plus its TTL ({pin_ttl})",
                    master.objects.key_of(object),
                    object.soft_pin_expiry()
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that the timer's turn left nothing due at the master's time undone.
pub fn check_timer_done(master: &Master) -> Result<(), Violation> {
    let now = master.now;
    let discard = master.config.put_start_discard_timeout;
    if let Some((_, object)) = master
        .objects
        .iter()
        .find(|(_, o)| o.writing() && o.put_start() + discard <= now)
    {
        return Err(violation(
            "write-discard-timeout",
            format!(
                "{:?}'s write (started {}) is still running at {now}, past the discard timeout \
                 ({discard})",
                master.objects.key_of(object),
                object.put_start()
            ),
        ));
    }
    let ttl = master.config.client_ttl;
    if let Some((client, heard)) = master
        .clients
        .last_heard()
        .find(|&(_, heard)| heard + ttl <= now)
    {
        return Err(violation(
            "client-ttl",
            format!("client {client} silent since {heard} is still live at {now} (TTL {ttl})"),
        ));
    }
    if let Some(release) = master.discarded.next_release()
        && release <= now
    {
        return Err(violation(
            "discarded-release",
            format!("a discarded block due at {release} is still parked at {now}"),
        ));
    }
    Ok(())
}
