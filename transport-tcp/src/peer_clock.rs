//! A data connection's view of its sender's clock, on this machine's monotonic clock: the
//! rule (how a write's validity, stamped on the sender's clock, becomes a local deadline) is
//! `mooring_core::client::SenderClockView`'s; this only reads the clock.

use std::time::Duration;

use mooring_core::client::SenderClockView;
use mooring_proto::serve::SenderClock;
use tokio::time::Instant;

/// A connection's [`SenderClockView`], with node times measured from `origin`.
pub(crate) struct PeerClock {
    origin: Instant,
    view: SenderClockView,
}

impl PeerClock {
    pub(crate) fn new() -> PeerClock {
        PeerClock {
            origin: Instant::now(),
            view: SenderClockView::new(),
        }
    }

    /// A clock whose first message, sent at time zero, arrived at `arrived` (a handshake's
    /// answer: see [`crate::handshake::ConnectionClock`]).
    pub(crate) fn from_handshake(arrived: Instant) -> PeerClock {
        PeerClock {
            origin: arrived,
            view: SenderClockView::anchored(0),
        }
    }

    fn now_us(&self) -> i64 {
        self.origin.elapsed().as_micros().min(i64::MAX as u128) as i64
    }

    /// The local deadline of a write sent at `sent_at_us` and valid for `valid_for_us`.
    pub(crate) fn deadline(&mut self, sent_at_us: u64, valid_for_us: u64) -> Instant {
        let at = self.view.deadline(sent_at_us, valid_for_us, self.now_us());
        self.origin + Duration::from_micros(at.max(0) as u64)
    }
}

impl SenderClock for PeerClock {
    fn observe(&mut self, sent_at_us: u64) {
        let now = self.now_us();
        self.view.observe(sent_at_us, now);
    }

    fn expired(&mut self, sent_at_us: u64, valid_for_us: u64) -> bool {
        let now = self.now_us();
        self.view.expired(sent_at_us, valid_for_us, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_delayed_longer_than_its_validity_gets_a_deadline_in_the_past() {
        // A connection whose clock started a second ago; a probe sent at 0.9 s (sender's
        // clock) arrives now: sender and node clocks differ by about 0.1 s.
        let mut clock = PeerClock {
            origin: Instant::now() - Duration::from_secs(1),
            view: SenderClockView::new(),
        };
        clock.observe(900_000);
        // Sent at 0 s with half a second of validity, arriving now: a second late.
        assert!(clock.deadline(0, 500_000) <= Instant::now());
        assert!(clock.expired(0, 500_000));
        // Sent just now: still valid for about half a second.
        let sent_now = clock.origin.elapsed().as_micros() as u64 - 100_000;
        let fresh = clock.deadline(sent_now, 500_000);
        assert!(fresh > Instant::now() + Duration::from_millis(300));
    }
}
