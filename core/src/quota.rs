//! What one member may hold back from everyone else: the value bytes of its unfinished puts.
//!
//! A put reserves its blocks at PutStart and holds them until it ends, is aborted or is
//! discarded; a member that starts large puts and never finishes them (while it keeps
//! heartbeating, so it is never taken for dead) would otherwise keep the pool from every
//! other writer. Each member may hold at most `unfinished_put_share` of the pool's capacity in
//! unfinished puts; past that its next put is refused with `NO_AVAILABLE_HANDLE`, the code that
//! tells a writer to back off, and other members' puts go on.
//!
//! A member is the high half of a client id: a member credential puts its own tag there (see
//! the proto crate's `auth`), so every process of one member counts together. Ids below 2^64
//! (tests, and tools that pick small ids) each count as a member of their own.

use std::collections::BTreeMap;

use crate::error::{Error, ErrorCode, Result};
use crate::ids::ClientId;
use crate::master::Master;

/// The member a client id belongs to.
pub fn member_of(client: ClientId) -> u128 {
    match client.0 >> 64 {
        0 => client.0,
        tag => tag << 64,
    }
}

/// Unfinished puts, by object slot and by member: rebuilt from the objects at restore, so it is
/// never part of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Unfinished {
    by_slot: BTreeMap<u32, (u128, u64)>,
    by_member: BTreeMap<u128, u64>,
}

impl Unfinished {
    /// The write on `slot` by `writer` of `size` bytes started.
    pub(crate) fn start(&mut self, slot: u32, writer: ClientId, size: u64) {
        let member = member_of(writer);
        if let Some((old, bytes)) = self.by_slot.insert(slot, (member, size)) {
            self.take(old, bytes);
        }
        *self.by_member.entry(member).or_default() += size;
    }

    /// The write on `slot` ended (completed, aborted, discarded, or its object removed).
    pub(crate) fn end(&mut self, slot: u32) {
        if let Some((member, bytes)) = self.by_slot.remove(&slot) {
            self.take(member, bytes);
        }
    }

    fn take(&mut self, member: u128, bytes: u64) {
        if let Some(held) = self.by_member.get_mut(&member) {
            *held -= bytes;
            if *held == 0 {
                self.by_member.remove(&member);
            }
        }
    }

    /// Bytes of unfinished puts `client`'s member holds.
    pub(crate) fn held_by(&self, client: ClientId) -> u64 {
        self.by_member.get(&member_of(client)).copied().unwrap_or(0)
    }

    /// The same table, worked out from the objects being written.
    pub(crate) fn rebuild(master: &Master) -> Unfinished {
        let mut table = Unfinished::default();
        for (slot, object) in master.objects.iter().filter(|(_, o)| o.writing) {
            table.start(slot, object.writer, object.size);
        }
        table
    }
}

impl Master {
    /// Refuses a put of `size` bytes by `client` that would take its member past its share of
    /// the pool in unfinished puts.
    pub(crate) fn check_unfinished_share(&self, client: ClientId, size: u64) -> Result<()> {
        let capacity = self.segments.capacity();
        let cap = (capacity as f64 * self.config.unfinished_put_share) as u64;
        let held = self.unfinished.held_by(client);
        // A value larger than the pool cannot be placed at all; placement says why.
        if held.saturating_add(size) <= cap || size > capacity {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::NO_AVAILABLE_HANDLE,
            format!(
                "this member already holds {held} bytes in unfinished puts; another {size} would \
                 pass its share ({cap} bytes, unfinished_put_share {} of the pool's {capacity}); \
                 finish or abort its puts first, or back off and retry",
                self.config.unfinished_put_share
            ),
        ))
    }
}
