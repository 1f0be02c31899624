//! Removal: explicit deletes by key, by pattern, or of everything removable.
//!
//! Removal is refused while anyone may be using the object: a reader's lease
//! (`OBJECT_HAS_LEASE`), a held read (`OBJECT_REPLICA_BUSY`), a write in progress
//! (`REPLICA_IS_NOT_READY`) or a copy/move (`OBJECT_HAS_REPLICATION_TASK`). Pins do not stop
//! removal: removing is how a hard pin is cleared.

use crate::error::{ErrorCode, Result};
use crate::master::Master;
use crate::reads::tenant_pattern;
use crate::tenant::tenant_of;
use crate::time::Millis;

impl Master {
    /// Removes `key`.
    pub fn remove(&mut self, key: &str, now: Millis) -> Result<()> {
        let now = self.advance(now);
        self.check_key(key)?;
        let slot = self.objects.find(key).ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        self.removable(slot, now)?;
        self.remove_now(slot);
        Ok(())
    }

    /// Removes every object of `tenant` that [`Master::remove`] would; returns how many.
    pub fn remove_all(&mut self, tenant: &str, now: Millis) -> u64 {
        let now = self.advance(now);
        self.remove_matching(now, |key| tenant_of(key) == tenant)
    }

    /// Removes every removable object of `tenant` whose key (as the tenant named it) matches
    /// `pattern`; returns how many.
    pub fn remove_by_regex(&mut self, tenant: &str, pattern: &str, now: Millis) -> Result<u64> {
        let now = self.advance(now);
        let matches = tenant_pattern(tenant, pattern, self.config.max_key_len)?;
        Ok(self.remove_matching(now, matches))
    }

    fn remove_matching(&mut self, now: Millis, matches: impl Fn(&str) -> bool) -> u64 {
        let victims: Vec<u32> = self
            .objects
            .iter()
            .filter(|(_, o)| matches(self.objects.key_of(o)))
            .map(|(slot, _)| slot)
            .collect();
        let mut removed = 0;
        for slot in victims {
            if self.removable(slot, now).is_ok() {
                self.remove_now(slot);
                removed += 1;
            }
        }
        removed
    }

    /// Why the object in `slot` cannot be removed now, if it cannot.
    pub(crate) fn removable(&self, slot: u32, now: Millis) -> Result<()> {
        let object = self.objects.at(slot);
        if object.task().is_some() {
            return Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK.into());
        }
        if object.writing() {
            return Err(ErrorCode::REPLICA_IS_NOT_READY.into());
        }
        if object.holds() > 0 {
            return Err(ErrorCode::OBJECT_REPLICA_BUSY.into());
        }
        if object.lease_active(now) {
            return Err(ErrorCode::OBJECT_HAS_LEASE.into());
        }
        Ok(())
    }

    /// Removes the object in `slot`; its blocks are reused once its last lease (plus grace)
    /// is over.
    pub(crate) fn remove_now(&mut self, slot: u32) {
        if self.objects.at(slot).is_readable() {
            self.value_removed(slot);
        }
        self.retire_disk_copy(slot);
        let object = self.remove_object(slot);
        let done = object.readers_done_at(self.config.lease_grace);
        self.release_read_blocks(&object.replicas, object.size(), done);
    }
}
