//! Latency tuning shared by every service and client of a process.
//!
//! Connections busy-poll their socket for a short while before parking, because waking a
//! parked task through epoll costs tens of microseconds on virtualised hosts (measured here:
//! a tokio ping-pong over loopback takes about 60 µs per round trip when both sides park, and
//! 10 to 15 µs when they poll). Clients wait for answers they expect soon; servers wait for
//! the next request of a client making back-to-back calls. A server connection learns its
//! client's pace (the time from each answer to the next request) and spins half again that
//! long, up to five times its configured spin, so a client that does a little work between
//! calls (checks a batch, reads from a node) still finds the master and the node polling.
//! After a longer pause it goes by the gap before that one (a put's two master calls have
//! its copy between them, then a short gap to the next put). Set `MOORING_CLIENT_SPIN` and
//! `MOORING_SERVER_SPIN` (e.g. `0`, `20us`, `100us`) to change the defaults; zero turns
//! polling off (idle CPU matters more than latency). Pollers yield the CPU between polls,
//! so on an oversubscribed host the process that has work still gets to run.

use std::time::Duration;

use crate::config::parse_duration;

/// Default client-side polling before parking.
const CLIENT_SPIN: Duration = Duration::from_micros(50);
/// Default server-side polling for a connection's next request.
const SERVER_SPIN: Duration = Duration::from_micros(20);

fn from_env(var: &str, default: Duration) -> Duration {
    match std::env::var(var) {
        Ok(text) => parse_duration(&text).unwrap_or_else(|e| {
            tracing::warn!("ignoring {var}: {e}");
            default
        }),
        Err(_) => default,
    }
}

/// How long clients busy-poll for an answer.
pub fn client_spin() -> Duration {
    from_env("MOORING_CLIENT_SPIN", CLIENT_SPIN)
}

/// How long servers busy-poll for a connection's next request.
pub fn server_spin() -> Duration {
    from_env("MOORING_SERVER_SPIN", SERVER_SPIN)
}

/// Connections one large transfer is striped over (`MOORING_STRIPES`). Striping only pays
/// when both ends have cores to spare for the extra copies: the default is half the cores,
/// at most 4 (one on the 2-core development host, where one stream with zero-copy sends is
/// fastest).
pub fn stripes() -> usize {
    std::env::var("MOORING_STRIPES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            (cores / 2).clamp(1, 4)
        })
}
