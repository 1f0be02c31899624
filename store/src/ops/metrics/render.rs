//! The Prometheus text exposition of a master's figures, one function per section of the
//! output (in the order they appear), and of a master standing by.

use mooring_core::{Census, SegmentInfo, Stats, StatsReport};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::{Registry, Unit};

use super::MasterMetrics;
use crate::master::journal::JournalCounts;

/// Labels of the census: an object state, or the tier a value (or a read) is in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// Labels of a per-tier figure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: &'static str,
}

/// Labels of a tenant's gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: String,
}

/// Labels of a segment's gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SegmentLabel {
    segment: String,
}

impl MasterMetrics {
    /// The Prometheus text exposition of `report`, `segments`, the recorded RPCs and the
    /// `connections` open to the master.
    pub fn render(
        &self,
        report: &StatsReport,
        segments: &[SegmentInfo],
        connections: usize,
        journal: Option<JournalCounts>,
        in_group: bool,
    ) -> String {
        let stats = &report.stats;
        let census = &report.census;
        let mut registry = Registry::with_prefix("mooring");
        if in_group {
            registry.register("master_leading", LEADING_HELP, ConstGauge::new(1i64));
        }
        if let Some(journal) = journal {
            register_journal(&mut registry, journal);
        }
        register_census(&mut registry, census);
        register_reads(&mut registry, stats);
        register_connections(&mut registry, connections);
        register_gauges(&mut registry, stats);
        register_counters(&mut registry, stats);
        register_segments(&mut registry, segments);
        register_tenants(&mut registry, &report.tenants);
        self.register_rpcs(&mut registry);
        exposition(&registry)
    }

    /// The RPCs recorded: requests by kind and outcome, and their latencies.
    fn register_rpcs(&self, registry: &mut Registry) {
        registry.register(
            "rpc_requests",
            "Requests served, by kind and outcome",
            self.requests.clone(),
        );
        registry.register_with_unit(
            "rpc_duration",
            "Time to serve a request, by kind",
            Unit::Seconds,
            self.latency.clone(),
        );
    }
}

/// The journal's counters (a master with `--state-dir`).
fn register_journal(registry: &mut Registry, journal: JournalCounts) {
    for (name, help, count, unit) in [
        (
            "journal_records",
            "Journal records on disk (--state-dir)",
            journal.records,
            None,
        ),
        (
            "journal_written",
            "Bytes written to the journal",
            journal.bytes,
            Some(Unit::Bytes),
        ),
        (
            "journal_syncs",
            "Journal fdatasync calls (each covers every record appended before it: group commit)",
            journal.syncs,
            None,
        ),
        (
            "journal_slow_syncs",
            "Journal syncs that took over 1 ms (every change waiting on one waits as long)",
            journal.slow_syncs,
            None,
        ),
        (
            "journal_reused_files",
            "Journal generations begun in a retired journal's file (no zeros written ahead of their records)",
            journal.reused_files,
            None,
        ),
    ] {
        match unit {
            Some(unit) => registry.register_with_unit(name, help, unit, ConstCounter::new(count)),
            None => registry.register(name, help, ConstCounter::new(count)),
        }
    }
    for (name, help, micros) in [
        (
            "journal_sync",
            "Time spent writing and syncing the journal",
            journal.sync_micros,
        ),
        (
            "journal_slow_sync",
            "Time spent in journal syncs that took over 1 ms",
            journal.slow_sync_micros,
        ),
    ] {
        let seconds = ConstCounter::new(micros as f64 / 1e6);
        registry.register_with_unit(name, help, Unit::Seconds, seconds);
    }
}

