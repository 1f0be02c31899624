//! A node's view of a writer's clock: how a write's validity, stamped on the writer's clock,
//! becomes a deadline on the node's clock without synchronized clocks.
//!
//! Each probe or write carries its send time on the writer's clock. The smallest gap seen
//! between arrival (node's clock) and send time is the clock offset plus the smallest delay
//! any message on the connection had. The writer leaves a round trip (which bounds that
//! delay) out of the validity it announces ([`crate::client::FenceRule::announced_validity`]),
//! so the node's deadline is never later than the real one. Clock rates differ by parts per
//! million: the estimate may rise by [`MAX_DRIFT_PPM`] of the time between messages, so a
//! writer whose clock runs slow is not judged late on a connection that lives for days.
//!
//! Times are microseconds: the node's since some origin of its own, the writer's since the
//! connection's send time zero.

/// The most two hosts' clock rates are taken to differ, in parts per million (quartz is within
/// 100; NTP keeps monotonic clocks within tens).
pub const MAX_DRIFT_PPM: i64 = 200;

/// Far-future deadlines are capped at a day past arrival: forever, for a transfer.
const LONGEST_VALIDITY_US: i64 = 86_400_000_000;

/// What a node has learned of one writer's clock (one per connection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderClockView {
    /// Smallest (arrival − send time) seen, raised by the allowed drift since.
    offset_us: Option<i64>,
    /// When the last message arrived (node's clock).
    last_arrival_us: i64,
}

impl SenderClockView {
    /// A view that has seen nothing yet.
    pub fn new() -> SenderClockView {
        SenderClockView::default()
    }

    /// A view whose send time zero arrived at `arrived_us` (a handshake's answer).
    pub fn anchored(arrived_us: i64) -> SenderClockView {
        SenderClockView {
            offset_us: Some(arrived_us),
            last_arrival_us: arrived_us,
        }
    }

    /// A message sent at `sent_at_us` (writer's clock) arrived at `arrived_us` (node's clock).
    /// Returns the offset now estimated.
    pub fn observe(&mut self, sent_at_us: u64, arrived_us: i64) -> i64 {
        let gap = arrived_us.saturating_sub(clamp(sent_at_us));
        let since_last = arrived_us.saturating_sub(self.last_arrival_us).max(0);
        let drift = since_last.saturating_mul(MAX_DRIFT_PPM) / 1_000_000;
        let offset = self
            .offset_us
            .map_or(gap, |o| o.saturating_add(drift).min(gap));
        self.offset_us = Some(offset);
        self.last_arrival_us = self.last_arrival_us.max(arrived_us);
        offset
    }

    /// The deadline (node's clock, µs) of a write sent at `sent_at_us` and valid for
    /// `valid_for_us`, arriving at `arrived_us`.
    pub fn deadline(&mut self, sent_at_us: u64, valid_for_us: u64, arrived_us: i64) -> i64 {
        let offset = self.observe(sent_at_us, arrived_us);
        clamp(sent_at_us)
            .saturating_add(offset)
            .saturating_add(clamp(valid_for_us))
            .min(arrived_us.saturating_add(LONGEST_VALIDITY_US))
    }

    /// Whether a write sent at `sent_at_us`, valid for `valid_for_us` and arriving at
    /// `arrived_us` came too late to apply.
    pub fn expired(&mut self, sent_at_us: u64, valid_for_us: u64, arrived_us: i64) -> bool {
        arrived_us >= self.deadline(sent_at_us, valid_for_us, arrived_us)
    }
}

fn clamp(us: u64) -> i64 {
    us.min(i64::MAX as u64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_delayed_longer_than_its_validity_is_late() {
        // A probe sent at 0.9 s (writer's clock) arrives at 1 s (node's): the clocks differ
        // by at most 0.1 s.
        let mut view = SenderClockView::new();
        view.observe(900_000, 1_000_000);
        // Sent at 0 s with half a second of validity, arriving at 1 s: late.
        assert!(view.expired(0, 500_000, 1_000_000));
        // Sent at 0.95 s and arriving at 1 s, it is itself the fastest message yet: the
        // offset is now at most 50 ms, and the write valid until 1.5 s.
        assert_eq!(view.deadline(950_000, 500_000, 1_000_000), 1_500_000);
        // A slower message does not move the estimate out.
        view.observe(0, 1_000_000);
        assert!(!view.expired(950_000, 500_000, 1_000_000));
        assert_eq!(view.offset_us, Some(50_000));
    }

    #[test]
    fn a_writer_whose_clock_runs_slow_is_not_judged_late_days_later() {
        // Clocks matched at 0; 100 s later the writer's clock, 100 ppm slow, says 99.99 s.
        let mut view = SenderClockView::anchored(0);
        assert!(!view.expired(99_990_000, 5_000, 100_000_000));
        // The estimate rose by the drift, not to whatever a late message's gap says: one sent
        // at 99 s and valid for 0.98 s, which ran out 10 ms before arriving, is refused.
        assert!(view.expired(99_000_000, 1_000_000 - 20_000, 100_000_000));
    }

    #[test]
    fn absurd_stamps_saturate_instead_of_overflowing() {
        let mut view = SenderClockView::new();
        assert!(!view.expired(u64::MAX, u64::MAX, 0));
        let mut view = SenderClockView::anchored(i64::MIN);
        view.observe(u64::MAX, i64::MIN);
        // Deadlines are capped at a day past arrival.
        let deadline = view.deadline(0, u64::MAX, 0);
        assert!(deadline <= LONGEST_VALIDITY_US);
        // Node times before its origin are times like any other: sent 4 ms after an anchor that
        // arrived at -5 ms and valid for 1 ms, a write arriving at 0.1 ms is late.
        let mut view = SenderClockView::anchored(-5_000);
        assert!(view.expired(4_000, 1_000, 100));
    }
}
