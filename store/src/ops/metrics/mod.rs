//! The master's metrics for Prometheus (`GET /metrics`) and as JSON (`GET /stats.json`).
//!
//! Gauges and counters the core keeps ([`Stats`], the segments) are read at scrape time; RPC
//! counts and latencies are recorded here as requests are served. Names follow Prometheus's
//! conventions: `mooring_` prefix, `_total` counters, `_bytes` and `_seconds` units. Nothing
//! shown is secret: segment names, sizes and usage, never a data-plane key or endpoint.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `rpc` | RPC labels, latency buckets, and each request kind's totals |
//! | `render` | the Prometheus exposition, section by section |
//! | `node` | a storage node's exposition ([`node_text`]) |
//! | `json` | the figures as JSON ([`stats_json`]) |
//! | `pages` | the HTTP pages: [`handler`], [`static_page`], the dashboard, Mooncake's segment list |

mod json;
mod latency;
mod node;
mod pages;
mod peer;
mod render;
mod rpc;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::ErrorCode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use rpc::{
    KindRecord, KindSummary, RpcKind, RpcOutcome, bucket_of, latency_histogram, outcome_labels,
};

pub use json::stats_json;
pub use latency::Latency;
pub use node::node_text;
pub use pages::{PEER_DASHBOARD, PUBLIC_PATHS, handler, segment_list, static_page};
pub use peer::{peer_stats_json, peer_text};
pub use render::render_standby;

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
        record.summary.buckets[bucket_of(seconds)] += 1;
        record.latency.observe(seconds);
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

#[cfg(test)]
mod tests;
