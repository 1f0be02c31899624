//! The master's metrics for Prometheus (`GET /metrics`) and as JSON (`GET /stats.json`).
//!
//! Gauges and counters the core keeps ([`Stats`], the segments) are read at scrape time; RPC
//! counts and latencies are recorded here as requests are served. Names follow Prometheus's
//! conventions: `mooring_` prefix, `_total` counters, `_bytes` and `_seconds` units. Nothing
//! shown is secret: segment names, sizes and usage, never a data-plane key or endpoint.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::{ErrorCode, SegmentInfo, StatsReport};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::http::{Handler, Response};
use crate::journal::JournalCounts;

/// Paths served without the scrape token: the dashboard page, which holds no figures (it
/// fetches them with the token it is given).
pub const PUBLIC_PATHS: &[&str] = &["/", "/index.html"];

/// The dashboard: one self-contained page (no CDN, works offline) that polls /stats.json.
const DASHBOARD: &str = include_str!("dashboard.html");

/// Labels of an RPC count: which request, and how it ended ("ok" or the error code's name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcOutcome {
    kind: String,
    outcome: String,
}

/// The labels counting a request of `kind` that ended with `outcome`.
fn outcome_labels(kind: &str, outcome: Result<(), ErrorCode>) -> RpcOutcome {
    RpcOutcome {
        kind: kind.to_string(),
        outcome: match outcome {
            Ok(()) => "ok".to_string(),
            Err(code) => format!("{code:?}"),
        },
    }
}

/// Labels of an RPC latency: which request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcKind {
    kind: String,
}

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

/// Labels of a segment's gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SegmentLabel {
    segment: String,
}

/// Latency bucket bounds: 10 µs doubling to about 80 ms.
const BUCKETS: usize = 14;

fn bucket_bounds() -> impl Iterator<Item = f64> {
    exponential_buckets(1e-5, 2.0, BUCKETS as u16)
}

fn latency_histogram() -> Histogram {
    Histogram::new(bucket_bounds())
}

/// One request kind's totals, for the dashboard's rates and percentiles.
#[derive(Clone, Default)]
struct KindSummary {
    ok: u64,
    errors: u64,
    /// Requests per latency bucket; the last counts those above every bound.
    buckets: [u64; BUCKETS + 1],
}

impl KindSummary {
    /// The bucket bound under which a fraction `q` of the requests fell, in µs (the top
    /// bound doubled for the overflow bucket).
    fn quantile_us(&self, q: f64) -> f64 {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let wanted = (total as f64 * q).ceil() as u64;
        let bounds: Vec<f64> = bucket_bounds().collect();
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= wanted {
                let bound = bounds.get(i).copied().unwrap_or(bounds[BUCKETS - 1] * 2.0);
                return bound * 1e6;
            }
        }
        bounds[BUCKETS - 1] * 2e6
    }
}

/// One request kind's totals, and its Prometheus counter of successes and its latency
/// histogram (looked up once: a family lookup builds its label strings, too slow to do for
/// every request).
struct KindRecord {
    summary: KindSummary,
    served_ok: Counter,
    latency: Histogram,
}

/// What the master records as it serves.
#[derive(Clone)]
pub struct MasterMetrics {
    requests: Family<RpcOutcome, Counter>,
    latency: Family<RpcKind, Histogram, fn() -> Histogram>,
    summary: Arc<Mutex<BTreeMap<&'static str, KindRecord>>>,
}

impl Default for MasterMetrics {
    fn default() -> MasterMetrics {
        MasterMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            summary: Arc::default(),
        }
    }
}

