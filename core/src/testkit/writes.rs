//! Writes: put and upsert starts (the model predicts the path: create, preempt, in place,
//! copy on write, new size, or refusal), the checks on every grant, clients (zombies included)
//! writing their values, and end / revoke / abort.

use super::harness::Grant;
use super::memory::pattern;
use super::model::{MObject, MWrite};
use super::ops::Pin;
use super::{
    CLIENTS, Harness, client_id, client_index, ensure, expect_code, key_name, segment_name,
    to_model_replica,
};
use crate::checksum::Checksum;
use crate::config::ReplicateConfig;
use crate::error::ErrorCode;
use crate::events::{DiscardCause, Event};
use crate::ids::{ClientId, SegmentId};
use crate::object::ReplicaStatus;
use crate::segments::ALLOC_ALIGN;
use crate::segments::block_len;
use crate::soft_pin::SoftPinAction;
use crate::time::Millis;

/// How a client finishes one of its writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Finish {
    End,
    Revoke,
    Abort,
}

impl Harness {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put(
        &mut self,
        upsert: bool,
        client: u8,
        key: u8,
        size: u16,
        replicas: u8,
        pin: Pin,
        prefer: Option<u8>,
    ) -> Result<(), String> {
        let (id, key) = (client_id(client), key_name(key));
        // Mostly a few common sizes, so upserts often keep the size (in-place and
        // copy-on-write paths); sometimes anything.
        // Occasionally a value large enough that eviction must open a contiguous range.
        let size = match size % 8 {
            0 | 4 => 1 + u64::from(size / 8) % 6000,
            7 => 8 * 1024 + u64::from(size / 8) % (16 * 1024),
            n => [700, 2048, 4000][usize::from(n % 3)],
        };
        let count = 1 + u32::from(replicas % 3);
        let mut config = ReplicateConfig::replicas(count);
        match pin {
            Pin::None => {}
            Pin::Soft => config = config.soft_pinned(None),
            Pin::SoftTtl(ms) => config = config.soft_pinned(Some(Millis(1 + u64::from(ms % 2000)))),
            Pin::Hard => config.with_hard_pin = true,
            Pin::Unpin => config = config.soft_unpinned(),
        }
        if let Some(p) = prefer {
            config.preferred_segments.push(segment_name(p));
        }
        let now = self.now;
        let empty_fit = self.model.segments.iter().any(|(_, s)| {
            s.capacity >= block_len(size) && self.model.segment_certainly_empty(s.id)
        });
        let preferred_empty = prefer
            .and_then(|p| self.model.segments.get(&segment_name(p)))
            .and_then(|s| {
                (s.capacity >= block_len(size) && self.model.segment_certainly_empty(s.id))
                    .then_some(s.id)
            });

        // What the model expects before any allocation.
        let existing = self.model.objects.get(&key).cloned();
        enum Path {
            Fail(ErrorCode),
            New { preempt: bool, hard: bool },
            InPlace,
            CopyOnWrite,
            Reallocate,
        }
        // A member's unfinished puts may hold at most its share of the pool (see `quota`):
        // checked before anything else about the key.
        let member = crate::quota::member_of(id);
        let held: u64 = self
            .model
            .objects
            .values()
            .filter(|o| {
                o.writing
                    .is_some_and(|w| crate::quota::member_of(w.client) == member)
            })
            .map(|o| o.size)
            .sum();
        let pool: u64 = self
            .model
            .segments
            .values()
            .map(|s| s.capacity / ALLOC_ALIGN * ALLOC_ALIGN)
            .sum();
        let over_share =
            held + size > (pool as f64 * self.config.unfinished_put_share) as u64 && size <= pool;
        let path = match &existing {
            _ if over_share => Path::Fail(ErrorCode::NO_AVAILABLE_HANDLE),
            None => Path::New {
                preempt: false,
                hard: config.with_hard_pin,
            },
            Some(o) if !upsert => {
                let zombie = o
                    .writing
                    .is_some_and(|w| w.start + self.config.put_start_discard_timeout <= now);
                if zombie {
                    Path::New {
                        preempt: true,
                        hard: config.with_hard_pin,
                    }
                } else {
                    Path::Fail(ErrorCode::OBJECT_ALREADY_EXISTS)
                }
            }
            Some(o) if o.task.is_some() => Path::Fail(ErrorCode::OBJECT_HAS_REPLICATION_TASK),
            Some(o) if o.writing.is_some() => Path::New {
                preempt: true,
                hard: o.hard || config.with_hard_pin,
            },
            Some(o) if o.holds > 0 => Path::Fail(ErrorCode::OBJECT_REPLICA_BUSY),
            // A new size, or a value only on disk: fresh memory.
            Some(o) if o.size != size || o.replicas.is_empty() => Path::Reallocate,
            Some(o) if now < o.readers_done_at(self.config.lease_grace) => Path::CopyOnWrite,
            Some(_) => Path::InPlace,
        };

        let got = if upsert {
            self.master.upsert_start(id, &key, size, &config, now)
        } else {
            self.master.put_start(id, &key, size, &config, now)
        };
        self.model.touch(id, now);
        let events = self.master.drain_events();
        let preempted = events.iter().any(|e| {
            matches!(
                e,
                Event::WriteDiscarded {
                    cause: DiscardCause::Preempted,
                    ..
                }
            )
        });
        let expect_preempt = matches!(path, Path::New { preempt: true, .. });
        ensure(preempted == expect_preempt, || {
            format!("preemption {preempted}, expected {expect_preempt}; events {events:?}")
        })?;
        if let Some(Event::WriteDiscarded { key: k, .. }) = events
            .iter()
            .find(|e| matches!(e, Event::WriteDiscarded { .. }))
        {
            ensure(**k == *key, || {
                format!("preempted {k:?} while writing {key:?}")
            })?;
        }
        if matches!(path, Path::InPlace | Path::Fail(_)) {
            ensure(events.is_empty(), || {
                format!("unexpected events {events:?}")
            })?;
        }
        self.apply_events(events, None, Some(&key))?;

        // An upsert starts from the key's soft pin (even one whose write it preempts); a put
        // from none.
        let soft_before = match (&existing, upsert) {
            (Some(o), true) => (o.soft_ttl, o.soft_expiry),
            _ => (Millis::ZERO, Millis::ZERO),
        };
        let (soft_ttl, soft_expiry) = match config.soft_pin {
            SoftPinAction::Preserve => soft_before,
            SoftPinAction::Enable => {
                let ttl = config
                    .soft_pin_ttl
                    .unwrap_or(self.config.default_soft_pin_ttl);
                (ttl, now + ttl)
            }
            SoftPinAction::Disable => (Millis::ZERO, Millis::ZERO),
        };
        let label = match &path {
            Path::Fail(ErrorCode::NO_AVAILABLE_HANDLE) => "start-over-share",
            Path::Fail(_) => "start-refused",
            Path::New { preempt: true, .. } => "preempt",
            Path::New { .. } => "create",
            Path::InPlace => "upsert-in-place",
            Path::CopyOnWrite => "upsert-copy-on-write",
            Path::Reallocate => "upsert-new-size",
        };
        if got.is_ok() || matches!(path, Path::Fail(_)) {
            self.hit(label);
        } else {
            self.hit("start-no-room-or-busy");
        }
        match path {
            Path::Fail(code) => expect_code(&got, code, "start"),
            Path::New { hard, .. } => {
                let grant = match got {
                    Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE => {
                        return ensure(!empty_fit, || {
                            format!("NO_AVAILABLE_HANDLE with an empty segment that fits: {e}")
                        });
                    }
                    other => other.map_err(|e| format!("start failed: {e}"))?,
                };
                let max = (count as usize).min(self.model.segments.len());
                ensure((1..=max).contains(&grant.replicas.len()), || {
                    format!(
                        "{} replicas granted, wanted {count} of {max} segments",
                        grant.replicas.len()
                    )
                })?;
                if let Some(p) = preferred_empty {
                    ensure(grant.replicas[0].segment == p, || {
                        format!("preferred empty segment {p} not used: {:?}", grant.replicas)
                    })?;
                }
                self.accept_grant(id, &key, size, &grant, None)?;
                let version = self.fresh_version();
                self.model.bury_ghost(&key);
                let mut object = MObject::new(size, id, grant.write_id);
                object.replicas = grant.replicas.iter().map(to_model_replica).collect();
                object.writing = Some(MWrite {
                    client: id,
                    write_id: grant.write_id,
                    version,
                    start: now,
                });
                object.soft_ttl = soft_ttl;
                object.soft_expiry = soft_expiry;
                object.hard = hard;
                self.model.objects.insert(key.clone(), object);
                self.remember_grant(id, &key, version, grant, upsert);
                Ok(())
            }
            Path::InPlace | Path::CopyOnWrite | Path::Reallocate => {
                let old = existing.expect("exists");
                let grant = match got {
                    Err(e)
                        if matches!(path, Path::CopyOnWrite)
                            && e.code == ErrorCode::OBJECT_REPLICA_BUSY =>
                    {
                        return Ok(());
                    }
                    Err(e)
                        if matches!(path, Path::Reallocate)
                            && e.code == ErrorCode::NO_AVAILABLE_HANDLE =>
                    {
                        return ensure(!empty_fit, || {
                            format!("NO_AVAILABLE_HANDLE with an empty segment that fits: {e}")
                        });
                    }
                    other => other.map_err(|e| format!("upsert failed: {e}"))?,
                };
                if matches!(path, Path::InPlace) {
                    let same: Vec<(SegmentId, u64)> =
                        old.replicas.iter().map(|r| (r.segment, r.addr)).collect();
                    let got: Vec<(SegmentId, u64)> =
                        grant.replicas.iter().map(|r| (r.segment, r.addr)).collect();
                    ensure(same == got, || {
                        format!("in-place upsert moved the buffers: {same:?} -> {got:?}")
                    })?;
                    ensure(
                        grant
                            .replicas
                            .iter()
                            .all(|r| r.status == ReplicaStatus::Processing && r.len == size),
                        || format!("in-place grant {grant:?}"),
                    )?;
                } else {
                    let max = match path {
                        Path::CopyOnWrite => old.replicas.len(),
                        _ => (count as usize).min(self.model.segments.len()),
                    };
                    ensure((1..=max).contains(&grant.replicas.len()), || {
                        format!("{} replicas granted, at most {max}", grant.replicas.len())
                    })?;
                    self.accept_grant(id, &key, size, &grant, None)?;
                    self.model.reserve_for_readers(
                        &old.replicas,
                        old.size,
                        old.readers_done_at(self.config.lease_grace),
                    );
                }
                let version = self.fresh_version();
                self.model.retire_disk_copy(&key);
                let object = self.model.objects.get_mut(&key).expect("exists");
                object.size = size;
                object.replicas = grant.replicas.iter().map(to_model_replica).collect();
                object.writing = Some(MWrite {
                    client: id,
                    write_id: grant.write_id,
                    version,
                    start: now,
                });
                object.writer = id;
                object.write_id = grant.write_id;
                object.version = None;
                object.soft_ttl = soft_ttl;
                object.soft_expiry = soft_expiry;
                object.hard = old.hard || config.with_hard_pin;
                object.leased = false;
                self.remember_grant(id, &key, version, grant, upsert);
                Ok(())
            }
        }
    }

