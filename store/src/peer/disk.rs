//! A peer's disk tier: the disk operations its state owes (write-through copies, deletions)
//! carried out, and promotes (a disk copy read back into the pool).
//!
//! Every decision is the core's (`mooring_core::peer::disk`): which copy to write, delete or
//! read, when, and what room it takes. Copies are kept one file per key (the file-per-key
//! layout), versioned by the write's stamp. A peer that starts clears what an earlier run
//! left: a restarted peer is a new member, and the directory no longer points at its old
//! values (they may have been removed or overwritten since).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mooring_core::peer::directory::{Location, Stamp};
use mooring_core::peer::disk::DiskWork;
use mooring_core::peer::pool::{BLOCK_HEADER, Promotion};
use mooring_core::peer::state::PeerState;
use mooring_core::{Checksum, Error, ErrorCode, Result};
use mooring_disk::backend::read_len;
use mooring_disk::{Backend, FilePerKey, IoBuf, Item};
use mooring_proto::transport::SegmentMemory;
use mooring_proto::wire::{PeerReply, PeerRequest};
use tracing::{info, warn};

use crate::node::disk_tier::{DiskDevice, DiskIo, DiskTierConfig};

use super::PeerNode;

/// How often a promote that meets another operation on its key's copy asks again, and how
/// many times.
const BUSY_RETRY: Duration = Duration::from_millis(5);
const BUSY_TRIES: usize = 400;

/// A peer's disk tier settings.
#[derive(Clone, Debug)]
pub struct PeerDiskConfig {
    /// Where the copies live (created if missing; emptied at start).
    pub dir: PathBuf,
    /// Most bytes of copies kept.
    pub capacity: u64,
    /// Run on this disk instead of opening `dir` (the simulated disk, in simulations).
    pub device: Option<DiskDevice>,
}

/// The copies' layout on the peer's disk.
pub(super) struct PeerDisk {
    store: Arc<dyn Backend>,
}

impl PeerDisk {
    /// Opens the tier and clears an earlier run's copies; on failure says why, and the peer
    /// runs without a disk tier.
    pub(super) async fn open(config: &PeerDiskConfig, pool: &SegmentMemory) -> Option<PeerDisk> {
        match PeerDisk::try_open(config, pool).await {
            Ok(disk) => Some(disk),
            Err(e) => {
                warn!(
                    dir = %config.dir.display(),
                    "the peer runs without a disk tier: {e}"
                );
                None
            }
        }
    }

    async fn try_open(config: &PeerDiskConfig, pool: &SegmentMemory) -> Result<PeerDisk> {
        let tier = DiskTierConfig {
            device: config.device.clone(),
            io: DiskIo::Posix,
            ..DiskTierConfig::new(config.dir.clone())
        };
        let disk = crate::node::disk_tier::open_disk(&tier, pool)?;
        let store: Arc<dyn Backend> = Arc::new(FilePerKey::new(disk));
        let failed = |what: &str, e: std::io::Error| {
            Error::new(ErrorCode::FILE_OPEN_FAIL, format!("{what}: {e}"))
        };
        let found = store
            .recover()
            .await
            .map_err(|e| failed("cannot scan the disk directory", e))?;
        let stale: Vec<(String, u64)> = found
            .objects
            .into_iter()
            .map(|held| (held.key, held.version))
            .collect();
        if !stale.is_empty() {
            store
                .remove(&stale)
                .await
                .map_err(|e| failed("cannot clear an earlier run's copies", e))?;
            info!(
                cleared = stale.len(),
                "cleared an earlier run's disk copies"
            );
        }
        Ok(PeerDisk { store })
    }
}

impl PeerNode {
    /// Starts the disk operations `state` owes, each on its own task.
    pub(super) fn start_disk_work(&self, state: &mut PeerState) {
        let work = state.take_disk_work();
        if work.is_empty() {
            return;
        }
        let Some(disk) = self.inner.disk.as_ref() else {
            debug_assert!(false, "disk work without a disk tier");
            return;
        };
        for work in work {
            let (peer, store) = (self.clone(), disk.store.clone());
            let task = match work {
                DiskWork::Write { key, stamp, .. } => {
                    // Copied now, while the state says where: the value may go later.
                    let value = state.disk_source(&key, stamp).and_then(|(offset, len)| {
                        let mut value = vec![0u8; len as usize];
                        let memory = &self.inner.memory;
                        memory
                            .copy_out(memory.base() + offset, &mut value)
                            .then_some(value)
                    });
                    tokio::spawn(async move {
                        let ok = match value {
                            Some(value) => {
                                let item = Item {
                                    key: &key,
                                    version: stamp.clock,
                                    value: &value,
                                };
                                let written = store.put_items(&[item]).await;
                                if let Err(e) = &written {
                                    warn!(%key, "a disk copy failed; the value stays in memory only: {e}");
                                }
                                written.is_ok()
                            }
                            None => false,
                        };
                        peer.disk_finished(&key, stamp, ok).await;
                    })
                }
                DiskWork::Delete { key, stamp } => tokio::spawn(async move {
                    let removed = store.remove(&[(key.to_string(), stamp.clock)]).await;
                    if let Err(e) = &removed {
                        warn!(%key, "a disk copy could not be deleted (the key's next copy replaces it): {e}");
                    }
                    peer.disk_finished(&key, stamp, removed.is_ok()).await;
                }),
            };
            drop(task);
        }
    }

