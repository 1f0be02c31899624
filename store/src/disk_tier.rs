//! A node's disk tier (spec 001): the node's half of offloading, disk reads and disk eviction.
//! The policy (which objects, when, and what the master records) is the core's `offload`; this
//! file moves bytes between the segment, the disk and the staging buffer, and talks to the
//! master in one RPC, the *disk sync*, every `sync_interval`:
//!
//! 1. After every mount it reports everything intact on disk (`recovered`).
//! 2. It carries out the master's tombstones (deletes a key only if it holds that write).
//! 3. It copies each offload order's bytes out of its segment while the order's lease lasts,
//!    makes room (disk eviction, below), writes them, and reports them in the next sync.
//!
//! **Disk eviction** keeps the disk under `capacity`: victims are chosen (FIFO by write, or
//! LRU by last read) and taken out of the index with no I/O, the master is told in one sync
//! and must acknowledge, then the node waits for in-flight reads of them and deletes the
//! files. If the master cannot be told, the victims go back and the writes that needed the
//! room fail: the master never points at a deleted file.
//!
//! **Reads** come through the data server ([`Stager`]): the value is loaded into a slot of the
//! staging buffer (exported like a segment), the reader pulls it with a one-sided read and
//! unstages it; a slot nobody unstages is reclaimed after `slot_ttl`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::allocator::OffsetAllocator;
use mooring_core::disk::Disk;
use mooring_core::transport::{BoxFuture, ControlPlane, DataServer, SegmentMemory, Stager};
use mooring_core::wire::{MasterRequest, Reply, StagedSlot};
use mooring_core::{
    ClientId, DiskReport, DiskSyncAck, Error, ErrorCode, OffloadOrder, Result, SegmentId, WriteId,
};
use mooring_disk::FilePerKey;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::memory::MappedMemory;
use crate::node::{Node, unexpected};

/// Which copies disk eviction takes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskEviction {
    /// The oldest written.
    Fifo,
    /// The least recently read (never-read copies first, oldest written among them).
    Lru,
}

/// How the disk is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskIo {
    /// io_uring (falls back to POSIX, with a log line, where unavailable).
    Uring,
    /// POSIX pread/pwrite.
    Posix,
}

/// A node's disk tier settings.
#[derive(Clone, Debug)]
pub struct DiskTierConfig {
    /// Where the copies live (created if missing; an existing one is recovered).
    pub dir: PathBuf,
    /// Most bytes of values kept on disk; 0 means no limit (and no disk eviction).
    pub capacity: u64,
    /// Disk eviction order.
    pub eviction: DiskEviction,
    /// io_uring or POSIX.
    pub io: DiskIo,
    /// O_DIRECT (bypass the page cache), with the alignment the filesystem reports.
    pub direct: bool,
    /// Bytes of staging buffer for readers' disk reads.
    pub staging: u64,
    /// How long a staged value waits for its reader before the slot is reclaimed.
    pub slot_ttl: Duration,
    /// How often the node syncs with the master when idle.
    pub sync_interval: Duration,
    /// Most offload orders taken per sync.
    pub batch: u32,
}

impl DiskTierConfig {
    /// Defaults for a disk tier in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> DiskTierConfig {
        DiskTierConfig {
            dir: dir.into(),
            capacity: 0,
            eviction: DiskEviction::Fifo,
            io: DiskIo::Uring,
            direct: false,
            staging: 64 << 20,
            slot_ttl: Duration::from_secs(5),
            sync_interval: Duration::from_millis(100),
            batch: 32,
        }
    }
}

/// One copy on disk.
#[derive(Clone, Debug)]
struct Entry {
    version: u64,
    size: u64,
    /// Write order (FIFO).
    written: u64,
    /// Last read (LRU); 0 if never read.
    read: u64,
    /// Cloned by every read in progress: a copy being evicted is deleted once this is the
    /// only reference.
    readers: Arc<()>,
}

/// What is on disk.
#[derive(Clone, Default)]
struct Index {
    entries: BTreeMap<String, Entry>,
    bytes: u64,
    /// A logical clock for FIFO and LRU order.
    tick: u64,
}

