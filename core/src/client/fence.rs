//! The write fence: a writer that the master may have presumed dead, or whose write the master
//! may have given up on, must not put bytes into blocks that may already be someone else's.
//!
//! Three clocks meet here. The master presumes a member dead `client_ttl` after it last heard
//! from it, and then may reuse the blocks of its unfinished writes; it releases the blocks of
//! an abandoned write `release_timeout` after the write started. The writer cannot see either
//! decision, so it stops on its own:
//!
//! - it starts transfers only within the **write window**, half a TTL after the send time of
//!   the newest request the master acknowledged (a send time is no later than when the master
//!   heard it), and never later than half a TTL after it asked for the write: so the master,
//!   which heard that request no earlier than it was sent, knows without asking when the
//!   writer's last byte can land, and frees the blocks of a write it abandoned then, not a
//!   release timeout later ([`FenceRule::writes_land_by`]);
//! - it stops a write the **release margin** before the release timeout, counted from before
//!   it asked for the write;
//! - bytes already sent land within the **late-landing bound** or never: a node refuses a
//!   write that arrives after its deadline (see [`crate::client::sender_clock`]), and the
//!   transports give up on bytes in flight for longer (TCP's user timeout, RDMA's retry limit).
//!
//! The inequality they jointly keep, for every write that lands at time `t`:
//!
//! ```text
//! t ≤ acknowledged_send + write_window + late_landing  <  acknowledged_send + client_ttl
//! t ≤ started + write_window + late_landing            <  started + client_ttl
//! t ≤ started + release_timeout − release_margin + late_landing  ≤  started + release_timeout
//! ```
//!
//! so `write_window + late_landing < client_ttl` and `late_landing ≤ release_margin`, which
//! [`FenceRule::check`] states and master configuration validation enforces. The clock
//! uncertainty between writer and node is not in the sum: the writer announces a validity
//! shortened by the round trip the node's estimate of its clock may lag by
//! ([`FenceRule::announced_validity`]), so the node's deadline is never later than the real
//! one.

use crate::time::Millis;

/// The longest any transport lets bytes already sent land late, whatever the client TTL:
/// TCP's user timeout is set to this, or to a quarter TTL if that is shorter.
pub const MAX_LATE_LANDING: Millis = Millis(2_000);

/// The slowest a write is allowed to move its value, in bytes a second: a write of `size`
/// bytes may transfer for a write window plus `size` at this rate after it asked for its
/// blocks (4 MiB: 62 ms more; 1 GiB: 16 s more). Writer and master both derive the bound from
/// the size, so a large value is not cut off by a window sized for pages, and the master
/// still knows when the last byte of any write can land.
pub const SLOWEST_WRITE_RATE: u64 = 64 << 20;

/// The protocol settings the fence is derived from (what the master tells each member in
/// its cluster info).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceRule {
    /// After this long without hearing from a member, the master presumes it dead.
    pub client_ttl: Millis,
    /// This long after a write started, the master may release its blocks.
    pub release_timeout: Millis,
}

impl FenceRule {
    /// The fence for a master with these settings.
    pub fn new(client_ttl: Millis, release_timeout: Millis) -> FenceRule {
        FenceRule {
            client_ttl,
            release_timeout,
        }
    }

    /// How long after the send time of an acknowledged request a member may start transfers:
    /// half the client TTL.
    pub fn write_window(&self) -> Millis {
        Millis(self.client_ttl.as_millis() / 2)
    }

    /// The longest bytes already sent may take to land: a quarter of the client TTL, at most
    /// [`MAX_LATE_LANDING`], at least a millisecond. Transports enforce it (TCP's user
    /// timeout is set to it).
    pub fn late_landing(&self) -> Millis {
        Millis((self.client_ttl.as_millis() / 4).clamp(1, MAX_LATE_LANDING.as_millis()))
    }

    /// How long before the release timeout a write stops: a tenth of the timeout, and never
    /// less than the late-landing bound (so a short release timeout still covers bytes in
    /// flight).
    pub fn release_margin(&self) -> Millis {
        Millis(self.release_timeout.as_millis() / 10).max(self.late_landing())
    }

