//! Upsert: write a key whether or not it exists (see docs/upsert.md).
//!
//! UpsertStart, step by step:
//!
//! 1. Validate (`INVALID_PARAMS`). A missing key is **Case A**: a plain put.
//! 2. A copy/move on the key: `OBJECT_HAS_REPLICATION_TASK`.
//! 3. A put or upsert in progress is **preempted**: its PROCESSING replicas go to the
//!    discarded list until the write fence says its writer's last byte has landed (it may
//!    still be writing), and its End will fail. If nothing complete is left, continue as Case A.
//! 4. Held reads (replica refcount): `OBJECT_REPLICA_BUSY`.
//! 5. Same size, **Case B**: the same buffers go back to PROCESSING and are returned for
//!    overwriting in place; client, write id and start time are refreshed; the soft pin is
//!    reconciled with the new config; a hard pin is kept.
//! 6. Different size, **Case C**: fresh buffers are allocated, then the old ones are released
//!    once current readers' leases end. A value held only on disk takes this path too.
//!
//! Every case that succeeds retires the old value's disk copy (see `offload`).
//!
//! UpsertEnd and UpsertRevoke are PutEnd and PutRevoke.
//!
//! # Closing the torn-read window
//!
//! A plain in-place Case B would let a reader that fetched descriptors just before the upsert
//! read while the same buffer is overwritten, and return torn bytes. We do not allow that.
//! Mechanism: **a reader's lease protects the bytes, not just the object.** If a lease (plus
//! grace) may still be running, Case B becomes copy-on-write: fresh buffers are allocated for
//! the new value and the old ones are released only after the lease ends, so every reader
//! inside its lease reads the old value intact, and readers that arrive later get
//! `REPLICA_IS_NOT_READY` until UpsertEnd, then the new value. Only if no room can be found for
//! the copy does the upsert fail with `OBJECT_REPLICA_BUSY` (retry once the lease ends, at most
//! `lease_ttl` later).
//!
//! Why this and not the alternatives: treating every lease as busy would make upserts of a key
//! that is read continuously (a hot weight shard) fail forever, since every read extends the
//! lease; a per-replica version re-checked after the transfer costs every get a second RPC.
//! Copy-on-write costs memory only while readers are actually active, and falls back to
//! in-place (no extra memory) whenever nobody is reading, which is the coordinated
//! weight-update case upsert exists for. Readers already must finish inside their lease
//! (`LEASE_EXPIRED` otherwise), so this adds no rule for them.
//!
//! Two more choices, both so a failed upsert never loses data: Case C and the copy-on-write
//! path allocate the new buffers *before* releasing the old ones, and if that allocation fails
//! the old value stays readable (rather than being freed first to make room).

use crate::checksum::Checksum;
use crate::config::ReplicateConfig;
use crate::error::{Error, ErrorCode, Result};
use crate::events::DiscardCause;
use crate::ids::{ClientId, WriteId};
use crate::key_events::KeyChange;
use crate::master::Master;
use crate::object::ReplicaStatus;
use crate::put::PutGrant;
use crate::replicas::Replicas;
use crate::soft_pin::Pins;
use crate::time::Millis;

