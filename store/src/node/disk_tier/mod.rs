//! A node's disk tier (docs/ssd-tier.md): the node's half of offloading, disk reads and disk
//! eviction.
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
//! room fail: the master never points at a deleted file. Those decisions are the core's
//! [`DiskCopies`] and [`StagingSlots`]; this module drives them with what happened.
//!
//! Files: this one (settings, opening, deletion), `stage` (readers' loads), `sync` (the
//! disk sync: offload, tombstones, disk eviction).
//!
//! **Reads** come through the data server ([`Stager`]): the value is loaded into a slot of the
//! staging buffer (exported like a segment), the reader pulls it with a one-sided read and
//! unstages it; a slot nobody unstages is reclaimed after `slot_ttl`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mooring_core::disk_copies::{DiskCopies, DiskEvictionOrder};
use mooring_core::staging::StagingSlots;
use mooring_core::{ClientId, Error, ErrorCode, Millis, Result};
use mooring_disk::{BUCKET_BYTES, BUCKET_KEYS, Backend, Bucket, FilePerKey, OffsetFile};
use mooring_proto::disk::Disk;
use mooring_proto::transport::{ControlPlane, DataServer, SegmentMemory};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::node::Node;
use crate::node::memory::segment_memory;

mod stage;
mod sync;
mod watch;

pub use watch::{RecoveryStage, RecoveryWatch};

/// Which copies disk eviction takes first (the core's [`DiskEvictionOrder`], as a flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskEviction {
    /// The oldest written.
    Fifo,
    /// The least recently read (never-read copies first, oldest written among them).
    Lru,
}

impl From<DiskEviction> for DiskEvictionOrder {
    fn from(e: DiskEviction) -> DiskEvictionOrder {
        match e {
            DiskEviction::Fifo => DiskEvictionOrder::Fifo,
            DiskEviction::Lru => DiskEvictionOrder::Lru,
        }
    }
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

/// How copies are laid out on disk (the backends of docs/ssd-tier.md).
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
    /// Told before and after each recovery scan (simulations check what it reported).
    pub watch: Option<RecoveryWatch>,
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
            watch: None,
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
    store: Arc<dyn Backend>,
    /// What the disk holds and what is leaving it (the core's policy).
    copies: Mutex<DiskCopies>,
    staging: Staging,
    clock: Clock,
}