/// The census: objects by state, and the bytes of values by tier.
fn register_census(registry: &mut Registry, census: &Census) {
    let by_state = Family::<StateLabel, Gauge>::default();
    for (state, count) in [
        ("complete", census.complete),
        ("writing", census.writing),
        ("hard_pinned", census.hard_pinned),
        ("soft_pinned", census.soft_pinned),
        ("leased", census.leased),
        ("held", census.held),
        ("disk_only", census.disk_only),
    ] {
        by_state
            .get_or_create(&StateLabel { state })
            .set(count as i64);
    }
    registry.register(
        "objects_by_state",
        "Objects by state (an object may be in several: complete and leased, say); \
         state=\"leased\" counts the leases readers hold",
        by_state,
    );
    let value_bytes = Family::<TierLabel, Gauge>::default();
    for (tier, bytes) in [("memory", census.memory_bytes), ("disk", census.disk_bytes)] {
        value_bytes
            .get_or_create(&TierLabel { tier })
            .set(bytes as i64);
    }
    registry.register_with_unit(
        "values",
        "Bytes of complete values, by tier (memory counts every replica)",
        Unit::Bytes,
        value_bytes,
    );
}

/// Reads, by the tier that held the value.
fn register_reads(registry: &mut Registry, stats: &Stats) {
    let reads = Family::<TierLabel, Counter>::default();
    for (tier, count) in [
        ("memory", stats.reads.memory),
        ("disk", stats.reads.disk),
        ("none", stats.reads.misses),
    ] {
        reads.get_or_create(&TierLabel { tier }).inc_by(count);
    }
    registry.register(
        "reads",
        "Reads asked for, by the tier that held the value (tier=\"none\": a miss)",
        reads,
    );
}

/// The connections open to the master, and the peers it refused.
fn register_connections(registry: &mut Registry, connections: usize) {
    registry.register(
        "connections",
        "RPC connections open to the master",
        ConstGauge::new(connections as i64),
    );
    registry.register(
        "refused_peers",
        "Peers refused (failed handshake, connection cap, bad frame)",
        ConstCounter::new(mooring_proto::refusals::total()),
    );
}

/// The gauges of the master's stats, and its memory.
fn register_gauges(registry: &mut Registry, stats: &Stats) {
    let gauges: [(&str, &str, u64); 11] = [
        (
            "objects",
            "Objects in the table (complete or being written)",
            stats.objects,
        ),
        (
            "objects_writing",
            "Objects with a put or upsert in progress",
            stats.writing,
        ),
        ("segments", "Mounted segments", stats.segments),
        ("clients", "Live clients", stats.clients),
        ("holds", "Held reads outstanding", stats.holds),
        ("tasks", "Copy and move tasks running", stats.tasks),
        (
            "discarded_blocks",
            "Discarded blocks waiting for release",
            stats.discarded_blocks,
        ),
        (
            "disk_replicas",
            "Objects with a copy on a node's disk",
            stats.disk_replicas,
        ),
        (
            "disk_tombstones",
            "Disk copies dropped by the master that their nodes have not yet deleted",
            stats.disk_tombstones,
        ),
        (
            "events_dropped",
            "Events dropped because the driver did not drain them",
            stats.events_dropped,
        ),
        (
            "repairs_waiting",
            "Objects waiting for replicas lost with a segment",
            stats.repairs_waiting,
        ),
    ];
    for (name, help, value) in gauges {
        registry.register(name, help, ConstGauge::new(value as i64));
    }
    registry.register_with_unit(
        "capacity",
        "Usable segment memory",
        Unit::Bytes,
        ConstGauge::new(stats.capacity as i64),
    );
    registry.register_with_unit(
        "used",
        "Allocated segment memory, including discarded blocks not yet released",
        Unit::Bytes,
        ConstGauge::new(stats.used as i64),
    );
}