    /// When the last byte of a write of `size` bytes the master granted at `started` (by its
    /// own clock, which read no earlier than the writer's send) can have landed: the writer
    /// transfers at most its own window ([`FenceRule::own_window`]) after it asked, and
    /// before the release margin, and its bytes land within
    /// the late-landing bound or never. A write abandoned by the master may have its blocks
    /// reused from then on, even while its writer lives.
    pub fn writes_land_by(&self, started: Millis, size: u64) -> Millis {
        // A millisecond past the last instant a byte may land, so that "by" is strict.
        let window = self.own_window(size) + self.late_landing() + Millis(1);
        started + window.min(self.release_timeout)
    }

    /// How long after asking for its blocks a write of `size` bytes may transfer: a write
    /// window, plus the value's bytes at [`SLOWEST_WRITE_RATE`].
    pub fn own_window(&self, size: u64) -> Millis {
        let moving = size.saturating_mul(1_000).div_ceil(SLOWEST_WRITE_RATE);
        self.write_window() + Millis(moving)
    }

    /// Whether the fence holds for these settings: a write landing as late as the transports
    /// allow still lands before the master may reuse its blocks. The error says which side
    /// fails and what to change.
    pub fn check(&self) -> Result<(), String> {
        let (window, late) = (self.write_window(), self.late_landing());
        if (window + late).as_millis() >= self.client_ttl.as_millis() {
            return Err(format!(
                "client_ttl {} is too short for the write fence: the write window ({window}) plus \
                 the time late bytes may take to land ({late}) must stay under it; use a \
                 client_ttl of at least 3 ms (seconds in practice)",
                self.client_ttl
            ));
        }
        if self.release_margin() >= self.release_timeout {
            return Err(format!(
                "put_start_release_timeout {} is too short for the write fence: a writer stops \
                 {} before it, which leaves no time to write; make it longer than {late}",
                self.release_timeout,
                self.release_margin(),
            ));
        }
        Ok(())
    }

    /// How long of a transfer's validity `valid_for_us` a writer whose bytes no node checks on
    /// arrival (a one-sided RDMA write, a same-host copy into a mapped segment) may use: it
    /// stops issuing with a quarter to spare, so that a copy begun just before its own deadline
    /// still lands inside the validity unless the writer stalls for that quarter.
    pub fn self_checked_validity(valid_for_us: u64) -> u64 {
        valid_for_us - valid_for_us / 4
    }

    /// The validity a writer announces for a transfer it may run for `remaining_us` more
    /// microseconds: less the round trip `rtt_us` by which the node's view of the writer's
    /// clock may lag behind (see [`crate::client::sender_clock`]). `None` when nothing would
    /// be left.
    pub fn announced_validity(remaining_us: u64, rtt_us: u64) -> Option<u64> {
        let left = remaining_us.saturating_sub(rtt_us);
        (left > 0).then_some(left)
    }
}

/// A member's write window: when it last proved to the master that it is alive, and so how
/// long it may still write.
///
/// An answer only proves the master heard the request at some time between its send and the
/// answer's arrival. Answers chain: if one arrives less than a TTL after the previous one's
/// request was sent, the master heard both less than a TTL apart and cannot have presumed the
/// member dead in between. An answer that arrives later breaks the chain (the master may have
/// forgotten the member, released its writes' blocks, and taken it back silently on its next
/// request), so writes started before the new chain began may not transfer again.
#[derive(Clone, Copy, Debug)]
pub struct WriteWindow {
    rule: FenceRule,
    /// The send time of the newest request the master answered.
    acknowledged_send: Millis,
    /// When the current unbroken chain of answers began: writes started earlier are fenced.
    unbroken_since: Millis,
}

impl WriteWindow {
    /// The window of a member whose hello was sent at `joined` and answered.
    pub fn new(rule: FenceRule, joined: Millis) -> WriteWindow {
        WriteWindow {
            rule,
            acknowledged_send: joined,
            unbroken_since: joined,
        }
    }

    /// The rule this window follows.
    pub fn rule(&self) -> &FenceRule {
        &self.rule
    }

