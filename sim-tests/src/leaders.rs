//! A group's leadership terms as the simulation sees them, on its one clock: when each master
//! began leading and when it last answered as leader, so two terms that overlap are caught
//! however briefly they do (sampling which masters grant each tick misses short overlaps).

use std::time::Duration;

/// One master's time as leader: from when it began leading until it last answered as one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// The group master.
    pub master: usize,
    /// When it began leading.
    pub began: Duration,
    /// When it last answered a request as leader, if it has.
    pub last_answer: Option<Duration>,
}

/// Every term so far, in the order they began.
#[derive(Debug, Default)]
pub struct Terms {
    terms: Vec<Term>,
}

impl Terms {
    /// Master `master` begins leading at `at`. Returns the overlap if another master answered
    /// as leader at or after `at` (its answers and this term overlap).
    pub fn began(&mut self, master: usize, at: Duration) -> Option<String> {
        let overlap = self
            .terms
            .iter()
            .filter(|t| t.master != master)
            .find(|t| t.last_answer.is_some_and(|last| last >= at))
            .map(|t| {
                format!(
                    "master {master} began leading at {at:?}, but master {} (leading since {:?}) \
                     answered as leader until {:?}",
                    t.master,
                    t.began,
                    t.last_answer.expect("found by it")
                )
            });
        self.terms.push(Term {
            master,
            began: at,
            last_answer: None,
        });
        overlap
    }

    /// Master `master` answers a request as leader at `at`. Returns the overlap if another
    /// master began leading since `master`'s term began, at or before `at`.
    pub fn answered(&mut self, master: usize, at: Duration) -> Option<String> {
        let term = self.terms.iter_mut().rev().find(|t| t.master == master)?;
        term.last_answer = Some(at);
        let since = term.began;
        self.terms
            .iter()
            .find(|t| t.master != master && t.began > since && t.began <= at)
            .map(|t| {
                format!(
                    "master {master} (leading since {since:?}) answered as leader at {at:?}, \
                     after master {} began leading at {:?}",
                    t.master, t.began
                )
            })
    }

    /// The master that led before the newest term, if any did.
    pub fn previous(&self) -> Option<&Term> {
        self.terms.iter().rev().nth(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn terms_that_follow_each_other_pass_and_any_overlap_is_caught() {
        let mut terms = Terms::default();
        assert_eq!(terms.began(0, ms(0)), None);
        assert_eq!(terms.answered(0, ms(10)), None);
        assert_eq!(terms.answered(0, ms(900)), None);
        // The next leader begins after the last answer: fine.
        assert_eq!(terms.began(1, ms(901)), None);
        assert_eq!(terms.previous().map(|t| t.master), Some(0));
        assert_eq!(terms.answered(1, ms(950)), None);
        // The deposed leader answers once more, however briefly after: caught.
        let late = terms.answered(0, ms(902)).expect("an overlap");
        assert!(
            late.contains("after master 1 began leading at 901ms"),
            "{late}"
        );
        // A term that begins while another master's answers are later than its start.
        let mut terms = Terms::default();
        terms.began(0, ms(0));
        terms.answered(0, ms(500));
        let early = terms.began(1, ms(500)).expect("an overlap");
        assert!(early.contains("answered as leader until 500ms"), "{early}");
        // The same master leading again (restarted) overlaps nothing.
        let mut terms = Terms::default();
        terms.began(0, ms(0));
        terms.answered(0, ms(100));
        assert_eq!(terms.began(0, ms(50)), None);
        // A master that never led answers nothing as leader.
        assert_eq!(terms.answered(3, ms(60)), None);
    }
}
