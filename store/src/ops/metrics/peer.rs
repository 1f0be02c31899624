//! A peer's metrics (peer mode) in the Prometheus text format.

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
        "Values held in this peer's pool",
        ConstGauge::new(sizes.values as i64),
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
    registry.register_with_unit(
        "put_latency",
        "How long this peer's puts took: the copy into its pool and the publish to the owners",
        Unit::Seconds,
        counts.put_latency.clone(),
    );
    registry.register_with_unit(
        "get_latency",
        "How long reads asked of this peer took (hits and misses): the lookup and the data",
        Unit::Seconds,
        counts.get_latency.clone(),
    );
    registry.register(
        "refused_peers",
        "Connections refused (failed handshake, connection cap, bad frame)",
        ConstCounter::new(mooring_proto::refusals::total()),
    );
    exposition(&registry)
}
