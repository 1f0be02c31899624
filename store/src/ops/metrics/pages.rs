//! The metrics pages a master serves over HTTP: `/metrics`, `/stats.json`, the dashboard, and
//! Mooncake's `/get_all_segments` (the list SGLang's `check_server` polls before `setup`).

use std::sync::{Arc, LazyLock};

use mooring_core::{SegmentInfo, StatsReport};

use super::MasterMetrics;
use super::json::stats_value;
use crate::master::journal::JournalCounts;
use crate::ops::http::{Handler, Request, Response};

/// Paths served without the scrape token: the dashboard page, which holds no figures (it
/// fetches them with the token it is given).
pub const PUBLIC_PATHS: &[&str] = &["/", "/index.html"];

/// The master's dashboard: one self-contained page (no CDN, works offline) that polls
/// /stats.json.
pub static DASHBOARD: LazyLock<String> =
    LazyLock::new(|| dashboard_page(include_str!("../dashboard.html")));

/// A peer's dashboard, likewise.
pub static PEER_DASHBOARD: LazyLock<String> =
    LazyLock::new(|| dashboard_page(include_str!("../peer_dashboard.html")));

/// `page` with what every dashboard shares (its style and helpers) where its
/// `<!-- shared -->` line stands.
fn dashboard_page(page: &str) -> String {
    page.replacen(
        "<!-- shared -->",
        include_str!("../dashboard_shared.html"),
        1,
    )
}

/// The content type of Mooncake's plain-text admin pages.
const MOONCAKE_TEXT: &str = "text/plain; version=0.0.4";

/// The HTTP handler serving `/metrics`, `/stats.json` and `/get_all_segments` from `read`
/// (which gives the current stats and segments) and `metrics`.
pub fn handler(
    metrics: MasterMetrics,
    read: Arc<dyn Fn() -> (StatsReport, Vec<SegmentInfo>) + Send + Sync>,
    connections: Arc<dyn Fn() -> usize + Send + Sync>,
    journal: Arc<dyn Fn() -> Option<JournalCounts> + Send + Sync>,
    in_group: bool,
) -> Handler {
    Arc::new(move |request: &Request| match request.path {
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
        "/get_all_segments" => {
            let (_, segments) = read();
            Response::ok(MOONCAKE_TEXT, segment_list(&segments))
        }
        other => static_page(other),
    })
}

/// Mooncake's `/get_all_segments` body: each mounted segment's name on a line of its own
/// (nothing at all while none is mounted, which is how SGLang's `check_server` tells that the
/// cluster has no memory yet).
pub fn segment_list(segments: &[SegmentInfo]) -> String {
    segments.iter().map(|s| format!("{}\n", s.name)).collect()
}

/// The pages that hold no figures: the dashboard, "no such page", and, on a master standing
/// by (the only one that reaches here with it), `/get_all_segments`, which only the leader
/// can answer.
pub fn static_page(path: &str) -> Response {
    match path {
        "/" | "/index.html" => Response::ok("text/html; charset=utf-8", DASHBOARD.as_str()),
        "/get_all_segments" => Response::error(
            503,
            "this master is standing by: ask the group's leader (its address is in /stats.json)",
        ),
        _ => Response::error(404, "no such page: try /metrics or /stats.json"),
    }
}
