//! A storage node's metrics in the Prometheus text format.

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::render::exposition;

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
    exposition(&registry)
}