    async fn disk_finished(&self, key: &str, stamp: Stamp, ok: bool) {
        let out = {
            let mut state = self.inner.state.lock().expect("peer state lock");
            let out = state.disk_finished(key, stamp, ok);
            self.owed(&mut state);
            out
        };
        self.deliver(out).await;
    }

    /// Brings `key`'s value back from this peer's disk into its pool (a reader asked), and
    /// re-publishes it; its location, or `None` if this peer no longer holds it.
    pub(super) async fn promote(&self, key: &str) -> Result<Option<Location>> {
        for _ in 0..BUSY_TRIES {
            let now = self.inner.clock.now();
            let (promotion, out) = {
                let mut state = self.inner.state.lock().expect("peer state lock");
                let promoted = state.promote(key, now);
                self.owed(&mut state);
                promoted
            };
            // The directory updates for what made room go on their own: the reader (and any
            // other waiting on this key's copy) need not wait for slow owners.
            self.deliver_in_background(out);
            let (stamp, offset, len, checksum) = match promotion {
                Promotion::Absent => return Ok(None),
                Promotion::Resident(location) => return Ok(Some(location)),
                Promotion::Busy => {
                    tokio::time::sleep(BUSY_RETRY).await;
                    continue;
                }
                Promotion::Full(full) => {
                    return Err(Error::new(
                        ErrorCode::NO_AVAILABLE_HANDLE,
                        format!(
                            "no room in peer {}'s pool to bring {key:?} back from disk ({} \
                             bytes): everything left is pinned; read it again later",
                            self.inner.name, full.wanted
                        ),
                    ));
                }
                Promotion::Load {
                    stamp,
                    offset,
                    len,
                    checksum,
                    ..
                } => (stamp, offset, len, checksum),
            };
            // The block is set aside until the read ends: the read runs on a task of its own,
            // so a reader that gives up (a timeout, a closed connection) cannot leave it, and
            // the key, held forever.
            let (peer, key) = (self.clone(), key.to_string());
            let finished = tokio::spawn(async move {
                let ok = peer.load(&key, stamp, offset, len, checksum).await;
                let now = peer.inner.clock.now();
                let (location, out) = {
                    let mut state = peer.inner.state.lock().expect("peer state lock");
                    let promoted = state.promoted(&key, stamp, ok, now);
                    peer.owed(&mut state);
                    promoted
                };
                if location.is_some() {
                    peer.inner
                        .counts
                        .promotes
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                peer.deliver(out).await;
                location
            });
            return finished.await.map_err(|e| {
                Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!("a promote's read ended without an answer: {e}"),
                )
            });
        }
        Err(Error::new(
            ErrorCode::OBJECT_REPLICA_BUSY,
            format!(
                "{key:?}'s disk copy stayed busy on peer {}; read it again",
                self.inner.name
            ),
        ))
    }

    fn deliver_in_background(&self, out: Vec<mooring_core::peer::state::Outgoing>) {
        if out.is_empty() {
            return;
        }
        let peer = self.clone();
        tokio::spawn(async move {
            peer.deliver(out).await;
        });
    }

    /// Reads the disk copy of `key`'s write `stamp` into the block at `offset`, after its
    /// header; whether the bytes are there and sound.
    async fn load(
        &self,
        key: &str,
        stamp: Stamp,
        offset: u64,
        len: u64,
        checksum: Checksum,
    ) -> bool {
        let Some(disk) = self.inner.disk.as_ref() else {
            return false;
        };
        let align = disk.store.alignment();
        let buf = IoBuf::new(read_len(key, len, align), align);
        let (buf, result) = disk.store.read(key, stamp.clock, buf).await;
        let range = match result {
            Ok(range) => range,
            Err(e) => {
                warn!(%key, "a disk copy could not be read; the value is lost: {e}");
                return false;
            }
        };
        let value = &buf[range];
        if value.len() as u64 != len || Checksum::of(value) != checksum {
            warn!(%key, "a disk copy holds other bytes than its value; the value is lost");
            return false;
        }
        let memory = &self.inner.memory;
        memory.copy_in(memory.base() + offset + BLOCK_HEADER, value)
    }

    /// Asks the peer a non-resident location names to bring its value back into memory.
    pub(super) async fn promote_at(
        &self,
        key: &str,
        location: &Location,
    ) -> Result<Option<Location>> {
        if *location.peer == *self.inner.name {
            return self.promote(key).await;
        }
        let request = PeerRequest::Promote { key: key.into() };
        match self.call(&location.peer, &request).await? {
            PeerReply::Promoted { location } => Ok(location),
            other => Err(Error::new(
                ErrorCode::RPC_FAIL,
                format!("a promote answered with {other:?}"),
            )),
        }
    }
}
