//! Client liveness: who has been heard from, and when.
//!
//! Any call from a client counts as a sign of life; clients with nothing to do heartbeat. A
//! client silent for `client_ttl` is dead: the master unmounts its segments, drops its
//! in-progress writes and releases its held reads (see `Master::expire_clients`).

use std::collections::BTreeMap;

use crate::ids::ClientId;
use crate::time::Millis;

/// Live clients and when each was last heard from.
///
/// A client is *announced* once it has been told it is registered (by a heartbeat or a
/// mount). A client that expired and then came back with some other call (a put, a read) is
/// live again but not announced, so its next heartbeat answers `Registered` and its node
/// knows to mount its segments again.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Clients {
    last_seen: BTreeMap<ClientId, Seen>,
}

/// When a client was last heard from, whether it knows it is registered, and whether it said
/// goodbye since.
#[derive(Clone, Copy, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct Seen {
    at: Millis,
    announced: bool,
    left: bool,
}

impl Clients {
    /// Records that `client` was heard from at `now` (registering it, unannounced, if it
    /// was not known).
    pub(crate) fn touch(&mut self, client: ClientId, now: Millis) {
        self.last_seen
            .entry(client)
            .and_modify(|seen| {
                seen.at = now;
                seen.left = false;
            })
            .or_insert(Seen {
                at: now,
                announced: false,
                left: false,
            });
    }

    /// Records that `client` was heard from and is told it is registered; returns true if it
    /// had not been told since it (re)joined.
    pub(crate) fn announce(&mut self, client: ClientId, now: Millis) -> bool {
        let previous = self.last_seen.insert(
            client,
            Seen {
                at: now,
                announced: true,
                left: false,
            },
        );
        !previous.is_some_and(|seen| seen.announced)
    }

    pub(crate) fn is_live(&self, client: ClientId) -> bool {
        self.last_seen.contains_key(&client)
    }

    /// Whether `client` was heard from within the TTL and has not said goodbye since.
    pub(crate) fn is_present(&self, client: ClientId) -> bool {
        self.last_seen.get(&client).is_some_and(|seen| !seen.left)
    }

    /// Clients heard from within the TTL that have not said goodbye since.
    pub(crate) fn present(&self) -> usize {
        self.last_seen.values().filter(|seen| !seen.left).count()
    }

    /// Removes the clients silent since before `now - ttl` and returns them, in id order,
    /// with whether each had said goodbye.
    pub(crate) fn take_expired(&mut self, now: Millis, ttl: Millis) -> Vec<(ClientId, bool)> {
        let expired: Vec<(ClientId, bool)> = self
            .last_seen
            .iter()
            .filter(|&(_, seen)| seen.at + ttl <= now)
            .map(|(&client, seen)| (client, seen.left))
            .collect();
        for (client, _) in &expired {
            self.last_seen.remove(client);
        }
        expired
    }

    /// Records that `client` said goodbye; whether it was known and had not already.
    pub(crate) fn leave(&mut self, client: ClientId) -> bool {
        match self.last_seen.get_mut(&client) {
            Some(seen) if !seen.left => {
                seen.left = true;
                true
            }
            _ => false,
        }
    }

    /// When each live client was last heard from (for audits, which work deadlines out for
    /// themselves).
    pub(crate) fn last_heard(&self) -> impl Iterator<Item = (ClientId, Millis)> + '_ {
        self.last_seen
            .iter()
            .map(|(&client, seen)| (client, seen.at))
    }

    /// When the next client expires, if any is live.
    pub(crate) fn next_expiry(&self, ttl: Millis) -> Option<Millis> {
        self.last_seen
            .values()
            .map(|seen| seen.at)
            .min()
            .map(|at| at + ttl)
    }

    pub(crate) fn rebase(&mut self, shift: impl Fn(Millis) -> Millis) {
        for seen in self.last_seen.values_mut() {
            seen.at = shift(seen.at);
        }
    }
}
