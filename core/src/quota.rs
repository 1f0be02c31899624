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

use std::collections::{BTreeMap, HashMap};

use foldhash::fast::FixedState;

use crate::error::{Error, ErrorCode, Result};
use crate::ids::ClientId;
use crate::master::Master;
use crate::objects::ObjectTable;
use crate::tenant::{DEFAULT_TENANT, tenant_of};

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
    /// Hashed, not ordered: every put starts and ends an entry, and nothing walks them.
    by_slot: HashMap<u32, Held, FixedState>,
    by_member: BTreeMap<u128, u64>,
    /// The same bytes by tenant: only tenants with a quota on them are asked, and few writes
    /// are in progress at once, so this is a map of the writes' keys' tenants.
    by_tenant: BTreeMap<String, u64>,
}

/// What one unfinished put holds back, and whose.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    member: u128,
    bytes: u64,
    /// Its key's tenant; none for the default tenant, which most keys have (every put would
    /// otherwise allocate its name).
    tenant: Option<Box<str>>,
}

impl Unfinished {
    /// The write on `slot` (of `key`) by `writer` of `size` bytes started.
    pub(crate) fn start(&mut self, slot: u32, key: &str, writer: ClientId, size: u64) {
        self.end(slot);
        let member = member_of(writer);
        *self.by_member.entry(member).or_default() += size;
        let tenant = tenant_of(key);
        match self.by_tenant.get_mut(tenant) {
            Some(held) => *held += size,
            None => {
                self.by_tenant.insert(tenant.to_string(), size);
            }
        }
        let held = Held {
            member,
            bytes: size,
            tenant: (tenant != DEFAULT_TENANT).then(|| tenant.into()),
        };
        self.by_slot.insert(slot, held);
    }

    /// The write on `slot` ended (completed, aborted, discarded, or its object removed).
    pub(crate) fn end(&mut self, slot: u32) {
        if let Some(held) = self.by_slot.remove(&slot) {
            take(&mut self.by_member, &held.member, held.bytes);
            let tenant = held.tenant.as_deref().unwrap_or(DEFAULT_TENANT);
            take(&mut self.by_tenant, tenant, held.bytes);
        }
    }

    /// Bytes of unfinished puts of `tenant`'s keys.
    pub(crate) fn held_in(&self, tenant: &str) -> u64 {
        self.by_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// Bytes of unfinished puts `client`'s member holds.
    pub(crate) fn held_by(&self, client: ClientId) -> u64 {
        self.by_member.get(&member_of(client)).copied().unwrap_or(0)
    }

    /// The same table, worked out from the objects being written.
    pub(crate) fn rebuild(objects: &ObjectTable) -> Unfinished {
        let mut table = Unfinished::default();
        for (slot, object) in objects.iter().filter(|(_, o)| o.writing()) {
            table.start(
                slot,
                objects.key_of(object),
                objects.writer(slot),
                object.size(),
            );
        }
        table
    }
}

/// Takes `bytes` from `key`'s count, forgetting a count that reaches zero.
fn take<K: Ord + std::borrow::Borrow<Q>, Q: Ord + ?Sized>(
    map: &mut BTreeMap<K, u64>,
    key: &Q,
    bytes: u64,
) {
    if let Some(held) = map.get_mut(key) {
        *held -= bytes;
        if *held == 0 {
            map.remove(key);
        }
    }
}

impl Master {
    /// What `tenant` stores now: its objects, value bytes and bytes on disk.
    pub fn tenant_usage(&self, tenant: &str) -> crate::tenant::Usage {
        self.objects.tenants().of(tenant)
    }

    /// Refuses a put of `key` (`size` bytes) that would take its tenant past its quota, if it
    /// has one. `replaced` is the size of the value of `key` the put replaces, if any.
    pub(crate) fn check_tenant_quota(
        &self,
        key: &str,
        size: u64,
        replaced: Option<u64>,
    ) -> Result<()> {
        let tenant = tenant_of(key);
        let Some(quota) = self
            .config
            .tenant_quotas
            .iter()
            .find(|q| q.tenant == tenant)
        else {
            return Ok(());
        };
        let usage = self.objects.tenants().of(tenant);
        let unfinished = self.unfinished.held_in(tenant);
        match quota.refusal(
            usage,
            unfinished,
            size,
            replaced.unwrap_or(0),
            replaced.is_none(),
        ) {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

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