impl Index {
    fn insert(&mut self, key: String, version: u64, size: u64) {
        self.tick += 1;
        let entry = Entry {
            version,
            size,
            written: self.tick,
            read: 0,
            readers: Arc::new(()),
        };
        if let Some(old) = self.entries.insert(key, entry) {
            self.bytes -= old.size;
        }
        self.bytes += size;
    }

    fn remove(&mut self, key: &str) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.bytes -= entry.size;
        Some(entry)
    }

    /// Phase one of disk eviction: takes copies out until `need` more bytes fit under
    /// `capacity`, never `keep`. No I/O.
    fn choose_victims(
        &mut self,
        need: u64,
        capacity: u64,
        policy: DiskEviction,
        keep: &str,
    ) -> Vec<(String, Entry)> {
        let mut victims = Vec::new();
        while self.bytes + need > capacity {
            let victim = self
                .entries
                .iter()
                .filter(|(k, _)| k.as_str() != keep)
                .min_by_key(|(_, e)| match policy {
                    DiskEviction::Fifo => (e.written, 0),
                    DiskEviction::Lru => (e.read, e.written),
                })
                .map(|(k, _)| k.clone());
            let Some(key) = victim else { break };
            let entry = self.remove(&key).expect("chosen from the index");
            victims.push((key, entry));
        }
        victims
    }
}

/// The staging buffer: slots handed to readers.
struct Staging {
    memory: SegmentMemory,
    /// The buffer's access key on the data plane.
    key: u64,
    slots: Mutex<Slots>,
}

struct Slots {
    allocator: OffsetAllocator,
    /// Slot id → (allocator node, reclaimed at).
    live: BTreeMap<u64, (u32, Instant)>,
    next: u64,
}

impl Slots {
    fn reclaim_expired(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(&slot, _)| slot)
            .collect();
        for slot in expired {
            let (node, _) = self.live.remove(&slot).expect("listed");
            self.allocator.free(node);
            debug!(slot, "staging slot reclaimed after its TTL");
        }
    }
}

/// A node's disk tier. Dropping it stops the sync loop.
pub struct DiskTier {
    inner: Arc<TierInner>,
    task: Mutex<Option<JoinHandle<()>>>,
}

struct TierInner {
    config: DiskTierConfig,
    store: FilePerKey,
    index: Mutex<Index>,
    staging: Staging,
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().expect("task lock").take() {
            task.abort();
        }
    }
}

/// Under the simulator there are no real disks: simulations pass the simulated one to
/// [`DiskTier::start_on`].
#[cfg(madsim)]
fn open_disk(config: &DiskTierConfig) -> Result<Arc<dyn Disk>> {
    Err(Error::new(
        ErrorCode::FILE_OPEN_FAIL,
        format!(
            "cannot open {} under the simulator; start the tier on a simulated disk",
            config.dir.display()
        ),
    ))
}

