//! What a peer does for its clients, and how it moves directory messages.
//!
//! - **Put**: one copy into the peer's own pool (header after value, so a block's header
//!   names a write only once the write's bytes are there), then one publish to each owner.
//! - **Get**: ask the key's owners (itself among them, maybe), try their answers newest
//!   first, and read each from its peer: a local copy, or one data-plane read of header and
//!   value. A header that names another write, or bytes that fail the checksum, make the
//!   entry stale: the next answer is tried; never wrong bytes.
//! - **Remove**: a stamp above every write the owners know of, given to every owner.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures_util::future::join_all;
use mooring_core::peer::directory::Location;
use mooring_core::peer::pool::{BLOCK_HEADER, HeaderWrite, block_header};
use mooring_core::peer::state::{DirectoryMessage, Outgoing, PeerState, read_order};
use mooring_core::{Checksum, Error, ErrorCode, Result};
use mooring_proto::transport::{BoxFuture, NodeAddr, ReadOp};
use mooring_proto::wire::{MAX_PEER_BATCH, PeerReply, PeerRequest};
use tracing::debug;

use crate::node::memory::value_buffer;

use super::PeerNode;

/// Most rounds of answers-to-answers one delivery follows before leaving the rest to the
/// next re-publish round (a bound, never reached by the protocol's own exchanges).
const MAX_DELIVERY_ROUNDS: usize = 8;

