//! Configuration: the master's policy knobs and the per-put replication request.

use crate::error::{Error, ErrorCode, Result};
use crate::key_arena::MAX_KEY_LEN;
use crate::soft_pin::SoftPinAction;
use crate::time::Millis;

/// The longest soft-pin TTL (about 49 days).
pub const MAX_SOFT_PIN_TTL: Millis = Millis(u32::MAX as u64);

/// The master's policy knobs. Defaults follow Mooncake Store's.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct MasterConfig {
    /// Seeds the RNG that spreads replicas over segments.
    pub seed: u64,
    /// How long a read (GetReplicaList, Exist) protects an object from removal, eviction and
    /// in-place overwrite. Mooncake default: 5 s.
    pub lease_ttl: Millis,
    /// Slack added after a lease ends before its buffers may be reused, covering clock-rate
    /// drift between the reader and the master.
    pub lease_grace: Millis,
    /// Soft-pin TTL when a put asks for a soft pin without its own TTL. Default 30 min.
    pub default_soft_pin_ttl: Millis,
    /// Whether eviction may take soft-pinned objects once nothing else is left. Default true.
    pub allow_evict_soft_pinned: bool,
    /// Eviction starts when used/capacity reaches this. Default 0.95.
    pub eviction_high_watermark: f64,
    /// Fraction of capacity one eviction pass frees (beyond getting under the watermark).
    /// Default 0.05.
    pub eviction_ratio: f64,
    /// Minimum time between watermark-driven eviction passes that could not get under the
    /// watermark, so an unevictable full pool does not spin the driver.
    pub eviction_retry_interval: Millis,
    /// A put/upsert with no End or Revoke for this long may be preempted, and `tick` discards
    /// it. Default 30 s.
    pub put_start_discard_timeout: Millis,
    /// A discarded put's buffers are reused only after this long from its start, in case its
    /// writer is still writing. Default 10 min.
    pub put_start_release_timeout: Millis,
    /// A client silent for this long is dead: its segments are unmounted, its writes and held
    /// reads dropped. Default 10 s.
    pub client_ttl: Millis,
    /// Longest key accepted, in bytes (at most [`MAX_KEY_LEN`]).
    pub max_key_len: usize,
    /// Most replicas one put may ask for.
    pub max_replicas: usize,
    /// Eviction first offloads objects whose memory replica sits on a segment whose node has a
    /// disk, then drops only their memory (offload on eviction, docs/ssd-tier.md). Default
    /// true; without disks it changes nothing.
    pub offload_on_evict: bool,
    /// Every completed write is also queued for offload (write-through). Default false.
    pub offload_write_through: bool,
    /// Offload ahead: once a segment whose node has a disk is this full, the node's disk syncs
    /// also take its least recently used memory-only objects, so eviction later finds copies
    /// to drop rather than values. Above 1 turns it off. Default 0.6.
    pub offload_ahead_watermark: f64,
    /// The most one member (the processes of one credential) may hold in unfinished puts, as
    /// a fraction of the pool's capacity; past it, its puts are refused with
    /// `NO_AVAILABLE_HANDLE` until it finishes some (see `quota`). Default 0.75: a lone
    /// writer's batch may still fill most of a small pool.
    pub unfinished_put_share: f64,
    /// Limits per tenant (objects, value bytes, bytes in unfinished puts); a tenant without
    /// one is limited only by the pool. Default none.
    pub tenant_quotas: Vec<crate::tenant::TenantQuota>,
}

impl Default for MasterConfig {
    fn default() -> MasterConfig {
        MasterConfig {
            seed: 0x006d_6f6f_7269_6e67,
            lease_ttl: Millis::from_secs(5),
            lease_grace: Millis(100),
            default_soft_pin_ttl: Millis::from_mins(30),
            allow_evict_soft_pinned: true,
            eviction_high_watermark: 0.95,
            eviction_ratio: 0.05,
            eviction_retry_interval: Millis(100),
            put_start_discard_timeout: Millis::from_secs(30),
            put_start_release_timeout: Millis::from_mins(10),
            client_ttl: Millis::from_secs(10),
            max_key_len: 4096,
            max_replicas: 16,
            offload_on_evict: true,
            offload_write_through: false,
            offload_ahead_watermark: 0.6,
            unfinished_put_share: 0.75,
            tenant_quotas: Vec::new(),
        }
    }
}

impl MasterConfig {
    /// The write fence these settings give writers (see [`crate::client::fence`]).
    pub fn fence_rule(&self) -> crate::client::FenceRule {
        crate::client::FenceRule::new(self.client_ttl, self.put_start_release_timeout)
    }