    /// Checks a new grant's blocks against everything live or reserved.
    pub(super) fn accept_grant(
        &mut self,
        client: ClientId,
        key: &str,
        size: u64,
        grant: &crate::PutGrant,
        ignore: Option<&str>,
    ) -> Result<(), String> {
        let _ = client;
        for (i, r) in grant.replicas.iter().enumerate() {
            ensure(
                r.status == ReplicaStatus::Processing && r.len == size,
                || format!("grant replica {r:?} for {key:?} of {size} bytes"),
            )?;
            ensure(
                !grant.replicas[..i].iter().any(|o| o.segment == r.segment),
                || format!("two replicas of {key:?} on {}", r.segment),
            )?;
            self.model
                .claim_block(r.segment, r.addr, size, self.now, ignore)?;
        }
        ensure(
            grant.write_id.0
                >= self
                    .model
                    .objects
                    .values()
                    .map(|o| o.write_id.0)
                    .max()
                    .unwrap_or(0),
            || format!("write id {} reused", grant.write_id),
        )
    }

    pub(super) fn remember_grant(
        &mut self,
        client: ClientId,
        key: &str,
        version: u64,
        grant: crate::PutGrant,
        upsert: bool,
    ) {
        let side = &mut self.clients[client_index(client)];
        if side.grants.len() >= 6 {
            side.grants.remove(0);
        }
        side.grants.push(Grant {
            key: key.to_string(),
            write_id: grant.write_id,
            version,
            replicas: grant.replicas,
            started: self.now,
            transferred: false,
            upsert,
        });
    }

