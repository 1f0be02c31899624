//! Time and membership: ticks (client expiry, write and task timeouts, delayed releases and
//! eviction, judged in the order the master performs them), heartbeats, mounts and unmounts,
//! and what the model drops when a client dies.

use super::model;
use super::{CLIENTS, Harness, client_id, ensure, expect_code, segment_name};
use crate::error::ErrorCode;
use crate::events::Event;
use crate::ids::{ClientId, HoldId, TaskId};
use crate::segments::SegmentSpec;

impl Harness {
    pub(super) fn tick(&mut self) -> Result<(), String> {
        let now = self.now;
        self.master.tick(now);
        let events = self.master.drain_events();
        let silent: Vec<ClientId> = self
            .model
            .clients
            .iter()
            .filter(|&(_, &seen)| seen + self.config.client_ttl <= now)
            .map(|(&c, _)| c)
            .collect();
        // Clients that said goodbye expire without a word.
        let (departed, expected): (Vec<ClientId>, Vec<ClientId>) = silent
            .into_iter()
            .partition(|c| self.model.left.contains(c));
        for client in departed {
            self.model.clients.remove(&client);
            self.model.announced.remove(&client);
            self.model.left.remove(&client);
        }
        let expired: Vec<ClientId> = events
            .iter()
            .filter_map(|e| match e {
                Event::ClientExpired { client } => Some(*client),
                _ => None,
            })
            .collect();
        ensure(expired == expected, || {
            format!("expired clients {expired:?}, expected {expected:?}")
        })?;
        // The master expires clients, discards writes, expires tasks, releases blocks, then
        // evicts; replay the silent steps at the same point.
        let first_eviction = events
            .iter()
            .position(|e| matches!(e, Event::Evicted { .. }))
            .unwrap_or(events.len());
        let mut events = events;
        let evictions = events.split_off(first_eviction);
        self.apply_events(events, None, None)?;
        let timeout = self.config.put_start_discard_timeout;
        let stale: Vec<TaskId> = self
            .model
            .tasks
            .iter()
            .filter(|(_, t)| t.started + timeout <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            self.abandon_task(id);
        }
        self.model.reserved.retain(|b| b.release_at > now);
        self.apply_events(evictions, None, None)?;
        ensure(
            !self
                .model
                .objects
                .values()
                .any(|o| o.writing.is_some_and(|w| w.start + timeout <= now)),
            || "a write outlived its discard timeout through a tick".into(),
        )?;
        ensure(
            !self
                .model
                .clients
                .values()
                .any(|&seen| seen + self.config.client_ttl <= now),
            || "a silent client survived a tick".into(),
        )
    }

    pub(super) fn heartbeat(&mut self, client: u8) -> Result<(), String> {
        let id = client_id(client);
        let status = self.master.heartbeat(id, self.now).status;
        let expected = if self.model.announce(id, self.now) {
            crate::HeartbeatStatus::Registered
        } else {
            crate::HeartbeatStatus::Known
        };
        ensure(status == expected, || {
            format!("heartbeat {status:?}, expected {expected:?}")
        })
    }

    /// A client says goodbye: a known one is dropped at once, with what it held; an unknown
    /// one changes nothing.
    pub(super) fn goodbye(&mut self, client: u8) -> Result<(), String> {
        let id = client_id(client);
        let known = self.model.clients.contains_key(&id) && !self.model.left.contains(&id);
        self.master.goodbye(id, self.now);
        let events = self.master.drain_events();
        if !known {
            return ensure(events.is_empty(), || {
                format!("goodbye of an unknown or departed client produced {events:?}")
            });
        }
        ensure(
            matches!(events.first(), Some(Event::ClientLeft { client }) if *client == id),
            || format!("goodbye produced {events:?}"),
        )?;
        self.model.left.insert(id);
        self.apply_events(events, Some(id), None)
    }

