//! Reads, judged by content: the model's expected replicas and version for a key, byte checks
//! against the memory, get (and reads carried out later inside their lease), exist and query.

use super::harness::PendingRead;
use super::memory::{self, pattern};
use super::model::MObject;
use super::{Harness, ensure, expect_code, key_name};
use crate::checksum::Checksum;
use crate::client::ReadPlan;
use crate::client::read_plan::value_len;
use crate::error::ErrorCode;
use crate::ids::SegmentId;
use crate::object::{Medium, ReplicaDescriptor, ReplicaStatus};

/// What the model expects a read to return: the replicas (segment, address), the version
/// and the size.
type ExpectedRead = (Vec<(SegmentId, u64)>, u64, u64);

impl Harness {
    /// Checks that a replica holds one of `versions`: a memory replica in the memory, a disk
    /// replica in its node's disk (which must still hold that write).
    pub(super) fn check_bytes(
        &mut self,
        key: &str,
        replica: &ReplicaDescriptor,
        versions: &[u64],
    ) -> Result<(), String> {
        if replica.medium == Medium::Disk {
            let bytes = self.read_disk(key, replica)?.ok_or_else(|| {
                format!("disk replica {replica:?} of {key:?}, but its node's disk has no such copy")
            })?;
            return ensure(memory::identify(&bytes, versions).is_some(), || {
                format!("disk read of {key:?} at {replica:?} is not version {versions:?}")
            });
        }
        let Some(bytes) = self.memory.read(replica) else {
            return Err(format!(
                "replica {replica:?} of {key:?} points outside any memory"
            ));
        };
        ensure(memory::identify(&bytes, versions).is_some(), || {
            let expected = versions.first().map(|&v| pattern(v, bytes.len() as u64));
            let diff = expected.and_then(|e| e.iter().zip(&bytes).position(|(a, b)| a != b));
            format!(
                "read of {key:?} at {replica:?} is not version {versions:?} (first difference at byte {diff:?})"
            )
        })
    }

    /// The model's verdict for a read of `key`: the error it expects, or the replicas and
    /// version it expects.
    pub(super) fn expected_read(&self, key: &str) -> Result<ExpectedRead, ErrorCode> {
        let object = self
            .model
            .objects
            .get(key)
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        if !object.readable() {
            return Err(ErrorCode::REPLICA_IS_NOT_READY);
        }
        // Memory replicas first, then the disk copy (its address is the write id).
        let replicas = object
            .replicas
            .iter()
            .filter(|r| r.complete)
            .map(|r| (r.segment, r.addr))
            .chain(object.disk.map(|d| (d, object.write_id.0)))
            .collect();
        Ok((
            replicas,
            object.version.expect("complete object has a version"),
            object.size,
        ))
    }

    pub(super) fn judge_list(
        &mut self,
        key: &str,
        list: &crate::ReplicaList,
    ) -> Result<u64, String> {
        let (replicas, version, size) = self
            .expected_read(key)
            .map_err(|code| format!("read of {key:?} succeeded, expected {code}"))?;
        let len = value_len(key, list).map_err(|e| format!("the reader refuses the list: {e}"))?;
        ensure(len as u64 == size, || {
            format!("{key:?} listed as {len} bytes, the value has {size}")
        })?;
        let got: Vec<(SegmentId, u64)> =
            list.replicas.iter().map(|r| (r.segment, r.addr)).collect();
        ensure(got == replicas, || {
            format!("replicas of {key:?}: {got:?}, expected {replicas:?}")
        })?;
        ensure(list.lease_ttl == self.config.lease_ttl, || {
            "lease ttl".into()
        })?;
        let sum = Checksum::of(&pattern(version, size));
        ensure(list.checksum == sum, || {
            format!("{key:?} listed with {}, its value has {sum}", list.checksum)
        })?;
        let on_disk = self.model.objects[key].disk.is_some();
        for (i, r) in list.replicas.iter().enumerate() {
            let disk = on_disk && i + 1 == list.replicas.len();
            let medium = if disk { Medium::Disk } else { Medium::Memory };
            ensure(
                r.status == ReplicaStatus::Complete && r.len == size && r.medium == medium,
                || format!("served replica {r:?} of {key:?} ({size} bytes)"),
            )?;
            if disk {
                self.hit("read-disk");
            }
            self.check_bytes(key, r, &[version])?;
        }
        let lease = self.config.lease_ttl;
        self.model
            .objects
            .get_mut(key)
            .expect("exists")
            .grant_lease(self.now, lease);
        Ok(version)
    }

