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
use mooring_core::{
    ClientId, DiskReport, DiskSyncAck, Error, ErrorCode, OffloadOrder, Result, SegmentId, WriteId,
};
use mooring_disk::backend::read_len;
use mooring_disk::{
    BUCKET_BYTES, BUCKET_KEYS, Backend, Bucket, FilePerKey, Held, Item, OffsetFile,
};
use mooring_proto::disk::Disk;
use mooring_proto::transport::{BoxFuture, ControlPlane, DataServer, SegmentMemory, Stager};
use mooring_proto::wire::{DiskSync, StagedSlot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::memory::MappedMemory;
use crate::node::Node;

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

/// How copies are laid out on disk (spec 001's backends).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskBackend {
    /// Values grouped into buckets (up to 256 MiB or 500 values): a data file and a
    /// checksummed meta file each; evicted a bucket at a time.
    Bucket,
    /// One record file per key under two levels of hashed directories.
    FilePerKey,
    /// One preallocated file whose space an offset allocator manages; needs a capacity.
    OffsetFile,
}

/// A disk handed to the tier instead of one opened on its directory: the simulated disk,
/// in simulations.
#[derive(Clone)]
pub struct DiskDevice(pub Arc<dyn Disk>);

impl std::fmt::Debug for DiskDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DiskDevice")
    }
}

