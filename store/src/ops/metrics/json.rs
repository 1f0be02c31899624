//! The master's figures as JSON: what `mooring stat --json` prints and `/stats.json` serves.

use mooring_core::{SegmentInfo, StatsReport};

/// The JSON `mooring stat --json` prints: the stats and the segments' names, sizes and usage.
pub fn stats_json(report: &StatsReport, segments: &[SegmentInfo]) -> String {
    stats_value(report, segments).to_string()
}

pub(super) fn stats_value(report: &StatsReport, segments: &[SegmentInfo]) -> serde_json::Value {
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
        "tenants": report
            .tenants
            .iter()
            .map(|(tenant, usage)| {
                serde_json::json!({
                    "tenant": tenant,
                    "objects": usage.objects,
                    "value_bytes": usage.bytes,
                    "disk_bytes": usage.disk_bytes,
                })
            })
            .collect::<Vec<_>>(),
        "segment_list": segments,
    })
}
