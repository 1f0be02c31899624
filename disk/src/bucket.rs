//! The bucket backend, spec 001's default: each put writes one bucket holding a group of
//! values, as two files:
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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mooring_proto::disk::Disk;
use mooring_proto::transport::BoxFuture;
use tracing::{debug, info, warn};

use crate::AlignedBuf;
use crate::backend::{Backend, Held, Item, Recovered, check_record, read_len};
use crate::record;

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
pub(crate) fn check_items(items: &[Item<'_>]) -> io::Result<()> {
    let mut seen = HashSet::with_capacity(items.len());
    for item in items {
        if item.key.len() > record::MAX_KEY_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "key of {} bytes; at most {}",
                    item.key.len(),
                    record::MAX_KEY_LEN
                ),
            ));
        }
        if !seen.insert(item.key) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("key {:?} twice in one put", item.key),
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
}

impl Entry {
    /// The index entry of a meta entry of bucket `bucket`.
    fn of(bucket: u64, e: &meta::MetaEntry) -> Entry {
        Entry {
            bucket,
            version: e.version,
            offset: e.offset,
            value_len: e.value_len,
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

    /// [`Backend::put`]: one bucket for all of `items`.
    async fn put_group(&self, items: &[Item<'_>]) -> io::Result<Vec<Held>> {
        if !self.recovered.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "bucket backend: recover() must run before the first put",
            ));
        }
        check_items(items)?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (data, entries) = self.lay_out(items)?;
        let meta = meta::encode(id, &entries, self.disk.alignment());
        if let Err(e) = self.write_bucket(id, &data, &meta).await {
            self.discard(id).await;
            return Err(e);
        }
        debug!(
            bucket = id,
            keys = items.len(),
            bytes = data.len(),
            "bucket written"
        );
        for old in self.publish(id, &entries) {
            // The new values are durable and served; the old entry stays on disk only until
            // this succeeds or, failing that, until recovery drops the lower version.
            if let Err(e) = self.rewrite_meta(old).await {
                warn!(
                    bucket = old,
                    "could not remove replaced values from their bucket: {e}"
                );
            }
        }
        Ok(entries
            .into_iter()
            .map(|e| Held {
                key: e.key,
                version: e.version,
                len: e.value_len,
                unit: id,
            })
            .collect())
    }

