//! A peer's metrics (peer mode): the Prometheus text format, and the figures its dashboard
//! reads.

use std::sync::atomic::Ordering;

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::render::exposition;
use crate::peer::PeerNode;

/// A peer's metrics: its pool and directory shard, the ring it sees, and what it served.
pub fn peer_text(peer: &PeerNode) -> String {
    let sizes = peer.sizes();
    let counts = peer.counts();
    let count = |c: &std::sync::atomic::AtomicU64| ConstCounter::new(c.load(Ordering::Relaxed));
    let mut registry = Registry::with_prefix("mooring_peer");
    registry.register_with_unit(
        "pool",
        "Bytes of the published pool",
        Unit::Bytes,
        ConstGauge::new(sizes.pool_bytes as i64),
    );
    registry.register_with_unit(
        "pool_used",
        "Bytes of the pool holding values (headers included)",
        Unit::Bytes,
        ConstGauge::new(sizes.used_bytes as i64),
    );
    registry.register(
        "values",
        "Values held in this peer's pool (in memory or only on its disk)",
        ConstGauge::new(sizes.values as i64),
    );
    registry.register(
        "disk_values",
        "Copies on this peer's disk tier",
        ConstGauge::new(sizes.disk_values as i64),
    );
    registry.register_with_unit(
        "disk_used",
        "Bytes of copies on this peer's disk tier (and being written)",
        Unit::Bytes,
        ConstGauge::new(sizes.disk_bytes as i64),
    );
    registry.register(
        "directory_entries",
        "Directory entries this peer's shard holds",
        ConstGauge::new(sizes.entries as i64),
    );
    registry.register(
        "members",
        "Peers on this peer's ring, itself included",
        ConstGauge::new(peer.members().len() as i64),
    );
    registry.register(
        "ready",
        "Whether the peer serves clients (1) or is still joining (0)",
        ConstGauge::new(i64::from(peer.is_ready())),
    );
    registry.register(
        "puts",
        "Values written into this peer's pool",
        count(&counts.puts),
    );
    registry.register("gets", "Reads asked of this peer", count(&counts.gets));
    registry.register("hits", "Reads that found a value", count(&counts.hits));
    registry.register(
        "stale_entries",
        "Directory entries read that no longer held their write (the next was tried)",
        count(&counts.stale),
    );
    registry.register(
        "republishes",
        "Re-publish rounds run",
        count(&counts.republishes),
    );
    registry.register(
        "ring_changes",
        "Ring changes this peer saw",
        count(&counts.ring_changes),
    );
    registry.register(
        "reads_served",
        "Reads of this peer's pool served over the network (peers on this host reading through shared memory are not counted)",
        ConstCounter::new(sizes.reads_served),
    );
    registry.register(
        "promotes",
        "Values brought back from this peer's disk into its pool",
        count(&counts.promotes),
    );
    registry.register_with_unit(
        "put_latency",
        "How long this peer's puts took: the copy into its pool and the publish to the owners",
        Unit::Seconds,
        counts.put_latency.histogram(),
    );
    registry.register_with_unit(
        "get_latency",
        "How long reads asked of this peer took (hits and misses): the lookup and the data",
        Unit::Seconds,
        counts.get_latency.histogram(),
    );
    registry.register(
        "refused_peers",
        "Connections refused (failed handshake, connection cap, bad frame)",
        ConstCounter::new(mooring_proto::refusals::total()),
    );
    exposition(&registry)
}

/// A peer's figures for its dashboard: who it is, its ring, its pool and shard, what it
/// served, and its latency percentiles (bucket bounds, in µs).
pub fn peer_stats_json(peer: &PeerNode) -> serde_json::Value {
    let sizes = peer.sizes();
    let counts = peer.counts();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let latency = |l: &crate::ops::metrics::Latency| {
        serde_json::json!({
            "count": l.count(),
            "p50_us": l.quantile_us(0.5),
            "p99_us": l.quantile_us(0.99),
        })
    };
    serde_json::json!({
        "name": peer.name(),
        "address": peer.address(),
        "ready": peer.is_ready(),
        "members": peer.members(),
        "pool_bytes": sizes.pool_bytes,
        "used_bytes": sizes.used_bytes,
        "values": sizes.values,
        "directory_entries": sizes.entries,
        "disk_values": sizes.disk_values,
        "disk_bytes": sizes.disk_bytes,
        "promotes": load(&counts.promotes),
        "reads_served": sizes.reads_served,
        "puts": load(&counts.puts),
        "gets": load(&counts.gets),
        "hits": load(&counts.hits),
        "stale_entries": load(&counts.stale),
        "republishes": load(&counts.republishes),
        "ring_changes": load(&counts.ring_changes),
        "put_latency": latency(&counts.put_latency),
        "get_latency": latency(&counts.get_latency),
    })
}