    /// The master answered, at `now`, a request (a heartbeat, or any request naming this
    /// member) sent at `sent`. An answer to a request older than one already answered
    /// changes nothing.
    pub fn acknowledged(&mut self, sent: Millis, now: Millis) {
        if sent <= self.acknowledged_send {
            return;
        }
        if now.since(self.acknowledged_send) >= self.rule.client_ttl {
            // A new chain starts with this request if its own round trip was shorter than a
            // TTL (the master heard it less than a TTL before any later start it granted),
            // else with its answer.
            self.unbroken_since = if now.since(sent) < self.rule.client_ttl {
                sent
            } else {
                now
            };
        }
        self.acknowledged_send = sent;
    }

    /// When this member must stop starting transfers, unless the master acknowledges it again.
    pub fn closes_at(&self) -> Millis {
        self.acknowledged_send + self.rule.write_window()
    }

    /// How much longer a write of `size` bytes that started (asked the master for its blocks)
    /// at `started` may transfer, at `now`: zero when it must not transfer at all. Never past
    /// its own window from `started`, however recently the master answered: the master frees
    /// an abandoned write's blocks by that bound ([`FenceRule::writes_land_by`]).
    pub fn fence(&self, started: Millis, size: u64, now: Millis) -> Millis {
        if started < self.unbroken_since {
            return Millis::ZERO;
        }
        let release = (started + self.rule.release_timeout)
            .as_millis()
            .saturating_sub(self.rule.release_margin().as_millis());
        let own_window = (started + self.rule.own_window(size)).as_millis();
        let until = release.min(self.closes_at().as_millis()).min(own_window);
        Millis(until.saturating_sub(now.as_millis()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> FenceRule {
        FenceRule::new(Millis::from_secs(10), Millis::from_mins(10))
    }

    #[test]
    fn the_default_settings_keep_the_fence() {
        let r = rule();
        assert_eq!(r.write_window(), Millis(5_000));
        assert_eq!(r.late_landing(), MAX_LATE_LANDING);
        assert_eq!(r.release_margin(), Millis(60_000));
        r.check().unwrap();
    }

    #[test]
    fn a_short_ttl_shortens_the_late_landing_bound() {
        let r = FenceRule::new(Millis::from_secs(3), Millis::from_mins(10));
        assert_eq!(r.late_landing(), Millis(750));
        r.check().unwrap();
    }

    #[test]
    fn a_short_release_timeout_keeps_a_margin_for_bytes_in_flight() {
        let r = FenceRule::new(Millis::from_secs(10), Millis::from_secs(3));
        assert_eq!(r.release_margin(), MAX_LATE_LANDING);
        r.check().unwrap();
        let too_short = FenceRule::new(Millis::from_secs(10), Millis::from_secs(2));
        assert!(
            too_short
                .check()
                .unwrap_err()
                .contains("put_start_release_timeout")
        );
    }

    #[test]
    fn a_ttl_too_short_for_any_window_is_refused() {
        for ttl in [1, 2] {
            let r = FenceRule::new(Millis(ttl), Millis::from_mins(10));
            assert!(r.check().unwrap_err().contains("client_ttl"), "{ttl}");
        }
        FenceRule::new(Millis(3), Millis::from_mins(10))
            .check()
            .unwrap();
    }

    #[test]
    fn the_window_follows_the_newest_acknowledged_send() {
        let mut w = WriteWindow::new(rule(), Millis(100));
        assert_eq!(w.fence(Millis(100), 0, Millis(100)), Millis(5_000));
        w.acknowledged(Millis(3_000), Millis(3_010));
        w.acknowledged(Millis(2_000), Millis(3_020)); // a late answer to an older request
        assert_eq!(w.closes_at(), Millis(8_000));
        assert_eq!(w.fence(Millis(7_000), 0, Millis(7_500)), Millis(500));
        assert_eq!(w.fence(Millis(7_000), 0, Millis(9_000)), Millis::ZERO);
    }

    #[test]
    fn a_write_stops_a_window_after_it_asked_however_often_the_master_answers() {
        let r = FenceRule::new(Millis::from_secs(10), Millis::from_secs(20));
        let mut w = WriteWindow::new(r, Millis::ZERO);
        // Kept acknowledged all along: the member may start new writes, but the write that
        // asked at 0 stops at its own window, where the master counts its last byte from.
        for sent in (1..=17).map(|s| Millis(s * 1_000)) {
            w.acknowledged(sent, sent + Millis(5));
        }
        assert_eq!(w.fence(Millis::ZERO, 0, Millis(4_000)), Millis(1_000));
        assert_eq!(w.fence(Millis::ZERO, 0, Millis(5_000)), Millis::ZERO);
        assert_eq!(w.fence(Millis(16_000), 0, Millis(17_000)), Millis(4_000));
        assert_eq!(r.writes_land_by(Millis::ZERO, 0), Millis(7_001));
        // A 64 MiB value may move for a second longer, and its blocks wait as much longer.
        assert_eq!(
            w.fence(Millis::ZERO, 64 << 20, Millis(5_000)),
            Millis(1_000)
        );
        assert_eq!(r.writes_land_by(Millis::ZERO, 64 << 20), Millis(8_001));
    }

    #[test]
    fn a_short_release_timeout_stops_a_write_before_its_window() {
        let r = FenceRule::new(Millis::from_secs(10), Millis::from_secs(3));
        let w = WriteWindow::new(r, Millis::ZERO);
        // The release margin is the late-landing bound (2 s): the write stops at 1 s.
        assert_eq!(w.fence(Millis::ZERO, 0, Millis(500)), Millis(500));
        assert_eq!(w.fence(Millis::ZERO, 0, Millis(1_000)), Millis::ZERO);
        assert_eq!(r.writes_land_by(Millis::ZERO, 0), Millis(3_000));
    }

    #[test]
    fn the_last_byte_lands_before_the_master_may_reuse_the_blocks() {
        // For any settings the fence accepts, a byte sent at the fence's end and landing as
        // late as the transports allow lands by `writes_land_by`.
        for ttl in [3, 10, 100, 1_000, 10_000, 60_000] {
            for release in [3, 50, 1_000, 20_000, 600_000] {
                let r = FenceRule::new(Millis(ttl), Millis(release));
                if r.check().is_err() {
                    continue;
                }
                let w = WriteWindow::new(r, Millis::ZERO);
                for size in [0, 4096, 64 << 20, 1 << 30] {
                    let last_send = w.fence(Millis::ZERO, size, Millis::ZERO);
                    assert!(last_send + r.late_landing() <= r.writes_land_by(Millis::ZERO, size));
                }
                assert!(
                    r.writes_land_by(Millis::ZERO, 0)
                        < Millis(ttl).max(Millis(release)) + Millis(1)
                );
            }
        }
    }

    #[test]
    fn an_answer_after_a_ttl_of_silence_fences_earlier_writes() {
        let mut w = WriteWindow::new(rule(), Millis::ZERO);
        // A write started at 1 s; the member then hears nothing for longer than a TTL.
        w.acknowledged(Millis(1_000), Millis(1_010));
        // A heartbeat sent at 9 s is answered at 11.5 s, a TTL after the last answered send:
        // the master may have forgotten the member in between.
        w.acknowledged(Millis(9_000), Millis(11_500));
        assert_eq!(w.fence(Millis(1_000), 0, Millis(11_600)), Millis::ZERO);
        // Its round trip was shorter than a TTL: writes started since it was sent may write.
        assert_eq!(w.fence(Millis(9_000), 0, Millis(11_600)), Millis(2_400));
        // An answer that itself took a TTL starts the chain only when it arrives.
        w.acknowledged(Millis(20_000), Millis(30_000));
        assert_eq!(w.fence(Millis(25_000), 0, Millis(30_000)), Millis::ZERO);
        w.acknowledged(Millis(30_001), Millis(30_002)); // a TTL after 20 s: a chain of its own
        assert_eq!(w.fence(Millis(30_001), 0, Millis(30_002)), Millis(4_999));
    }

    #[test]
    fn the_announced_validity_leaves_out_the_round_trip() {
        assert_eq!(FenceRule::announced_validity(500, 20), Some(480));
        assert_eq!(FenceRule::announced_validity(20, 20), None);
        assert_eq!(FenceRule::self_checked_validity(1_000), 750);
    }
}
