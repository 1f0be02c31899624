//! Reads: replica lists, existence, sizes and regex queries, each granting a lease.
//!
//! A lease is the reader's protection. Until it ends the object is not removed or evicted, and
//! its bytes are not overwritten in place: an upsert that arrives during a lease writes fresh
//! buffers instead (see `upsert`), and replaced buffers are only reused after the lease ends.
//! The reader's side of the bargain: it must finish its transfer within the lease (measured
//! from before it sent the request) or throw the data away (`LEASE_EXPIRED`).

use regex::{Regex, RegexBuilder};

use crate::checksum::Checksum;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::SegmentId;
use crate::master::Master;
use crate::object::ReplicaDescriptor;
use crate::tenant::{local_key, tenant_of};
use crate::time::Millis;

/// The readable replicas of an object and how long the reader may use them.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct ReplicaList {
    /// Complete replicas only; read any one. Memory replicas come first; a disk replica
    /// (`Medium::Disk`), if any, is last.
    pub replicas: Vec<ReplicaDescriptor>,
    /// The lease granted with this list. The reader must finish within this long of sending
    /// its request, or discard what it read.
    pub lease_ttl: Millis,
    /// The value's checksum: a replica whose bytes do not match it is damaged; read another.
    pub checksum: Checksum,
}

/// Longest regular expression accepted, in bytes, unless the longest key needs more.
const MAX_PATTERN_LEN: usize = 4096;

/// The longest pattern accepted when keys may be `max_key_len` bytes: enough for an exact
/// match of any key (`^…$`, every character escaped), as `mooring put` asks after a write.
fn pattern_limit(max_key_len: usize) -> usize {
    MAX_PATTERN_LEN.max(max_key_len.saturating_mul(2).saturating_add(2))
}

/// One object as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct KeyListing {
    /// The key.
    pub key: String,
    /// Value size in bytes.
    pub size: u64,
    /// Complete memory replicas.
    pub replicas: u32,
    /// Whether a node also holds it on disk.
    pub on_disk: bool,
}

impl Master {
    /// The complete replicas of `key`, with a lease. `OBJECT_NOT_FOUND` if there is no such
    /// object, `REPLICA_IS_NOT_READY` while it is being written.
    pub fn get_replica_list(&mut self, key: &str, now: Millis) -> Result<ReplicaList> {
        let now = self.advance(now);
        let found = self.objects.find(key);
        let slot = self.read_slot(key, found)?;
        Ok(self.read_replicas(slot, now))
    }

    /// The complete memory replicas of `key` and the checksum their bytes must have, for an
    /// audit that reads them behind the master's back (a scrubber, the simulation's oracle):
    /// no lease is granted and no access counted. `None` if `key` is not readable.
    pub fn audit_memory_replicas(&self, key: &str) -> Option<(Vec<ReplicaDescriptor>, Checksum)> {
        let slot = self.readable_slot(key).ok()?;
        let object = self.objects.at(slot);
        let replicas = object
            .replicas
            .iter()
            .filter(|replica| replica.is_complete())
            .map(|replica| self.segments.describe(replica, object.size()))
            .collect();
        Some((replicas, self.objects.checksum(slot)))
    }

    /// The segment whose node holds `key`'s current value on disk, for the same kind of audit
    /// as [`Master::audit_memory_replicas`]. `None` if `key` is not readable or has no disk
    /// copy.
    pub fn audit_disk_copy(&self, key: &str) -> Option<SegmentId> {
        let slot = self.readable_slot(key).ok()?;
        let object = self.objects.at(slot);
        object
            .has_disk_replica()
            .then(|| self.segments.at(object.disk()).id)
    }

    /// Whether an object has `key` (readable or not), and if so whether it carries a hard
    /// pin: for audits that follow the pin through every operation (only removal clears it).
    pub fn audit_hard_pin(&self, key: &str) -> Option<bool> {
        let slot = self.objects.find(key)?;
        Some(self.objects.at(slot).hard_pinned())
    }

