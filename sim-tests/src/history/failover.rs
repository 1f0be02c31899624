//! What a master that takes over must hold: for each key, the last change the clients saw
//! acknowledged before the takeover, where nothing else may have changed the key since.
//!
//! A key is left unjudged ([`History::expected_at`] gives `None`) when its last acknowledged
//! change is not the last word on it: another write or remove that was not over before that
//! change began (it may have landed after it, or be landing still), the master letting the
//! object go on its own since (eviction, loss with a node, a discarded write, a dropped disk
//! copy), or a memory fault on its bytes (a reader's report may drop a damaged replica).
//! Everything else the old leader acknowledged must be in the new leader's state as it
//! recovered it, before it serves anyone.

use std::time::Duration;

use mooring_core::ErrorCode;

use super::{At, History, Outcome};

/// How long a write that failed, or whose outcome the client never learned, may still change
/// its key after it began: a discard or release after the master's longest timeouts (the
/// plans draw discard and release timeouts of at most 7 s), and a late request.
const UNSETTLED_FOR: Duration = Duration::from_secs(10);

/// The state a key must have on a master that takes over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// The value of write `version` (`size` bytes), acknowledged at `acked`.
    Value {
        /// The write's version.
        version: u64,
        /// Its size.
        size: usize,
        /// When the client saw it acknowledged.
        acked: At,
    },
    /// No object: a remove acknowledged at `acked` took it.
    Absent {
        /// When the client saw the remove acknowledged.
        acked: At,
    },
}

impl History {
    /// What a master that takes over at `at` must hold for `key`, or `None` if the history
    /// does not say (nothing acknowledged yet, or something else may have changed the key;
    /// see the module docs).
    pub fn expected_at(&self, key: &str, at: At) -> Option<Expected> {
        if self.was_rotted(key) {
            return None;
        }
        // The change acknowledged last before the takeover: (began, acknowledged, what).
        let write = self
            .writes
            .iter()
            .filter(|(_, w)| w.key == key)
            .filter_map(|(&v, w)| match w.outcome {
                Outcome::Acked(acked) if acked < at => Some((
                    w.invoked,
                    acked,
                    Expected::Value {
                        version: v,
                        size: w.size,
                        acked,
                    },
                )),
                _ => None,
            })
            .max_by_key(|(_, acked, _)| *acked);
        let remove = self
            .removes
            .iter()
            .filter(|r| r.key == key && r.acked < at)
            .map(|r| (r.invoked, r.acked, Expected::Absent { acked: r.acked }))
            .max_by_key(|(_, acked, _)| *acked);
        let (began, acked, expected) = match (write, remove) {
            (Some(w), Some(r)) => {
                if w.1 >= r.1 {
                    w
                } else {
                    r
                }
            }
            (Some(one), None) | (None, Some(one)) => one,
            (None, None) => return None,
        };
        let version = match expected {
            Expected::Value { version, .. } => Some(version),
            Expected::Absent { .. } => None,
        };
        let other_write = self.writes.iter().any(|(&v, w)| {
            w.key == key
                && Some(v) != version
                && w.invoked < at
                && !refused(w.outcome)
                && match w.outcome {
                    // Over before the change began: it came first.
                    Outcome::Acked(done) => done > began,
                    _ => w.invoked + UNSETTLED_FOR > began,
                }
        });
        let other_remove = self.remove_attempts.iter().any(|r| {
            let this_one = version.is_none() && r.invoked == began && r.ended == Some(acked);
            !this_one
                && !r.refused
                && r.pattern.is_match(key)
                && r.invoked < at
                && r.ended.is_none_or(|ended| ended > began)
        });
        let let_go = self
            .gone
            .iter()
            .any(|g| g.key == key && g.at >= began && g.at <= at);
        (!other_write && !other_remove && !let_go).then_some(expected)
    }
}

/// Whether a write with this outcome was turned down before it changed anything (a put of a
/// key that exists is refused too: objects are immutable).
fn refused(outcome: Outcome) -> bool {
    outcome.refused_at_start() || outcome == Outcome::Failed(ErrorCode::OBJECT_ALREADY_EXISTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::GoneWhy;

    fn ms(n: u64) -> At {
        Duration::from_millis(n)
    }

    #[test]
    fn the_last_acknowledged_change_is_expected_unless_something_else_may_follow_it() {
        let mut h = History::default();
        let v1 = h.write_invoked("k", 64, ms(0), false, false);
        h.write_completed(v1, ms(10), Ok(()));
        assert_eq!(h.expected_at("k", ms(5)), None, "not acknowledged yet");
        let value = Expected::Value {
            version: v1,
            size: 64,
            acked: ms(10),
        };
        assert_eq!(h.expected_at("k", ms(20)), Some(value.clone()));

        // A refused put changes nothing; an acknowledged remove after it is the last word.
        let refused = h.write_invoked("k", 80, ms(30), false, false);
        h.write_completed(refused, ms(31), Err(ErrorCode::OBJECT_ALREADY_EXISTS));
        assert_eq!(h.expected_at("k", ms(40)), Some(value));
        let r = h.remove_invoked("^k$", ms(50));
        h.remove_ended(r, ms(55));
        h.remove_acked("k", ms(50), ms(55));
        assert_eq!(
            h.expected_at("k", ms(60)),
            Some(Expected::Absent { acked: ms(55) })
        );

        // A write whose outcome is unknown may land later: nothing is expected for a while.
        let unknown = h.write_invoked("k", 64, ms(70), true, false);
        h.write_completed(unknown, ms(75), Err(ErrorCode::RPC_FAIL));
        assert_eq!(h.expected_at("k", ms(80)), None);
        // A later acknowledged upsert, begun after the unknown one settled, is expected.
        let later = ms(70) + UNSETTLED_FOR;
        let v2 = h.write_invoked("k", 96, later, true, false);
        h.write_completed(v2, later + ms(5), Ok(()));
        assert!(matches!(
            h.expected_at("k", later + ms(10)),
            Some(Expected::Value { version, size: 96, .. }) if version == v2
        ));

        // The master let it go on its own, or a remove by pattern was under way.
        let mut evicted = History::default();
        let v = evicted.write_invoked("k", 64, ms(0), false, false);
        evicted.write_completed(v, ms(10), Ok(()));
        evicted.gone("k", ms(15), GoneWhy::Evicted);
        assert_eq!(evicted.expected_at("k", ms(20)), None);
        let mut pattern = History::default();
        let v = pattern.write_invoked("k1", 64, ms(0), false, false);
        pattern.write_completed(v, ms(10), Ok(()));
        pattern.remove_invoked("^k.$", ms(12));
        assert_eq!(pattern.expected_at("k1", ms(20)), None);
        // Writes of other keys say nothing of this one.
        let other = pattern.write_invoked("k2", 64, ms(13), false, false);
        pattern.write_completed(other, ms(14), Err(ErrorCode::RPC_FAIL));
        assert!(pattern.expected_at("k2", ms(20)).is_none());
    }
}
