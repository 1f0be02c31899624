//! The bucket backend, the default layout (docs/ssd-tier.md): each put writes one bucket
//! holding a group of values, as two files:
//!
//! - `buckets/{id:016x}.bucket`: the values' [`record`]s, each at an aligned offset (zeros in
//!   between), so one aligned read loads one record;
//! - `buckets/{id:016x}.meta`: a checksummed list of the records (key, version, offset, value
//!   length).
//!
//! The data file is synced first; the meta is written under a temporary name, synced and
//! renamed into place. That rename commits the bucket, so a crash leaves all of it or none.
//! Removing values rewrites their bucket's meta the same way; a bucket left empty loses its
//! meta first, then its data file. Replacing a key commits the new bucket before the old entry
//! is removed, so a crash in between leaves both, and recovery keeps the higher version.
//!
//! Records sit at offsets aligned to [`layout_alignment`] (the disk's alignment, at least
//! 4 KiB), so buckets written through the page cache stay readable with `O_DIRECT`.
//!
//! Written against the [`Disk`] trait, so the simulated disk drives the same code.
//!
//! This file holds the [`Bucket`] type, its in-memory index, the file names and the read path,
//! and wires them into [`Backend`]; the rest is split by concern:
//!
//! - `meta`: the meta file format and its checksum;
//! - `write`: the group writer, and removal by meta rewrite;
//! - `recover`: recovery.

mod meta;
mod recover;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{Backend, Held, Recovered, check_record, read_len};
use crate::record::{self, RecordBuf};
use mooring_core::Checksum;
use mooring_proto::disk::{Disk, IoBuf, IoResult};
use mooring_proto::transport::BoxFuture;

/// Default most bytes of values the caller groups into one bucket (spec: 256 MB).
pub const BUCKET_BYTES: u64 = 256 << 20;
/// Default most values the caller groups into one bucket (spec: 500).
pub const BUCKET_KEYS: usize = 500;

/// Where buckets live.
const DIR: &str = "buckets";
const DATA_EXT: &str = ".bucket";
const META_EXT: &str = ".meta";
/// Suffix of a meta being written; removed by recovery.
const TMP_EXT: &str = ".meta.tmp";

/// Smallest alignment of records in the bucket and offset-file layouts.
const MIN_LAYOUT_ALIGNMENT: usize = 4096;

/// Alignment of record offsets on `disk`: its own, but at least 4 KiB, so a layout written
/// through the page cache (alignment 1) can be read back with `O_DIRECT`.
pub(crate) fn layout_alignment(disk: &dyn Disk) -> usize {
    disk.alignment().max(MIN_LAYOUT_ALIGNMENT)
}

/// `len` rounded up to `align`, or `None` on overflow.
pub(crate) fn align_up(len: u64, align: usize) -> Option<u64> {
    let align = align.max(1) as u64;
    Some(len.checked_add(align - 1)? / align * align)
}

/// Refuses keys a record cannot carry and keys repeated within one put (the trait asks for
/// distinct keys; a repeat would leave two records of a key in one unit).
pub(crate) fn check_items(items: &[RecordBuf]) -> io::Result<()> {
    let mut seen = HashSet::with_capacity(items.len());
    for item in items {
        if item.key().len() > record::MAX_KEY_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "key of {} bytes; at most {}",
                    item.key().len(),
                    record::MAX_KEY_LEN
                ),
            ));
        }
        if !seen.insert(item.key()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("key {:?} twice in one put", item.key()),
            ));
        }
    }
    Ok(())
}

