//! Membership: clients heartbeating, nodes mounting and unmounting segments, and what happens
//! when either goes away.

use crate::error::{Error, ErrorCode, Result};
use crate::events::{DiscardCause, Event};
use crate::ids::{ClientId, SegmentId};
use crate::master::Master;
use crate::segments::SegmentSpec;
use crate::time::Millis;

/// What a heartbeat tells its client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub enum HeartbeatStatus {
    /// The master knew the client; nothing changed.
    Known,
    /// The master did not know the client (first contact, or it had expired and its segments,
    /// writes and held reads were dropped). A node must mount its segments again.
    Registered,
}

/// A heartbeat's answer.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct HeartbeatAck {
    /// Whether the client had to be registered again.
    pub status: HeartbeatStatus,
    /// The segments the master has mounted for this client, in id order. A node whose own
    /// segment is missing mounts again. Unlike `status`, this survives a lost reply: a
    /// `Registered` answer to a heartbeat whose caller had already timed out is not repeated,
    /// but the missing segment is reported by every later heartbeat.
    pub segments: Vec<SegmentId>,
}

impl Master {
    /// Records a sign of life from `client`.
    pub fn heartbeat(&mut self, client: ClientId, now: Millis) -> HeartbeatAck {
        let now = self.advance(now);
        let status = if self.clients.announce(client, now) {
            HeartbeatStatus::Registered
        } else {
            HeartbeatStatus::Known
        };
        let mut segments: Vec<SegmentId> = self
            .segments
            .iter()
            .filter(|(_, s)| s.owner == client)
            .map(|(_, s)| s.id)
            .collect();
        segments.sort_unstable();
        HeartbeatAck { status, segments }
    }

    /// Any call from a client also counts as a sign of life (but only a heartbeat or a mount
    /// tells an expired client it must mount again).
    pub(crate) fn touch(&mut self, client: ClientId, now: Millis) {
        self.clients.touch(client, now);
    }

    /// Mounts a segment that `client` contributes. Repeating an identical mount returns the
    /// same id (safe to retry). A different spec under a name the same client already mounted
    /// replaces the old mount: the client is telling us its memory was reset (a restarted
    /// node), so everything on the old mount is gone. Another client's name is refused
    /// (`SEGMENT_ALREADY_EXISTS`).
    pub fn mount_segment(
        &mut self,
        client: ClientId,
        spec: &SegmentSpec,
        now: Millis,
    ) -> Result<SegmentId> {
        let now = self.advance(now);
        self.clients.announce(client, now);
        if let Some(slot) = self.segments.slot_by_name(&spec.name) {
            let existing = self.segments.at(slot);
            if existing.owner == client && !existing.matches(spec) {
                self.drop_segment(slot);
            }
        }
        self.segments.mount(client, spec)
    }

