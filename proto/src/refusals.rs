//! Refusals (handshakes failed, connection caps reached, bad frames) are logged at WARN, but
//! at most a few a second: a flood of strangers must not drown the log or the disk it goes to.
//! Suppressed ones are counted and reported with the next line that is logged.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

/// Most lines one [`LogBudget`] lets through per second.
const PER_SECOND: u32 = 10;

/// A budget of log lines: at most ten a second, counting the ones it holds back so the next
/// line let through can say how many. Shared by everything that logs what strangers or
/// failing callers can make it log as often as they like.
pub struct LogBudget {
    window: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogBudget {
    /// A fresh budget.
    pub const fn new() -> LogBudget {
        LogBudget {
            window: Mutex::new(Window {
                started: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be logged now; if so, how many were held back since the last one.
    pub fn admit(&self) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if w.started
            .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
        {
            w.started = Some(now);
            w.logged = 0;
        }
        if w.logged >= PER_SECOND {
            w.suppressed += 1;
            return None;
        }
        w.logged += 1;
        Some(std::mem::take(&mut w.suppressed))
    }
}

impl Default for LogBudget {
    fn default() -> LogBudget {
        LogBudget::new()
    }
}

/// The refusal lines' budget.
static REFUSALS: LogBudget = LogBudget::new();

/// Refusals since the process started (logged or not), for metrics.
static TOTAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many peers this process has refused (failed handshakes, caps reached, bad frames).
pub fn total() -> u64 {
    TOTAL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Logs that `peer` was refused and why, unless this second's share is used up.
pub fn refused(peer: &str, why: &str) {
    TOTAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Some(suppressed) = REFUSALS.admit() else {
        return;
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
