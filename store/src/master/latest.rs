//! The latest value of something that changes, for tasks that wait for its next change.
//!
//! What tokio's `watch` channel does, with one difference that matters to the simulation: a
//! watch receiver waits on one of eight wait lists, picked by tokio's thread-local random
//! generator, whose seed comes from a process-wide counter. The order in which a change woke
//! its waiters, and with it a whole simulated run, then depended on which runs had gone
//! before in the same process (a group of masters follows its journal's syncs with several
//! waiters at once: such seeds ran differently in a batch than replayed alone). Here every
//! waiter joins one list, and a change wakes them in the order they began to wait.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// The owner's side: sets the value; dropping it tells followers no change will come.
pub struct Latest<T> {
    shared: Arc<Shared<T>>,
}

/// A follower's side: reads the value and waits for changes it has not seen.
pub struct Follower<T> {
    shared: Arc<Shared<T>>,
    /// The version this follower saw last.
    seen: u64,
}

/// The owner is gone: the value will not change again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed;

struct Shared<T> {
    state: Mutex<State<T>>,
    changed: Notify,
}

struct State<T> {
    value: T,
    /// Counts the changes.
    version: u64,
    closed: bool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Every update completes before the lock is released.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T: Clone> Latest<T> {
    /// Starts at `value`.
    pub fn new(value: T) -> Latest<T> {
        Latest {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    value,
                    version: 0,
                    closed: false,
                }),
                changed: Notify::new(),
            }),
        }
    }

    /// The value now.
    pub fn get(&self) -> T {
        self.shared.lock().value.clone()
    }

    /// Replaces the value and wakes every follower waiting for a change.
    pub fn set(&self, value: T) {
        self.update(|old| {
            *old = value;
            true
        });
    }

    /// Lets `change` modify the value; followers are woken only if it says it did.
    pub fn update(&self, change: impl FnOnce(&mut T) -> bool) {
        let changed = {
            let mut state = self.shared.lock();
            let changed = change(&mut state.value);
            if changed {
                state.version += 1;
            }
            changed
        };
        if changed {
            self.shared.changed.notify_waiters();
        }
    }

    /// A follower that has seen the value as it is now.
    pub fn follow(&self) -> Follower<T> {
        Follower {
            seen: self.shared.lock().version,
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Latest<T> {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_waiters();
    }
}

impl<T: Clone> Follower<T> {
    /// The value now (not marked as seen).
    pub fn get(&self) -> T {
        self.shared.lock().value.clone()
    }

    /// The value now, marked as seen.
    pub fn take(&mut self) -> T {
        let state = self.shared.lock();
        self.seen = state.version;
        state.value.clone()
    }

    /// Waits until the value changes from the last one seen, and marks it seen; `Closed` once
    /// the owner is gone and every change was seen.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            // Registered before looking, so a change made between the look and the wait
            // still wakes it.
            notified.as_mut().enable();
            {
                let state = self.shared.lock();
                if state.version != self.seen {
                    self.seen = state.version;
                    return Ok(());
                }
                if state.closed {
                    return Err(Closed);
                }
            }
            notified.await;
        }
    }

    /// Waits until the value satisfies `wanted` (perhaps at once) and returns it; `Closed`
    /// once the owner is gone and the value never did.
    pub async fn wait_for(&mut self, mut wanted: impl FnMut(&T) -> bool) -> Result<T, Closed> {
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.shared.lock();
                self.seen = state.version;
                if wanted(&state.value) {
                    return Ok(state.value.clone());
                }
                if state.closed {
                    return Err(Closed);
                }
            }
            notified.await;
        }
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn followers_see_each_change_once_and_learn_when_the_owner_goes() {
        let latest = Latest::new(1);
        let mut follower = latest.follow();
        let waiting = tokio::spawn(async move {
            follower.changed().await.unwrap();
            let seen = follower.take();
            (follower, seen)
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        latest.set(2);
        let (mut follower, seen) = waiting.await.unwrap();
        assert_eq!(seen, 2);
        // An update that changes nothing wakes nobody.
        latest.update(|_| false);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), follower.changed())
                .await
                .is_err()
        );
        latest.update(|v| {
            *v = 3;
            true
        });
        follower.changed().await.unwrap();
        assert_eq!(follower.get(), 3);
        drop(latest);
        assert_eq!(follower.changed().await, Err(Closed));
    }

    #[tokio::test]
    async fn wait_for_returns_a_matching_value_at_once_or_when_it_comes() {
        let latest = Latest::new(Ok::<u64, String>(0));
        let mut follower = latest.follow();
        assert_eq!(follower.wait_for(|v| v.is_ok()).await, Ok(Ok(0)));
        let waiting = tokio::spawn(async move { follower.wait_for(|v| v.is_err()).await });
        latest.set(Ok(5));
        latest.set(Err("deposed".into()));
        assert_eq!(waiting.await.unwrap(), Ok(Err("deposed".to_string())));
        let mut late = latest.follow();
        drop(latest);
        assert_eq!(late.wait_for(|v| v.is_ok()).await, Err(Closed));
    }
}