    /// The bucket's data file contents and its meta entries.
    fn lay_out(&self, items: &[Item<'_>]) -> io::Result<(AlignedBuf, Vec<meta::MetaEntry>)> {
        let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "bucket too large");
        let mut entries = Vec::with_capacity(items.len());
        let mut total = 0u64;
        for item in items {
            let len = (record::HEADER_LEN + item.key.len()) as u64 + item.value.len() as u64;
            entries.push(meta::MetaEntry {
                key: item.key.to_string(),
                version: item.version,
                offset: total,
                value_len: item.value.len() as u64,
            });
            total = align_up(len, self.align)
                .and_then(|len| total.checked_add(len))
                .ok_or_else(too_large)?;
        }
        let mut data =
            AlignedBuf::new(usize::try_from(total).map_err(|_| too_large())?, self.align);
        for (item, entry) in items.iter().zip(&entries) {
            let bytes = record::encode(item.key, item.version, item.value);
            let at = entry.offset as usize;
            data[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        Ok((data, entries))
    }

    /// Writes and syncs the data file, then commits the meta.
    async fn write_bucket(&self, id: u64, data: &[u8], meta: &[u8]) -> io::Result<()> {
        let name = Self::data_name(id);
        self.disk.create(&name).await?;
        self.disk.write_at(&name, 0, data).await?;
        self.disk.sync(&name).await?;
        self.write_meta(id, meta).await
    }

    /// Replaces bucket `id`'s meta atomically: temporary file, sync, rename.
    async fn write_meta(&self, id: u64, meta: &[u8]) -> io::Result<()> {
        let tmp = Self::tmp_name(id);
        let written = async {
            self.disk.create(&tmp).await?;
            self.disk.write_at(&tmp, 0, meta).await?;
            self.disk.sync(&tmp).await?;
            self.disk.rename(&tmp, &Self::meta_name(id)).await
        }
        .await;
        if written.is_err() {
            let _ = remove_if_present(self.disk.as_ref(), &tmp).await;
        }
        written
    }

    /// Removes what a failed put of bucket `id` left behind (best effort: recovery removes
    /// anything left without a meta).
    async fn discard(&self, id: u64) {
        for name in [Self::meta_name(id), Self::tmp_name(id), Self::data_name(id)] {
            if let Err(e) = remove_if_present(self.disk.as_ref(), &name).await {
                warn!(file = %name, "could not remove a failed bucket write: {e}");
            }
        }
    }

    /// Deletes both files of bucket `id`, meta first (a data file without a meta is an
    /// unfinished write to recovery, never served).
    async fn delete_bucket(&self, id: u64) -> io::Result<()> {
        remove_if_present(self.disk.as_ref(), &Self::meta_name(id)).await?;
        remove_if_present(self.disk.as_ref(), &Self::data_name(id)).await
    }

    /// Makes committed bucket `id`'s values the keys' current ones; returns the buckets that
    /// held earlier values of the keys, which lost them.
    fn publish(&self, id: u64, entries: &[meta::MetaEntry]) -> BTreeSet<u64> {
        let mut index = self.lock();
        let mut displaced = BTreeSet::new();
        for e in entries {
            let entry = Entry::of(id, e);
            if let Some(old) = index.keys.insert(e.key.clone(), entry)
                && let Some(live) = index.buckets.get_mut(&old.bucket)
            {
                live.remove(&e.key);
                displaced.insert(old.bucket);
            }
        }
        index
            .buckets
            .insert(id, entries.iter().map(|e| e.key.clone()).collect());
        displaced
    }

    /// Brings bucket `id`'s files in line with the index: its meta rewritten with the keys
    /// still live in it, or both files deleted if none is.
    async fn rewrite_meta(&self, id: u64) -> io::Result<()> {
        let _writing = self.meta_writes.lock().await;
        let mut entries = {
            let index = self.lock();
            let Some(live) = index.buckets.get(&id) else {
                return Ok(()); // already deleted
            };
            live.iter()
                .filter_map(|key| {
                    let e = index.keys.get(key).filter(|e| e.bucket == id)?;
                    Some(meta::MetaEntry {
                        key: key.clone(),
                        version: e.version,
                        offset: e.offset,
                        value_len: e.value_len,
                    })
                })
                .collect::<Vec<_>>()
        };
        if entries.is_empty() {
            self.delete_bucket(id).await?;
            // Committed buckets never gain keys, so it is still empty.
            self.lock().buckets.remove(&id);
            debug!(bucket = id, "bucket deleted: no value left");
            return Ok(());
        }
        entries.sort_by_key(|e| e.offset);
        self.write_meta(id, &meta::encode(id, &entries, self.disk.alignment()))
            .await
    }

    /// [`Backend::read`].
    async fn read_record(
        &self,
        key: &str,
        version: u64,
        buf: &mut [u8],
    ) -> io::Result<Range<usize>> {
        let entry = self.lock().keys.get(key).copied();
        let Some(entry) = entry.filter(|e| e.version == version) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("write {version} of {key:?} is not on disk"),
            ));
        };
        let len = read_len(key, entry.value_len, self.disk.alignment());
        if buf.len() < len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read buffer of {} bytes; the record needs {len}", buf.len()),
            ));
        }
        let name = Self::data_name(entry.bucket);
        // The bucket may be deleted meanwhile (NotFound); ids are never reused, and the
        // record's checksum, key and version are checked, so wrong bytes are never returned.
        let n = self
            .disk
            .read_at(&name, entry.offset, &mut buf[..len])
            .await?;
        check_record(&buf[..n], key, version, &name)
    }

    /// [`Backend::remove`]: out of the index, then each touched bucket's meta rewritten once.
    async fn remove_writes(&self, writes: &[(String, u64)]) -> io::Result<()> {
        let touched: BTreeSet<u64> = {
            let mut index = self.lock();
            let mut touched = BTreeSet::new();
            for (key, version) in writes {
                let Some(entry) = index.keys.get(key).copied() else {
                    continue;
                };
                if entry.version != *version {
                    continue; // another write of the key: it stays
                }
                index.keys.remove(key);
                if let Some(live) = index.buckets.get_mut(&entry.bucket) {
                    live.remove(key);
                }
                touched.insert(entry.bucket);
            }
            touched
        };
        // Every bucket is attempted; the first error is returned (the values are no longer
        // served either way; on disk they stay until a rewrite or recovery drops them).
        let mut result = Ok(());
        for id in touched {
            if let Err(e) = self.rewrite_meta(id).await {
                warn!(
                    bucket = id,
                    "could not rewrite a bucket after removals: {e}"
                );
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }
}

/// Why a file or value found by recovery is not kept.
type Damage = String;

impl Bucket {
    /// [`Backend::recover`].
    async fn recover_all(&self) -> io::Result<Recovered> {
        let mut found = Recovered::default();
        let mut data_ids = BTreeSet::new();
        let mut meta_ids = BTreeSet::new();
        let mut max_id = 0;
        for name in self.disk.list().await? {
            let Some((id, ext)) = parse_name(&name) else {
                continue; // not ours
            };
            max_id = max_id.max(id);
            match ext {
                TMP_EXT => {
                    self.drop_file(&mut found, &name, "an unfinished meta write".into())
                        .await?
                }
                DATA_EXT => _ = data_ids.insert(id),
                _ => _ = meta_ids.insert(id),
            }
        }
        let mut buckets: BTreeMap<u64, Vec<meta::MetaEntry>> = BTreeMap::new();
        let mut dirty = BTreeSet::new();
        for &id in data_ids.union(&meta_ids) {
            let data = Self::data_name(id);
            if !meta_ids.contains(&id) {
                let why = "no meta: an unfinished bucket write".to_string();
                self.drop_file(&mut found, &data, why).await?;
                continue;
            }
            let entries = match self.read_meta(id).await? {
                Ok(entries) => entries,
                Err(why) => {
                    // Meta first: a crash in between leaves a data file without a meta.
                    self.drop_file(&mut found, &Self::meta_name(id), why.clone())
                        .await?;
                    if data_ids.contains(&id) {
                        self.drop_file(&mut found, &data, why).await?;
                    }
                    continue;
                }
            };
            let data_len = match self.disk.len(&data).await {
                Ok(len) => len,
                Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
                Err(e) => return Err(e),
            };
            let mut kept = Vec::with_capacity(entries.len());
            for entry in entries {
                match self.check_entry(&data, data_len, &entry).await? {
                    Ok(()) => kept.push(entry),
                    Err(why) => {
                        warn!(key = %entry.key, file = %data, "dropping on recovery: {why}");
                        found
                            .dropped
                            .push((format!("{} in {data}", entry.key), why));
                        dirty.insert(id);
                    }
                }
            }
            buckets.insert(id, kept);
        }
        drop_superseded(&mut buckets, &mut dirty, &mut found);
        for id in dirty {
            let entries = buckets.get(&id).map_or(&[][..], Vec::as_slice);
            if entries.is_empty() {
                self.delete_bucket(id).await?;
                buckets.remove(&id);
            } else {
                let bytes = meta::encode(id, entries, self.disk.alignment());
                self.write_meta(id, &bytes).await?;
            }
        }
        self.install(&buckets, &mut found);
        self.next_id.store(max_id + 1, Ordering::Relaxed);
        self.recovered.store(true, Ordering::Release);
        info!(
            buckets = buckets.len(),
            objects = found.objects.len(),
            dropped = found.dropped.len(),
            "bucket backend recovered"
        );
        Ok(found)
    }

    /// Fills the index with the recovered buckets and lists their values.
    fn install(&self, buckets: &BTreeMap<u64, Vec<meta::MetaEntry>>, found: &mut Recovered) {
        let mut index = self.lock();
        for (&id, entries) in buckets {
            let mut live = BTreeSet::new();
            for e in entries {
                let entry = Entry::of(id, e);
                index.keys.insert(e.key.clone(), entry);
                live.insert(e.key.clone());
                found.objects.push(Held {
                    key: e.key.clone(),
                    version: e.version,
                    len: e.value_len,
                    unit: id,
                });
            }
            index.buckets.insert(id, live);
        }
    }

    /// Bucket `id`'s meta entries, or why the meta is damaged. Errors are I/O failures.
    async fn read_meta(&self, id: u64) -> io::Result<Result<Vec<meta::MetaEntry>, Damage>> {
        let name = Self::meta_name(id);
        let len = self.disk.len(&name).await?;
        let Ok(len) = usize::try_from(len) else {
            return Ok(Err(format!("meta of {len} bytes is too large")));
        };
        let mut buf = AlignedBuf::new(len, self.disk.alignment());
        let whole = buf.len();
        let n = self.disk.read_at(&name, 0, &mut buf[..whole]).await?;
        Ok(meta::decode(&buf[..n.min(len)], id).map_err(|why| format!("damaged meta: {why}")))
    }

    /// Reads the record `entry` points at and checks it. Errors are I/O failures.
    async fn check_entry(
        &self,
        data: &str,
        data_len: u64,
        entry: &meta::MetaEntry,
    ) -> io::Result<Result<(), Damage>> {
        let a = self.disk.alignment() as u64;
        let record_len = (record::HEADER_LEN + entry.key.len()) as u64;
        let end = record_len
            .checked_add(entry.value_len)
            .and_then(|len| len.checked_add(entry.offset));
        match end {
            _ if !entry.offset.is_multiple_of(a) => {
                return Ok(Err(format!("offset {} is not aligned", entry.offset)));
            }
            Some(end) if end <= data_len => {}
            _ => {
                return Ok(Err(format!(
                    "torn record: the data file ends at {data_len}, before the record's end"
                )));
            }
        }
        let len = read_len(&entry.key, entry.value_len, a as usize);
        let mut buf = AlignedBuf::new(len, a as usize);
        let n = self
            .disk
            .read_at(data, entry.offset, &mut buf[..len])
            .await?;
        Ok(check_record(&buf[..n], &entry.key, entry.version, data)
            .map(|_| ())
            .map_err(|e| e.to_string()))
    }

    async fn drop_file(&self, found: &mut Recovered, name: &str, why: Damage) -> io::Result<()> {
        warn!(file = %name, "dropping on recovery: {why}");
        remove_if_present(self.disk.as_ref(), name).await?;
        found.dropped.push((name.to_string(), why));
        Ok(())
    }
}

/// Bucket id and extension of one of our file names.
fn parse_name(name: &str) -> Option<(u64, &'static str)> {
    let file = name.strip_prefix(DIR)?.strip_prefix('/')?;
    let (stem, ext) = [TMP_EXT, DATA_EXT, META_EXT]
        .into_iter()
        .find_map(|ext| Some((file.strip_suffix(ext)?, ext)))?;
    if stem.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(stem, 16).ok()?, ext))
}

