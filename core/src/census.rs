//! The census: how many objects are in each state and how many bytes they hold, counted by a
//! walk over the table when an operator asks (a metrics scrape, `mooring stat`). Nothing here
//! is kept up to date on the hot path: the figures cost one pass, paid only by whoever reads
//! them.

use crate::master::{Master, Stats};
use crate::time::Millis;

/// Objects by state and the bytes they hold, at one instant.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct Census {
    /// Objects with a complete value (in memory, on disk, or both).
    pub complete: u64,
    /// Objects being written (a put or upsert in progress).
    pub writing: u64,
    /// Hard-pinned objects (never evicted).
    pub hard_pinned: u64,
    /// Objects whose soft pin currently protects them.
    pub soft_pinned: u64,
    /// Objects a reader holds a live lease on.
    pub leased: u64,
    /// Objects with held reads outstanding.
    pub held: u64,
    /// Complete objects whose only copy is on a node's disk.
    pub disk_only: u64,
    /// Bytes of complete memory replicas (a value with two replicas counts twice).
    pub memory_bytes: u64,
    /// Bytes of values with a disk copy.
    pub disk_bytes: u64,
}

/// What the master reports to an operator: its counters and gauges, and the census.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct StatsReport {
    /// Counters and gauges kept as the master runs.
    pub stats: Stats,
    /// Objects by state, counted for this report.
    pub census: Census,
    /// Per tenant that stores anything: its name and what it stores.
    pub tenants: Vec<(String, crate::tenant::Usage)>,
}

impl Master {
    /// The stats and the census at `now`.
    pub fn report(&self, now: Millis) -> StatsReport {
        StatsReport {
            stats: self.stats(),
            census: self.census(now),
            tenants: self
                .objects
                .tenants()
                .iter()
                .map(|(tenant, usage)| (tenant.to_string(), usage))
                .collect(),
        }
    }

    /// Counts the objects by state at `now` (or the master's latest time, if later). One pass
    /// over the table; changes nothing.
    pub fn census(&self, now: Millis) -> Census {
        let now = now.max(self.now);
        let mut census = Census::default();
        for (_, object) in self.objects.iter() {
            let count = |flag: bool| u64::from(flag);
            let complete = !object.writing() && object.is_readable();
            census.complete += count(complete);
            census.writing += count(object.writing());
            census.hard_pinned += count(object.hard_pinned());
            census.soft_pinned += count(object.soft_pinned(now));
            census.leased += count(object.lease_active(now));
            census.held += count(object.holds() > 0);
            census.disk_only += count(object.has_disk_replica() && !object.has_complete_replica());
            let memory_replicas = object.replicas.iter().filter(|r| r.is_complete()).count();
            census.memory_bytes += object.size() * memory_replicas as u64;
            if object.has_disk_replica() {
                census.disk_bytes += object.size();
            }
        }
        census
    }
}