/// Opens the disk the config asks for.
#[cfg(not(madsim))]
fn open_disk(config: &DiskTierConfig) -> Result<Arc<dyn Disk>> {
    use mooring_disk::{IoMode, PosixDisk};
    let mode = if config.direct {
        IoMode::Direct
    } else {
        IoMode::Buffered
    };
    let failed = |e: std::io::Error| {
        Error::new(
            ErrorCode::FILE_OPEN_FAIL,
            format!("cannot open disk directory {}: {e}", config.dir.display()),
        )
    };
    if config.io == DiskIo::Uring {
        match mooring_disk::UringDisk::open(&config.dir, mode) {
            Ok(disk) => return Ok(Arc::new(disk)),
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                warn!("io_uring unavailable, using POSIX pread/pwrite: {e}")
            }
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(Arc::new(
        PosixDisk::open(&config.dir, mode).map_err(failed)?,
    ))
}

fn io_error(code: ErrorCode, what: &str, e: std::io::Error) -> Error {
    Error::new(code, format!("{what}: {e}"))
}

impl DiskTier {
    /// Opens the tier on `config.dir`, recovers what is there, registers the staging buffer
    /// with `server`, and starts syncing `node`'s disk with the master.
    pub async fn start(
        config: DiskTierConfig,
        node: Node,
        client: ClientId,
        control: Arc<dyn ControlPlane>,
        server: Arc<dyn DataServer>,
    ) -> Result<DiskTier> {
        let disk = open_disk(&config)?;
        Self::start_on(disk, config, node, client, control, server).await
    }

    /// [`DiskTier::start`] on a given disk (the simulated one, in tests).
    pub async fn start_on(
        disk: Arc<dyn Disk>,
        config: DiskTierConfig,
        node: Node,
        client: ClientId,
        control: Arc<dyn ControlPlane>,
        server: Arc<dyn DataServer>,
    ) -> Result<DiskTier> {
        let store = FilePerKey::new(disk);
        let recovered = store
            .recover()
            .await
            .map_err(|e| io_error(ErrorCode::FILE_READ_FAIL, "disk recovery scan failed", e))?;
        let mut index = Index::default();
        for (key, version, size) in recovered.objects {
            index.insert(key, version, size);
        }
        info!(
            dir = %config.dir.display(),
            objects = index.entries.len(),
            bytes = index.bytes,
            dropped = recovered.dropped.len(),
            "disk tier recovered"
        );
        let memory = MappedMemory::new(config.staging as usize, true)?.into_segment();
        let staging_addr = server.export(memory.clone())?;
        let inner = Arc::new(TierInner {
            staging: Staging {
                key: staging_addr.key,
                slots: Mutex::new(Slots {
                    allocator: OffsetAllocator::new(memory.len() as u64),
                    live: BTreeMap::new(),
                    next: 1,
                }),
                memory,
            },
            store,
            index: Mutex::new(index),
            config,
        });
        server.serve_disk(inner.clone())?;
        let task = tokio::spawn(sync_loop(inner.clone(), node, client, control));
        Ok(DiskTier {
            inner,
            task: Mutex::new(Some(task)),
        })
    }

    /// Copies on disk and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        let index = self.inner.index.lock().expect("index lock");
        (index.entries.len(), index.bytes)
    }
}

impl Stager for TierInner {
    fn stage(&self, object: String, size: u64) -> BoxFuture<'_, Result<StagedSlot>> {
        Box::pin(async move {
            let readers = {
                let mut index = self.index.lock().expect("index lock");
                index.tick += 1;
                let tick = index.tick;
                let entry = index
                    .entries
                    .get_mut(&object)
                    .filter(|e| e.size == size)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorCode::OBJECT_NOT_FOUND,
                            format!("this node has no {size}-byte disk copy of {object:?} (evicted or replaced)"),
                        )
                    })?;
                entry.read = tick;
                entry.readers.clone()
            };
            let (slot, node, addr) = self.allocate_slot(size)?;
            let loaded = self.load_into(&object, size, addr).await;
            drop(readers);
            if let Err(e) = loaded {
                self.unstage_slot(slot, node);
                return Err(e);
            }
            Ok(StagedSlot {
                key: self.staging.key,
                addr,
                len: size,
                slot,
                ttl_ms: self.config.slot_ttl.as_millis() as u64,
            })
        })
    }

    fn unstage(&self, slot: u64) {
        let mut slots = self.staging.slots.lock().expect("slots lock");
        if let Some((node, _)) = slots.live.remove(&slot) {
            slots.allocator.free(node);
        }
    }
}

impl TierInner {
    /// A staging slot of `size` bytes: (slot id, allocator node, address).
    fn allocate_slot(&self, size: u64) -> Result<(u64, u32, u64)> {
        let now = Instant::now();
        let mut slots = self.staging.slots.lock().expect("slots lock");
        let allocation = slots.allocator.allocate(size).or_else(|| {
            slots.reclaim_expired(now);
            slots.allocator.allocate(size)
        });
        let allocation = allocation.ok_or_else(|| {
            Error::new(
                ErrorCode::BUFFER_OVERFLOW,
                format!(
                    "the node's {}-byte staging buffer has no room for {size} bytes; retry shortly or give the node a larger staging buffer",
                    self.staging.memory.len()
                ),
            )
        })?;
        let slot = slots.next;
        slots.next += 1;
        slots
            .live
            .insert(slot, (allocation.node, now + self.config.slot_ttl));
        Ok((
            slot,
            allocation.node,
            self.staging.memory.base() + allocation.offset,
        ))
    }