    /// Checks that the knobs make sense together.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::new(ErrorCode::INVALID_PARAMS, what));
        if !(self.eviction_high_watermark > 0.0 && self.eviction_high_watermark <= 1.0) {
            return bad(format!(
                "eviction_high_watermark must be in (0, 1], got {}",
                self.eviction_high_watermark
            ));
        }
        if !(self.unfinished_put_share > 0.0 && self.unfinished_put_share <= 1.0) {
            return bad(format!(
                "unfinished_put_share must be in (0, 1], got {}",
                self.unfinished_put_share
            ));
        }
        if !(self.eviction_ratio > 0.0 && self.eviction_ratio <= 1.0) {
            return bad(format!(
                "eviction_ratio must be in (0, 1], got {}",
                self.eviction_ratio
            ));
        }
        if self.offload_ahead_watermark.is_nan() || self.offload_ahead_watermark <= 0.0 {
            return bad(format!(
                "offload_ahead_watermark must be positive (above 1 turns it off), got {}",
                self.offload_ahead_watermark
            ));
        }
        if self.lease_ttl == Millis::ZERO {
            return bad("lease_ttl must be positive".into());
        }
        if self.put_start_discard_timeout == Millis::ZERO {
            return bad("put_start_discard_timeout must be positive".into());
        }
        if self.put_start_release_timeout < self.put_start_discard_timeout {
            return bad(format!(
                "put_start_release_timeout ({}) must not be shorter than put_start_discard_timeout ({})",
                self.put_start_release_timeout, self.put_start_discard_timeout
            ));
        }
        if self.default_soft_pin_ttl == Millis::ZERO || self.default_soft_pin_ttl > MAX_SOFT_PIN_TTL
        {
            return bad(format!(
                "default_soft_pin_ttl must be 1 ms to {MAX_SOFT_PIN_TTL}, got {}",
                self.default_soft_pin_ttl
            ));
        }
        if self.client_ttl == Millis::ZERO {
            return bad("client_ttl must be positive".into());
        }
        self.fence_rule().check().or_else(bad)?;
        if self.max_key_len == 0 || self.max_replicas == 0 {
            return bad("max_key_len and max_replicas must be positive".into());
        }
        if self.max_key_len > MAX_KEY_LEN {
            return bad(format!(
                "max_key_len must be at most {MAX_KEY_LEN} bytes, got {}",
                self.max_key_len
            ));
        }
        Ok(())
    }
}

/// How a put or upsert wants its object stored.
#[derive(
    Clone, Debug, PartialEq, Eq, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct ReplicateConfig {
    /// Replicas wanted (at least one), each on a distinct segment. Best effort: fewer are
    /// allocated if there is no room, but at least one.
    pub replica_num: u32,
    /// What the write does to the soft pin (see [`SoftPinAction`]): a soft-pinned object is
    /// evicted only after every unpinned one, and only if the master allows it.
    pub soft_pin: SoftPinAction,
    /// The soft-pin TTL, only with [`SoftPinAction::Enable`]; `None` takes the master's
    /// default. The pin lapses after this long without access and returns on access.
    pub soft_pin_ttl: Option<Millis>,
    /// Hard-pin the object: never evicted; kept across upsert; cleared only by removal.
    pub with_hard_pin: bool,
    /// Segments to try first, in order (for example the caller's own); then any other.
    pub preferred_segments: Vec<String>,
}

impl ReplicateConfig {
    /// One replica, no pins, no preference.
    pub fn single() -> ReplicateConfig {
        ReplicateConfig {
            replica_num: 1,
            ..ReplicateConfig::default()
        }
    }

    /// `n` replicas.
    pub fn replicas(n: u32) -> ReplicateConfig {
        ReplicateConfig {
            replica_num: n,
            ..ReplicateConfig::default()
        }
    }

    /// With a hard pin.
    pub fn hard_pinned(mut self) -> ReplicateConfig {
        self.with_hard_pin = true;
        self
    }

    /// With a soft pin and, optionally, its own TTL.
    pub fn soft_pinned(mut self, ttl: Option<Millis>) -> ReplicateConfig {
        self.soft_pin = SoftPinAction::Enable;
        self.soft_pin_ttl = ttl;
        self
    }

    /// Dropping any soft pin the key had.
    pub fn soft_unpinned(mut self) -> ReplicateConfig {
        self.soft_pin = SoftPinAction::Disable;
        self.soft_pin_ttl = None;
        self
    }

    /// Preferring `segment` for the first replica.
    pub fn preferring(mut self, segment: impl Into<String>) -> ReplicateConfig {
        self.preferred_segments.push(segment.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_mooncake() {
        let c = MasterConfig::default();
        c.validate().unwrap();
        assert_eq!(c.lease_ttl, Millis(5000));
        assert_eq!(c.default_soft_pin_ttl, Millis(30 * 60 * 1000));
        assert_eq!(c.put_start_discard_timeout, Millis(30_000));
        assert_eq!(c.put_start_release_timeout, Millis(600_000));
        assert!(c.allow_evict_soft_pinned);
    }

    #[test]
    fn nonsense_is_refused_with_a_reason() {
        let mut c = MasterConfig {
            eviction_high_watermark: 1.5,
            ..MasterConfig::default()
        };
        let e = c.validate().unwrap_err();
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
        assert!(e.to_string().contains("eviction_high_watermark"));
        c.eviction_high_watermark = 0.9;
        c.put_start_release_timeout = Millis(1);
        assert!(c.validate().is_err());
        let longest = MasterConfig {
            max_key_len: MAX_KEY_LEN,
            ..MasterConfig::default()
        };
        longest.validate().unwrap();
        let too_long = MasterConfig {
            max_key_len: MAX_KEY_LEN + 1,
            ..MasterConfig::default()
        };
        let e = too_long.validate().unwrap_err();
        assert!(
            e.to_string().contains("max_key_len must be at most 65535"),
            "{e}"
        );
    }
}