    pub(super) fn get(&mut self, key: u8, keep: bool) -> Result<(), String> {
        let key = key_name(key);
        let got = self.master.get_replica_list(&key, self.now);
        self.no_events("get")?;
        match self.expected_read(&key) {
            Err(code) => expect_code(&got, code, "get"),
            Ok(_) => {
                let list = got.map_err(|e| format!("get failed: {e}"))?;
                let version = self.judge_list(&key, &list)?;
                self.hit("read");
                if keep {
                    if self.reads.len() >= 8 {
                        self.reads.remove(0);
                    }
                    self.reads.push(PendingRead {
                        key,
                        version,
                        replicas: list.replicas,
                        asked: self.now,
                        lease_ttl: list.lease_ttl,
                    });
                }
                Ok(())
            }
        }
    }

    pub(super) fn read_late(&mut self, read: u8) -> Result<(), String> {
        if self.reads.is_empty() {
            return Ok(());
        }
        let read = self.reads.remove(usize::from(read) % self.reads.len());
        let plan = ReadPlan {
            lease_ttl: read.lease_ttl,
        };
        if !plan.inside_lease(read.asked, self.now) {
            return Ok(()); // the reader discards it (the client library's rule)
        }
        for r in &read.replicas {
            let present = match r.medium {
                // A disk copy may have gone since (evicted or tombstoned): the node then
                // refuses the read, and the reader retries.
                Medium::Disk => self.read_disk(&read.key, r)?.is_some(),
                Medium::Memory => self.memory.read(r).is_some(),
            };
            if present {
                self.check_bytes(&read.key, r, &[read.version])?;
            }
        }
        let replaced = self
            .model
            .objects
            .get(&read.key)
            .is_none_or(|o| o.version != Some(read.version));
        self.hit(if replaced {
            "late-read-of-replaced-value"
        } else {
            "late-read"
        });
        Ok(())
    }

    pub(super) fn exist(&mut self, key: u8) -> Result<(), String> {
        let key = key_name(key);
        let got = self.master.exist(&key, self.now);
        self.no_events("exist")?;
        let expected = self.model.objects.get(&key).is_some_and(MObject::readable);
        ensure(got.as_ref().ok() == Some(&expected), || {
            format!("exist {got:?}, expected {expected}")
        })?;
        if expected {
            let (now, lease) = (self.now, self.config.lease_ttl);
            self.model
                .objects
                .get_mut(&key)
                .expect("exists")
                .grant_lease(now, lease);
        }
        Ok(())
    }

    pub(super) fn query(&mut self, prefix: u8) -> Result<(), String> {
        let prefix = format!("k{}", prefix % 10);
        let got = self
            .master
            .query_by_regex(
                crate::tenant::DEFAULT_TENANT,
                &format!("^{prefix}"),
                self.now,
            )
            .map_err(|e| format!("query failed: {e}"))?;
        self.no_events("query")?;
        let expected: Vec<String> = self
            .model
            .objects
            .iter()
            .filter(|(k, o)| k.starts_with(&prefix) && o.readable())
            .map(|(k, _)| k.clone())
            .collect();
        let keys: Vec<String> = got.iter().map(|(k, _)| k.clone()).collect();
        ensure(keys == expected, || {
            format!("query keys {keys:?}, expected {expected:?}")
        })?;
        for (key, list) in &got {
            self.judge_list(key, list)?;
        }
        Ok(())
    }
}
