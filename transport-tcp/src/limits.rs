//! Connection caps for servers: in total, for connections that have not finished the
//! handshake, and per authenticated identity, so one peer (a runaway client, a leak) cannot
//! take the whole cap from everyone else. Identities, not addresses: co-located engines and
//! striped transfers share one address. A connection is counted from accept to close by the
//! guards this hands out.
//!
//! The handshake room never turns a newcomer away: when it is full, a connection is dismissed
//! to make room: the one that has waited longest among those of the source address holding
//! the most places. An honest peer finishes its handshake within a round trip, so it is never
//! the one waiting longest; a stranger holding sockets open without finishing pushes out only
//! its own, and a flood from a few addresses cannot crowd out a slow peer elsewhere. Members
//! already admitted are never touched.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
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
    /// Those not dismissed, oldest first: their tickets, sources and dismissals.
    waiting: VecDeque<(u64, IpAddr, oneshot::Sender<()>)>,
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

    /// Admits a connection from `source` just accepted, to its handshake (if the room is
    /// full, dismissing the longest waiting of the source that holds the most places); the
    /// reason if the total cap is reached.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<Handshaking, String> {
        let mut counts = self.counts();
        if counts.open >= self.total {
            return Err(format!("{} connections already open", self.total));
        }
        while counts.waiting.len() >= self.unauthenticated.max(1) {
            let mut held: HashMap<IpAddr, usize> = HashMap::new();
            for (_, from, _) in &counts.waiting {
                *held.entry(*from).or_default() += 1;
            }
            // The source holding the most places; of equals, the one whose oldest waited
            // longest (the first met).
            let most = held.values().copied().max().unwrap_or(0);
            let at = counts
                .waiting
                .iter()
                .position(|(_, from, _)| held[from] == most)
                .expect("a source holds the most");
            if let Some((_, _, dismiss)) = counts.waiting.remove(at) {
                let _ = dismiss.send(());
            }
        }
        counts.next_ticket += 1;
        let ticket = counts.next_ticket;
        let (dismiss, dismissed) = oneshot::channel();
        counts.waiting.push_back((ticket, source, dismiss));
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
pub const DISMISSED: &str = "dismissed: the handshake room was full, and this connection's \
     address held the most places and it had waited longest of them";

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
        counts.waiting.retain(|(t, _, _)| *t != ticket);
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

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn one_identity_cannot_take_the_whole_cap() {
        let limits = ConnectionLimits::new(6, 3, 2);
        let a1 = limits.admit(HERE).unwrap().authenticated(1).unwrap();
        let _a2 = limits.admit(HERE).unwrap().authenticated(1).unwrap();
        let refused = limits.admit(HERE).unwrap().authenticated(1).unwrap_err();
        assert!(refused.contains("already holds 2"), "{refused}");
        // Another identity still gets in, and a closed connection frees its share.
        let _b = limits.admit(HERE).unwrap().authenticated(2).unwrap();
        drop(a1);
        let _a3 = limits.admit(HERE).unwrap().authenticated(1).unwrap();
    }

    #[test]
    fn a_full_room_dismisses_whoever_waited_longest_and_the_total_holds() {
        let limits = ConnectionLimits::new(4, 2, 4);
        let mut h1 = limits.admit(HERE).unwrap();
        let mut h2 = limits.admit(HERE).unwrap();
        // The room is full: a newcomer gets in, and the oldest is told to go.
        let h3 = limits.admit(HERE).unwrap();
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
        let _in3 = limits.admit(HERE).unwrap().authenticated(7).unwrap();
        let _h4 = limits.admit(HERE).unwrap();
        let _h5 = limits.admit(HERE).unwrap();
        assert!(
            limits
                .admit(HERE)
                .unwrap_err()
                .contains("4 connections already open")
        );
    }

    #[test]
    fn a_flood_from_one_address_pushes_out_only_its_own() {
        let limits = ConnectionLimits::new(64, 4, 4);
        let elsewhere = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));
        let flood = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 9));
        // A slow honest peer arrived first, then the flood.
        let mut slow = limits.admit(elsewhere).unwrap();
        let mut flooding: Vec<Handshaking> = (0..3).map(|_| limits.admit(flood).unwrap()).collect();
        for _ in 0..20 {
            flooding.push(limits.admit(flood).unwrap());
        }
        assert!(
            slow.dismissed.try_recv().is_err(),
            "the slow peer keeps its place though it waited longest"
        );
        let dismissed = flooding
            .iter_mut()
            .map(|h| h.dismissed.try_recv().is_ok())
            .filter(|&gone| gone)
            .count();
        assert_eq!(dismissed, 20, "the flood pushed out only its own");
        assert!(slow.authenticated(1).is_ok());
    }
}