    fn unstage_slot(&self, slot: u64, node: u32) {
        let mut slots = self.staging.slots.lock().expect("slots lock");
        if slots.live.remove(&slot).is_some() {
            slots.allocator.free(node);
        }
    }

    /// Reads `object`'s copy into the staging buffer at `addr`.
    async fn load_into(&self, object: &str, size: u64, addr: u64) -> Result<()> {
        let stored = self
            .store
            .get(object)
            .await
            .map_err(|e| io_error(ErrorCode::FILE_READ_FAIL, "disk read failed", e))?
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::OBJECT_NOT_FOUND,
                    format!("the disk copy of {object:?} is gone"),
                )
            })?;
        if stored.value.len() as u64 != size {
            return Err(Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                format!("the disk copy of {object:?} is of another value"),
            ));
        }
        if !self.staging.memory.copy_in(addr, &stored.value) {
            return Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                "staging slot outside the buffer",
            ));
        }
        Ok(())
    }

    /// Deletes `key`'s copy if it is `version`, once its reads are done.
    async fn delete(&self, key: &str, version: u64, readers: Arc<()>) -> Result<()> {
        wait_for_readers(key, readers).await;
        self.store
            .remove_version(key, version)
            .await
            .map(|_| ())
            .map_err(|e| io_error(ErrorCode::FILE_WRITE_FAIL, "disk delete failed", e))
    }
}