/// Removes `name`; absent is fine.
async fn remove_if_present(disk: &dyn Disk, name: &str) -> io::Result<()> {
    match disk.remove(name).await {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Where one value of a bucket lies.
#[derive(Clone, Copy, Debug)]
struct Entry {
    bucket: u64,
    version: u64,
    offset: u64,
    value_len: u64,
    checksum: Checksum,
}

impl Entry {
    /// The index entry of a meta entry of bucket `bucket`.
    fn of(bucket: u64, e: &meta::MetaEntry) -> Entry {
        Entry {
            bucket,
            version: e.version,
            offset: e.offset,
            value_len: e.value_len,
            checksum: e.checksum,
        }
    }
}

/// What the backend holds, in memory.
#[derive(Default)]
struct Index {
    keys: HashMap<String, Entry>,
    /// Every committed bucket's keys still live in it.
    buckets: BTreeMap<u64, BTreeSet<String>>,
}

/// Values grouped into buckets of two files each on a [`Disk`].
pub struct Bucket {
    disk: Arc<dyn Disk>,
    /// Alignment of record offsets.
    align: usize,
    next_id: AtomicU64,
    /// Set by recovery: only then are bucket ids known not to clash with files on disk.
    recovered: AtomicBool,
    /// Never held across an await.
    index: Mutex<Index>,
    /// Serialises meta rewrites of committed buckets, so each lands in the order its
    /// snapshot of the index was taken (a stale one renamed last would bring values back).
    meta_writes: tokio::sync::Mutex<()>,
}

impl Bucket {
    /// The backend on `disk`. [`Backend::recover`] must run before the first put: it learns
    /// which bucket ids are taken.
    pub fn new(disk: Arc<dyn Disk>) -> Bucket {
        let align = layout_alignment(disk.as_ref());
        Bucket {
            disk,
            align,
            next_id: AtomicU64::new(1),
            recovered: AtomicBool::new(false),
            index: Mutex::new(Index::default()),
            meta_writes: tokio::sync::Mutex::new(()),
        }
    }

    /// The data file of bucket `id`.
    pub fn data_name(id: u64) -> String {
        format!("{DIR}/{id:016x}{DATA_EXT}")
    }

    /// The meta file of bucket `id`.
    pub fn meta_name(id: u64) -> String {
        format!("{DIR}/{id:016x}{META_EXT}")
    }

    fn tmp_name(id: u64) -> String {
        format!("{DIR}/{id:016x}{TMP_EXT}")
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        // Every update of the index is completed before the lock is released, so a panic
        // elsewhere cannot leave it half-changed.
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Backend::read`].
    async fn read_record(
        &self,
        key: &str,
        version: u64,
        mut buf: IoBuf,
    ) -> IoResult<IoBuf, Range<usize>> {
        let entry = self.lock().keys.get(key).copied();
        let Some(entry) = entry.filter(|e| e.version == version) else {
            let e = io::Error::new(
                io::ErrorKind::NotFound,
                format!("write {version} of {key:?} is not on disk"),
            );
            return (buf, Err(e));
        };
        let len = read_len(key, entry.value_len, self.disk.alignment());
        if buf.capacity() < len {
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "read buffer of {} bytes; the record needs {len}",
                    buf.capacity()
                ),
            );
            return (buf, Err(e));
        }
        buf.set_len(len);
        let name = Self::data_name(entry.bucket);
        // The bucket may be deleted meanwhile (NotFound); ids are never reused, and the
        // record's checksum, key and version are checked, so wrong bytes are never returned.
        let (buf, read) = self.disk.read_at(&name, entry.offset, buf).await;
        let checked =
            read.and_then(|n| check_record(&buf[..n.min(buf.len())], key, version, &name));
        (buf, checked)
    }
}

impl Backend for Bucket {
    fn name(&self) -> &'static str {
        "bucket"
    }

    fn alignment(&self) -> usize {
        self.disk.alignment()
    }

    fn groups_writes(&self) -> bool {
        true
    }

    fn record_alignment(&self) -> usize {
        self.align
    }

    fn put(&self, records: Vec<RecordBuf>) -> BoxFuture<'_, io::Result<Vec<Held>>> {
        Box::pin(self.put_group(records))
    }

    fn read<'a>(
        &'a self,
        key: &'a str,
        version: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, Range<usize>>> {
        Box::pin(self.read_record(key, version, buf))
    }

    fn remove<'a>(&'a self, writes: &'a [(String, u64)]) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(self.remove_writes(writes))
    }

    fn recover(&self) -> BoxFuture<'_, io::Result<Recovered>> {
        Box::pin(self.recover_all())
    }
}
