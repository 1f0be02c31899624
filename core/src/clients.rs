//! Client liveness: who has been heard from, and when.
//!
//! Any call from a client counts as a sign of life; clients with nothing to do heartbeat. A
//! client silent for `client_ttl` is dead: the master unmounts its segments, drops its
//! in-progress writes and releases its held reads (see `Master::expire_clients`).

use std::collections::BTreeMap;

use crate::ids::ClientId;
use crate::time::Millis;

/// Live clients and when each was last heard from.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Clients {
    last_seen: BTreeMap<ClientId, Millis>,
}

impl Clients {
    /// Records that `client` was heard from at `now`; returns true if it was not known.
    pub(crate) fn touch(&mut self, client: ClientId, now: Millis) -> bool {
        self.last_seen.insert(client, now).is_none()
    }

    pub(crate) fn is_live(&self, client: ClientId) -> bool {
        self.last_seen.contains_key(&client)
    }

    pub(crate) fn len(&self) -> usize {
        self.last_seen.len()
    }

    /// Removes and returns the clients silent since before `now - ttl`, in id order.
    pub(crate) fn take_expired(&mut self, now: Millis, ttl: Millis) -> Vec<ClientId> {
        let expired: Vec<ClientId> = self
            .last_seen
            .iter()
            .filter(|&(_, &seen)| seen + ttl <= now)
            .map(|(&client, _)| client)
            .collect();
        for client in &expired {
            self.last_seen.remove(client);
        }
        expired
    }

    /// When the next client expires, if any is live.
    pub(crate) fn next_expiry(&self, ttl: Millis) -> Option<Millis> {
        self.last_seen.values().min().map(|&seen| seen + ttl)
    }

    pub(crate) fn rebase(&mut self, shift: impl Fn(Millis) -> Millis) {
        for seen in self.last_seen.values_mut() {
            *seen = shift(*seen);
        }
    }
}
