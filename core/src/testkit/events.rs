//! Events: judging and applying what the master reports (client expiry, lost objects,
//! unmounted segments, discarded writes, evictions), including the eviction order checks.

use super::model::MReplica;
use super::{Harness, client_index, ensure};
use crate::events::{DiscardCause, Event};
use crate::ids::{ClientId, SegmentId};
use crate::segments::block_len;
use crate::time::Millis;

/// Eviction tiers, in the order eviction takes them.
const ON_DISK: u8 = 0;
const UNPINNED: u8 = 1;
const SOFT: u8 = 2;

/// The eviction tier of a candidate.
fn tier(soft_pinned: bool, on_disk: bool) -> u8 {
    match (soft_pinned, on_disk) {
        (true, _) => SOFT,
        (false, true) => ON_DISK,
        (false, false) => UNPINNED,
    }
}

impl Harness {
    pub(super) fn no_events(&mut self, what: &str) -> Result<(), String> {
        let events = self.master.drain_events();
        ensure(events.is_empty(), || {
            format!("{what} produced events {events:?}")
        })
    }

    /// Judges and applies events the master reported. `unmounter` is the client whose unmount
    /// request produced them, if any.
    /// `exempt` is a key the operation itself protects from its own eviction (an upsert
    /// allocating fresh buffers for it).
    pub(super) fn apply_events(
        &mut self,
        events: Vec<Event>,
        unmounter: Option<ClientId>,
        exempt: Option<&str>,
    ) -> Result<(), String> {
        let now = self.now;
        let mut evicted: Vec<(Millis, u8)> = Vec::new();
        let mut lost_replicas: Vec<(SegmentId, u64)> = Vec::new();
        let mut expiring: Option<ClientId> = None;
        for event in &events {
            self.note(format!("    event {event:?}"));
        }
        // The simulation's checker, which has no model, must agree on every run.
        let protected: Vec<&str> = exempt.into_iter().collect();
        crate::invariants::check_eviction_order(&self.master, &events, &protected)
            .map_err(|v| v.to_string())?;
        for event in events {
            let part_of_expiry = matches!(
                event,
                Event::ClientExpired { .. }
                    | Event::ClientLeft { .. }
                    | Event::ObjectLost { .. }
                    | Event::SegmentUnmounted { .. }
                    | Event::WriteDiscarded {
                        cause: DiscardCause::WriterDead | DiscardCause::WriterLeft,
                        ..
                    }
            );
            if !part_of_expiry && let Some(client) = expiring.take() {
                self.release_dead_client(client);
            }
            match event {
                Event::PrefetchFailed { key, .. } | Event::ReadableCopyLost { key, .. } => {
                    return Err(format!(
                        "prefetch of {key:?}, but the harness never prefetches"
                    ));
                }
                Event::ClientExpired { client } | Event::ClientLeft { client } => {
                    if matches!(event, Event::ClientLeft { .. }) {
                        // Kept live until its silence reaches the TTL (see `goodbye`).
                        self.hit("client-left");
                    } else {
                        self.hit("client-expired");
                        self.model.clients.remove(&client);
                        self.model.announced.remove(&client);
                    }
                    let side = &mut self.clients[client_index(client)];
                    side.grants.clear();
                    side.holds.clear();
                    side.tasks.clear();
                    // The master drops the client's segments and writes first, then its holds
                    // and tasks.
                    if let Some(previous) = expiring.replace(client) {
                        self.release_dead_client(previous);
                    }
                }
                Event::ObjectLost { key, segment } => {
                    let (task, on_segment) = self.model.objects.get(&*key).map_or((None, 0), |o| {
                        (
                            o.task,
                            o.replicas.iter().filter(|r| r.segment == segment).count() as u64,
                        )
                    });
                    if let Some(task) = task {
                        self.abandon_task(task);
                    }
                    let object = self
                        .model
                        .objects
                        .get(&*key)
                        .ok_or_else(|| format!("lost unknown {key:?}"))?;
                    ensure(object.replicas.iter().all(|r| r.segment == segment), || {
                        format!("{key:?} reported lost but has replicas elsewhere")
                    })?;
                    lost_replicas.push((segment, on_segment));
                    self.hit("object-lost");
                    let object = self.model.objects.remove(&*key).expect("exists");
                    if object.disk == Some(segment) {
                        // It went with its node's disk: the node may bring it back.
                        let name = self
                            .model
                            .segment_by_id(segment)
                            .map(|(n, _)| n.clone())
                            .ok_or_else(|| format!("{key:?} lost on an unknown segment"))?;
                        let version = object.version.expect("a disk copy is of a complete value");
                        self.model.bury_ghost(&key);
                        self.model.ghosts.insert(
                            key.to_string(),
                            (name, object.write_id, version, object.size),
                        );
                        self.hit("disk-ghost");
                    }
                }
                Event::SegmentUnmounted {
                    segment,
                    name,
                    replicas_dropped,
                    objects_lost,
                } => {
                    let seg = self
                        .model
                        .segments
                        .get(&*name)
                        .filter(|s| s.id == segment)
                        .ok_or_else(|| format!("unmounted unknown segment {name:?}"))?;
                    ensure(
                        Some(seg.owner) == unmounter
                            || !self.model.clients.contains_key(&seg.owner),
                        || format!("segment {name:?} of live client {} dropped", seg.owner),
                    )?;
                    let mut dropped: u64 = lost_replicas
                        .iter()
                        .filter(|(s, _)| *s == segment)
                        .map(|(_, n)| n)
                        .sum();
                    let mut departed = Vec::new();
                    for (key, o) in &mut self.model.objects {
                        let before = o.replicas.len();
                        o.replicas.retain(|r| r.segment != segment);
                        dropped += (before - o.replicas.len()) as u64;
                        if o.disk == Some(segment) {
                            // The object lives on in memory and may change before the node
                            // returns: its disk copy is deleted when it does.
                            o.disk = None;
                            departed.push((key.clone(), o.write_id));
                        }
                        let lost = if o.writing.is_some() {
                            o.replicas.is_empty() && o.disk.is_none()
                        } else {
                            !o.readable()
                        };
                        ensure(!lost, || format!("{key:?} lost without an event"))?;
                    }
                    for (key, write) in departed {
                        self.hit("disk-copy-departed");
                        self.model.tombstone(&name, &key, write);
                    }
                    self.model.disk_segments.remove(&segment);
                    let lost = lost_replicas.iter().filter(|(s, _)| *s == segment).count() as u64;
                    ensure(lost == objects_lost, || {
                        format!("{name:?} reported {objects_lost} objects lost, model saw {lost}")
                    })?;
                    ensure(dropped == replicas_dropped, || {
                        format!("{name:?} dropped {replicas_dropped} replicas, model had {dropped}")
                    })?;
                    self.model.reserved.retain(|b| b.segment != segment);
                    self.model.segments.remove(&*name);
                    self.memory.unmount(segment);
                }
                Event::WriteDiscarded {
                    key,
                    write,
                    cause,
                    object_removed,
                } => {
                    let object = self
                        .model
                        .objects
                        .get(&*key)
                        .ok_or_else(|| format!("discarded write of unknown {key:?}"))?;
                    let w = object
                        .writing
                        .filter(|w| w.write_id == write)
                        .ok_or_else(|| format!("discarded {write} which is not {key:?}'s write"))?;
                    self.hit(match cause {
                        DiscardCause::Timeout => "write-timeout",
                        DiscardCause::WriterDead => "writer-dead",
                        DiscardCause::WriterLeft => "writer-left",
                        DiscardCause::Preempted => "write-preempted",
                        DiscardCause::Aborted => "write-aborted",
                        DiscardCause::ReplicasLost => "write-replicas-lost",
                        DiscardCause::PrefetchRevoked => "prefetch-revoked",
                    });
                    match cause {
                        DiscardCause::Timeout => ensure(
                            w.start + self.config.put_start_discard_timeout <= now,
                            || format!("{key:?} discarded before its timeout"),
                        )?,
                        DiscardCause::WriterDead => {
                            ensure(!self.model.clients.contains_key(&w.client), || {
                                format!("{key:?} discarded though its writer lives")
                            })?
                        }
                        DiscardCause::WriterLeft => {
                            ensure(self.model.left.contains(&w.client), || {
                                format!("{key:?} discarded as its writer left, which it did not")
                            })?
                        }
                        DiscardCause::Preempted | DiscardCause::Aborted => {}
                        DiscardCause::ReplicasLost | DiscardCause::PrefetchRevoked => {
                            return Err(format!(
                                "{key:?}: a prefetch ended ({cause:?}), but the harness never prefetches"
                            ));
                        }
                    }
                    let object = self.model.objects.get_mut(&*key).expect("exists");
                    object.writing = None;
                    let processing: Vec<MReplica> = object
                        .replicas
                        .iter()
                        .filter(|r| !r.complete)
                        .copied()
                        .collect();
                    object.replicas.retain(|r| r.complete);
                    let (size, empty) = (
                        object.size,
                        object.replicas.is_empty() && object.disk.is_none(),
                    );
                    ensure(empty == object_removed, || {
                        format!("{key:?} removal {object_removed}")
                    })?;
                    if empty {
                        self.model.objects.remove(&*key);
                    }
                    let release_at = self.config.fence_rule().writes_land_by(w.start, size);
                    self.model
                        .reserve_for_writer(&processing, size, release_at, w.client);
                }
                Event::Evicted {
                    key,
                    soft_pinned,
                    bytes,
                    contiguous,
                    kept_on_disk,
                    last_access,
                } => {
                    let object = self
                        .model
                        .objects
                        .get(&*key)
                        .ok_or_else(|| format!("evicted unknown {key:?}"))?;
                    ensure(kept_on_disk == object.disk.is_some(), || {
                        format!("evicted {key:?} (kept on disk {kept_on_disk}): {object:?}")
                    })?;
                    let class = object.eviction_tier(now);
                    ensure(class == Some(soft_pinned), || {
                        format!(
                            "evicted {key:?} (soft {soft_pinned}) but its tier is {class:?}: {object:?}"
                        )
                    })?;
                    ensure(!soft_pinned || self.config.allow_evict_soft_pinned, || {
                        format!("evicted soft-pinned {key:?} though not allowed")
                    })?;
                    let expected = block_len(object.size) * object.replicas.len() as u64;
                    ensure(bytes == expected, || {
                        format!("evicted {key:?} freed {bytes}, expected {expected}")
                    })?;
                    ensure(last_access == object.last_access, || {
                        format!("evicted {key:?} reported last access {last_access}: {object:?}")
                    })?;
                    if contiguous {
                        // A window eviction may skip LRU order, but only takes objects whose
                        // blocks are free at once (lease and grace over).
                        ensure(
                            object.readers_done_at(self.config.lease_grace) <= now,
                            || format!("window-evicted {key:?} inside its lease grace"),
                        )?;
                        self.hit("evict-window");
                    } else {
                        evicted.push((object.last_access, tier(soft_pinned, kept_on_disk)));
                        self.hit(if soft_pinned {
                            "evict-soft-pinned"
                        } else {
                            "evict"
                        });
                    }
                    if kept_on_disk {
                        // Only its memory goes: it lives on, readable from disk.
                        self.hit("evict-to-disk");
                        let grace = self.config.lease_grace;
                        let object = self.model.objects.get_mut(&*key).expect("exists");
                        let replicas = std::mem::take(&mut object.replicas);
                        let (size, done) = (object.size, object.readers_done_at(grace));
                        object.leased = false;
                        self.model.reserve_for_readers(&replicas, size, done);
                    } else {
                        self.model_remove(&key);
                    }
                }
            }
        }
        if let Some(client) = expiring.take() {
            self.release_dead_client(client);
        }
        // Order: least recently used first within a tier, and a tier only once the one before
        // is used up: unpinned objects with a disk copy (dropping their memory loses nothing),
        // then other unpinned ones, then (if allowed) soft-pinned ones. Objects the master may
        // have queued for offload instead are excused: the model cannot see its queues, and
        // this very pass may have queued any candidate it picked (so they are marked as of
        // now, the moment of the pass).
        if !evicted.is_empty() {
            self.model.mark_maybe_queued(now);
        }
        for t in [ON_DISK, UNPINNED, SOFT] {
            let Some(newest) = evicted.iter().filter(|e| e.1 == t).map(|e| e.0).max() else {
                continue;
            };
            for (key, o) in &self.model.objects {
                if Some(key.as_str()) == exempt || o.maybe_queued {
                    continue;
                }
                let Some(soft) = o.eviction_tier(now) else {
                    continue;
                };
                let kept = tier(soft, o.disk.is_some());
                ensure(kept != t || o.last_access >= newest, || {
                    format!(
                        "evicted an object used at {newest} but kept {key:?} used at {}",
                        o.last_access
                    )
                })?;
                ensure(kept >= t, || {
                    format!("evicted from tier {t} but kept {key:?} of tier {kept}")
                })?;
            }
        }
        Ok(())
    }
}