    /// Unmounts a segment of `client`'s. Replicas on it are dropped at once, and objects left
    /// without a replica disappear. Readers that already hold descriptors may still read it
    /// until their leases end, so the node should keep the memory mapped for a lease TTL.
    pub fn unmount_segment(&mut self, client: ClientId, name: &str, now: Millis) -> Result<()> {
        let now = self.advance(now);
        self.touch(client, now);
        let slot = self.segments.slot_by_name(name).ok_or_else(|| {
            Error::new(
                ErrorCode::SEGMENT_NOT_FOUND,
                format!("no segment named {name:?}"),
            )
        })?;
        let owner = self.segments.at(slot).owner;
        if owner != client {
            return Err(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!("segment {name:?} belongs to client {owner}"),
            ));
        }
        self.drop_segment(slot);
        Ok(())
    }

    /// Forgets every client silent for the client TTL: unmounts its segments, discards its
    /// writes in progress, releases its held reads and abandons its copy tasks. A client that
    /// said goodbye (and has not been heard from since) goes quietly: it held nothing by then.
    pub(crate) fn expire_clients(&mut self, now: Millis) {
        for (client, left) in self.clients.take_expired(now, self.config.client_ttl) {
            if !left {
                self.events.push(Event::ClientExpired { client });
                self.drop_client(client, DiscardCause::WriterDead);
            }
        }
    }

    /// A client says goodbye: what it holds goes at once, as an expired client's does after
    /// the client TTL (its segments unmounted, unfinished writes discarded, held reads
    /// released, tasks abandoned). The client itself is kept until its silence reaches the
    /// client TTL: until then its write window may still be open (see the writer's fence in
    /// the store), so the blocks of writes it lost stay out of early reuse, as for any live
    /// writer. Saying goodbye twice, or for a client the master does not know, changes
    /// nothing; a client heard from again after its goodbye is back.
    pub fn goodbye(&mut self, client: ClientId, now: Millis) {
        self.advance(now);
        if self.clients.leave(client) {
            self.events.push(Event::ClientLeft { client });
            self.drop_client(client, DiscardCause::WriterLeft);
        }
    }

    /// Drops everything `client` holds: its segments, writes in progress (discarded for
    /// `cause`), held reads and copy tasks.
    fn drop_client(&mut self, client: ClientId, cause: DiscardCause) {
        let owned: Vec<u32> = self
            .segments
            .iter()
            .filter(|(_, s)| s.owner == client)
            .map(|(slot, _)| slot)
            .collect();
        for slot in owned {
            self.drop_segment(slot);
        }
        let writing: Vec<u32> = self
            .objects
            .iter()
            .filter(|&(slot, o)| o.writing() && self.objects.written_by(slot, client))
            .map(|(slot, _)| slot)
            .collect();
        for slot in writing {
            self.discard_write(slot, cause);
        }
        self.release_client_holds(client);
        self.abandon_client_tasks(client);
    }

    /// Removes a segment and every replica on it.
    fn drop_segment(&mut self, slot: u32) {
        let segment_id = self.segments.at(slot).id;
        let affected: Vec<u32> = self
            .objects
            .iter()
            .filter(|(_, o)| o.has_replica_on(slot) || o.disk() == slot)
            .map(|(object_slot, _)| object_slot)
            .collect();
        self.forget_disk(slot);
        let name = self.segments.at(slot).name.clone();
        let mut replicas_dropped = 0;
        let mut objects_lost = 0;
        for object_slot in affected {
            // The node's disk copies go unreachable with it; a restarted node may register
            // them again (see `offload`).
            let readable_before = self.objects.at(object_slot).is_readable();
            let disk_copy = (self.objects.at(object_slot).disk() == slot).then(|| {
                let object = self.objects.at(object_slot);
                (self.objects.key_of(object).to_owned(), object.write_id())
            });
            if disk_copy.is_some() {
                self.clear_disk_copy(object_slot);
            }
            let object = self.objects.at_mut(object_slot);
            let before = object.replicas.len();
            let complete =
                |o: &crate::object::Object| o.replicas.iter().filter(|r| r.is_complete()).count();
            let complete_before = complete(object);
            object.replicas.retain(|r| r.segment != slot);
            replicas_dropped += (before - object.replicas.len()) as u64;
            let complete_after = complete(object);
            if !object.writing() && complete_after > 0 && complete_after < complete_before {
                // Copies from what is left restore the count (see `repair`).
                let wanted = u8::try_from(complete_before).unwrap_or(u8::MAX);
                let repair = crate::repair::Repair::new(object_slot, object.write_id(), wanted);
                self.tasks.queue_repair(repair);
            }
            // A write in progress survives while any of its replicas does. A complete object
            // survives while a complete replica does; copy targets alone are not a value.
            let lost = if object.writing() {
                object.replicas.is_empty() && !object.has_disk_replica()
            } else {
                !object.is_readable()
            };
            if let Some((key, write)) = disk_copy {
                self.disk_copy_departed(&name, &key, write, lost);
            }
            let object = self.objects.at_mut(object_slot);
            if readable_before && !object.is_readable() {
                self.value_removed(object_slot);
            }
            let object = self.objects.at(object_slot);
            if !lost && readable_before && !object.is_readable() {
                // Kept for the write in progress, which alone can bring the value back.
                self.events.push(Event::ReadableCopyLost {
                    key: self.objects.key(object_slot).into(),
                    segment: segment_id,
                });
            }
            let object = self.objects.at_mut(object_slot);
            if !lost && object.writing() && object.replicas.is_empty() {
                // A prefetch whose target went: the value stays on disk.
                self.discard_write(object_slot, DiscardCause::ReplicasLost);
                continue;
            }
            let object = self.objects.at_mut(object_slot);
            if lost {
                if let Some(task) = object.task() {
                    self.abandon_task(task, crate::replication::Finish::ObjectLost);
                }
                let key = self.objects.key(object_slot).into();
                let object = self.remove_object(object_slot);
                debug_assert!(object.replicas.is_empty());
                self.counters.lost_objects += 1;
                objects_lost += 1;
                self.events.push(Event::ObjectLost {
                    key,
                    segment: segment_id,
                });
            }
        }
        self.discarded.forget_segment(slot);
        let segment = self.segments.remove(slot);
        self.events.push(Event::SegmentUnmounted {
            segment: segment.id,
            name: segment.name,
            replicas_dropped,
            objects_lost,
        });
    }
}