/// The staging buffer: slots handed to readers.
struct Staging {
    memory: SegmentMemory,
    /// The buffer's access key on the data plane.
    key: u64,
    /// Its RDMA remote key, when the node serves RDMA.
    rdma_key: Option<u32>,
    /// Shared with the buffers of loads in progress, which give their slot back when the disk
    /// drops them.
    slots: Arc<Mutex<StagingSlots>>,
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
pub(crate) fn open_disk(config: &DiskTierConfig, staging: &SegmentMemory) -> Result<Arc<dyn Disk>> {
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
        // The disk keeps the staging memory mapped while its ring may read into it; each
        // read into a slot owns the slot until the kernel is done with it (see `stage`).
        match mooring_disk::UringDisk::open_with_buffer(&config.dir, mode, Some(staging.clone())) {
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

/// A disk tier opened and recovered, not yet serving: [`DiskTier::open`] runs before the
/// node mounts, so a disk that cannot be read fails the start before anything is mounted.
pub struct OpenedDisk {
    config: DiskTierConfig,
    memory: SegmentMemory,
    store: Arc<dyn Backend>,
    copies: DiskCopies,
}

impl DiskTier {
    /// Opens the tier on `config.dir` and recovers what is there; its staging buffer is in
    /// shared memory when `shared` (the node serves shm).
    pub async fn open(config: DiskTierConfig, shared: bool) -> Result<OpenedDisk> {
        let memory = segment_memory(config.staging as usize, true, shared)?;
        let store = open_backend(open_disk(&config, &memory)?, &config)?;
        if let Some(watch) = &config.watch {
            (watch.0)(RecoveryStage::Scanning);
        }
        let recovered = store
            .recover()
            .await
            .map_err(|e| io_error(ErrorCode::FILE_READ_FAIL, "disk recovery scan failed", e))?;
        if let Some(watch) = &config.watch {
            (watch.0)(RecoveryStage::Recovered(&recovered));
        }
        watch::hit_paths(config.backend, &recovered);
        let mut copies = DiskCopies::new();
        for held in recovered.objects {
            copies.insert(held.key, held.version, held.len, held.checksum, held.unit);
        }
        let (objects, bytes) = copies.usage();
        info!(
            dir = %config.dir.display(),
            backend = store.name(),
            objects,
            bytes,
            dropped = recovered.dropped.len(),
            "disk tier recovered"
        );
        Ok(OpenedDisk {
            config,
            memory,
            store,
            copies,
        })
    }

    /// Serves the opened tier: registers the staging buffer with `server` and starts syncing
    /// `node`'s disk with the master.
    pub async fn start(
        opened: OpenedDisk,
        node: Node,
        client: ClientId,
        control: Arc<dyn ControlPlane>,
        server: Arc<dyn DataServer>,
    ) -> Result<DiskTier> {
        let OpenedDisk {
            config,
            memory,
            store,
            copies,
        } = opened;
        let staging_addr = server.export(memory.clone())?;
        let inner = Arc::new(TierInner {
            staging: Staging {
                key: staging_addr.key,
                rdma_key: staging_addr.rdma_key,
                slots: Arc::new(Mutex::new(StagingSlots::new(
                    memory.len() as u64,
                    Millis(config.slot_ttl.as_millis() as u64),
                ))),
                memory,
            },
            store,
            copies: Mutex::new(copies),
            config,
            clock: Clock::new(),
        });
        server.serve_disk(inner.clone())?;
        let task = tokio::spawn(sync::sync_loop(inner.clone(), node, client, control));
        Ok(DiskTier {
            inner,
            task: Mutex::new(Some(task)),
        })
    }

    /// Copies on disk and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        self.inner.copies().usage()
    }

    /// A reader of [`DiskTier::usage`] that outlives a borrow of the tier (for metrics).
    pub fn usage_reader(&self) -> impl Fn() -> (usize, u64) + Send + Sync + 'static {
        let inner = self.inner.clone();
        move || inner.copies().usage()
    }
}

impl TierInner {
    fn copies(&self) -> MutexGuard<'_, DiskCopies> {
        self.copies.lock().expect("disk copies lock")
    }

    /// Deletes copies that have left the index, once their reads in progress are done.
    async fn delete(&self, writes: &[(String, u64)]) -> Result<()> {
        for (key, version) in writes {
            self.wait_for_readers(key, *version).await;
        }
        self.store
            .remove(writes)
            .await
            .map_err(|e| io_error(ErrorCode::FILE_WRITE_FAIL, "disk delete failed", e))
    }

    /// Deletes copies that have left the index and records the outcome: a failed deletion is
    /// retried at every sync (the master has forgotten the copies, so they must not outlive
    /// this run: a restart would report them again).
    async fn delete_for_good(&self, writes: Vec<(String, u64)>) {
        let outcome = self.delete(&writes).await;
        if let Err(e) = &outcome {
            warn!(
                count = writes.len(),
                "copies not deleted yet, will retry: {e}"
            );
        }
        self.copies().deletion_finished(&writes, outcome.is_ok());
    }

    /// Retries the deletions that failed.
    async fn retry_doomed(&self) {
        let doomed = self.copies().take_doomed();
        if !doomed.is_empty() {
            self.delete_for_good(doomed).await;
        }
    }

    /// Phase two's wait: until no read of the copy is in progress (at most 10 s; see
    /// docs/ssd-tier.md).
    async fn wait_for_readers(&self, key: &str, version: u64) {
        let give_up = Instant::now() + Duration::from_secs(10);
        while self.copies().readers_left(key, version) > 0 {
            if Instant::now() >= give_up {
                warn!(%key, "deleting a disk copy with reads still in progress after 10 s");
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
