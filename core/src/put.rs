//! The two-phase put: PutStart allocates PROCESSING replicas, the client writes the bytes
//! straight to the nodes, PutEnd makes them COMPLETE (readable) or PutRevoke frees them.
//!
//! Objects are immutable: PutStart on an existing key fails with `OBJECT_ALREADY_EXISTS`
//! (upsert replaces values). A PutStart that nobody ended within `put_start_discard_timeout`
//! is a zombie: a new PutStart preempts it with fresh space (see `zombies`).
//!
//! Every start hands out a [`WriteId`]; End and Revoke must present it. A preempted writer's
//! late End therefore fails (`ILLEGAL_CLIENT` if another client took over, `OBJECT_NOT_FOUND`
//! if its write is gone) instead of completing replicas someone else is still writing.

use crate::checksum::Checksum;
use crate::config::ReplicateConfig;
use crate::error::{Error, ErrorCode, Result};
use crate::events::{DiscardCause, Event};
use crate::ids::{ClientId, WriteId};
use crate::master::Master;
use crate::object::{MAX_VALUE_SIZE, MAX_WRITERS, Replica, ReplicaDescriptor, ReplicaStatus};
use crate::soft_pin::{Pins, check_soft_pin};
use crate::time::Millis;

/// A started put or upsert: where to write, and the token that ends it.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct PutGrant {
    /// Present this to PutEnd or PutRevoke.
    pub write_id: WriteId,
    /// Write the whole value to every one of these (all PROCESSING).
    pub replicas: Vec<ReplicaDescriptor>,
}

impl Master {
    /// Starts a put of a `size`-byte value under `key`.
    pub fn put_start(
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
        if let Some(slot) = existing {
            if !self.write_expired(slot, now) {
                return Err(if self.objects.at(slot).writing() {
                    Error::new(
                        ErrorCode::OBJECT_ALREADY_EXISTS,
                        "another put of this key is in progress",
                    )
                } else {
                    ErrorCode::OBJECT_ALREADY_EXISTS.into()
                });
            }
            // A zombie: take over with fresh space.
            if !self.discard_write(slot, DiscardCause::Preempted) {
                return Err(Error::new(
                    ErrorCode::OBJECT_ALREADY_EXISTS,
                    "the object still has complete replicas",
                ));
            }
        }
        self.create_object(client, key, size, config, Pins::default(), now)
    }

    /// [`Master::put_start`] for many keys with one config.
    pub fn batch_put_start<K: AsRef<str>>(
        &mut self,
        client: ClientId,
        items: &[(K, u64)],
        config: &ReplicateConfig,
        now: Millis,
    ) -> Vec<Result<PutGrant>> {
        items
            .iter()
            .map(|(key, size)| self.put_start(client, key.as_ref(), *size, config, now))
            .collect()
    }

    /// Ends a put (or upsert): its replicas become readable, and readers will check them
    /// against `checksum`, the crc32c of the value written. Ending a write that already ended
    /// succeeds again (a retried RPC). A prefetch writes a value the master already has the
    /// checksum of: one that does not match is refused (`INVALID_WRITE`; revoke it).
    pub fn put_end(
        &mut self,
        client: ClientId,
        key: &str,
        write: WriteId,
        checksum: Checksum,
        now: Millis,
    ) -> Result<()> {
        let now = self.advance(now);
        self.touch(client, now);
        let slot = self.owned_write(client, key, write)?;
        let object = self.objects.at(slot);
        if !object.writing() {
            return Ok(());
        }
        let known = self.objects.checksum(slot);
        // A prefetch must bring back the value the master knows, whether or not the disk
        // copy it read is still there (a node may drop it mid-prefetch: seed 2477 saw the
        // damaged bytes of such a prefetch accepted, with their checksum, as the value).
        if (object.prefetch() || object.has_disk_replica()) && checksum != known {
            return Err(Error::new(
                ErrorCode::INVALID_WRITE,
                format!(
                    "the prefetched bytes of {key:?} have {checksum}, the value has {known}: \
                     the copy read from disk is damaged; revoke the prefetch"
                ),
            ));
        }
        // A prefetch brings back a value readers already had, unless its only copy went.
        let new_value = !object.prefetch() || !object.is_readable();
        self.objects.set_checksum(slot, checksum);
        let object = self.objects.at_mut(slot);
        object.end_write();
        for replica in object.replicas.iter_mut() {
            replica.set_status(ReplicaStatus::Complete);
        }
        // A completed write counts as an access for LRU purposes; it grants no reader lease.
        object.touch(now);
        object.refresh_soft_pin(now);
        self.write_ended(slot);
        if new_value {
            self.value_stored(slot);
        }
        if self.config.offload_write_through {
            self.queue_offload(slot);
        }
        Ok(())
    }

    /// [`Master::put_end`] for many keys: `(key, write, checksum)` each.
    pub fn batch_put_end<K: AsRef<str>>(
        &mut self,
        client: ClientId,
        items: &[(K, WriteId, Checksum)],
        now: Millis,
    ) -> Vec<Result<()>> {
        items
            .iter()
            .map(|(key, write, sum)| self.put_end(client, key.as_ref(), *write, *sum, now))
            .collect()
    }

