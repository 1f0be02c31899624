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
/// than the real one. (Clock rates are assumed equal; drift is parts per million.)
pub(crate) struct PeerClock {
    origin: Instant,
    offset_us: Option<i64>,
}

impl PeerClock {
    pub(crate) fn new() -> PeerClock {
        PeerClock {
            origin: Instant::now(),
            offset_us: None,
        }
    }

    /// A clock whose first message, sent at time zero, arrived at `arrived` (a handshake's
    /// answer: see [`crate::handshake::ConnectionClock`]).
    pub(crate) fn from_handshake(arrived: Instant) -> PeerClock {
        PeerClock {
            origin: arrived,
            offset_us: Some(0),
        }
    }

    /// Records a message sent at `sent_at_us` (sender's clock) arriving now.
    fn offset(&mut self, sent_at_us: u64) -> i64 {
        let arrived = self.origin.elapsed().as_micros() as i64;
        let gap = arrived.saturating_sub(sent_at_us.min(i64::MAX as u64) as i64);
        let offset = self.offset_us.map_or(gap, |o| o.min(gap));
        self.offset_us = Some(offset);
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
        };
        clock.observe(900_000);
        // Sent at 0 s with half a second of validity, arriving now: a second late.
        assert!(clock.deadline(0, 500_000) <= Instant::now());
        // Sent at 0.95 s: still valid for about half a second.
        let fresh = clock.deadline(950_000, 500_000);
        assert!(fresh > Instant::now() + Duration::from_millis(300));
        // The offset only ever shrinks: a later, slower message does not move deadlines out.
        let offset = clock.offset_us;
        clock.observe(0);
        assert_eq!(clock.offset_us, offset);
    }
}