/// Where two buckets hold the same key (a crash between a new bucket's commit and the old
/// entry's removal), keeps the higher version (the later bucket on a tie) and drops the other.
fn drop_superseded(
    buckets: &mut BTreeMap<u64, Vec<meta::MetaEntry>>,
    dirty: &mut BTreeSet<u64>,
    found: &mut Recovered,
) {
    let mut best: HashMap<&str, (u64, u64)> = HashMap::new();
    for (&id, entries) in buckets.iter() {
        for e in entries {
            let held = best.entry(&e.key).or_insert((e.version, id));
            *held = (*held).max((e.version, id));
        }
    }
    let best: HashMap<String, (u64, u64)> =
        best.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    for (&id, entries) in buckets.iter_mut() {
        entries.retain(|e| {
            let (version, bucket) = best[&e.key];
            if bucket == id {
                return true;
            }
            let why = format!("superseded by write {version} in bucket {bucket:016x}");
            info!(key = %e.key, bucket = id, "dropping on recovery: {why}");
            found
                .dropped
                .push((format!("{} in {}", e.key, Bucket::data_name(id)), why));
            dirty.insert(id);
            false
        });
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

    fn put<'a>(&'a self, items: &'a [Item<'a>]) -> BoxFuture<'a, io::Result<Vec<Held>>> {
        Box::pin(self.put_group(items))
    }

    fn read<'a>(
        &'a self,
        key: &'a str,
        version: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, io::Result<Range<usize>>> {
        Box::pin(self.read_record(key, version, buf))
    }

    fn remove<'a>(&'a self, writes: &'a [(String, u64)]) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(self.remove_writes(writes))
    }

    fn recover(&self) -> BoxFuture<'_, io::Result<Recovered>> {
        Box::pin(self.recover_all())
    }
}