    /// Revokes a put (or upsert, or prefetch) whose transfer failed: its replicas are freed at
    /// once, so call it only after every transfer of the write has stopped. The object goes
    /// away if nothing complete is left in memory or on disk (for an in-place upsert that means the old value is lost, as in
    /// Mooncake).
    pub fn put_revoke(
        &mut self,
        client: ClientId,
        key: &str,
        write: WriteId,
        now: Millis,
    ) -> Result<()> {
        let now = self.advance(now);
        self.touch(client, now);
        let slot = self.owned_write(client, key, write)?;
        let object = self.objects.at_mut(slot);
        if !object.writing() {
            return Err(Error::new(
                ErrorCode::INVALID_WRITE,
                "the write already ended; remove the object instead",
            ));
        }
        let was_prefetch = object.prefetch();
        object.end_write();
        let processing: Vec<Replica> = object
            .replicas
            .iter()
            .filter(|r| r.is_processing())
            .copied()
            .collect();
        object.replicas.retain(|r| r.is_complete());
        let empty = object.replicas.is_empty() && !object.has_disk_replica();
        let size = object.size();
        self.write_ended(slot);
        for replica in &processing {
            let freed = self.segments.free(replica, size);
            debug_assert!(freed);
        }
        if empty {
            self.objects.remove(slot);
            if was_prefetch {
                // The value existed before this write: its going is news.
                self.events.push(Event::WriteDiscarded {
                    key: key.into(),
                    write,
                    cause: DiscardCause::PrefetchRevoked,
                    object_removed: true,
                });
            }
        }
        Ok(())
    }

    /// Abandons a put (or upsert) whose transfers may still be landing: a transfer timed out
    /// or its connection broke, so the node may yet apply bytes already sent. The key is freed
    /// at once (its value, for an in-place upsert, is lost as with revoke), but the blocks are
    /// reused only once the write fence says the writer's last byte has landed, like a
    /// zombie's. Use this instead of
    /// [`Master::put_revoke`] whenever a transfer's outcome is unknown.
    pub fn put_abort(
        &mut self,
        client: ClientId,
        key: &str,
        write: WriteId,
        now: Millis,
    ) -> Result<()> {
        let now = self.advance(now);
        self.touch(client, now);
        let slot = self.owned_write(client, key, write)?;
        if !self.objects.at(slot).writing() {
            return Err(Error::new(
                ErrorCode::INVALID_WRITE,
                "the write already ended; remove the object instead",
            ));
        }
        self.discard_write(slot, DiscardCause::Aborted);
        Ok(())
    }

    /// [`Master::put_revoke`] for many keys.
    pub fn batch_put_revoke<K: AsRef<str>>(
        &mut self,
        client: ClientId,
        items: &[(K, WriteId)],
        now: Millis,
    ) -> Vec<Result<()>> {
        items
            .iter()
            .map(|(key, write)| self.put_revoke(client, key.as_ref(), *write, now))
            .collect()
    }

    /// Validates `client`'s put or upsert request.
    pub(crate) fn check_put(
        &self,
        client: ClientId,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
    ) -> Result<()> {
        self.check_key(key)?;
        if size == 0 {
            return Err(Error::new(ErrorCode::INVALID_PARAMS, "value size is zero"));
        }
        if size > MAX_VALUE_SIZE {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "value size {size} is over the limit of {MAX_VALUE_SIZE} bytes; split the value"
                ),
            ));
        }
        self.check_writer_room(client)?;
        let replicas = config.replica_num as usize;
        if replicas == 0 || replicas > self.config.max_replicas {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "replica_num must be 1 to {}, got {replicas}",
                    self.config.max_replicas
                ),
            ));
        }
        check_soft_pin(config)
    }

    /// Refuses a write by a client no object names yet when objects already name as many
    /// writers as an object can reference.
    pub(crate) fn check_writer_room(&self, client: ClientId) -> Result<()> {
        if self.objects.has_writer_room(client) {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
            format!(
                "objects already name {MAX_WRITERS} distinct writers, the most the master \
                 tracks; remove the objects of clients that are gone, then retry"
            ),
        ))
    }

    /// The slot of `key` if `client` owns its current write `write`. Otherwise
    /// `OBJECT_NOT_FOUND` (no such key, or the write was superseded) or `ILLEGAL_CLIENT`
    /// (another client's write).
    fn owned_write(&self, client: ClientId, key: &str, write: WriteId) -> Result<u32> {
        self.check_key(key)?;
        let slot = self.objects.find(key).ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        if !self.objects.written_by(slot, client) {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!(
                    "the current write of {key:?} belongs to client {}",
                    self.objects.writer(slot)
                ),
            ));
        }
        let object = self.objects.at(slot);
        if object.write_id() != write {
            return Err(Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                format!("{write} was superseded by {}", object.write_id()),
            ));
        }
        Ok(slot)
    }

    /// Allocates replicas for a new object and inserts it, PROCESSING, owned by `client`, with
    /// the pins a write with `config` leaves on a key that had `before`.
    pub(crate) fn create_object(
        &mut self,
        client: ClientId,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        before: Pins,
        now: Millis,
    ) -> Result<PutGrant> {
        let placed = self.place_or_evict(
            size,
            config.replica_num as usize,
            &config.preferred_segments,
            &[],
            now,
        )?;
        let write_id = self.next_write_id();
        let pins = self.pins_after(config, before, now);
        self.bury_ghost(key);
        let slot = self.objects.insert(key, size, client, write_id);
        let object = self.objects.at_mut(slot);
        object.replicas = placed.into_iter().collect();
        object.start_write(now);
        object.set_pins(pins);
        self.track_write(slot);
        Ok(self.grant(slot))
    }

    /// The grant for the write in progress on `slot`.
    pub(crate) fn grant(&self, slot: u32) -> PutGrant {
        let object = self.objects.at(slot);
        PutGrant {
            write_id: object.write_id(),
            replicas: object
                .replicas
                .iter()
                .map(|r| self.segments.describe(r, object.size()))
                .collect(),
        }
    }
}