    /// [`Master::get_replica_list`] for many keys.
    pub fn batch_get_replica_list<K: AsRef<str>>(
        &mut self,
        keys: &[K],
        now: Millis,
    ) -> Vec<Result<ReplicaList>> {
        let now = self.advance(now);
        let found = self.objects.find_many(keys);
        // The checksums too in a pass of their own, for the same reason as `find_many`.
        let checksums: Vec<Checksum> = found
            .iter()
            .map(|slot| slot.map_or(Checksum::EMPTY, |slot| self.objects.checksum(slot)))
            .collect();
        keys.iter()
            .zip(found)
            .zip(checksums)
            .map(|((key, found), checksum)| {
                let slot = self.read_slot(key.as_ref(), found)?;
                Ok(self.read_replicas_with(slot, checksum, now))
            })
            .collect()
    }

    /// Whether `key` has a complete replica; if so, grants a lease.
    pub fn exist(&mut self, key: &str, now: Millis) -> Result<bool> {
        let now = self.advance(now);
        let found = self.objects.find(key);
        self.exist_found(key, found, now)
    }

    /// [`Master::exist`] for a key already looked up: `found` is where the table holds it.
    fn exist_found(&mut self, key: &str, found: Option<u32>, now: Millis) -> Result<bool> {
        self.check_key(key)?;
        match found {
            Some(slot) if self.objects.at(slot).is_readable() => {
                let lease_ttl = self.config.lease_ttl;
                self.objects.at_mut(slot).grant_lease(now, lease_ttl);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// [`Master::exist`] for many keys.
    pub fn batch_exist<K: AsRef<str>>(&mut self, keys: &[K], now: Millis) -> Vec<Result<bool>> {
        let now = self.advance(now);
        let found = self.objects.find_many(keys);
        keys.iter()
            .zip(found)
            .map(|(key, found)| self.exist_found(key.as_ref(), found, now))
            .collect()
    }

    /// The size of `key`'s value. No lease.
    pub fn get_size(&self, key: &str) -> Result<u64> {
        let slot = self.readable_slot(key)?;
        Ok(self.objects.at(slot).size())
    }

    /// Every readable object of `tenant` whose key (as the tenant named it) matches `pattern`,
    /// sorted by key, each with a lease; keys as the tenant named them.
    pub fn query_by_regex(
        &mut self,
        tenant: &str,
        pattern: &str,
        now: Millis,
    ) -> Result<Vec<(String, ReplicaList)>> {
        let now = self.advance(now);
        let matches = tenant_pattern(tenant, pattern, self.config.max_key_len)?;
        let mut matched: Vec<(String, u32)> = self
            .objects
            .iter()
            .filter(|(_, o)| o.is_readable() && matches(self.objects.key_of(o)))
            .map(|(slot, o)| (local_key(self.objects.key_of(o)).to_string(), slot))
            .collect();
        matched.sort_unstable();
        Ok(matched
            .into_iter()
            .map(|(key, slot)| (key, self.read_replicas(slot, now)))
            .collect())
    }

    /// Every readable object of `tenant` whose key matches `pattern` (both as the tenant named
    /// them), sorted by key, with its size and where it is. Grants no lease and changes
    /// nothing: listing must not keep objects from eviction or removal (an operator's `mooring
    /// ls` once made later puts fail).
    pub fn list_by_regex(&self, tenant: &str, pattern: &str) -> Result<Vec<KeyListing>> {
        let matches = tenant_pattern(tenant, pattern, self.config.max_key_len)?;
        let mut listed: Vec<KeyListing> = self
            .objects
            .iter()
            .filter(|(_, o)| o.is_readable() && matches(self.objects.key_of(o)))
            .map(|(_, o)| KeyListing {
                key: local_key(self.objects.key_of(o)).to_string(),
                size: o.size(),
                replicas: o.replicas.iter().filter(|r| r.is_complete()).count() as u32,
                on_disk: o.has_disk_replica(),
            })
            .collect();
        listed.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    /// Rejects keys no object could have.
    pub(crate) fn check_key(&self, key: &str) -> Result<()> {
        if key.is_empty() {
            return Err(Error::new(ErrorCode::INVALID_PARAMS, "key is empty"));
        }
        if key.len() > self.config.max_key_len {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "key is {} bytes, the limit is {}",
                    key.len(),
                    self.config.max_key_len
                ),
            ));
        }
        crate::tenant::check_stored(key)
    }

    /// The slot of `key` if it can be read now.
    pub(crate) fn readable_slot(&self, key: &str) -> Result<u32> {
        self.readable_found(key, self.objects.find(key))
    }

    /// [`Master::readable_slot`] for a key already looked up: `found` is where the table
    /// holds it.
    fn readable_found(&self, key: &str, found: Option<u32>) -> Result<u32> {
        self.check_key(key)?;
        let slot = found.ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        if !self.objects.at(slot).is_readable() {
            return Err(ErrorCode::REPLICA_IS_NOT_READY.into());
        }
        Ok(slot)
    }

    /// [`Master::readable_slot`] for a read about to be served, counted by the tier that can
    /// serve it: memory, only a node's disk, or none (a miss).
    /// `found` is where the table holds `key`.
    pub(crate) fn read_slot(&mut self, key: &str, found: Option<u32>) -> Result<u32> {
        let found = self.readable_found(key, found);
        let reads = &mut self.counters.reads;
        match &found {
            Ok(slot) if self.objects.at(*slot).has_complete_replica() => reads.memory += 1,
            Ok(_) => reads.disk += 1,
            Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => reads.misses += 1,
            Err(_) => {}
        }
        found
    }

    /// Grants a lease on the object in `slot` and lists its complete replicas.
    pub(crate) fn read_replicas(&mut self, slot: u32, now: Millis) -> ReplicaList {
        // Read first: its load then overlaps the object's instead of following it.
        let checksum = self.objects.checksum(slot);
        self.read_replicas_with(slot, checksum, now)
    }

    /// [`Master::read_replicas`] given the checksum of `slot`'s value.
    fn read_replicas_with(&mut self, slot: u32, checksum: Checksum, now: Millis) -> ReplicaList {
        let lease_ttl = self.config.lease_ttl;
        let object = self.objects.at_mut(slot);
        object.grant_lease(now, lease_ttl);
        let object = self.objects.at(slot);
        let mut replicas: Vec<ReplicaDescriptor> = object
            .replicas
            .iter()
            .filter(|r| r.is_complete())
            .map(|r| self.segments.describe(r, object.size()))
            .collect();
        if object.has_disk_replica() {
            replicas.push(self.segments.describe_disk(
                object.disk(),
                object.write_id(),
                object.size(),
            ));
        }
        ReplicaList {
            replicas,
            lease_ttl,
            checksum,
        }
    }
}

/// Compiles a user's key pattern with limits that keep a hostile one cheap.
/// Whether a stored key belongs to `tenant` and, as the tenant named it, matches `pattern`.
pub(crate) fn tenant_pattern(
    tenant: &str,
    pattern: &str,
    max_key_len: usize,
) -> Result<impl Fn(&str) -> bool + use<>> {
    let regex = compile_pattern(pattern, max_key_len)?;
    let tenant = tenant.to_string();
    Ok(move |stored: &str| tenant_of(stored) == tenant && regex.is_match(local_key(stored)))
}

pub(crate) fn compile_pattern(pattern: &str, max_key_len: usize) -> Result<Regex> {
    let limit = pattern_limit(max_key_len);
    if pattern.len() > limit {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("pattern is {} bytes, the limit is {limit}", pattern.len()),
        ));
    }
    RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 20)
        .build()
        .map_err(|e| Error::new(ErrorCode::INVALID_PARAMS, format!("bad pattern: {e}")))
}