/// A node's disk tier settings.
#[derive(Clone, Debug)]
pub struct DiskTierConfig {
    /// Where the copies live (created if missing; an existing one is recovered).
    pub dir: PathBuf,
    /// Run on this disk instead of opening `dir`.
    pub device: Option<DiskDevice>,
    /// The on-disk layout.
    pub backend: DiskBackend,
    /// Most bytes of values written as one group (a bucket).
    pub group_bytes: u64,
    /// Most values written as one group (a bucket).
    pub group_keys: usize,
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
            device: None,
            backend: DiskBackend::Bucket,
            group_bytes: BUCKET_BYTES,
            group_keys: BUCKET_KEYS,
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
    /// The eviction unit (a bucket): evicted whole.
    unit: u64,
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
    fn insert(&mut self, held: Held) {
        self.tick += 1;
        let Held {
            key,
            version,
            len: size,
            unit,
        } = held;
        let entry = Entry {
            version,
            size,
            unit,
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

    /// Phase one of disk eviction: takes whole units (buckets) out until `need` more bytes
    /// fit under `capacity`. No I/O.
    fn choose_victims(
        &mut self,
        need: u64,
        capacity: u64,
        policy: DiskEviction,
    ) -> Vec<(String, Entry)> {
        if self.bytes + need <= capacity {
            return Vec::new();
        }
        // Per unit: (first written, last read, its keys).
        let mut units: BTreeMap<u64, (u64, u64, Vec<String>)> = BTreeMap::new();
        for (key, e) in &self.entries {
            let unit = units.entry(e.unit).or_insert((u64::MAX, 0, Vec::new()));
            unit.0 = unit.0.min(e.written);
            unit.1 = unit.1.max(e.read);
            unit.2.push(key.clone());
        }
        let mut order: Vec<(u64, u64, Vec<String>)> = units.into_values().collect();
        order.sort_by_key(|(written, read, _)| match policy {
            DiskEviction::Fifo => (*written, 0),
            DiskEviction::Lru => (*read, *written),
        });
        let mut victims = Vec::new();
        for (_, _, keys) in order {
            if self.bytes + need <= capacity {
                break;
            }
            for key in keys {
                let entry = self.remove(&key).expect("listed from the index");
                victims.push((key, entry));
            }
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
    /// Slot id → (allocator node, reclaimed at; `None` while it is being loaded).
    live: BTreeMap<u64, (u32, Option<Instant>)>,
    next: u64,
}

impl Slots {
    fn reclaim_expired(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, (_, at))| at.is_some_and(|at| at <= now))
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
    /// Declared before `staging`, so it goes first: an io_uring disk has the staging buffer
    /// registered.
    store: Arc<dyn Backend>,
    index: Mutex<Index>,
    /// Evicted copies whose deletion failed, retried every sync.
    doomed: Mutex<Vec<(String, u64)>>,
    /// Copies found damaged, to report to the master as evicted.
    damaged: Mutex<Vec<(String, u64)>>,
    staging: Staging,
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().expect("task lock").take() {
            task.abort();
        }
    }
}

/// Under the simulator there are no real disks: simulations hand the tier the simulated one
/// ([`DiskTierConfig::device`]).
#[cfg(madsim)]
fn open_real_disk(config: &DiskTierConfig, _staging: &SegmentMemory) -> Result<Arc<dyn Disk>> {
    Err(Error::new(
        ErrorCode::FILE_OPEN_FAIL,
        format!(
            "cannot open {} under the simulator; start the tier on a simulated disk",
            config.dir.display()
        ),
    ))
}

/// The disk the config asks for; an io_uring disk registers the staging buffer.
fn open_disk(config: &DiskTierConfig, staging: &SegmentMemory) -> Result<Arc<dyn Disk>> {
    match &config.device {
        Some(device) => Ok(device.0.clone()),
        None => open_real_disk(config, staging),
    }
}

/// Opens the directory the config names.
#[cfg(not(madsim))]
fn open_real_disk(config: &DiskTierConfig, staging: &SegmentMemory) -> Result<Arc<dyn Disk>> {
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
        let buffer = staging
            .range(staging.base(), staging.len() as u64)
            .map(|ptr| (ptr, staging.len()));
        // SAFETY: the staging memory outlives the disk (the tier holds both, and the data
        // server's export keeps the memory mapped), and a slot whose load was abandoned is
        // never handed out again (reclaim and unstage skip slots still loading).
        match unsafe { mooring_disk::UringDisk::open_with_buffer(&config.dir, mode, buffer) } {
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

/// The backend the config asks for, on `disk`.
fn open_backend(disk: Arc<dyn Disk>, config: &DiskTierConfig) -> Result<Arc<dyn Backend>> {
    match config.backend {
        DiskBackend::Bucket => Ok(Arc::new(Bucket::new(disk))),
        DiskBackend::FilePerKey => Ok(Arc::new(FilePerKey::new(disk))),
        DiskBackend::OffsetFile => {
            if config.capacity == 0 {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "the offset-file disk backend preallocates its file: give the tier a capacity (--disk-capacity)",
                ));
            }
            // Room for the values plus their record headers and alignment padding.
            let file = config.capacity + config.capacity / 8 + (1 << 20);
            OffsetFile::open(disk, file)
                .map(|f| Arc::new(f) as Arc<dyn Backend>)
                .map_err(|e| io_error(ErrorCode::FILE_OPEN_FAIL, "cannot open the offset file", e))
        }
    }
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
        let memory = MappedMemory::new(config.staging as usize, true)?.into_segment();
        let store = open_backend(open_disk(&config, &memory)?, &config)?;
        let recovered = store
            .recover()
            .await
            .map_err(|e| io_error(ErrorCode::FILE_READ_FAIL, "disk recovery scan failed", e))?;
        let mut index = Index::default();
        for held in recovered.objects {
            index.insert(held);
        }
        info!(
            dir = %config.dir.display(),
            backend = store.name(),
            objects = index.entries.len(),
            bytes = index.bytes,
            dropped = recovered.dropped.len(),
            "disk tier recovered"
        );
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
            doomed: Mutex::default(),
            damaged: Mutex::default(),
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
    fn stage(&self, object: String, write: u64, size: u64) -> BoxFuture<'_, Result<StagedSlot>> {
        Box::pin(async move {
            let (version, readers) = {
                let mut index = self.index.lock().expect("index lock");
                index.tick += 1;
                let tick = index.tick;
                let entry = index
                    .entries
                    .get_mut(&object)
                    .filter(|e| e.size == size && e.version == write)
                    .ok_or_else(|| {
                        Error::new(
                            ErrorCode::OBJECT_NOT_FOUND,
                            format!("this node has no disk copy of write {write} of {object:?} (evicted or replaced)"),
                        )
                    })?;
                entry.read = tick;
                (entry.version, entry.readers.clone())
            };
            let len = read_len(&object, size, self.store.alignment());
            let (slot, node, addr) = self.allocate_slot(len)?;
            let loaded = self.load_into(&object, version, addr, len).await;
            drop(readers);
            let value = match loaded {
                Ok(value) if value.len() as u64 == size => value,
                Ok(_) => {
                    self.unstage_slot(slot, node);
                    return Err(Error::new(
                        ErrorCode::OBJECT_NOT_FOUND,
                        format!("the disk copy of {object:?} is of another value"),
                    ));
                }
                Err(e) => {
                    self.unstage_slot(slot, node);
                    return Err(e);
                }
            };
            self.loaded(slot);
            Ok(StagedSlot {
                key: self.staging.key,
                addr: addr + value.start as u64,
                len: size,
                slot,
                ttl_ms: self.config.slot_ttl.as_millis() as u64,
            })
        })
    }

    fn unstage(&self, slot: u64) {
        let mut slots = self.staging.slots.lock().expect("slots lock");
        // A slot still loading is not the reader's yet (it does not know its id).
        if let Some(&(node, Some(_))) = slots.live.get(&slot) {
            slots.live.remove(&slot);
            slots.allocator.free(node);
        }
    }
}

impl TierInner {
    /// A staging slot of `len` bytes, aligned for the disk: (slot id, allocator node,
    /// address). Its TTL starts when it is loaded.
    fn allocate_slot(&self, len: usize) -> Result<(u64, u32, u64)> {
        let align = self.store.alignment().max(1) as u64;
        let size = len as u64 + align - 1;
        let mut slots = self.staging.slots.lock().expect("slots lock");
        let allocation = slots.allocator.allocate(size).or_else(|| {
            slots.reclaim_expired(Instant::now());
            slots.allocator.allocate(size)
        });
        let allocation = allocation.ok_or_else(|| {
            Error::new(
                ErrorCode::BUFFER_OVERFLOW,
                format!(
                    "the node's {}-byte staging buffer has no room for {len} bytes; retry shortly or give the node a larger staging buffer",
                    self.staging.memory.len()
                ),
            )
        })?;
        let slot = slots.next;
        slots.next += 1;
        slots.live.insert(slot, (allocation.node, None));
        let start = self.staging.memory.base() + allocation.offset;
        Ok((slot, allocation.node, start.div_ceil(align) * align))
    }

