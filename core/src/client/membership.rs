//! How a member stays one: how often it heartbeats, when its node mounts its segment again,
//! how long a restarted node waits for its old name, and how long a leaving node keeps serving.

use crate::error::{Error, ErrorCode};
use crate::ids::SegmentId;
use crate::membership::{HeartbeatAck, HeartbeatStatus};
use crate::time::Millis;

/// The shortest heartbeat period, whatever the client TTL.
const SHORTEST_HEARTBEAT: Millis = Millis(10);

/// A member's timing, from the master's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Membership {
    /// After this long without hearing from a member, the master presumes it dead.
    pub client_ttl: Millis,
    /// How long a read lease lasts.
    pub lease_ttl: Millis,
}

impl Membership {
    /// A member's timing under these settings.
    pub fn new(client_ttl: Millis, lease_ttl: Millis) -> Membership {
        Membership {
            client_ttl,
            lease_ttl,
        }
    }

    /// How often to heartbeat: a quarter TTL, so that two lost heartbeats do not expire the
    /// member. Each heartbeat is given one period to be answered, so a slow master does not
    /// silently stretch the period.
    pub fn heartbeat_interval(&self) -> Millis {
        Millis(self.client_ttl.as_millis() / 4).max(SHORTEST_HEARTBEAT)
    }

    /// How long a node waits for its segment's name: a restarted node may find it still held
    /// by its previous incarnation until the master expires that one, a TTL later at most;
    /// twice that leaves room for a heartbeat in flight.
    pub fn mount_patience(&self) -> Millis {
        Millis(self.client_ttl.as_millis() * 2)
    }

    /// How long a leaving node keeps serving after it unmounts: one lease, so every reader
    /// that was handed its replicas finishes.
    pub fn linger(&self) -> Millis {
        self.lease_ttl
    }

    /// Whether a node whose segment is `mounted` (if any) must mount again after heartbeat
    /// answer `ack`: the master registered this member afresh, or does not list the segment
    /// among the member's (a `Registered` answer may have been lost), or nothing is mounted.
    pub fn needs_mount(mounted: Option<SegmentId>, ack: &HeartbeatAck) -> bool {
        ack.status == HeartbeatStatus::Registered
            || !mounted.is_some_and(|segment| ack.segments.contains(&segment))
    }
}

/// How often a member asks the master for repair work (copies of replicas lost with a node).
pub const REPAIR_POLL: Millis = Millis(100);

/// How many repairs to ask for per poll, to repair up to `per_second` objects a second.
pub fn repairs_per_poll(per_second: u32) -> u32 {
    let polls = (1_000 / REPAIR_POLL.as_millis()) as u32;
    per_second.div_ceil(polls).max(1)
}

/// Retries of a node's first mount. A restarted node may find its name still held by its
/// previous incarnation (`SEGMENT_ALREADY_EXISTS`) until the master expires it, or the master
/// may be between leaders (`RPC_FAIL`): the node retries, from 50 ms doubling to a second
/// apart, until its [`Membership::mount_patience`] runs out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountRetry {
    give_up_at: Millis,
    backoff: Millis,
}

impl MountRetry {
    /// Retries for a mount first tried at `now`, giving up `patience` later.
    pub fn new(patience: Millis, now: Millis) -> MountRetry {
        MountRetry {
            give_up_at: now + patience,
            backoff: Millis(50),
        }
    }

    /// The mount was refused with `error` at `now`: how long to wait before trying again, or
    /// `None` to report the error.
    pub fn after(&mut self, error: &Error, now: Millis) -> Option<Millis> {
        let retryable = matches!(
            error.code,
            ErrorCode::SEGMENT_ALREADY_EXISTS | ErrorCode::RPC_FAIL
        );
        if !retryable || now + self.backoff >= self.give_up_at {
            return None;
        }
        let wait = self.backoff;
        self.backoff = Millis(self.backoff.as_millis() * 2).min(Millis::from_secs(1));
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_follows_the_ttls() {
        let m = Membership::new(Millis::from_secs(10), Millis::from_secs(5));
        assert_eq!(m.heartbeat_interval(), Millis(2_500));
        assert_eq!(m.mount_patience(), Millis(20_000));
        assert_eq!(m.linger(), Millis(5_000));
        let short = Membership::new(Millis(8), Millis(1));
        assert_eq!(short.heartbeat_interval(), SHORTEST_HEARTBEAT);
    }

    #[test]
    fn a_mount_retries_a_held_name_until_its_patience_runs_out() {
        let held = Error::new(ErrorCode::SEGMENT_ALREADY_EXISTS, "held");
        let mut retry = MountRetry::new(Millis(2_000), Millis::ZERO);
        let waits: Vec<u64> = std::iter::from_fn(|| retry.after(&held, Millis(100)))
            .take(8)
            .map(Millis::as_millis)
            .collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1_000, 1_000, 1_000]);
        assert_eq!(retry.after(&held, Millis(1_500)), None, "patience ran out");
        let refused = Error::new(ErrorCode::INVALID_PARAMS, "bad spec");
        assert_eq!(
            MountRetry::new(Millis(2_000), Millis::ZERO).after(&refused, Millis::ZERO),
            None
        );
        assert_eq!(repairs_per_poll(25), 3);
        assert_eq!(repairs_per_poll(0), 1);
    }

    #[test]
    fn a_node_mounts_again_when_the_master_forgot_it_or_its_segment() {
        let ack = |status, segments: &[u64]| HeartbeatAck {
            status,
            segments: segments.iter().map(|&s| SegmentId(s)).collect(),
        };
        let mine = Some(SegmentId(2));
        assert!(!Membership::needs_mount(
            mine,
            &ack(HeartbeatStatus::Known, &[1, 2])
        ));
        assert!(Membership::needs_mount(
            mine,
            &ack(HeartbeatStatus::Registered, &[2])
        ));
        assert!(Membership::needs_mount(
            mine,
            &ack(HeartbeatStatus::Known, &[1])
        ));
        assert!(Membership::needs_mount(
            None,
            &ack(HeartbeatStatus::Known, &[1])
        ));
    }
}
