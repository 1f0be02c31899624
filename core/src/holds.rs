//! Held reads: a read that pins an object's replicas until it is explicitly released.
//!
//! A lease protects a read for a fixed TTL. A held read (Mooncake's replica refcount) protects
//! it for as long as it takes: while held, the object is not evicted, removed, or upserted
//! (`OBJECT_REPLICA_BUSY`). Holds belong to a client and are released if the client dies, so a
//! crashed reader cannot pin an object forever.

use std::collections::BTreeMap;

use crate::error::{Error, ErrorCode, Result};
use crate::ids::{ClientId, HoldId, WriteId};
use crate::master::Master;
use crate::reads::ReplicaList;
use crate::time::Millis;

/// One held read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Hold {
    pub client: ClientId,
    /// The held object's slot and the write that produced it: together they identify the
    /// object even if the slot is later reused.
    pub slot: u32,
    pub write: WriteId,
}

/// The slot of a hold whose object went away and whose slot and write now name another
/// object (see [`Master::detach_holds`]): no object is ever in it.
const DETACHED: u32 = u32::MAX;

/// Outstanding held reads.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Holds {
    by_id: BTreeMap<HoldId, Hold>,
}

impl Holds {
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&HoldId, &Hold)> {
        self.by_id.iter()
    }
}

impl Master {
    /// Reads `key`'s complete replicas and holds them until [`Master::release_hold`].
    pub fn acquire_hold(
        &mut self,
        client: ClientId,
        key: &str,
        now: Millis,
    ) -> Result<(HoldId, ReplicaList)> {
        let now = self.advance(now);
        self.touch(client, now);
        let slot = self.read_slot(key, self.objects.find(key))?;
        let list = self.read_replicas(slot, now);
        let object = self.objects.at_mut(slot);
        object.add_hold();
        let hold = Hold {
            client,
            slot,
            write: object.write_id(),
        };
        self.counters.next_hold += 1;
        let id = HoldId(self.counters.next_hold);
        self.holds.by_id.insert(id, hold);
        Ok((id, list))
    }

    /// Releases a held read. Releasing a hold whose object has since gone is fine.
    pub fn release_hold(&mut self, client: ClientId, hold: HoldId, now: Millis) -> Result<()> {
        let now = self.advance(now);
        self.touch(client, now);
        let held = *self.holds.by_id.get(&hold).ok_or_else(|| {
            Error::new(ErrorCode::INVALID_PARAMS, format!("no outstanding {hold}"))
        })?;
        if held.client != client {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!("{hold} belongs to client {}", held.client),
            ));
        }
        self.holds.by_id.remove(&hold);
        self.unhold(held);
        Ok(())
    }

    /// Releases every hold of a dead client.
    pub(crate) fn release_client_holds(&mut self, client: ClientId) {
        let mine: Vec<HoldId> = self
            .holds
            .by_id
            .iter()
            .filter(|(_, h)| h.client == client)
            .map(|(&id, _)| id)
            .collect();
        for id in mine {
            let held = self.holds.by_id.remove(&id).expect("listed hold");
            self.unhold(held);
        }
    }

    /// The object just put in `slot` is new but holds an old write, `write` (a disk copy
    /// adopted after its object went away): holds taken on the object that went away are
    /// not holds on this one, so they stop naming it (releasing them stays fine).
    pub(crate) fn detach_holds(&mut self, slot: u32, write: WriteId) {
        for hold in self.holds.by_id.values_mut() {
            if hold.slot == slot && hold.write == write {
                hold.slot = DETACHED;
            }
        }
    }

    fn unhold(&mut self, held: Hold) {
        if let Some(object) = self.objects.get_mut(held.slot)
            && object.write_id() == held.write
        {
            debug_assert!(object.holds() > 0);
            object.drop_hold();
        }
    }
}
