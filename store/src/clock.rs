//! The service clock: monotonic milliseconds since the service started, the `now` every core
//! call takes. Under the simulator `tokio::time` is simulated time, so runs replay exactly.

use mooring_core::Millis;
use tokio::time::Instant;

/// Monotonic milliseconds since creation.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    /// Milliseconds since the clock started.
    pub fn now(&self) -> Millis {
        Millis(self.start.elapsed().as_millis() as u64)
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}
