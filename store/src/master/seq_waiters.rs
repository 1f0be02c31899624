//! Requests waiting for a record's sequence number to be reached: on the journal's disk, or
//! on every in-sync standby's. Each advance wakes only the requests it covers. (A watch
//! channel wakes every waiter on every change and the uncovered ones go back to sleep: with
//! hundreds of puts in flight, that herd cost the master more CPU than the puts themselves.)

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// What a wait resolves to: reached, or why it never will be.
pub type Reached = std::result::Result<(), String>;

/// Requests waiting for a sequence number, and how far the sequence has got.
pub struct SeqWaiters {
    inner: Mutex<Inner>,
}

struct Inner {
    /// The last sequence number reached, or why no more will be.
    reached: std::result::Result<u64, String>,
    /// Each waiting request's sequence number, and how to wake it.
    waiting: Vec<(u64, oneshot::Sender<Reached>)>,
}

impl SeqWaiters {
    /// Waiters on a sequence that has reached `reached` (or stopped, with why).
    pub fn new(reached: std::result::Result<u64, String>) -> SeqWaiters {
        SeqWaiters {
            inner: Mutex::new(Inner {
                reached,
                waiting: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves once `seq` is reached, or with why it never will be.
    pub fn wait(&self, seq: u64) -> impl Future<Output = Reached> + Send + use<> {
        let waiting = {
            let mut inner = self.lock();
            match &inner.reached {
                Ok(reached) if *reached >= seq => Err(Ok(())),
                Ok(_) => {
                    let (wake, woken) = oneshot::channel();
                    inner.waiting.push((seq, wake));
                    Ok(woken)
                }
                Err(why) => Err(Err(why.clone())),
            }
        };
        async move {
            match waiting {
                Ok(woken) => woken
                    .await
                    .unwrap_or_else(|_| Err("the sequence's owner stopped".into())),
                Err(now) => now,
            }
        }
    }

    /// The sequence has reached `seq`: wakes every request waiting for it or an earlier one.
    /// (A stopped sequence stays stopped; a lower `seq` changes nothing.)
    pub fn advance(&self, seq: u64) {
        let mut inner = self.lock();
        match &mut inner.reached {
            Ok(reached) if *reached < seq => *reached = seq,
            _ => return,
        }
        let mut i = 0;
        while i < inner.waiting.len() {
            if inner.waiting[i].0 <= seq {
                let (_, wake) = inner.waiting.swap_remove(i);
                // A request that gave up waiting has dropped its end: nothing to wake.
                let _ = wake.send(Ok(()));
            } else {
                i += 1;
            }
        }
    }

    /// No further sequence number will be reached, because of `why`: every waiting request,
    /// and every later one, is told so.
    pub fn stop(&self, why: String) {
        let mut inner = self.lock();
        for (_, wake) in inner.waiting.drain(..) {
            let _ = wake.send(Err(why.clone()));
        }
        inner.reached = Err(why);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    fn poll<F: Future>(future: &mut std::pin::Pin<&mut F>) -> Poll<F::Output> {
        future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn an_advance_wakes_exactly_the_requests_it_covers() {
        let waiters = SeqWaiters::new(Ok(3));
        let mut reached = pin!(waiters.wait(2));
        assert_eq!(poll(&mut reached), Poll::Ready(Ok(())), "already reached");
        let mut five = pin!(waiters.wait(5));
        let mut seven = pin!(waiters.wait(7));
        let mut four = pin!(waiters.wait(4));
        assert!(poll(&mut five).is_pending());
        waiters.advance(5);
        assert_eq!(poll(&mut five), Poll::Ready(Ok(())));
        assert_eq!(poll(&mut four), Poll::Ready(Ok(())), "out of order");
        assert!(poll(&mut seven).is_pending(), "not yet reached");
        waiters.advance(4);
        assert!(
            poll(&mut seven).is_pending(),
            "the sequence never goes back"
        );
        assert_eq!(
            waiters.lock().waiting.len(),
            1,
            "only the uncovered one waits"
        );
        waiters.advance(7);
        assert_eq!(poll(&mut seven), Poll::Ready(Ok(())));
    }

    #[test]
    fn a_stop_fails_every_waiting_and_later_request() {
        let waiters = SeqWaiters::new(Ok(0));
        let mut one = pin!(waiters.wait(1));
        assert!(poll(&mut one).is_pending());
        waiters.stop("disk full".into());
        assert_eq!(poll(&mut one), Poll::Ready(Err("disk full".into())));
        waiters.advance(9);
        let mut later = pin!(waiters.wait(1));
        assert_eq!(
            poll(&mut later),
            Poll::Ready(Err("disk full".into())),
            "a stopped sequence stays stopped"
        );
    }
}
