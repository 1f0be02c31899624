//! The leader's lease: how long a master elected through a lease may go on granting.
//!
//! A leader holds its office through a lease the coordinator (etcd) expires `ttl` after the
//! last renewal *it received*. The leader cannot see that moment, but it knows when it *sent*
//! each renewal, which is earlier: so it serves only until `sent + ttl - margin` of the last
//! renewal the coordinator confirmed. A rival can be elected only after the coordinator
//! expired the lease, by which time this leader has stopped granting (the margin covers the
//! two clocks running at slightly different rates), so two masters never grant at once.

use crate::time::Millis;

/// A leader's view of its lease (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct LeaderLease {
    ttl: Millis,
    margin: Millis,
    /// Until when it may grant, from the last confirmed renewal.
    valid_until: Millis,
}

impl LeaderLease {
    /// A lease of `ttl` granted in response to a request sent at `sent`; the leader stops
    /// `margin` before the coordinator could expire it.
    pub fn granted(ttl: Millis, margin: Millis, sent: Millis) -> LeaderLease {
        let mut lease = LeaderLease {
            ttl,
            margin,
            valid_until: Millis::ZERO,
        };
        lease.renewed(sent);
        lease
    }

    /// The coordinator confirmed a renewal sent at `sent`.
    pub fn renewed(&mut self, sent: Millis) {
        let until = (sent + self.ttl).since(self.margin);
        self.valid_until = self.valid_until.max(until);
    }

    /// Whether the leader may still grant at `now`.
    pub fn valid(&self, now: Millis) -> bool {
        now < self.valid_until
    }

    /// When it stops being valid unless renewed.
    pub fn valid_until(&self) -> Millis {
        self.valid_until
    }
}