/// Phase two's wait: until no read of the copy is in progress (at most 10 s, as in spec 001).
async fn wait_for_readers(key: &str, readers: Arc<()>) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&readers) > 1 {
        if Instant::now() >= give_up {
            warn!(%key, "deleting a disk copy with reads still in progress after 10 s");
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Syncs with the master until aborted.
async fn sync_loop(
    tier: Arc<TierInner>,
    node: Node,
    client: ClientId,
    control: Arc<dyn ControlPlane>,
) {
    let mut pending = DiskReport::default();
    let mut synced_mount: Option<SegmentId> = None;
    loop {
        let Some(segment) = node.segment() else {
            tokio::time::sleep(tier.config.sync_interval).await;
            continue;
        };
        if synced_mount != Some(segment) {
            // A new mount: the master knows none of our copies.
            let index = tier.index.lock().expect("index lock");
            pending.recovered = index
                .entries
                .iter()
                .map(|(k, e)| (k.clone(), WriteId(e.version), e.size))
                .collect();
        }
        pending.want = tier.config.batch;
        let sent = Instant::now();
        let ack = match call_sync(&control, client, segment, pending.clone()).await {
            Ok(ack) => ack,
            Err(e) => {
                warn!("disk sync failed, retrying: {e}");
                tokio::time::sleep(tier.config.sync_interval).await;
                continue;
            }
        };
        synced_mount = Some(segment);
        pending = DiskReport::default();
        let busy = ack.offload.len() as u32 >= tier.config.batch.max(1);
        carry_out(
            &tier,
            &node,
            client,
            &control,
            segment,
            ack,
            sent,
            &mut pending,
        )
        .await;
        if !busy {
            tokio::time::sleep(tier.config.sync_interval).await;
        }
    }
}

async fn call_sync(
    control: &Arc<dyn ControlPlane>,
    client: ClientId,
    segment: SegmentId,
    report: DiskReport,
) -> Result<DiskSyncAck> {
    match control
        .call(MasterRequest::DiskSync {
            client,
            segment,
            report,
        })
        .await?
    {
        Reply::DiskSync(ack) => Ok(ack),
        other => Err(unexpected(&other)),
    }
}

/// Carries out one sync's answer: tombstones, then offload orders. Results go into `pending`.
#[allow(clippy::too_many_arguments)]
async fn carry_out(
    tier: &Arc<TierInner>,
    node: &Node,
    client: ClientId,
    control: &Arc<dyn ControlPlane>,
    segment: SegmentId,
    ack: DiskSyncAck,
    sent: Instant,
    pending: &mut DiskReport,
) {
    for (key, write) in ack.delete {
        let held = {
            let mut index = tier.index.lock().expect("index lock");
            match index.entries.get(&key) {
                Some(e) if e.version == write.0 => index.remove(&key),
                _ => None,
            }
        };
        let deleted = match held {
            Some(entry) => tier.delete(&key, write.0, entry.readers).await,
            None => Ok(()),
        };
        match deleted {
            Ok(()) => pending.deleted.push((key, write)),
            Err(e) => warn!(%key, "tombstone not carried out, will retry: {e}"),
        }
    }
    // Copy every order out of the segment while their lease holds.
    let lease = Duration::from_millis(ack.lease_ttl.as_millis());
    let copies: Vec<(OffloadOrder, Option<Vec<u8>>)> = ack
        .offload
        .into_iter()
        .map(|order| {
            let mut bytes = vec![0u8; order.size as usize];
            let copied = node.memory().copy_out(order.addr, &mut bytes);
            (order, copied.then_some(bytes))
        })
        .collect();
    let in_time = sent.elapsed() < lease;
    for (order, bytes) in copies {
        let key_write = (order.key.clone(), order.write);
        let Some(bytes) = bytes.filter(|_| in_time) else {
            warn!(key = %order.key, "offload order not copied within its lease");
            pending.failed.push(key_write);
            continue;
        };
        match write_copy(tier, client, control, segment, &order, &bytes).await {
            Ok(()) => pending.offloaded.push(key_write),
            Err(e) => {
                warn!(key = %order.key, "offload failed: {e}");
                pending.failed.push(key_write);
            }
        }
    }
}

/// Makes room for `order` (disk eviction), then writes it.
async fn write_copy(
    tier: &Arc<TierInner>,
    client: ClientId,
    control: &Arc<dyn ControlPlane>,
    segment: SegmentId,
    order: &OffloadOrder,
    bytes: &[u8],
) -> Result<()> {
    let capacity = tier.config.capacity;
    if capacity > 0 {
        if order.size > capacity {
            return Err(Error::new(
                ErrorCode::FILE_WRITE_FAIL,
                format!(
                    "a {}-byte value exceeds the disk tier's capacity",
                    order.size
                ),
            ));
        }
        let victims = tier.index.lock().expect("index lock").choose_victims(
            order.size,
            capacity,
            tier.config.eviction,
            &order.key,
        );
        if !victims.is_empty() {
            let report = DiskReport {
                evicted: victims
                    .iter()
                    .map(|(k, e)| (k.clone(), WriteId(e.version)))
                    .collect(),
                ..DiskReport::default()
            };
            if let Err(e) = call_sync(control, client, segment, report).await {
                // The master may still point at them: keep them.
                let mut index = tier.index.lock().expect("index lock");
                for (key, entry) in victims {
                    index.bytes += entry.size;
                    index.entries.insert(key, entry);
                }
                return Err(Error::new(
                    e.code,
                    format!("could not tell the master about disk eviction: {e}"),
                ));
            }
            debug!(count = victims.len(), "disk eviction");
            for (key, entry) in victims {
                if let Err(e) = tier.delete(&key, entry.version, entry.readers).await {
                    warn!(%key, "evicted copy not deleted (its space is lost until restart): {e}");
                }
            }
        }
    }
    tier.store
        .put(&order.key, order.write.0, bytes)
        .await
        .map_err(|e| io_error(ErrorCode::FILE_WRITE_FAIL, "disk write failed", e))?;
    tier.index
        .lock()
        .expect("index lock")
        .insert(order.key.clone(), order.write.0, order.size);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_follow_the_policy_and_spare_the_incoming_key() {
        let mut index = Index::default();
        for (i, key) in ["a", "b", "c", "d"].iter().enumerate() {
            index.insert(key.to_string(), i as u64, 100);
        }
        index.entries.get_mut("a").unwrap().read = 10;
        let fifo = index
            .clone()
            .choose_victims(150, 400, DiskEviction::Fifo, "b");
        let names: Vec<&str> = fifo.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["a", "c"], "oldest first, never the incoming key");
        let lru = index.choose_victims(100, 400, DiskEviction::Lru, "zzz");
        let names: Vec<&str> = lru.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["b"], "never-read copies go before read ones");
        assert_eq!(index.bytes, 300);
    }
}
