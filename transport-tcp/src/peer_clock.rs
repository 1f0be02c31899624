//! A data connection's view of its sender's clock: how a write's validity, stamped on the
//! sender's clock, becomes a local deadline without synchronized clocks.

use std::time::Duration;

use mooring_proto::serve::SenderClock;
use tokio::time::Instant;

/// Relates a data connection's sender clock to this node's, to turn a write's validity into a
/// local deadline without synchronized clocks.
///
/// Each probe or write carries its send time on the sender's clock. The smallest gap seen
/// between arrival here and that send time is the clock skew plus the smallest delay any
/// message on this connection had; the sender bounds that delay by the probe's round trip
/// and leaves it out of the validity it announces, so the local deadline is never later
/// than the real one. Clock rates differ by parts per million: the estimate may rise by
/// [`MAX_DRIFT_PPM`] of the time between messages, so a sender whose clock runs slow is not
/// judged late on a connection that lives for days (and a late message moves it by no more).
pub(crate) struct PeerClock {
    origin: Instant,
    offset_us: Option<i64>,
    /// When the last message arrived, in microseconds since `origin`.
    last_arrival_us: i64,
}

/// The most two hosts' clock rates are taken to differ, in parts per million (quartz is
/// within 100; NTP keeps monotonic clocks within tens).
const MAX_DRIFT_PPM: i64 = 200;

impl PeerClock {
    pub(crate) fn new() -> PeerClock {
        PeerClock {
            origin: Instant::now(),
            offset_us: None,
            last_arrival_us: 0,
        }
    }

    /// A clock whose first message, sent at time zero, arrived at `arrived` (a handshake's
    /// answer: see [`crate::handshake::ConnectionClock`]).
    pub(crate) fn from_handshake(arrived: Instant) -> PeerClock {
        PeerClock {
            origin: arrived,
            offset_us: Some(0),
            last_arrival_us: 0,
        }
    }

    /// Records a message sent at `sent_at_us` (sender's clock) arriving now.
    fn offset(&mut self, sent_at_us: u64) -> i64 {
        let arrived = self.origin.elapsed().as_micros() as i64;
        let gap = arrived.saturating_sub(sent_at_us.min(i64::MAX as u64) as i64);
        let since_last = arrived.saturating_sub(self.last_arrival_us).max(0);
        let drift = since_last.saturating_mul(MAX_DRIFT_PPM) / 1_000_000;
        let offset = self
            .offset_us
            .map_or(gap, |o| o.saturating_add(drift).min(gap));
        self.offset_us = Some(offset);
        self.last_arrival_us = arrived;
        offset
    }

    /// The local deadline of a write sent at `sent_at_us` and valid for `valid_for_us`.
    pub(crate) fn deadline(&mut self, sent_at_us: u64, valid_for_us: u64) -> Instant {
        let offset = self.offset(sent_at_us);
        let at = (sent_at_us.min(i64::MAX as u64) as i64)
            .saturating_add(offset)
            .saturating_add(valid_for_us.min(i64::MAX as u64) as i64);
        // Far-future deadlines are capped: a day is forever for a transfer.
        let at = Duration::from_micros(at.clamp(0, 86_400_000_000) as u64);
        self.origin + at
    }
}

impl SenderClock for PeerClock {
    fn observe(&mut self, sent_at_us: u64) {
        self.offset(sent_at_us);
    }

    fn expired(&mut self, sent_at_us: u64, valid_for_us: u64) -> bool {
        Instant::now() >= self.deadline(sent_at_us, valid_for_us)
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
            offset_us: None,
            last_arrival_us: 0,
        };
        clock.observe(900_000);
        // Sent at 0 s with half a second of validity, arriving now: a second late.
        assert!(clock.deadline(0, 500_000) <= Instant::now());
        // Sent at 0.95 s: still valid for about half a second.
        let fresh = clock.deadline(950_000, 500_000);
        assert!(fresh > Instant::now() + Duration::from_millis(300));
        // A later, slower message does not move deadlines out (beyond the drift the few
        // microseconds since the last message allow: none).
        let offset = clock.offset_us;
        clock.observe(0);
        assert_eq!(clock.offset_us, offset);
    }

    #[test]
    fn a_sender_whose_clock_runs_slow_is_not_judged_late_days_later() {
        // Clocks matched 100 s ago (offset zero then); the sender's runs 100 ppm slow, so a
        // message it sends now says 99.99 s. Valid for 5 ms, it is on time.
        let mut clock = PeerClock {
            origin: Instant::now() - Duration::from_secs(100),
            offset_us: Some(0),
            last_arrival_us: 0,
        };
        assert!(!clock.expired(99_990_000, 5_000));
        // The estimate rose by the drift, not to whatever a late message's gap says: one sent
        // at 99 s and valid for 0.98 s, which ran out 10 ms ago, is still refused.
        assert!(clock.expired(99_000_000, 1_000_000 - 20_000));
    }
}
