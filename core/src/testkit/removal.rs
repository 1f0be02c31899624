//! Removal: when the model lets an object go (no task, write, hold or lease), remove, remove
//! all and remove by regex, and the reservation of removed blocks for readers still inside
//! their lease.

use super::model::MObject;
use super::{Harness, ensure, expect_code, key_name};
use crate::error::ErrorCode;

impl Harness {
    pub(super) fn removable(&self, object: &MObject) -> Result<(), ErrorCode> {
        if object.task.is_some() {
            Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK)
        } else if object.writing.is_some() {
            Err(ErrorCode::REPLICA_IS_NOT_READY)
        } else if object.holds > 0 {
            Err(ErrorCode::OBJECT_REPLICA_BUSY)
        } else if object.lease_active(self.now) {
            Err(ErrorCode::OBJECT_HAS_LEASE)
        } else {
            Ok(())
        }
    }

    /// The object goes away (removed or evicted): its disk copy, if any, is a tombstone, and
    /// its blocks stay reserved for readers inside their lease.
    pub(super) fn model_remove(&mut self, key: &str) {
        self.model.retire_disk_copy(key);
        let object = self.model.objects.remove(key).expect("exists");
        self.model.reserve_for_readers(
            &object.replicas,
            object.size,
            object.readers_done_at(self.config.lease_grace),
        );
    }

    pub(super) fn remove(&mut self, key: u8) -> Result<(), String> {
        let key = key_name(key);
        let got = self.master.remove(&key, self.now);
        self.no_events("remove")?;
        let Some(object) = self.model.objects.get(&key) else {
            return expect_code(&got, ErrorCode::OBJECT_NOT_FOUND, "remove");
        };
        match self.removable(object) {
            Err(code) => {
                self.hit(if code == ErrorCode::OBJECT_HAS_LEASE {
                    "remove-leased"
                } else {
                    "remove-refused"
                });
                expect_code(&got, code, "remove")
            }
            Ok(()) => {
                got.map_err(|e| format!("remove failed: {e}"))?;
                self.hit("remove");
                self.model_remove(&key);
                Ok(())
            }
        }
    }

    pub(super) fn remove_matching(&mut self, prefix: Option<u8>) -> Result<(), String> {
        let prefix = prefix.map(|p| format!("k{}", p % 10));
        let got = match &prefix {
            Some(p) => self
                .master
                .remove_by_regex(crate::tenant::DEFAULT_TENANT, &format!("^{p}"), self.now)
                .map_err(|e| format!("remove_by_regex failed: {e}"))?,
            None => self
                .master
                .remove_all(crate::tenant::DEFAULT_TENANT, self.now),
        };
        self.no_events("remove_all")?;
        let victims: Vec<String> = self
            .model
            .objects
            .iter()
            .filter(|(k, o)| {
                prefix.as_ref().is_none_or(|p| k.starts_with(p.as_str()))
                    && self.removable(o).is_ok()
            })
            .map(|(k, _)| k.clone())
            .collect();
        ensure(got == victims.len() as u64, || {
            format!("removed {got}, expected {} ({victims:?})", victims.len())
        })?;
        for key in victims {
            self.model_remove(&key);
        }
        Ok(())
    }
}
