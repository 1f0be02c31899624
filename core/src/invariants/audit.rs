//! The checks a driver runs after every call when asked to audit (tests and the simulation
//! do): the at-rest invariants' cheaper neighbours that need to see each step, not only the
//! state at rest.

use super::announced::KeyEventLedger;
use super::deadlines::{check_bounds, check_timer_done};
use super::reuse::{ReuseCounts, ReuseLedger};
use super::{Violation, check_eviction_order};
use crate::events::Event;
use crate::key_events::KeyChanges;
use crate::master::Master;

/// Checks each call's decisions as it is made: eviction order, the bounds on leases and pins,
/// when blocks are reused, that the KV events tell the readable keys, and that the timer
/// leaves nothing overdue. Keeps the first
/// violation found.
#[derive(Default)]
pub struct Auditor {
    reuse: ReuseLedger,
    announced: KeyEventLedger,
    first: Option<Violation>,
}

impl Auditor {
    /// An auditor that has seen nothing yet (its first call is its baseline).
    pub fn new() -> Auditor {
        Auditor::default()
    }

    /// Checks the master right after a call that reported `events` and `key_changes`;
    /// `protected` are the keys the call shielded from its own eviction.
    pub fn after_call(
        &mut self,
        master: &Master,
        events: &[Event],
        key_changes: &KeyChanges,
        protected: &[&str],
    ) -> Result<(), Violation> {
        let found = check_eviction_order(master, events, protected)
            .and_then(|()| check_bounds(master))
            .and(self.reuse.observe(master, events))
            .and(self.announced.observe(master, key_changes));
        self.keep(found)
    }

    /// Checks the master right after a turn of the driver's timer.
    pub fn after_timer(&mut self, master: &Master) -> Result<(), Violation> {
        let found = check_timer_done(master);
        self.keep(found)
    }

    /// The first violation found, if any.
    pub fn first_violation(&self) -> Option<&Violation> {
        self.first.as_ref()
    }

    /// What the block-reuse ledger has checked.
    pub fn reuse_counts(&self) -> ReuseCounts {
        self.reuse.counts()
    }

    fn keep(&mut self, found: Result<(), Violation>) -> Result<(), Violation> {
        if let Err(v) = &found
            && self.first.is_none()
        {
            self.first = Some(v.clone());
        }
        found
    }
}
