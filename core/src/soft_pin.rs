//! Soft pins: what a put or upsert asks for, and what the object carries afterwards.
//!
//! A soft-pinned object is evicted only after every unpinned one, and only if the master
//! allows it. The pin lapses after its TTL without access and returns on the next access.
//! Mooncake's `SoftPinAction` says what a write does to the pin:
//!
//! - `Preserve` (the default): a new key gets no pin; an upsert keeps the pin the key had.
//! - `Enable`: pin for the request's TTL, or the master's default TTL.
//! - `Disable`: no pin, whatever the key had.
//!
//! A TTL only means something with `Enable`: a request that gives one with another action is
//! refused (INVALID_PARAMS), so a caller never believes a pin was set that was not.

use crate::config::{MAX_SOFT_PIN_TTL, ReplicateConfig};
use crate::error::{Error, ErrorCode, Result};
use crate::master::Master;
use crate::time::Millis;

/// What a put or upsert does to the object's soft pin.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub enum SoftPinAction {
    /// Keep what the key had (a new key: no pin).
    #[default]
    Preserve,
    /// Pin, for the request's TTL or the master's default.
    Enable,
    /// Unpin.
    Disable,
}

/// The soft pin an object carries: its TTL (zero: none) and when it lapses unless accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct SoftPin {
    pub(crate) ttl: Millis,
    pub(crate) expiry: Millis,
}

impl SoftPin {
    /// No pin.
    pub(crate) const NONE: SoftPin = SoftPin {
        ttl: Millis::ZERO,
        expiry: Millis::ZERO,
    };

    /// A pin of `ttl` starting at `now`.
    pub(crate) fn starting(ttl: Millis, now: Millis) -> SoftPin {
        SoftPin {
            ttl,
            expiry: now + ttl,
        }
    }
}

/// The pins an object carries into a write: the hard pin and the soft pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Pins {
    pub(crate) hard: bool,
    pub(crate) soft: SoftPin,
}

/// Checks the soft-pin part of a request.
pub(crate) fn check_soft_pin(config: &ReplicateConfig) -> Result<()> {
    let Some(ttl) = config.soft_pin_ttl else {
        return Ok(());
    };
    if config.soft_pin != SoftPinAction::Enable {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "soft_pin_ttl is only for SoftPinAction::Enable, got it with {:?}: drop the TTL or ask for Enable",
                config.soft_pin
            ),
        ));
    }
    if !(1..=MAX_SOFT_PIN_TTL.as_millis()).contains(&ttl.as_millis()) {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("soft_pin_ttl must be 1 ms to {MAX_SOFT_PIN_TTL}, got {ttl}"),
        ));
    }
    Ok(())
}

impl Master {
    /// The pins an object has after a write with `config` that found `before` (the default
    /// for a new key). A hard pin is never dropped by a write: only removal clears it.
    pub(crate) fn pins_after(&self, config: &ReplicateConfig, before: Pins, now: Millis) -> Pins {
        let soft = match config.soft_pin {
            SoftPinAction::Preserve => before.soft,
            SoftPinAction::Enable => SoftPin::starting(
                config
                    .soft_pin_ttl
                    .unwrap_or(self.config.default_soft_pin_ttl),
                now,
            ),
            SoftPinAction::Disable => SoftPin::NONE,
        };
        Pins {
            hard: before.hard || config.with_hard_pin,
            soft,
        }
    }
}