    /// Starts a loaded slot's TTL.
    fn loaded(&self, slot: u64) {
        let mut slots = self.staging.slots.lock().expect("slots lock");
        if let Some((_, at)) = slots.live.get_mut(&slot) {
            *at = Some(Instant::now() + self.config.slot_ttl);
        }
    }

    fn unstage_slot(&self, slot: u64, node: u32) {
        let mut slots = self.staging.slots.lock().expect("slots lock");
        if slots.live.remove(&slot).is_some() {
            slots.allocator.free(node);
        }
    }

    /// Reads the record of `object`'s write `version` straight into the staging buffer at
    /// `addr` (`len` bytes) and returns where its value lies, relative to `addr`.
    async fn load_into(
        &self,
        object: &str,
        version: u64,
        addr: u64,
        len: usize,
    ) -> Result<std::ops::Range<usize>> {
        let start = self.staging.memory.range(addr, len as u64).ok_or_else(|| {
            Error::new(ErrorCode::INTERNAL_ERROR, "staging slot outside the buffer")
        })?;
        // SAFETY: the slot is this stage's alone until it is loaded (reclaim and unstage skip
        // slots still loading), and the staging memory lives as long as `self`.
        let buf = unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), len) };
        let read = self.store.read(object, version, buf).await;
        read.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                format!("the disk copy of {object:?} is gone: {e}"),
            ),
            std::io::ErrorKind::InvalidData => {
                self.forget_damaged(object, version);
                io_error(ErrorCode::FILE_READ_FAIL, "disk copy damaged", e)
            }
            _ => io_error(ErrorCode::FILE_READ_FAIL, "disk read failed", e),
        })
    }

    /// A copy found damaged is never served again: it leaves the index, the master hears
    /// of it as evicted at the next sync, and it is deleted.
    fn forget_damaged(&self, key: &str, version: u64) {
        let held = {
            let mut index = self.index.lock().expect("index lock");
            match index.entries.get(key) {
                Some(e) if e.version == version => index.remove(key).is_some(),
                _ => false,
            }
        };
        if held {
            warn!(%key, version, "disk copy damaged; dropping it");
            self.damaged
                .lock()
                .expect("damaged lock")
                .push((key.to_string(), version));
            self.doomed
                .lock()
                .expect("doomed lock")
                .push((key.to_string(), version));
        }
    }

    /// Deletes copies taken out of the index, once their reads are done.
    async fn delete(&self, copies: &[(String, Entry)]) -> Result<()> {
        for (key, entry) in copies {
            wait_for_readers(key, &entry.readers).await;
        }
        let writes: Vec<(String, u64)> = copies
            .iter()
            .map(|(key, entry)| (key.clone(), entry.version))
            .collect();
        self.remove_writes(&writes).await
    }

    async fn remove_writes(&self, writes: &[(String, u64)]) -> Result<()> {
        self.store
            .remove(writes)
            .await
            .map_err(|e| io_error(ErrorCode::FILE_WRITE_FAIL, "disk delete failed", e))
    }

    /// Retries deleting evicted copies whose deletion failed: the master has forgotten them,
    /// so they must not outlive this run (a restart would report them again).
    async fn retry_doomed(&self) {
        let doomed = std::mem::take(&mut *self.doomed.lock().expect("doomed lock"));
        if doomed.is_empty() {
            return;
        }
        if let Err(e) = self.remove_writes(&doomed).await {
            warn!(
                count = doomed.len(),
                "evicted copies still not deleted, will retry: {e}"
            );
            self.doomed.lock().expect("doomed lock").extend(doomed);
        }
    }
}