impl MasterMetrics {
    /// Records one served request of `kind` that took `elapsed` and ended with `outcome`.
    pub fn record(&self, kind: &'static str, outcome: Result<(), ErrorCode>, elapsed: Duration) {
        let mut kinds = self.summary.lock().unwrap_or_else(|e| e.into_inner());
        let record = kinds.entry(kind).or_insert_with(|| KindRecord {
            summary: KindSummary::default(),
            served_ok: self
                .requests
                .get_or_create(&outcome_labels(kind, Ok(())))
                .clone(),
            latency: self
                .latency
                .get_or_create(&RpcKind {
                    kind: kind.to_string(),
                })
                .clone(),
        });
        match outcome {
            Ok(()) => {
                record.summary.ok += 1;
                record.served_ok.inc();
            }
            Err(_) => {
                record.summary.errors += 1;
                self.requests
                    .get_or_create(&outcome_labels(kind, outcome))
                    .inc();
            }
        }
        let seconds = elapsed.as_secs_f64();
        let bucket = bucket_bounds()
            .position(|bound| seconds <= bound)
            .unwrap_or(BUCKETS);
        record.summary.buckets[bucket] += 1;
        record.latency.observe(seconds);
    }

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
                    Some(unit) => {
                        registry.register_with_unit(name, help, unit, ConstCounter::new(count))
                    }
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
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .expect("writing to a String does not fail");
        text
    }

    /// Per request kind: requests served, failures, and latency percentiles (from the
    /// histogram's buckets, so an upper bound within a factor of two).
    pub fn rpc_json(&self) -> serde_json::Value {
        let kinds = self.summary.lock().unwrap_or_else(|e| e.into_inner());
        kinds
            .iter()
            .map(|(kind, record)| {
                let s = &record.summary;
                (
                    kind.to_string(),
                    serde_json::json!({
                        "ok": s.ok,
                        "errors": s.errors,
                        "p50_us": s.quantile_us(0.5),
                        "p99_us": s.quantile_us(0.99),
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
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
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("writing to a String does not fail");
    text
}

/// A storage node's metrics in the Prometheus text format: what its data server served, its
/// segment, its disk tier (`disk`: copies and bytes, if it has one) and the peers refused.
pub fn node_text(node: &crate::node::Node, disk: Option<(usize, u64)>) -> String {
    let counts = node.counts();
    let mut registry = Registry::with_prefix("mooring_node");
    registry.register(
        "reads",
        "Reads served from segment memory",
        ConstCounter::new(counts.reads),
    );
    registry.register_with_unit(
        "read",
        "Bytes sent by reads",
        Unit::Bytes,
        ConstCounter::new(counts.read_bytes),
    );
    registry.register(
        "writes",
        "Writes accepted into segment memory",
        ConstCounter::new(counts.writes),
    );
    registry.register_with_unit(
        "written",
        "Bytes received by writes",
        Unit::Bytes,
        ConstCounter::new(counts.write_bytes),
    );
    registry.register(
        "stages",
        "Disk copies staged for readers",
        ConstCounter::new(counts.stages),
    );
    registry.register(
        "refused_requests",
        "Data requests refused (unknown key or range, late write, no disk tier)",
        ConstCounter::new(counts.refused),
    );
    registry.register(
        "refused_peers",
        "Peers refused (failed handshake, connection cap, bad frame)",
        ConstCounter::new(mooring_proto::refusals::total()),
    );
    registry.register(
        "connections",
        "Data connections open",
        ConstGauge::new(counts.connections as i64),
    );
    registry.register_with_unit(
        "segment",
        "Memory this node contributes",
        Unit::Bytes,
        ConstGauge::new(node.memory().len() as i64),
    );
    registry.register(
        "mounted",
        "Whether the segment is mounted (1) or not (0)",
        ConstGauge::new(i64::from(node.is_mounted())),
    );
    if let Some((copies, bytes)) = disk {
        registry.register(
            "disk_copies",
            "Values in the disk tier",
            ConstGauge::new(copies as i64),
        );
        registry.register_with_unit(
            "disk",
            "Bytes in the disk tier",
            Unit::Bytes,
            ConstGauge::new(bytes as i64),
        );
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("writing to a String does not fail");
    text
}

/// The JSON `mooring stat --json` prints: the stats and the segments' names, sizes and usage.
pub fn stats_json(report: &StatsReport, segments: &[SegmentInfo]) -> String {
    stats_value(report, segments).to_string()
}

fn stats_value(report: &StatsReport, segments: &[SegmentInfo]) -> serde_json::Value {
    let (stats, census) = (&report.stats, &report.census);
    let segments: Vec<serde_json::Value> = segments
        .iter()
        .map(|s| serde_json::json!({"name": s.name, "capacity": s.size, "used": s.used}))
        .collect();
    serde_json::json!({
        "objects": stats.objects,
        "objects_writing": stats.writing,
        "segments": stats.segments,
        "clients": stats.clients,
        "capacity_bytes": stats.capacity,
        "used_bytes": stats.used,
        "holds": stats.holds,
        "tasks": stats.tasks,
        "evicted_objects": stats.evicted_objects,
        "evicted_bytes": stats.evicted_bytes,
        "evicted_to_disk": stats.evicted_to_disk,
        "discarded_writes": stats.discarded_writes,
        "discarded_blocks": stats.discarded_blocks,
        "lost_objects": stats.lost_objects,
        "disk_replicas": stats.disk_replicas,
        "disk_tombstones": stats.disk_tombstones,
        "disk_copies_recorded": stats.disk_copies_recorded,
        "prefetches": stats.prefetches,
        "prefetch_failures": stats.prefetch_failures,
        "events_dropped": stats.events_dropped,
        "repairs_waiting": stats.repairs_waiting,
        "upserts": {
            "created": stats.upserts.created,
            "in_place": stats.upserts.in_place,
            "copied": stats.upserts.copied,
            "resized": stats.upserts.resized,
        },
        "reads": {
            "memory": stats.reads.memory,
            "disk": stats.reads.disk,
            "misses": stats.reads.misses,
        },
        "census": {
            "complete": census.complete,
            "writing": census.writing,
            "hard_pinned": census.hard_pinned,
            "soft_pinned": census.soft_pinned,
            "leased": census.leased,
            "held": census.held,
            "disk_only": census.disk_only,
            "memory_bytes": census.memory_bytes,
            "disk_bytes": census.disk_bytes,
        },
        "segment_list": segments,
    })
}

/// The HTTP handler serving `/metrics` and `/stats.json` from `read` (which gives the current
/// stats and segments) and `metrics`.
pub fn handler(
    metrics: MasterMetrics,
    read: Arc<dyn Fn() -> (StatsReport, Vec<SegmentInfo>) + Send + Sync>,
    connections: Arc<dyn Fn() -> usize + Send + Sync>,
    journal: Arc<dyn Fn() -> Option<JournalCounts> + Send + Sync>,
    in_group: bool,
) -> Handler {
    Arc::new(move |path: &str| match path {
        "/metrics" => {
            let (report, segments) = read();
            Response::ok(
                "text/plain; version=0.0.4; charset=utf-8",
                metrics.render(&report, &segments, connections(), journal(), in_group),
            )
        }
        "/stats.json" => {
            let (report, segments) = read();
            let mut document = stats_value(&report, &segments);
            document["rpc"] = metrics.rpc_json();
            if in_group {
                document["role"] = "leader".into();
            }
            Response::ok("application/json", document.to_string())
        }
        other => static_page(other),
    })
}

/// The pages that hold no figures: the dashboard, and "no such page".
pub fn static_page(path: &str) -> Response {
    match path {
        "/" | "/index.html" => Response::ok("text/html; charset=utf-8", DASHBOARD),
        _ => Response::error(404, "no such page: try /metrics or /stats.json"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooring_core::Stats;

    #[test]
    fn exposition_names_follow_prometheus_conventions() {
        let metrics = MasterMetrics::default();
        metrics.record("PutStart", Ok(()), Duration::from_micros(30));
        metrics.record(
            "GetReplicaList",
            Err(ErrorCode::OBJECT_NOT_FOUND),
            Duration::from_micros(12),
        );
        let report = StatsReport {
            stats: Stats {
                objects: 3,
                capacity: 1 << 20,
                used: 4096,
                evicted_bytes: 77,
                reads: mooring_core::ReadCounts {
                    memory: 5,
                    disk: 1,
                    misses: 2,
                },
                ..Stats::default()
            },
            census: mooring_core::Census {
                leased: 2,
                memory_bytes: 4000,
                ..mooring_core::Census::default()
            },
        };
        let segment = SegmentInfo {
            id: mooring_core::SegmentId(1),
            name: "node-a".into(),
            owner: mooring_core::ClientId(9),
            base: 0,
            size: 1 << 20,
            used: 4096,
            endpoint: "10.0.0.9:12345".into(),
            key: 0xdead_beef_1234,
            rdma_key: None,
        };
        let journal = JournalCounts {
            records: 12,
            syncs: 4,
            slow_syncs: 1,
            reused_files: 2,
            ..JournalCounts::default()
        };
        let text = metrics.render(&report, &[segment], 3, Some(journal), false);
        for line in [
            "mooring_objects 3",
            "mooring_connections 3",
            "mooring_capacity_bytes 1048576",
            "mooring_evicted_bytes_total 77",
            "mooring_segment_used_bytes{segment=\"node-a\"} 4096",
            "mooring_rpc_requests_total{kind=\"PutStart\",outcome=\"ok\"} 1",
            "mooring_rpc_requests_total{kind=\"GetReplicaList\",outcome=\"OBJECT_NOT_FOUND\"} 1",
            "mooring_rpc_duration_seconds_count{kind=\"PutStart\"} 1",
            "mooring_objects_by_state{state=\"leased\"} 2",
            "mooring_values_bytes{tier=\"memory\"} 4000",
            "mooring_reads_total{tier=\"memory\"} 5",
            "mooring_reads_total{tier=\"none\"} 2",
            "mooring_journal_records_total 12",
            "mooring_journal_syncs_total 4",
            "mooring_journal_slow_syncs_total 1",
            "mooring_journal_reused_files_total 2",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        // Nothing that grants access: no data-plane key, no endpoint.
        assert!(!text.contains(&format!("{}", 0xdead_beef_1234u64)));
        assert!(!text.contains("10.0.0.9"));
    }
}
