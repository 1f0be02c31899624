//! The service clock: monotonic milliseconds since the service started, the `now` every core
//! call takes. Under the simulator `tokio::time` is simulated time, so runs replay exactly.

use mooring_core::Millis;
use tokio::time::Instant;

/// Monotonic milliseconds since creation.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
    /// The reading at `start`.
    offset: Millis,
}

impl Clock {
    /// A clock starting now, at zero.
    pub fn new() -> Clock {
        Clock::resuming(Millis::ZERO)
    }

    /// A clock reading `at` now: a restarted master continues the clock its journal was
    /// written on (the time it was down is not counted, as if it had paused).
    pub fn resuming(at: Millis) -> Clock {
        Clock {
            start: Instant::now(),
            offset: at,
        }
    }

    /// Milliseconds since the clock started, plus where it started.
    pub fn now(&self) -> Millis {
        self.offset + Millis(self.start.elapsed().as_millis() as u64)
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}
