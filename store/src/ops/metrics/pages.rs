//! The metrics pages a master serves over HTTP: `/metrics`, `/stats.json` and the dashboard.

use std::sync::Arc;

use mooring_core::{SegmentInfo, StatsReport};

use super::MasterMetrics;
use super::json::stats_value;
use crate::master::journal::JournalCounts;
use crate::ops::http::{Handler, Response};

/// Paths served without the scrape token: the dashboard page, which holds no figures (it
/// fetches them with the token it is given).
pub const PUBLIC_PATHS: &[&str] = &["/", "/index.html"];

/// The dashboard: one self-contained page (no CDN, works offline) that polls /stats.json.
const DASHBOARD: &str = include_str!("../dashboard.html");

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
