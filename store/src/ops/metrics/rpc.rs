//! RPC counts and latencies: their labels, the latency buckets, and one request kind's
//! totals as the dashboard reads them.

use mooring_core::ErrorCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Labels of an RPC count: which request, and how it ended ("ok" or the error code's name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RpcOutcome {
    kind: String,
    outcome: String,
}

/// The labels counting a request of `kind` that ended with `outcome`.
pub(super) fn outcome_labels(kind: &str, outcome: Result<(), ErrorCode>) -> RpcOutcome {
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
pub(super) struct RpcKind {
    pub(super) kind: String,
}

/// Latency bucket bounds: 10 µs doubling to about 80 ms.
pub(super) const BUCKETS: usize = 14;

pub(super) fn bucket_bounds() -> impl Iterator<Item = f64> {
    exponential_buckets(1e-5, 2.0, BUCKETS as u16)
}

pub(super) fn latency_histogram() -> Histogram {
    Histogram::new(bucket_bounds())
}

/// One request kind's totals, for the dashboard's rates and percentiles.
#[derive(Clone, Default)]
pub(super) struct KindSummary {
    pub(super) ok: u64,
    pub(super) errors: u64,
    /// Requests per latency bucket; the last counts those above every bound.
    pub(super) buckets: [u64; BUCKETS + 1],
}

impl KindSummary {
    /// The bucket bound under which a fraction `q` of the requests fell, in µs.
    pub(super) fn quantile_us(&self, q: f64) -> f64 {
        quantile_us(&self.buckets, q)
    }
}

/// The bucket a latency of `seconds` falls in (the last: above every bound).
pub(super) fn bucket_of(seconds: f64) -> usize {
    bucket_bounds()
        .position(|bound| seconds <= bound)
        .unwrap_or(BUCKETS)
}

/// The bucket bound under which a fraction `q` of the counts in `buckets` fell, in µs (the
/// top bound doubled for the overflow bucket; 0 with no counts).
pub(super) fn quantile_us(buckets: &[u64; BUCKETS + 1], q: f64) -> f64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let wanted = (total as f64 * q).ceil() as u64;
    let bounds: Vec<f64> = bucket_bounds().collect();
    let mut seen = 0;
    for (i, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= wanted {
            let bound = bounds.get(i).copied().unwrap_or(bounds[BUCKETS - 1] * 2.0);
            return bound * 1e6;
        }
    }
    bounds[BUCKETS - 1] * 2e6
}

/// One request kind's totals, and its Prometheus counter of successes and its latency
/// histogram (looked up once: a family lookup builds its label strings, too slow to do for
/// every request).
pub(super) struct KindRecord {
    pub(super) summary: KindSummary,
    pub(super) served_ok: Counter,
    pub(super) latency: Histogram,
}
