//! Refusals (handshakes failed, connection caps reached, bad frames) are logged at WARN, but
//! at most a few a second: a flood of strangers must not drown the log or the disk it goes to.
//! Suppressed ones are counted and reported with the next line that is logged.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

/// Most refusal lines logged per second by one process.
const PER_SECOND: u32 = 10;

struct Window {
    started: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

static WINDOW: Mutex<Window> = Mutex::new(Window {
    started: None,
    logged: 0,
    suppressed: 0,
});

/// Refusals since the process started (logged or not), for metrics.
static TOTAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many peers this process has refused (failed handshakes, caps reached, bad frames).
pub fn total() -> u64 {
    TOTAL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Logs that `peer` was refused and why, unless this second's share is used up.
pub fn refused(peer: &str, why: &str) {
    TOTAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let suppressed = {
        let mut w = WINDOW.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if w.started
            .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
        {
            w.started = Some(now);
            w.logged = 0;
        }
        if w.logged >= PER_SECOND {
            w.suppressed += 1;
            return;
        }
        w.logged += 1;
        std::mem::take(&mut w.suppressed)
    };
    if suppressed > 0 {
        warn!(
            peer,
            suppressed, "refused: {why} (and {suppressed} more refusals not logged)"
        );
    } else {
        warn!(peer, "refused: {why}");
    }
}