    pub(super) fn fresh_version(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    /// A client (possibly a zombie) writes its grant's value, unless its write fence (the
    /// client library's, `crate::client::WriteWindow`) is closed.
    pub(super) fn transfer(&mut self, client: u8, grant: u8, partial: bool) {
        let side = &mut self.clients[usize::from(client % CLIENTS)];
        if side.grants.is_empty() {
            return;
        }
        let index = side.grants.len() - 1 - usize::from(grant) % side.grants.len();
        let size = side.grants[index].replicas.first().map_or(0, |r| r.len);
        if side.fence(side.grants[index].started, size, self.now) == Millis::ZERO {
            return;
        }
        let g = &mut side.grants[index];
        let len = g.replicas.first().map_or(0, |r| r.len);
        let upto = if partial { len / 2 } else { len };
        let current = self
            .model
            .objects
            .get(&g.key)
            .is_some_and(|o| o.writing.is_some_and(|w| w.write_id == g.write_id));
        let zombie = !current;
        for r in &g.replicas {
            self.memory.write(r, g.version, upto);
        }
        if !partial {
            g.transferred = true;
        }
        if zombie {
            self.hit("zombie-write");
        }
    }

    pub(super) fn finish_write(
        &mut self,
        client: u8,
        grant: u8,
        how: Finish,
    ) -> Result<(), String> {
        let end = how == Finish::End;
        let id = client_id(client);
        let side = &self.clients[client_index(id)];
        if side.grants.is_empty() {
            return Ok(());
        }
        let index = side.grants.len() - 1 - usize::from(grant) % side.grants.len();
        if end {
            // An honest client writes the value before ending (a no-op if done already or if
            // its self-fence forbids it).
            self.transfer(client, grant, false);
        }
        let side = &self.clients[client_index(id)];
        let g = side.grants[index].clone();
        let object = self.model.objects.get(&g.key).cloned();
        let current = object
            .as_ref()
            .is_some_and(|o| o.writing.is_some_and(|w| w.write_id == g.write_id));
        if end && current && !g.transferred {
            return Ok(()); // an honest client does not end a write it has not finished
        }
        let now = self.now;
        let size = g.replicas.first().map_or(0, |r| r.len);
        let sum = Checksum::of(&pattern(g.version, size));
        let got = match (how, g.upsert) {
            (Finish::End, false) => self.master.put_end(id, &g.key, g.write_id, sum, now),
            (Finish::End, true) => self.master.upsert_end(id, &g.key, g.write_id, sum, now),
            (Finish::Revoke, false) => self.master.put_revoke(id, &g.key, g.write_id, now),
            (Finish::Revoke, true) => self.master.upsert_revoke(id, &g.key, g.write_id, now),
            (Finish::Abort, _) => self.master.put_abort(id, &g.key, g.write_id, now),
        };
        self.model.touch(id, now);
        let events = self.master.drain_events();
        if how == Finish::Abort && got.is_ok() {
            // The aborting client may keep writing its grant until its fence: keep it.
            let aborted = matches!(
                events.as_slice(),
                [Event::WriteDiscarded { cause: DiscardCause::Aborted, write, .. }] if *write == g.write_id
            );
            ensure(aborted, || format!("abort reported {events:?}"))?;
        } else {
            ensure(events.is_empty(), || {
                format!("end/revoke produced events {events:?}")
            })?;
            self.clients[client_index(id)].grants.remove(index);
        }
        let Some(object) = object else {
            return expect_code(&got, ErrorCode::OBJECT_NOT_FOUND, "end of a vanished key");
        };
        if object.writer != id {
            self.hit("end-illegal-client");
            return expect_code(
                &got,
                ErrorCode::ILLEGAL_CLIENT,
                "end of another client's write",
            );
        }
        if object.write_id != g.write_id {
            self.hit("end-superseded");
            return expect_code(
                &got,
                ErrorCode::OBJECT_NOT_FOUND,
                "end of a superseded write",
            );
        }
        let Some(write) = object.writing else {
            return if end {
                got.map_err(|e| format!("repeated end failed: {e}"))
            } else {
                expect_code(&got, ErrorCode::INVALID_WRITE, "revoke after end")
            };
        };
        got.map_err(|e| format!("end/revoke failed: {e}"))?;
        if how == Finish::Abort {
            self.hit("abort");
            return self.apply_events(events, None, None);
        }
        self.hit(if end { "end" } else { "revoke" });
        let o = self.model.objects.get_mut(&g.key).expect("exists");
        o.writing = None;
        if end {
            for r in &mut o.replicas {
                r.complete = true;
            }
            o.version = Some(write.version);
            o.last_access = o.last_access.max(now);
            o.refresh_soft(now);
        } else {
            o.replicas.retain(|r| r.complete);
            if o.replicas.is_empty() && o.disk.is_none() {
                self.model.objects.remove(&g.key);
            }
        }
        Ok(())
    }
}
