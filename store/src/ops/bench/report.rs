//! What the benchmark measured: each phase's calls, bytes and latencies, and the report of
//! every phase as JSON or as a table.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One measured phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Phase {
    /// put, get, batch-get, exist, batch-exist.
    pub phase: String,
    /// Value size in bytes (0 for exist phases).
    pub size: u64,
    /// Calls made.
    pub calls: u64,
    /// Keys handled (calls x batch size for batches).
    pub keys: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Time spent inside the calls, in seconds.
    pub seconds: f64,
    /// Median call latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile call latency, microseconds.
    pub p99_us: f64,
    /// The master process's CPU over the phase, in cores (1.0: one core busy throughout);
    /// measured only in the many-clients phase, and only when this host runs the master.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_cpu: Option<f64>,
}

impl Phase {
    pub(super) fn from_latencies(
        phase: &str,
        size: u64,
        keys_per_call: u64,
        mut lat: Vec<Duration>,
    ) -> Phase {
        lat.sort_unstable();
        let pick = |q: f64| {
            lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        let calls = lat.len() as u64;
        Phase {
            phase: phase.into(),
            size,
            calls,
            keys: calls * keys_per_call,
            bytes: calls * keys_per_call * size,
            seconds: lat.iter().sum::<Duration>().as_secs_f64(),
            p50_us: pick(0.50),
            p99_us: pick(0.99),
            master_cpu: None,
        }
    }

    /// Keys per second.
    pub fn keys_per_sec(&self) -> f64 {
        self.keys as f64 / self.seconds.max(1e-9)
    }

    /// Bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }
}

/// Every phase's results.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// The phases, in the order run.
    pub phases: Vec<Phase>,
}

impl Report {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }

    /// The report as a table.
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "{:<12} {:>9} {:>12} {:>11} {:>10} {:>10}\n",
            "phase", "size", "keys/s", "GB/s", "p50 µs", "p99 µs"
        );
        for p in &self.phases {
            out += &format!(
                "{:<12} {:>9} {:>12.0} {:>11.3} {:>10.1} {:>10.1}\n",
                p.phase,
                human_size(p.size),
                p.keys_per_sec(),
                p.bytes_per_sec() / 1e9,
                p.p50_us,
                p.p99_us
            );
            if let Some(cores) = p.master_cpu {
                out += &format!(
                    "{:<12} master CPU {:.2} cores: {:.0} requests/s per core\n",
                    "",
                    cores,
                    p.keys_per_sec() / cores.max(1e-9)
                );
            }
        }
        out
    }
}

pub(super) fn human_size(n: u64) -> String {
    match n {
        0 => "-".into(),
        n if n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    }
}