impl Master {
    /// Starts an upsert of a `size`-byte value under `key` (see the module docs).
    pub fn upsert_start(
        &mut self,
        client: ClientId,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        now: Millis,
    ) -> Result<PutGrant> {
        let now = self.advance(now);
        self.touch(client, now);
        self.check_put(client, key, size, config)?;
        self.check_unfinished_share(client, size)?;
        let existing = self.objects.find(key);
        self.check_tenant_quota(key, size, existing.map(|s| self.objects.at(s).size()))?;
        let Some(slot) = existing else {
            let grant = self.create_object(client, key, size, config, Pins::default(), now)?;
            self.counters.upserts.created += 1;
            return Ok(grant);
        };
        let object = self.objects.at(slot);
        if object.task().is_some() {
            return Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK.into());
        }
        // A preempted write's object is replaced, but its pins carry over as for any upsert.
        let before = object.pins();
        if object.writing() && self.discard_write(slot, DiscardCause::Preempted) {
            let grant = self.create_object(client, key, size, config, before, now)?;
            self.counters.upserts.created += 1;
            return Ok(grant);
        }
        let object = self.objects.at(slot);
        // Readers lose the old value as the new one is written, whichever case follows.
        let key = self.objects.key(slot);
        let value_gone = (object.is_readable() && self.reports_key_changes())
            .then(|| KeyChange::removed(key, object));
        if object.holds() > 0 {
            return Err(Error::new(
                ErrorCode::OBJECT_REPLICA_BUSY,
                format!("{} held read(s) on {key:?}", object.holds()),
            ));
        }
        // A new size, or a value only on disk: fresh memory.
        let grant = if object.size() != size || object.replicas.is_empty() {
            let grant = self.upsert_reallocate(slot, client, size, config, now)?;
            self.counters.upserts.resized += 1;
            grant
        } else if now < object.readers_done_at(self.config.lease_grace) {
            let grant = self.upsert_copy_on_write(slot, client, config, now)?;
            self.counters.upserts.copied += 1;
            grant
        } else {
            self.upsert_in_place(slot, client, config, now);
            self.counters.upserts.in_place += 1;
            self.grant(slot)
        };
        if let Some(change) = value_gone {
            self.report_key_change(change);
        }
        Ok(grant)
    }

    /// [`Master::upsert_start`] for many keys with one config.
    pub fn batch_upsert_start<K: AsRef<str>>(
        &mut self,
        client: ClientId,
        items: &[(K, u64)],
        config: &ReplicateConfig,
        now: Millis,
    ) -> Vec<Result<PutGrant>> {
        items
            .iter()
            .map(|(key, size)| self.upsert_start(client, key.as_ref(), *size, config, now))
            .collect()
    }

    /// Ends an upsert; the same as [`Master::put_end`].
    pub fn upsert_end(
        &mut self,
        client: ClientId,
        key: &str,
        write: WriteId,
        checksum: Checksum,
        now: Millis,
    ) -> Result<()> {
        self.put_end(client, key, write, checksum, now)
    }

    /// Revokes an upsert; the same as [`Master::put_revoke`].
    pub fn upsert_revoke(
        &mut self,
        client: ClientId,
        key: &str,
        write: WriteId,
        now: Millis,
    ) -> Result<()> {
        self.put_revoke(client, key, write, now)
    }

    /// [`Master::upsert_end`] for many keys.
    pub fn batch_upsert_end<K: AsRef<str>>(
        &mut self,
        client: ClientId,
        items: &[(K, WriteId, Checksum)],
        now: Millis,
    ) -> Vec<Result<()>> {
        self.batch_put_end(client, items, now)
    }

    /// [`Master::upsert_revoke`] for many keys.
    pub fn batch_upsert_revoke<K: AsRef<str>>(
        &mut self,
        client: ClientId,
        items: &[(K, WriteId)],
        now: Millis,
    ) -> Vec<Result<()>> {
        self.batch_put_revoke(client, items, now)
    }

    /// Case B: hand the same buffers back for overwriting.
    fn upsert_in_place(
        &mut self,
        slot: u32,
        client: ClientId,
        config: &ReplicateConfig,
        now: Millis,
    ) {
        // The disk copy holds the old value.
        self.retire_disk_copy(slot);
        let write_id = self.next_write_id();
        let pins = self.pins_after(config, self.objects.at(slot).pins(), now);
        let object = self.objects.at_mut(slot);
        for replica in object.replicas.iter_mut() {
            replica.set_status(ReplicaStatus::Processing);
        }
        object.set_write_id(write_id);
        object.start_write(now);
        object.set_prefetch(false);
        object.set_pins(pins);
        // The buffers now hold a value nobody has read yet.
        object.clear_leased();
        self.objects.set_writer(slot, client);
        self.track_write(slot);
    }

    /// Case B while readers may be reading: same size, fresh buffers, old ones released after
    /// the lease.
    fn upsert_copy_on_write(
        &mut self,
        slot: u32,
        client: ClientId,
        config: &ReplicateConfig,
        now: Millis,
    ) -> Result<PutGrant> {
        let object = self.objects.at(slot);
        let (size, count, lease_expiry) =
            (object.size(), object.replicas.len(), object.lease_expiry);
        let readers_done = object.readers_done_at(self.config.lease_grace);
        let fresh = self.place_protected(slot, size, count, config, now).map_err(|e| {
            Error::new(
                ErrorCode::OBJECT_REPLICA_BUSY,
                format!(
                    "readers hold a lease until {lease_expiry} and there is no room for a fresh copy ({e})"
                ),
            )
        })?;
        let old = std::mem::replace(&mut self.objects.at_mut(slot).replicas, fresh);
        self.release_read_blocks(&old, size, readers_done);
        self.upsert_in_place(slot, client, config, now);
        Ok(self.grant(slot))
    }

    /// Case C: a new size. Allocate first; on success retire the old object.
    fn upsert_reallocate(
        &mut self,
        slot: u32,
        client: ClientId,
        size: u64,
        config: &ReplicateConfig,
        now: Millis,
    ) -> Result<PutGrant> {
        let count = config.replica_num as usize;
        let fresh = self.place_protected(slot, size, count, config, now)?;
        let old_size = self.objects.at(slot).size();
        self.objects.set_size(slot, size);
        let object = self.objects.at_mut(slot);
        let readers_done = object.readers_done_at(self.config.lease_grace);
        let old = std::mem::replace(&mut object.replicas, fresh);
        self.release_read_blocks(&old, old_size, readers_done);
        self.upsert_in_place(slot, client, config, now);
        Ok(self.grant(slot))
    }

    /// Places fresh replicas for the object in `slot` while keeping that object out of the
    /// eviction the placement may trigger.
    fn place_protected(
        &mut self,
        slot: u32,
        size: u64,
        count: usize,
        config: &ReplicateConfig,
        now: Millis,
    ) -> Result<Replicas> {
        self.objects.at_mut(slot).add_hold();
        let placed = self.place_or_evict(size, count, &config.preferred_segments, &[], now);
        self.objects.at_mut(slot).drop_hold();
        Ok(placed?.into_iter().collect())
    }
}
