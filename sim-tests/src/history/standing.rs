//! What the master must still hold for a key, worked out from the history: checked against
//! the master's state each tick, so a value that vanishes, or a pin that is dropped, is caught
//! where it happens — not only if a read happens to look for it later.
//!
//! An acknowledged write's object must exist until something that may take it happens: a
//! remove (any outcome, by key or by pattern), an upsert of the key that did not succeed
//! (a failed, abandoned or still running upsert may take the object with it), or an event of
//! the master's that lets it go (eviction, loss with a node, a discard, a fault destroying
//! every copy). The master reports those events as it acts, so the check needs no slack.
//!
//! A hard pin, once a write that asked for it is acknowledged, stays through every later
//! write (an upsert without a hard pin keeps it), copy, move, prefetch and master restart:
//! only what takes the object clears it, and eviction never may.

use super::{At, GoneWhy, History, Outcome, Write};

/// What the master must hold for one key at some instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Standing {
    /// The acknowledged write whose object must exist, if one stands.
    pub must_exist: Option<u64>,
    /// A hard-pinned write that nothing able to remove the object has cleared since: the
    /// object, while it exists, must carry a hard pin.
    pub hard_pinned_by: Option<u64>,
    /// When an eviction took the object while `hard_pinned_by` pinned it (a violation).
    pub evicted_while_pinned: Option<At>,
}

impl History {
    /// What the master must hold for `key` at `now`.
    pub fn standing(&self, key: &str, now: At) -> Standing {
        let Some(versions) = self.writes_by_key.get(key) else {
            return Standing::default();
        };
        let acked = |v: &u64| match self.writes[v].outcome {
            Outcome::Acked(at) if at < now => Some((at, *v)),
            _ => None,
        };
        let must_exist = versions
            .iter()
            .filter_map(acked)
            .max()
            .map(|(_, v)| v)
            .filter(|&v| !self.taken_since(key, v, now, true));
        let mut pinned_writes: Vec<(At, u64)> = versions
            .iter()
            .filter_map(acked)
            .filter(|(_, v)| self.writes[v].hard_pinned)
            .collect();
        pinned_writes.sort_unstable();
        let pinned = pinned_writes
            .into_iter()
            .rev()
            .find(|(_, v)| !self.taken_since(key, *v, now, false));
        let evicted_while_pinned = pinned.and_then(|(acked_at, _)| {
            self.gone_of(key)
                .find(|g| g.why == GoneWhy::Evicted && g.at >= acked_at && g.at <= now)
                .map(|g| g.at)
        });
        Standing {
            must_exist,
            hard_pinned_by: pinned.map(|(_, v)| v),
            evicted_while_pinned,
        }
    }

    /// Whether something that may take `key`'s object happened since write `anchor` began,
    /// up to `now`. Evictions count only if `evictions` (they may not take a hard-pinned
    /// object, so for a pin they are a violation rather than an excuse).
    fn taken_since(&self, key: &str, anchor: u64, now: At, evictions: bool) -> bool {
        let since = self.writes[&anchor].invoked;
        let overlaps = |from: At, to: Option<At>| from <= now && to.is_none_or(|t| t >= since);
        let removed = self
            .removes_by_key
            .get(key)
            .into_iter()
            .flatten()
            .chain(&self.pattern_removes)
            .map(|&i| &self.remove_attempts[i])
            .any(|r| !r.refused && overlaps(r.invoked, r.ended) && r.pattern.is_match(key));
        let other_write = self.writes_by_key[key].iter().any(|v| {
            let w: &Write = &self.writes[v];
            // A put of an existing key is refused and changes nothing.
            *v != anchor
                && w.upsert
                && !matches!(w.outcome, Outcome::Acked(_))
                && !w.outcome.refused_at_start()
                && overlaps(w.invoked, w.ended)
        });
        let gone = self
            .gone_of(key)
            .any(|g| g.at >= since && g.at <= now && (evictions || g.why != GoneWhy::Evicted));
        removed || other_write || gone
    }

    fn gone_of<'a>(&'a self, key: &str) -> impl Iterator<Item = &'a super::Gone> + 'a {
        self.gone_by_key
            .get(key)
            .into_iter()
            .flatten()
            .map(|&i| &self.gone[i])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mooring_core::ErrorCode;

    use super::*;

    fn ms(n: u64) -> At {
        Duration::from_millis(n)
    }

    #[test]
    fn an_acknowledged_write_stands_until_something_may_take_it() {
        let mut h = History::default();
        assert_eq!(h.standing("k", ms(1)), Standing::default());
        let v = h.write_invoked("k", 64, ms(0), false, true);
        assert_eq!(
            h.standing("k", ms(1)),
            Standing::default(),
            "not acknowledged yet"
        );
        h.write_completed(v, ms(2), Ok(()));
        let s = h.standing("k", ms(3));
        assert_eq!((s.must_exist, s.hard_pinned_by), (Some(v), Some(v)));

        // An acknowledged upsert without a pin keeps the hard pin.
        let u = h.write_invoked("k", 64, ms(4), true, false);
        h.write_completed(u, ms(5), Ok(()));
        let s = h.standing("k", ms(6));
        assert_eq!((s.must_exist, s.hard_pinned_by), (Some(u), Some(v)));
        assert_eq!(s.evicted_while_pinned, None);

        // An eviction takes the object, but not the pin: it is named.
        h.gone("k", ms(7), GoneWhy::Evicted);
        let s = h.standing("k", ms(8));
        assert_eq!(s.must_exist, None);
        assert_eq!(s.evicted_while_pinned, Some(ms(7)));

        // A failed upsert may take the object; a refused one may not.
        let mut h = History::default();
        let v = h.write_invoked("k", 64, ms(0), false, false);
        h.write_completed(v, ms(1), Ok(()));
        let refused = h.write_invoked("k", 64, ms(2), true, false);
        h.write_completed(refused, ms(3), Err(ErrorCode::OBJECT_REPLICA_BUSY));
        assert_eq!(h.standing("k", ms(4)).must_exist, Some(v));
        let failed = h.write_invoked("k", 64, ms(5), true, false);
        assert_eq!(
            h.standing("k", ms(6)).must_exist,
            None,
            "running: may yet take it"
        );
        h.write_completed(failed, ms(7), Err(ErrorCode::TRANSFER_FAIL));
        assert_eq!(h.standing("k", ms(8)).must_exist, None);

        // A remove of any outcome, by pattern too, and a loss with a node, take it and its pin.
        for reason in 0..3 {
            let mut h = History::default();
            let v = h.write_invoked("k1", 64, ms(0), false, true);
            h.write_completed(v, ms(1), Ok(()));
            match reason {
                0 => {
                    h.remove_invoked("^k.$", ms(2));
                }
                1 => {
                    let r = h.remove_invoked("^k1$", ms(2));
                    h.remove_ended(r, ms(3));
                }
                _ => h.gone("k1", ms(2), GoneWhy::Lost),
            }
            assert_eq!(
                h.standing("k1", ms(4)),
                Standing::default(),
                "reason {reason}"
            );
        }
        // ...but not a refused remove, nor one of another key.
        let mut h = History::default();
        let v = h.write_invoked("k1", 64, ms(0), false, false);
        h.write_completed(v, ms(1), Ok(()));
        let r = h.remove_invoked("^k1$", ms(2));
        h.remove_refused(r);
        h.remove_ended(r, ms(3));
        let r = h.remove_invoked("^k2$", ms(2));
        h.remove_ended(r, ms(3));
        assert_eq!(h.standing("k1", ms(4)).must_exist, Some(v));
    }
}