    pub(super) fn mount(&mut self, client: u8, segment: u8, kib: u8) -> Result<(), String> {
        let (id, name) = (client_id(client), segment_name(segment));
        let size = (u64::from(kib % 60) + 4) * 1024;
        let existing = self.model.segments.get(&name).cloned();
        let base = match &existing {
            Some(s) if s.owner == id && s.capacity == size => s.base,
            _ => self.next_base,
        };
        let spec = SegmentSpec {
            name: name.clone(),
            base,
            size,
            endpoint: format!("node-{}", client % CLIENTS),
            key: 7,
            rdma_key: None,
        };
        let got = self.master.mount_segment(id, &spec, self.now);
        self.model.announce(id, self.now);
        let events = self.master.drain_events();
        match existing {
            Some(s) if s.owner == id && s.capacity == size && s.base == base => {
                ensure(events.is_empty(), || {
                    format!("mount retry produced {events:?}")
                })?;
                ensure(got.as_ref().ok() == Some(&s.id), || {
                    format!("mount retry gave {got:?}, expected {}", s.id)
                })
            }
            Some(s) if s.owner != id => {
                ensure(events.is_empty(), || {
                    format!("refused mount produced {events:?}")
                })?;
                expect_code(&got, ErrorCode::SEGMENT_ALREADY_EXISTS, "mount over")
            }
            _ => {
                // A fresh mount, or the owner replacing its old mount (a restarted node).
                if existing.is_some() {
                    self.hit("remount");
                }
                self.apply_events(events, Some(id), None)?;
                let seg = got.map_err(|e| format!("mount failed: {e}"))?;
                self.next_base += 1 << 32;
                self.memory.mount(seg, base, size);
                self.model.segments.insert(
                    name,
                    model::MSegment {
                        id: seg,
                        owner: id,
                        base,
                        capacity: size,
                    },
                );
                Ok(())
            }
        }
    }

    pub(super) fn unmount(&mut self, client: u8, segment: u8) -> Result<(), String> {
        let (id, name) = (client_id(client), segment_name(segment));
        let got = self.master.unmount_segment(id, &name, self.now);
        self.model.touch(id, self.now);
        let events = self.master.drain_events();
        match self.model.segments.get(&name) {
            None => expect_code(&got, ErrorCode::SEGMENT_NOT_FOUND, "unmount"),
            Some(s) if s.owner != id => expect_code(&got, ErrorCode::ILLEGAL_CLIENT, "unmount"),
            Some(_) => {
                got.map_err(|e| format!("unmount failed: {e}"))?;
                self.apply_events(events, Some(id), None)
            }
        }
    }

    /// A dead client's holds are released, its tasks abandoned, and (if it expired rather
    /// than said goodbye) its discarded writes' blocks free to reuse.
    pub(super) fn release_dead_client(&mut self, client: ClientId) {
        // Once the master took the writer for dead it may free those blocks for good: if the
        // client comes back, its write fence keeps the writes it started before from ever
        // transferring again (`crate::client::WriteWindow`: its answers broke off for a TTL),
        // so they stay free to reuse even after it is live again. A client that said goodbye
        // stays live until its silence reaches the TTL, and its blocks wait as before.
        if !self.model.clients.contains_key(&client) {
            let now = self.now;
            for block in self.model.reserved.iter_mut() {
                if block.writer == Some(client) {
                    block.writer = None;
                    block.release_at = block.release_at.min(now);
                }
            }
        }
        let holds: Vec<HoldId> = self
            .model
            .holds
            .iter()
            .filter(|(_, h)| h.client == client)
            .map(|(&id, _)| id)
            .collect();
        for id in holds {
            let held = self.model.holds.remove(&id).expect("listed");
            if let Some(o) = self.model.objects.get_mut(&held.key)
                && o.write_id == held.write_id
            {
                o.holds -= 1;
            }
        }
        let tasks: Vec<TaskId> = self
            .model
            .tasks
            .iter()
            .filter(|(_, t)| t.client == client)
            .map(|(&id, _)| id)
            .collect();
        for id in tasks {
            self.abandon_task(id);
        }
    }
}
