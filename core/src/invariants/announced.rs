//! The KV events' promise, checked after every call: replaying the `Stored` and `Removed`
//! events gives exactly the keys readers can read, each with the write they are served. A
//! path that changes what is readable without saying so (or says so wrongly) is caught at the
//! call that did it, whether or not a subscriber would have noticed.

use std::collections::HashMap;

use super::{Violation, violation};
use crate::ids::WriteId;
use crate::key_events::{KeyChanges, KeyEventKind};
use crate::master::Master;

/// What the KV events have said so far: each readable key and the write it holds.
#[derive(Default)]
pub struct KeyEventLedger {
    announced: HashMap<Box<str>, WriteId>,
    /// Whether the baseline was taken (the first call's state, events and all).
    started: bool,
}

impl KeyEventLedger {
    /// Applies one call's key `changes` and checks the result against `master`'s readable
    /// keys. The first call only takes the baseline, and so does a call after which the
    /// master dropped changes (as a subscriber would, it lists the keys again).
    pub fn observe(&mut self, master: &Master, changes: &KeyChanges) -> Result<(), Violation> {
        if !self.started || changes.dropped > 0 {
            self.started = true;
            self.announced = master
                .objects
                .iter()
                .filter(|(_, o)| o.is_readable())
                .map(|(_, o)| (master.objects.key_of(o).into(), o.write_id()))
                .collect();
            return Ok(());
        }
        for change in &changes.changes {
            let (key, write) = (&change.key, change.write);
            match change.kind {
                KeyEventKind::Stored => {
                    if let Some(held) = self.announced.insert(key.clone(), write) {
                        return Err(violation(
                            "kv-events",
                            format!(
                                "{key:?} was reported stored by {write} while its value of \
                                 {held} was never reported removed"
                            ),
                        ));
                    }
                }
                KeyEventKind::Removed => match self.announced.remove(key) {
                    Some(held) if held == write => {}
                    held => {
                        return Err(violation(
                            "kv-events",
                            format!(
                                "{key:?} was reported removed ({write}) while the events held \
                                 {held:?} for it"
                            ),
                        ));
                    }
                },
            }
        }
        let mut readable = 0;
        for (_, object) in master.objects.iter().filter(|(_, o)| o.is_readable()) {
            readable += 1;
            let key = master.objects.key_of(object);
            match self.announced.get(key) {
                Some(write) if *write == object.write_id() => {}
                Some(write) => {
                    return Err(violation(
                        "kv-events",
                        format!(
                            "{key:?} serves {} but the last event for it said {write}",
                            object.write_id()
                        ),
                    ));
                }
                None => {
                    return Err(violation(
                        "kv-events",
                        format!(
                            "{key:?} is readable ({}) but no event reported it stored",
                            object.write_id()
                        ),
                    ));
                }
            }
        }
        if readable != self.announced.len() {
            let gone = self
                .announced
                .keys()
                .find(|key| {
                    master
                        .objects
                        .find(key)
                        .is_none_or(|slot| !master.objects.at(slot).is_readable())
                })
                .cloned()
                .unwrap_or_default();
            return Err(violation(
                "kv-events",
                format!("{gone:?} is no longer readable but no event reported it removed"),
            ));
        }
        Ok(())
    }
}