/// Phase two's wait: until no read of the copy is in progress (at most 10 s, as in spec 001).
async fn wait_for_readers(key: &str, readers: &Arc<()>) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(readers) > 1 {
        if Instant::now() >= give_up {
            warn!(%key, "deleting a disk copy with reads still in progress after 10 s");
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Offloaded values copied out of the segment, waiting to be written as one group.
#[derive(Default)]
struct Group {
    copies: Vec<(OffloadOrder, Vec<u8>)>,
    bytes: u64,
}

/// Syncs with the master until aborted.
async fn sync_loop(
    tier: Arc<TierInner>,
    node: Node,
    client: ClientId,
    control: Arc<dyn ControlPlane>,
) {
    let mut pending = DiskReport::default();
    let mut group = Group::default();
    let mut synced_mount: Option<SegmentId> = None;
    loop {
        let Some(segment) = node.segment() else {
            tokio::time::sleep(tier.config.sync_interval).await;
            continue;
        };
        if synced_mount != Some(segment) {
            // A new mount: the master knows none of our copies, and orders taken under the
            // old one are void.
            if !group.copies.is_empty() {
                warn!(
                    count = group.copies.len(),
                    "dropping offload copies taken before a remount"
                );
                group = Group::default();
            }
            let index = tier.index.lock().expect("index lock");
            pending.recovered = index
                .entries
                .iter()
                .map(|(k, e)| (k.clone(), WriteId(e.version), e.size))
                .collect();
        }
        tier.retry_doomed().await;
        pending.evicted.extend(
            std::mem::take(&mut *tier.damaged.lock().expect("damaged lock"))
                .into_iter()
                .map(|(key, version)| (key, WriteId(version))),
        );
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
        carry_out_tombstones(&tier, ack.delete, &mut pending).await;
        let lease = Duration::from_millis(ack.lease_ttl.as_millis());
        let copies = copy_orders(&node, ack.offload, sent, lease, &mut pending);
        let target = Sink {
            tier: &tier,
            client,
            control: &control,
            segment,
            memory: node.memory().len() as u64,
        };
        for (order, bytes) in copies {
            if group.copies.len() >= tier.config.group_keys.max(1)
                || group.bytes + order.size > target.group_limit()
            {
                target
                    .write_group(std::mem::take(&mut group), &mut pending)
                    .await;
            }
            // A group holds distinct keys: a newer order of a key supersedes the older one.
            if let Some(pos) = group.copies.iter().position(|(o, _)| o.key == order.key) {
                let (older, _) = group.copies.swap_remove(pos);
                group.bytes -= older.size;
                pending.failed.push((older.key, older.write));
            }
            group.bytes += order.size;
            group.copies.push((order, bytes));
        }
        // Leftovers wait for the next sync while orders keep coming (grouping backends).
        if (!busy || !tier.store.groups_writes()) && !group.copies.is_empty() {
            target
                .write_group(std::mem::take(&mut group), &mut pending)
                .await;
        }
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
    control
        .call(DiskSync {
            client,
            segment,
            report,
        })
        .await
}

/// Carries out tombstones: a key is deleted only if it holds that write.
async fn carry_out_tombstones(
    tier: &Arc<TierInner>,
    tombstones: Vec<(String, WriteId)>,
    pending: &mut DiskReport,
) {
    let held: Vec<(String, Entry)> = {
        let mut index = tier.index.lock().expect("index lock");
        tombstones
            .iter()
            .filter_map(|(key, write)| match index.entries.get(key) {
                Some(e) if e.version == write.0 => index.remove(key).map(|e| (key.clone(), e)),
                _ => None,
            })
            .collect()
    };
    match tier.delete(&held).await {
        Ok(()) => pending.deleted.extend(tombstones),
        Err(e) => {
            // Back into the index, so the master's next resend finds them.
            warn!("tombstones not carried out, will retry: {e}");
            let mut index = tier.index.lock().expect("index lock");
            for (key, entry) in held {
                index.bytes += entry.size;
                index.entries.insert(key, entry);
            }
        }
    }
}

/// Copies every order's bytes out of the segment while their lease holds; orders that
/// cannot be copied in time are reported failed.
fn copy_orders(
    node: &Node,
    orders: Vec<OffloadOrder>,
    sent: Instant,
    lease: Duration,
    pending: &mut DiskReport,
) -> Vec<(OffloadOrder, Vec<u8>)> {
    let copies: Vec<(OffloadOrder, Option<Vec<u8>>)> = orders
        .into_iter()
        .map(|order| {
            let mut bytes = vec![0u8; order.size as usize];
            let copied = node.memory().copy_out(order.addr, &mut bytes);
            (order, copied.then_some(bytes))
        })
        .collect();
    let in_time = sent.elapsed() < lease;
    copies
        .into_iter()
        .filter_map(|(order, bytes)| match bytes.filter(|_| in_time) {
            Some(bytes) => Some((order, bytes)),
            None => {
                warn!(key = %order.key, "offload order not copied within its lease");
                pending.failed.push((order.key, order.write));
                None
            }
        })
        .collect()
}

/// Where groups of copies go: the backend, after disk eviction made room.
struct Sink<'a> {
    tier: &'a Arc<TierInner>,
    client: ClientId,
    control: &'a Arc<dyn ControlPlane>,
    segment: SegmentId,
    /// Bytes of the node's segment.
    memory: u64,
}

impl Sink<'_> {
    /// Most bytes in one group: a group never needs more room than the disk has, and never
    /// keeps more than a quarter of the node's memory waiting for it (objects being offloaded
    /// cannot be evicted).
    fn group_limit(&self) -> u64 {
        let memory = (self.memory / 4).max(1);
        match self.tier.config.capacity {
            0 => self.tier.config.group_bytes.min(memory),
            capacity => self.tier.config.group_bytes.min(capacity).min(memory),
        }
    }

    /// Makes room for `group` (disk eviction), writes it, and reports the outcome.
    async fn write_group(&self, group: Group, pending: &mut DiskReport) {
        let capacity = self.tier.config.capacity;
        let (items, too_large): (Vec<_>, Vec<_>) = group
            .copies
            .iter()
            .partition(|(order, _)| capacity == 0 || order.size <= capacity);
        for (order, _) in too_large {
            warn!(key = %order.key, size = order.size, capacity, "a value larger than the disk tier is not offloaded");
            pending.failed.push((order.key.clone(), order.write));
        }
        let failed = |pending: &mut DiskReport, e: &Error| {
            warn!(count = items.len(), "offload failed: {e}");
            pending
                .failed
                .extend(items.iter().map(|(o, _)| (o.key.clone(), o.write)));
        };
        let need = items.iter().map(|(order, _)| order.size).sum();
        if let Err(e) = self.make_room(need).await {
            return failed(pending, &e);
        }
        let batch: Vec<Item<'_>> = items
            .iter()
            .map(|(order, bytes)| Item {
                key: &order.key,
                version: order.write.0,
                value: bytes,
            })
            .collect();
        match self.tier.store.put(&batch).await {
            Ok(held) => {
                let mut index = self.tier.index.lock().expect("index lock");
                for copy in held {
                    pending
                        .offloaded
                        .push((copy.key.clone(), WriteId(copy.version)));
                    index.insert(copy);
                }
            }
            Err(e) => failed(
                pending,
                &io_error(ErrorCode::FILE_WRITE_FAIL, "disk write failed", e),
            ),
        }
    }

    /// Disk eviction: takes victims out of the index, tells the master, then deletes them.
    async fn make_room(&self, need: u64) -> Result<()> {
        let capacity = self.tier.config.capacity;
        if capacity == 0 {
            return Ok(());
        }
        let victims = self.tier.index.lock().expect("index lock").choose_victims(
            need,
            capacity,
            self.tier.config.eviction,
        );
        if victims.is_empty() {
            return Ok(());
        }
        let report = DiskReport {
            evicted: victims
                .iter()
                .map(|(k, e)| (k.clone(), WriteId(e.version)))
                .collect(),
            ..DiskReport::default()
        };
        if let Err(e) = call_sync(self.control, self.client, self.segment, report).await {
            // The master may still point at them: keep them.
            let mut index = self.tier.index.lock().expect("index lock");
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
        if let Err(e) = self.tier.delete(&victims).await {
            warn!("evicted copies not deleted yet, will retry: {e}");
            self.tier
                .doomed
                .lock()
                .expect("doomed lock")
                .extend(victims.into_iter().map(|(key, entry)| (key, entry.version)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_follow_the_policy_and_spare_the_incoming_key() {
        let mut index = Index::default();
        // Units: {a}, {b, c} (one bucket), {d}.
        for (i, (key, unit)) in [("a", 1), ("b", 2), ("c", 2), ("d", 3)].iter().enumerate() {
            index.insert(Held {
                key: key.to_string(),
                version: i as u64,
                len: 100,
                unit: *unit,
            });
        }
        index.entries.get_mut("a").unwrap().read = 10;
        let fifo = index.clone().choose_victims(150, 400, DiskEviction::Fifo);
        let names: Vec<&str> = fifo.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"], "oldest first, whole units");
        let lru = index.clone().choose_victims(100, 400, DiskEviction::Lru);
        let names: Vec<&str> = lru.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["b", "c"], "never-read units go before read ones");
        assert!(index.choose_victims(100, 500, DiskEviction::Lru).is_empty());
        assert_eq!(index.bytes, 400);
    }
}
