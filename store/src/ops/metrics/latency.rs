//! A latency record: a Prometheus histogram for scrapes, and the same counts per bucket kept
//! readable for the percentiles `/stats.json` reports (a histogram's counts cannot be read
//! back).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;

use super::rpc::{BUCKETS, bucket_of, latency_histogram, quantile_us};

/// One operation's latencies; see the module docs.
#[derive(Debug)]
pub struct Latency {
    histogram: Histogram,
    buckets: [AtomicU64; BUCKETS + 1],
}

impl Default for Latency {
    fn default() -> Latency {
        Latency {
            histogram: latency_histogram(),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Latency {
    /// Records one operation that took `elapsed`.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        self.histogram.observe(seconds);
        self.buckets[bucket_of(seconds)].fetch_add(1, Ordering::Relaxed);
    }

    /// The histogram, to register for scrapes (it shares its counts with this record).
    pub fn histogram(&self) -> Histogram {
        self.histogram.clone()
    }

    /// How many operations were recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The bucket bound under which a fraction `q` of the operations fell, in µs (an upper
    /// bound within a factor of two; 0 before any).
    pub fn quantile_us(&self, q: f64) -> f64 {
        let counts = std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        quantile_us(&counts, q)
    }
}