/// The counters of the master's stats.
fn register_counters(registry: &mut Registry, stats: &Stats) {
    let counters: [(&str, &str, u64); 10] = [
        ("evicted_objects", "Objects evicted", stats.evicted_objects),
        (
            "evicted_to_disk",
            "Evicted objects that live on in a disk copy",
            stats.evicted_to_disk,
        ),
        (
            "discarded_writes",
            "Writes discarded (timed out, preempted, writer dead)",
            stats.discarded_writes,
        ),
        (
            "lost_objects",
            "Objects lost with their last segment",
            stats.lost_objects,
        ),
        (
            "disk_copies_recorded",
            "Disk copies recorded (offloaded or recovered)",
            stats.disk_copies_recorded,
        ),
        ("prefetches", "Prefetches started", stats.prefetches),
        (
            "prefetch_failures",
            "Prefetches that found no memory to promote into",
            stats.prefetch_failures,
        ),
        (
            "upserts_created",
            "Upserts that made a new object",
            stats.upserts.created,
        ),
        (
            "upserts_in_place",
            "Upserts overwritten in place",
            stats.upserts.in_place,
        ),
        (
            "upserts_resized",
            "Upserts written to fresh buffers for a new size",
            stats.upserts.resized,
        ),
    ];
    for (name, help, value) in counters {
        registry.register(name, help, ConstCounter::new(value));
    }
    registry.register(
        "upserts_copied",
        "Upserts written beside readers to fresh buffers",
        ConstCounter::new(stats.upserts.copied),
    );
    registry.register_with_unit(
        "evicted",
        "Bytes evicted",
        Unit::Bytes,
        ConstCounter::new(stats.evicted_bytes),
    );
}

/// Each segment's capacity and use.
fn register_segments(registry: &mut Registry, segments: &[SegmentInfo]) {
    let capacity = Family::<SegmentLabel, Gauge>::default();
    let used = Family::<SegmentLabel, Gauge>::default();
    for segment in segments {
        let label = SegmentLabel {
            segment: segment.name.clone(),
        };
        capacity.get_or_create(&label).set(segment.size as i64);
        used.get_or_create(&label).set(segment.used as i64);
    }
    registry.register_with_unit(
        "segment_capacity",
        "A segment's usable memory",
        Unit::Bytes,
        capacity,
    );
    registry.register_with_unit(
        "segment_used",
        "A segment's allocated memory",
        Unit::Bytes,
        used,
    );
}

/// Each tenant's objects, value bytes and bytes on disk.
fn register_tenants(registry: &mut Registry, tenants: &[(String, mooring_core::tenant::Usage)]) {
    let objects = Family::<TenantLabel, Gauge>::default();
    let bytes = Family::<TenantLabel, Gauge>::default();
    let disk = Family::<TenantLabel, Gauge>::default();
    for (tenant, usage) in tenants {
        let label = TenantLabel {
            tenant: tenant.clone(),
        };
        objects.get_or_create(&label).set(usage.objects as i64);
        bytes.get_or_create(&label).set(usage.bytes as i64);
        disk.get_or_create(&label).set(usage.disk_bytes as i64);
    }
    registry.register("tenant_objects", "A tenant's objects", objects);
    registry.register_with_unit(
        "tenant_values",
        "A tenant's value bytes (each value once, however many replicas)",
        Unit::Bytes,
        bytes,
    );
    registry.register_with_unit(
        "tenant_disk",
        "Bytes of a tenant's values with a copy on a node's disk (its disk quota counts these)",
        Unit::Bytes,
        disk,
    );
}

/// What `mooring_master_leading` says.
const LEADING_HELP: &str = "1 while this master leads its group (and serves the figures \
     shown), 0 while it stands by";

/// The Prometheus text exposition of a master standing by in a group: it holds no figures
/// of its own (the leader has them), only that it stands by and the `connections` open to it.
pub fn render_standby(connections: usize) -> String {
    let mut registry = Registry::with_prefix("mooring");
    registry.register("master_leading", LEADING_HELP, ConstGauge::new(0i64));
    registry.register(
        "connections",
        "RPC connections open to the master",
        ConstGauge::new(connections as i64),
    );
    exposition(&registry)
}

/// `registry` in the Prometheus text format.
pub(super) fn exposition(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)
        .expect("writing to a String does not fail");
    text
}
