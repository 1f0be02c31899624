//! Connection caps for servers: in total, for connections that have not finished the
//! handshake, and per authenticated identity, so one peer (a runaway client, a leak) cannot
//! take the whole cap from everyone else. Identities, not addresses: co-located engines and
//! striped transfers share one address. A connection is counted from accept to close by the
//! guards this hands out.
//!
//! The handshake room never turns a newcomer away: when it is full, the connection that has
//! waited longest is dismissed to make room. An honest peer finishes its handshake within a
//! round trip, so it is never the one waiting longest; a stranger holding sockets open
//! without finishing only pushes its own out. Members already admitted are never touched.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// Most connections a server keeps open.
pub const MAX_CONNECTIONS: usize = 4096;
/// Most connections still in their handshake: strangers wait in a small room, the longest
/// waiting dismissed when a newcomer needs its place.
pub const MAX_UNAUTHENTICATED: usize = 256;
/// Most connections one identity keeps open (client pools keep at most 64 control and 32 data
/// connections per peer, so an honest client stays far below it).
pub const MAX_PER_IDENTITY: usize = 512;
/// A server closes a connection that sent nothing for this long; clients retire pooled
/// connections idle for half of it, so they never pick one the server is about to close.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The caps, and the connections they count.
#[derive(Debug)]
pub struct ConnectionLimits {
    total: usize,
    unauthenticated: usize,
    per_identity: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    open: usize,
    /// Connections in their handshake, dismissed or not.
    pending: usize,
    /// Those not dismissed, oldest first: their tickets and dismissals.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
    next_ticket: u64,
    by_identity: HashMap<u128, usize>,
}

impl ConnectionLimits {
    /// Caps of `total` connections, `unauthenticated` of them in their handshake, and
    /// `per_identity` for any one identity.
    pub fn new(total: usize, unauthenticated: usize, per_identity: usize) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            total,
            unauthenticated,
            per_identity,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// The default caps ([`MAX_CONNECTIONS`], [`MAX_UNAUTHENTICATED`], [`MAX_PER_IDENTITY`]).
    pub fn standard() -> Arc<ConnectionLimits> {
        ConnectionLimits::new(MAX_CONNECTIONS, MAX_UNAUTHENTICATED, MAX_PER_IDENTITY)
    }

    /// Connections open now (handshaking or admitted).
    pub fn open(&self) -> usize {
        self.counts().open
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a connection just accepted, to its handshake (dismissing the connection that
    /// has waited longest if the room is full); the reason if the total cap is reached.
    pub fn admit(self: &Arc<Self>) -> Result<Handshaking, String> {
        let mut counts = self.counts();
        if counts.open >= self.total {
            return Err(format!("{} connections already open", self.total));
        }
        while counts.waiting.len() >= self.unauthenticated {
            if let Some((_, dismiss)) = counts.waiting.pop_front() {
                let _ = dismiss.send(());
            }
        }
        counts.next_ticket += 1;
        let ticket = counts.next_ticket;
        let (dismiss, dismissed) = oneshot::channel();
        counts.waiting.push_back((ticket, dismiss));
        counts.open += 1;
        counts.pending += 1;
        Ok(Handshaking {
            limits: Arc::clone(self),
            ticket,
            dismissed,
        })
    }
}

/// A connection in its handshake.
#[derive(Debug)]
pub struct Handshaking {
    limits: Arc<ConnectionLimits>,
    ticket: u64,
    dismissed: oneshot::Receiver<()>,
}

/// Why a dismissed connection was closed.
pub const DISMISSED: &str =
    "dismissed: the handshake room was full and this connection had waited longest";

impl Handshaking {
    /// Resolves when the connection is dismissed to make room for a newer one (run the
    /// handshake beside it and drop the connection if this comes first).
    pub async fn dismissed(&mut self) {
        if (&mut self.dismissed).await.is_err() {
            // Its place was given up another way: never dismissed.
            std::future::pending::<()>().await;
        }
    }

    /// The handshake proved `identity`: the connection now counts against its share.
    pub fn authenticated(self, identity: u128) -> Result<Admitted, String> {
        let limits = Arc::clone(&self.limits);
        let mut counts = limits.counts();
        let held = counts.by_identity.get(&identity).copied().unwrap_or(0);
        if held >= limits.per_identity {
            return Err(format!(
                "identity {identity:#x} already holds {held} connections (at most {})",
                limits.per_identity
            ));
        }
        counts.by_identity.insert(identity, held + 1);
        // Dropping `self` takes it out of the handshake room and the open count; `Admitted`
        // counts it as open again.
        counts.open += 1;
        drop(counts);
        drop(self);
        Ok(Admitted { limits, identity })
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut counts = self.limits.counts();
        let ticket = self.ticket;
        counts.waiting.retain(|(t, _)| *t != ticket);
        counts.pending -= 1;
        counts.open -= 1;
    }
}

/// An authenticated connection, counted until it closes.
#[derive(Debug)]
pub struct Admitted {
    limits: Arc<ConnectionLimits>,
    identity: u128,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.limits.counts();
        counts.open -= 1;
        if let Some(held) = counts.by_identity.get_mut(&self.identity) {
            *held -= 1;
            if *held == 0 {
                counts.by_identity.remove(&self.identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_identity_cannot_take_the_whole_cap() {
        let limits = ConnectionLimits::new(6, 3, 2);
        let a1 = limits.admit().unwrap().authenticated(1).unwrap();
        let _a2 = limits.admit().unwrap().authenticated(1).unwrap();
        let refused = limits.admit().unwrap().authenticated(1).unwrap_err();
        assert!(refused.contains("already holds 2"), "{refused}");
        // Another identity still gets in, and a closed connection frees its share.
        let _b = limits.admit().unwrap().authenticated(2).unwrap();
        drop(a1);
        let _a3 = limits.admit().unwrap().authenticated(1).unwrap();
    }

    #[test]
    fn a_full_room_dismisses_whoever_waited_longest_and_the_total_holds() {
        let limits = ConnectionLimits::new(4, 2, 4);
        let mut h1 = limits.admit().unwrap();
        let mut h2 = limits.admit().unwrap();
        // The room is full: a newcomer gets in, and the oldest is told to go.
        let h3 = limits.admit().unwrap();
        assert!(h1.dismissed.try_recv().is_ok(), "the oldest is dismissed");
        assert!(h2.dismissed.try_recv().is_err(), "the others wait on");
        drop(h1);
        let _in = h2.authenticated(7).unwrap();
        let counts = limits.counts();
        assert_eq!(
            (counts.open, counts.pending, counts.waiting.len()),
            (2, 1, 1)
        );
        drop(counts);
        drop(h3);
        let _in3 = limits.admit().unwrap().authenticated(7).unwrap();
        let _h4 = limits.admit().unwrap();
        let _h5 = limits.admit().unwrap();
        assert!(
            limits
                .admit()
                .unwrap_err()
                .contains("4 connections already open")
        );
    }
}