/// The `.meta` file format.
///
/// ```text
/// 0      4        5          8          16          24      28
/// | MKVB | format | reserved | meta_len | bucket id | count | entries… | crc32c | padding
/// entry: key_len u32 | version u64 | offset u64 | value_len u64 | key
/// ```
///
/// Little-endian; `meta_len` counts every byte up to and including the crc32c, which covers
/// everything before it. The file is padded to the disk's alignment (direct I/O writes whole
/// blocks); the padding is ignored.
mod meta {
    use crate::AlignedBuf;
    use crate::record::MAX_KEY_LEN;

    const MAGIC: [u8; 4] = *b"MKVB";
    const FORMAT: u8 = 1;
    const HEADER_LEN: usize = 28;
    const ENTRY_LEN: usize = 28;

    /// One value of a bucket.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub(super) struct MetaEntry {
        pub(super) key: String,
        pub(super) version: u64,
        /// Of its record in the data file.
        pub(super) offset: u64,
        pub(super) value_len: u64,
    }

    /// Bucket `id`'s meta listing `entries`, padded to `align`.
    pub(super) fn encode(id: u64, entries: &[MetaEntry], align: usize) -> AlignedBuf {
        let mut out = Vec::with_capacity(
            HEADER_LEN
                + 4
                + entries
                    .iter()
                    .map(|e| ENTRY_LEN + e.key.len())
                    .sum::<usize>(),
        );
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[FORMAT, 0, 0, 0]);
        out.extend_from_slice(&0u64.to_le_bytes()); // meta_len, set below
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for e in entries {
            out.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
            out.extend_from_slice(&e.version.to_le_bytes());
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.extend_from_slice(&e.value_len.to_le_bytes());
            out.extend_from_slice(e.key.as_bytes());
        }
        let meta_len = (out.len() + 4) as u64;
        out[8..16].copy_from_slice(&meta_len.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        AlignedBuf::copy_of(&out, align)
    }

    /// Reads fixed-size fields off the front of a byte slice.
    struct Cursor<'a>(&'a [u8]);

    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
            if self.0.len() < n {
                return Err("entries run past the end");
            }
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            Ok(head)
        }

        fn u32(&mut self) -> Result<u32, &'static str> {
            let mut b = [0; 4];
            b.copy_from_slice(self.take(4)?);
            Ok(u32::from_le_bytes(b))
        }

        fn u64(&mut self) -> Result<u64, &'static str> {
            let mut b = [0; 8];
            b.copy_from_slice(self.take(8)?);
            Ok(u64::from_le_bytes(b))
        }
    }

    /// The entries of bucket `id`'s meta in `bytes` (padding allowed), or why it is damaged.
    pub(super) fn decode(bytes: &[u8], id: u64) -> Result<Vec<MetaEntry>, &'static str> {
        let mut head = Cursor(bytes);
        if head.take(4).map_err(|_| "empty or truncated")? != MAGIC {
            return Err("bad magic");
        }
        if head.take(4).map_err(|_| "truncated header")?[0] != FORMAT {
            return Err("unknown format version");
        }
        let meta_len = head.u64().map_err(|_| "truncated header")?;
        let meta_len = usize::try_from(meta_len)
            .ok()
            .filter(|&len| (HEADER_LEN + 4..=bytes.len()).contains(&len))
            .ok_or("length out of range (truncated?)")?;
        let (body, crc) = bytes[..meta_len].split_at(meta_len - 4);
        let mut stored = [0; 4];
        stored.copy_from_slice(crc);
        if crc32c::crc32c(body) != u32::from_le_bytes(stored) {
            return Err("checksum mismatch");
        }
        let mut c = Cursor(&body[16..]);
        if c.u64()? != id {
            return Err("belongs to another bucket");
        }
        let count = c.u32()?;
        let mut entries = Vec::new();
        for _ in 0..count {
            let key_len = c.u32()? as usize;
            if key_len > MAX_KEY_LEN {
                return Err("key length out of range");
            }
            let version = c.u64()?;
            let offset = c.u64()?;
            let value_len = c.u64()?;
            let key = std::str::from_utf8(c.take(key_len)?).map_err(|_| "key is not UTF-8")?;
            entries.push(MetaEntry {
                key: key.to_string(),
                version,
                offset,
                value_len,
            });
        }
        if !c.0.is_empty() {
            return Err("bytes after the last entry");
        }
        Ok(entries)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn entries() -> Vec<MetaEntry> {
            (0..3)
                .map(|i| MetaEntry {
                    key: format!("key/{i}"),
                    version: i + 10,
                    offset: i * 4096,
                    value_len: 100 * i,
                })
                .collect()
        }

        #[test]
        fn round_trips_with_padding() {
            let bytes = encode(7, &entries(), 512);
            assert_eq!(bytes.len(), 512);
            assert_eq!(decode(&bytes, 7).unwrap(), entries());
            assert_eq!(decode(&encode(8, &[], 1), 8).unwrap(), vec![]);
            assert_eq!(decode(&bytes, 8), Err("belongs to another bucket"));
        }

        #[test]
        fn every_flipped_bit_and_every_truncation_is_refused() {
            let bytes = encode(7, &entries(), 1).to_vec();
            for at in 0..bytes.len() * 8 {
                let mut bad = bytes.clone();
                bad[at / 8] ^= 1 << (at % 8);
                assert!(decode(&bad, 7).is_err(), "flip of bit {at} went unnoticed");
            }
            for len in 0..bytes.len() {
                assert!(decode(&bytes[..len], 7).is_err(), "truncation to {len}");
            }
        }
    }
}