impl PeerNode {
    /// Stores `value` under `key`: copied into this peer's pool and published to the key's
    /// owners. Returns once the owners answered (or could not be reached: the next
    /// re-publish round tries again).
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        if value.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("an empty value for {key:?}: values take at least one byte"),
            ));
        }
        let started = Instant::now();
        let checksum = Checksum::of(value);
        let now = self.inner.clock.now();
        let placed = {
            let mut state = self.inner.state.lock().expect("peer state lock");
            let placed = state.put(key, value.len() as u64, checksum, now);
            // Headers of blocks just freed are cleared before the new value can land in one,
            // and its disk copy is taken once it has.
            self.apply_headers(state.take_header_writes());
            let placed = match placed {
                Ok((location, out)) => {
                    let block = self.inner.memory.base() + location.offset;
                    let copied = self.inner.memory.copy_in(block + BLOCK_HEADER, value)
                        && self
                            .inner
                            .memory
                            .copy_in(block, &block_header(location.stamp));
                    debug_assert!(copied, "the pool places values inside its memory");
                    Ok(out)
                }
                Err(full) => Err((state.evictions(&full.evicted), full.wanted)),
            };
            self.owed(&mut state);
            placed
        };
        let out = match placed {
            Ok(out) => out,
            Err((out, wanted)) => {
                self.deliver(out).await;
                return Err(Error::new(
                    ErrorCode::NO_AVAILABLE_HANDLE,
                    format!(
                        "no room for {key:?} ({wanted} bytes) in peer {}'s pool: everything \
                         left is pinned, or the value is larger than the pool; give the peer \
                         more memory (--size) or write through another peer",
                        self.inner.name
                    ),
                ));
            }
        };
        self.inner.counts.puts.fetch_add(1, Ordering::Relaxed);
        self.deliver(out).await;
        self.inner.counts.put_latency.observe(started.elapsed());
        Ok(())
    }

    /// The latest value of `key`, or `None`.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let started = Instant::now();
        let found = self.find(key).await;
        self.inner.counts.get_latency.observe(started.elapsed());
        found
    }

    /// The body of [`PeerNode::get`].
    async fn find(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.counts.gets.fetch_add(1, Ordering::Relaxed);
        let answers = self.lookup(&[key]).await.pop().unwrap_or_default();
        let mut held_back = None;
        for answer in read_order(answers) {
            match self.read_answer(key, answer).await {
                Ok(Some(value)) => {
                    self.inner.counts.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(Some(value));
                }
                Ok(None) => {}
                Err(e) => held_back = Some(e),
            }
        }
        // A value that is there but could not be brought back from disk just now is not a
        // miss: say why, so the caller reads again.
        match held_back {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Reads the value an owner's answer names. A value only on disk is promoted first. A
    /// block that no longer holds the write (a stale entry) is asked about once more at the
    /// value's peer: the value may have moved since the entry was written (evicted to disk,
    /// or promoted into another block) and the entry not caught up yet.
    /// `Err` only for a value its peer holds but could not bring back from disk just now (no
    /// room, or its copy busy).
    async fn read_answer(&self, key: &str, answer: Location) -> Result<Option<Vec<u8>>> {
        let mut location = answer;
        let mut asked_again = false;
        loop {
            if !location.resident {
                location = match self.promote_at(key, &location).await {
                    Ok(Some(promoted)) => promoted,
                    Ok(None) => return Ok(None),
                    Err(e)
                        if matches!(
                            e.code,
                            ErrorCode::NO_AVAILABLE_HANDLE | ErrorCode::OBJECT_REPLICA_BUSY
                        ) =>
                    {
                        return Err(e);
                    }
                    Err(e) => {
                        debug!(key, peer = %location.peer, "promote failed, trying the next: {e}");
                        return Ok(None);
                    }
                };
            }
            match self.read(key, &location).await {
                Ok(Some(value)) => return Ok(Some(value)),
                Ok(None) => {
                    self.inner.counts.stale.fetch_add(1, Ordering::Relaxed);
                    if asked_again {
                        return Ok(None);
                    }
                    asked_again = true;
                    location.resident = false;
                }
                Err(e) => {
                    debug!(key, peer = %location.peer, "read failed, trying the next: {e}");
                    return Ok(None);
                }
            }
        }
    }

    /// Whether each key has a value, as its owners know. A value only on disk is brought
    /// back into memory in the background (a reader is likely to follow).
    pub async fn exists(&self, keys: &[&str]) -> Vec<bool> {
        let answers = self.lookup(keys).await;
        let mut found = Vec::with_capacity(keys.len());
        for (key, answers) in keys.iter().zip(answers) {
            found.push(answers.iter().any(Option::is_some));
            if let Some(newest) = read_order(answers).into_iter().next()
                && !newest.resident
            {
                let (peer, key) = (self.clone(), key.to_string());
                tokio::spawn(async move {
                    if let Err(e) = peer.promote_at(&key, &newest).await {
                        debug!(key, "a warming promote failed: {e}");
                    }
                });
            }
        }
        found
    }

    /// Removes every write of `key` up to now; returns whether an owner held an entry.
    pub async fn remove(&self, key: &str) -> Result<bool> {
        let known: Vec<Location> = self
            .lookup(&[key])
            .await
            .pop()
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .collect();
        let existed = !known.is_empty();
        let now = self.inner.clock.now();
        let out = {
            let mut state = self.inner.state.lock().expect("peer state lock");
            state.removal(key, now, &known)
        };
        let owners: Vec<Box<str>> = out
            .iter()
            .filter(|o| matches!(o.message, DirectoryMessage::Removed { .. }))
            .map(|o| o.to.clone())
            .collect();
        // A data peer that cannot be told to free its copy is not a failed removal: the
        // owners' entries are gone, and their tombstones keep its re-publish out.
        let unreachable: Vec<Box<str>> = self
            .deliver(out)
            .await
            .into_iter()
            .filter(|peer| owners.contains(peer))
            .collect();
        if !unreachable.is_empty() {
            // A removal an owner missed could come back through it: say so, so the caller
            // removes again rather than count on it.
            return Err(Error::new(
                ErrorCode::RPC_FAIL,
                format!(
                    "the removal of {key:?} did not reach every owner of its entry \
                     ({unreachable:?} did not answer); it may have taken effect in part: \
                     remove it again"
                ),
            ));
        }
        Ok(existed)
    }

    /// Each key's owners' answers (an owner that cannot be reached answers nothing).
    async fn lookup(&self, keys: &[&str]) -> Vec<Vec<Option<Location>>> {
        let mut answers = vec![Vec::new(); keys.len()];
        let mut asked: BTreeMap<Box<str>, Vec<usize>> = BTreeMap::new();
        {
            let state = self.inner.state.lock().expect("peer state lock");
            for (index, key) in keys.iter().enumerate() {
                for owner in state.owners_of(key) {
                    if *owner == *self.inner.name {
                        answers[index].push(state.lookup(key));
                    } else {
                        asked.entry(owner).or_default().push(index);
                    }
                }
            }
        }
        let calls = asked.iter().flat_map(|(owner, indexes)| {
            indexes.chunks(MAX_PEER_BATCH).map(move |chunk| async move {
                let request = PeerRequest::Lookup {
                    keys: chunk.iter().map(|&i| keys[i].to_string()).collect(),
                };
                (chunk, owner, self.call(owner, &request).await)
            })
        });
        for (chunk, owner, reply) in join_all(calls).await {
            match reply {
                Ok(PeerReply::Locations { found }) if found.len() == chunk.len() => {
                    for (&index, location) in chunk.iter().zip(found) {
                        answers[index].push(location);
                    }
                }
                Ok(other) => debug!(peer = %owner, "a lookup answered with {other:?}"),
                Err(e) => debug!(peer = %owner, "lookup failed: {e}"),
            }
        }
        answers
    }

    /// Reads `location`'s value, or `None` if its block no longer holds that write.
    async fn read(&self, key: &str, location: &Location) -> Result<Option<Vec<u8>>> {
        let mut header = [0u8; BLOCK_HEADER as usize];
        let mut value = value_buffer(location.len)?;
        let expected = block_header(location.stamp);
        if *location.peer == *self.inner.name {
            let block = self.inner.memory.base() + location.offset;
            let inside = self.inner.memory.copy_out(block, &mut header)
                && self.inner.memory.copy_out(block + BLOCK_HEADER, &mut value);
            let sound = inside && header == expected && Checksum::of(&value) == location.checksum;
            if sound {
                let now = self.inner.clock.now();
                // A local read counts as an access for eviction order.
                self.inner
                    .state
                    .lock()
                    .expect("peer state lock")
                    .read_local(key, now);
            }
            return Ok(sound.then_some(value));
        }
        let member = self
            .inner
            .membership
            .lock()
            .expect("membership lock")
            .info(&location.peer)
            .cloned();
        let Some(member) = member else {
            return Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("peer {} is not a member now", location.peer),
            ));
        };
        let node = NodeAddr {
            endpoint: (*member.data_endpoint).into(),
            key: member.data_key,
            rdma_key: None,
        };
        let block = member.data_base + location.offset;
        // A pooled connection whose other end went away (the peer restarted, or a partition
        // reset it) fails the first read on it, and is dropped: one more read, on a fresh
        // connection, tells that apart from a peer that cannot be reached.
        let mut retried = false;
        let sums = loop {
            let ops = vec![
                ReadOp {
                    addr: block,
                    dest: &mut header,
                },
                ReadOp {
                    addr: block + BLOCK_HEADER,
                    dest: &mut value,
                },
            ];
            match self.inner.data.read(&node, ops).await {
                Err(e) if e.code == ErrorCode::TRANSFER_FAIL && !retried => {
                    debug!(key, peer = %location.peer, "read failed, once more: {e}");
                    retried = true;
                }
                result => break result?,
            }
        };
        let sound = header == expected && sums.get(1) == Some(&location.checksum);
        Ok(sound.then_some(value))
    }

    /// Sends `request` to member `name`.
    pub(super) async fn call(&self, name: &str, request: &PeerRequest) -> Result<PeerReply> {
        let address = self.address_of(name).ok_or_else(|| {
            Error::new(
                ErrorCode::RPC_FAIL,
                format!("peer {name} is not a member now"),
            )
        })?;
        self.inner.links.call(&address, request).await
    }

    /// Carries out what `state` owes the pool's memory and disk: block headers now, disk
    /// operations on tasks of their own. Called under the state lock after every change.
    pub(super) fn owed(&self, state: &mut PeerState) {
        self.apply_headers(state.take_header_writes());
        self.start_disk_work(state);
    }

    /// Writes the block headers the state owes into the pool's memory.
    fn apply_headers(&self, writes: Vec<HeaderWrite>) {
        let memory = &self.inner.memory;
        for write in writes {
            let written = match write {
                HeaderWrite::Clear(offset) => {
                    memory.copy_in(memory.base() + offset, &[0; BLOCK_HEADER as usize])
                }
                HeaderWrite::Write { offset, stamp, .. } => {
                    memory.copy_in(memory.base() + offset, &block_header(stamp))
                }
            };
            debug_assert!(written, "headers lie inside the pool");
        }
    }

    /// Sends `out` (directory messages) and follows the answers they cause, which may cause
    /// more. Messages for this peer itself are handled in place; unreachable peers are
    /// skipped (the next re-publish round repairs what they missed) and returned.
    pub(super) fn deliver(&self, out: Vec<Outgoing>) -> BoxFuture<'_, Vec<Box<str>>> {
        Box::pin(async move {
            let mut pending = out;
            let mut unreachable = Vec::new();
            for _ in 0..MAX_DELIVERY_ROUNDS {
                if pending.is_empty() {
                    return unreachable;
                }
                let now = self.inner.clock.now();
                let mut next = Vec::new();
                let mut remote: BTreeMap<Box<str>, Vec<DirectoryMessage>> = BTreeMap::new();
                {
                    let mut state = self.inner.state.lock().expect("peer state lock");
                    for message in pending {
                        if *message.to == *self.inner.name {
                            next.extend(state.receive(&self.inner.name, message.message, now));
                        } else {
                            remote.entry(message.to).or_default().push(message.message);
                        }
                    }
                    self.owed(&mut state);
                }
                let calls = remote.iter().flat_map(|(to, messages)| {
                    messages
                        .chunks(MAX_PEER_BATCH)
                        .map(move |chunk| async move {
                            let request = PeerRequest::Directory {
                                messages: chunk.to_vec(),
                            };
                            (to, self.call(to, &request).await)
                        })
                });
                let answers = join_all(calls).await;
                let now = self.inner.clock.now();
                let mut state = self.inner.state.lock().expect("peer state lock");
                for (to, answer) in answers {
                    match answer {
                        Ok(PeerReply::Directory { replies }) => {
                            for reply in replies {
                                next.extend(state.receive(to, reply, now));
                            }
                        }
                        Ok(other) => {
                            debug!(peer = %to, "directory messages answered with {other:?}")
                        }
                        Err(e) => {
                            debug!(peer = %to, "directory messages not delivered: {e}");
                            unreachable.push(to.clone());
                        }
                    }
                }
                self.owed(&mut state);
                pending = next;
            }
            if !pending.is_empty() {
                debug!(
                    left = pending.len(),
                    "directory exchange still going after {MAX_DELIVERY_ROUNDS} rounds; the \
                     re-publish round finishes it"
                );
            }
            unreachable
        })
    }
}
