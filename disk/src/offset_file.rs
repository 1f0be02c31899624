//! The offset-allocator backend: every value in one preallocated file, `kv_cache.data`, whose
//! space the core's [`OffsetAllocator`] manages. Each value is one [`record`] at an offset
//! aligned to the disk's alignment but at least 4 KiB (as in the bucket layout, so a file
//! written through the page cache stays readable with `O_DIRECT`), its size rounded up to
//! that alignment, so every offset stays aligned.
//!
//! A put writes its records, syncs the file once, then publishes them in a sharded index (1024
//! maps, to spread lock contention). A record is retired (replaced or removed) by zeroing its
//! first block and syncing before its space is freed, so freed space never holds a record the
//! recovery scan would find. The index is not persisted: [`Backend::recover`] scans the whole
//! file for intact records (checksummed, so torn or damaged ones are skipped) and rebuilds the
//! allocator with exactly that layout.
//!
//! The file is created, or extended to the capacity, by recovery, which must run before the
//! first put. A larger existing file is used whole, never shrunk.
//!
//! Known limits:
//! - a value whose bytes themselves contain a complete valid record (only a deliberately
//!   crafted value can), left in freed space after its own header was zeroed, could be found
//!   by a later scan and reported as that record;
//! - the file is shared, so a failed sync may drop other writers' unsynced records too (as a
//!   failed `fsync` on Linux may); their reads then fail the checksum, never return wrong bytes.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mooring_core::Checksum;
use mooring_core::allocator::{Allocation, MAX_CAPACITY, OffsetAllocator};
use mooring_proto::disk::{Disk, IoBuf, IoResult};
use mooring_proto::transport::BoxFuture;
use tracing::{debug, info, warn};

use crate::backend::{Backend, Held, Recovered, check_record, read_len};
use crate::bucket::{align_up, check_items, layout_alignment};
use crate::record::RecordBuf;
use crate::record::{self, RecordError};

/// The one data file.
pub const DATA_FILE: &str = "kv_cache.data";
/// Index shards, to spread lock contention.
const SHARDS: usize = 1024;
/// Bytes the recovery scan reads at a time.
const SCAN_CHUNK: usize = 4 << 20;

/// Where one value lies.
#[derive(Clone, Copy, Debug)]
struct Entry {
    offset: u64,
    /// Bytes of the file the record's space spans (what the allocator gave it).
    span: u64,
    version: u64,
    value_len: u64,
}

/// One preallocated file of records on a [`Disk`], its space managed by an offset allocator.
pub struct OffsetFile {
    disk: Arc<dyn Disk>,
    /// Alignment of record offsets and sizes.
    align: usize,
    /// The capacity asked for; recovery may find a larger file and use it whole.
    wanted: u64,
    /// The space in use; `None` until recovery has learnt the layout.
    space: Mutex<Option<OffsetAllocator>>,
    shards: Vec<Mutex<HashMap<String, Entry>>>,
    next_unit: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks completes before release; a panic elsewhere cannot
    // leave one half-done.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl OffsetFile {
    /// The backend on `disk`, managing `capacity` bytes (rounded down to the alignment).
    /// No I/O happens here: [`Backend::recover`] creates or extends the file and must run
    /// before the first put. `InvalidInput` if the capacity is below one aligned block or
    /// beyond the allocator's range.
    pub fn open(disk: Arc<dyn Disk>, capacity: u64) -> io::Result<OffsetFile> {
        let align = layout_alignment(disk.as_ref());
        let wanted = capacity / align as u64 * align as u64;
        if wanted == 0 || wanted > MAX_CAPACITY {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("capacity {capacity} out of range ({align}..={MAX_CAPACITY})"),
            ));
        }
        Ok(OffsetFile {
            disk,
            align,
            wanted,
            space: Mutex::new(None),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            next_unit: AtomicU64::new(1),
        })
    }

    /// Bytes of the file the allocator manages (known once recovered; the asked-for
    /// capacity before).
    pub fn capacity(&self) -> u64 {
        lock(&self.space)
            .as_ref()
            .map_or(self.wanted, OffsetAllocator::capacity)
    }

    /// Bytes not allocated to any record.
    pub fn free_bytes(&self) -> u64 {
        lock(&self.space)
            .as_ref()
            .map_or(self.wanted, OffsetAllocator::free_bytes)
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, Entry>> {
        lock(&self.shards[crc32c::crc32c(key.as_bytes()) as usize % SHARDS])
    }

    /// [`Backend::put`]: each record written from its own buffer at its allocated offset.
    async fn put_group(&self, records: Vec<RecordBuf>) -> io::Result<Vec<Held>> {
        check_items(&records)?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        // Already padded to `self.align` when the caller asked `record_alignment`.
        let records: Vec<RecordBuf> = records
            .into_iter()
            .map(|r| r.aligned_to(self.align))
            .collect();
        let sizes: Vec<u64> = records.iter().map(|r| r.bytes().len() as u64).collect();
        let allocations = self.allocate(&sizes)?;
        let kept: Vec<Held> = records
            .iter()
            .map(|r| Held::of(r, self.next_unit.fetch_add(1, Ordering::Relaxed)))
            .collect();
        let mut attempted = 0;
        let written = async {
            for (record, at) in records.into_iter().zip(&allocations) {
                attempted += 1;
                self.disk
                    .write_at(DATA_FILE, at.offset, record.into_buf())
                    .await
                    .1?;
            }
            self.disk.sync(DATA_FILE).await
        }
        .await;
        if let Err(e) = written {
            // Zero what may have reached the disk before the space can hold anything else.
            let offsets: Vec<u64> = allocations[..attempted].iter().map(|a| a.offset).collect();
            if let Err(undo) = self.zero_headers(&offsets).await {
                warn!("could not invalidate the records of a failed put: {undo}");
            }
            self.free(allocations.iter().copied());
            return Err(e);
        }
        let mut replaced = Vec::new();
        for (held, at) in kept.iter().zip(&allocations) {
            let entry = Entry {
                offset: at.offset,
                span: at.len,
                version: held.version,
                value_len: held.len,
            };
            replaced.extend(self.shard(&held.key).insert(held.key.clone(), entry));
        }
        if let Err(e) = self.retire(&replaced).await {
            // The new values are durable and served; an old record left intact is resolved by
            // recovery, which keeps the higher version.
            warn!("could not invalidate replaced records: {e}");
        }
        Ok(kept)
    }

    /// Space for records of `sizes`: all of it, or a `StorageFull` error and none.
    fn allocate(&self, sizes: &[u64]) -> io::Result<Vec<Allocation>> {
        let mut space = lock(&self.space);
        let Some(allocator) = space.as_mut() else {
            return Err(io::Error::other(
                "offset-file backend: recover() must run before the first put",
            ));
        };
        let mut got: Vec<Allocation> = Vec::with_capacity(sizes.len());
        for &size in sizes {
            let failure = match allocator.allocate(size) {
                Some(a) if a.offset.is_multiple_of(self.align as u64) => {
                    got.push(a);
                    continue;
                }
                Some(a) => {
                    got.push(a);
                    io::Error::other(format!(
                        "internal error: allocator returned unaligned offset {}",
                        a.offset
                    ))
                }
                None => io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!(
                        "{DATA_FILE} is full: no room for a record of {size} bytes ({} of {} \
                         bytes free)",
                        allocator.free_bytes(),
                        allocator.capacity()
                    ),
                ),
            };
            for a in &got {
                allocator.free(*a);
            }
            return Err(failure);
        }
        Ok(got)
    }

    fn free(&self, blocks: impl IntoIterator<Item = Allocation>) {
        if let Some(allocator) = lock(&self.space).as_mut() {
            for block in blocks {
                if !allocator.free(block) {
                    warn!(
                        offset = block.offset,
                        len = block.len,
                        "freeing space that was not allocated"
                    );
                }
            }
        }
    }

    /// Overwrites the first block of the records at `offsets` with zeros, then syncs, so the
    /// recovery scan no longer finds them.
    async fn zero_headers(&self, offsets: &[u64]) -> io::Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut zeros = IoBuf::new(self.align, self.align);
        for &offset in offsets {
            let (back, written) = self.disk.write_at(DATA_FILE, offset, zeros).await;
            zeros = back;
            written?;
        }
        self.disk.sync(DATA_FILE).await
    }

    /// Invalidates records taken out of the index and frees their space. The space is freed
    /// even if invalidation fails: the record's bytes are correct for its write, so at worst
    /// a crash brings back a value that was retired.
    async fn retire(&self, entries: &[Entry]) -> io::Result<()> {
        let offsets: Vec<u64> = entries.iter().map(|e| e.offset).collect();
        let zeroed = self.zero_headers(&offsets).await;
        self.free(entries.iter().map(|e| Allocation {
            offset: e.offset,
            len: e.span,
        }));
        zeroed
    }

    /// [`Backend::read`].
    async fn read_record(
        &self,
        key: &str,
        version: u64,
        mut buf: IoBuf,
    ) -> IoResult<IoBuf, Range<usize>> {
        let entry = self.shard(key).get(key).copied();
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
        // The space may be retired and reused meanwhile; the checksum, key and version
        // checks refuse whatever else is there now.
        let (buf, read) = self.disk.read_at(DATA_FILE, entry.offset, buf).await;
        let checked =
            read.and_then(|n| check_record(&buf[..n.min(buf.len())], key, version, DATA_FILE));
        (buf, checked)
    }

    /// [`Backend::remove`].
    async fn remove_writes(&self, writes: &[(String, u64)]) -> io::Result<()> {
        let mut taken = Vec::new();
        for (key, version) in writes {
            let mut shard = self.shard(key);
            if shard.get(key).is_some_and(|e| e.version == *version) {
                taken.extend(shard.remove(key));
            }
        }
        self.retire(&taken).await
    }
}

/// An intact record the scan found.
struct Found {
    key: String,
    version: u64,
    value_len: u64,
    checksum: Checksum,
    offset: u64,
    /// Its aligned size.
    span: u64,
}

impl OffsetFile {
    /// [`Backend::recover`].
    async fn recover_all(&self) -> io::Result<Recovered> {
        let capacity = self.prepare_file().await?;
        let mut found = Recovered::default();
        let (records, damaged) = self.scan(capacity).await?;
        let mut invalid: Vec<u64> = Vec::new();
        for (offset, why) in damaged {
            warn!(offset, "dropping on recovery: {why}");
            found.dropped.push((format!("{DATA_FILE}@{offset}"), why));
            invalid.push(offset);
        }
        let kept = self.drop_superseded(records, &mut found, &mut invalid);
        // Zeroed so a later scan does not report them again; none lies inside a kept record.
        self.zero_headers(&invalid).await?;
        let allocator = rebuild_allocator(capacity, &kept)?;
        for f in kept {
            let entry = Entry {
                offset: f.offset,
                span: f.span,
                version: f.version,
                value_len: f.value_len,
            };
            self.shard(&f.key).insert(f.key.clone(), entry);
            found.objects.push(Held {
                key: f.key,
                version: f.version,
                len: f.value_len,
                checksum: f.checksum,
                unit: self.next_unit.fetch_add(1, Ordering::Relaxed),
            });
        }
        info!(
            capacity,
            objects = found.objects.len(),
            dropped = found.dropped.len(),
            free = allocator.free_bytes(),
            "offset-file backend recovered"
        );
        *lock(&self.space) = Some(allocator);
        Ok(found)
    }

    /// Creates the file or extends it to the capacity (one aligned zero block at the end);
    /// returns the capacity to manage: the asked-for one, or a larger file's whole length.
    async fn prepare_file(&self) -> io::Result<u64> {
        let len = match self.disk.len(DATA_FILE).await {
            Ok(len) => len,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.disk.create(DATA_FILE).await?;
                0
            }
            Err(e) => return Err(e),
        };
        let existing = (len / self.align as u64 * self.align as u64).min(MAX_CAPACITY);
        let capacity = self.wanted.max(existing);
        if len < capacity {
            let zeros = IoBuf::new(self.align, self.align);
            let last = capacity - self.align as u64;
            self.disk.write_at(DATA_FILE, last, zeros).await.1?;
            self.disk.sync(DATA_FILE).await?;
            debug!(from = len, to = capacity, "{DATA_FILE} extended");
        } else if capacity > self.wanted {
            info!(
                capacity,
                asked = self.wanted,
                "{DATA_FILE} is larger than asked; using all of it"
            );
        }
        Ok(capacity)
    }

    /// Every intact record in `[0, capacity)`, and the offsets (with why) of records whose
    /// magic matched but which are torn or damaged.
    async fn scan(&self, capacity: u64) -> io::Result<(Vec<Found>, Vec<(u64, String)>)> {
        let a = self.align as u64;
        let mut records = Vec::new();
        let mut damaged = Vec::new();
        let chunk = (SCAN_CHUNK as u64).min(capacity) as usize;
        let mut window = IoBuf::new(chunk, self.align);
        // The window holds the file's bytes [base, base + filled).
        let (mut base, mut filled) = (0u64, 0usize);
        let mut pos = 0u64;
        while pos < capacity {
            if pos + record::HEADER_LEN as u64 > base + filled as u64 {
                base = pos;
                let want = (capacity - pos).min(chunk as u64) as usize;
                window.set_len(want);
                let (back, read) = self.disk.read_at(DATA_FILE, base, window).await;
                window = back;
                filled = read?;
                if filled < record::HEADER_LEN {
                    break; // the end of the file
                }
            }
            let header = &window[(pos - base) as usize..filled];
            if header[..4] != record::MAGIC {
                pos += a;
                continue;
            }
            let total = match record::announced_len(header) {
                Ok(total) => total,
                Err(e) => {
                    damaged.push((pos, e.to_string()));
                    pos += a;
                    continue;
                }
            };
            let span = match align_up(total, self.align) {
                Some(span) if span <= capacity - pos => span,
                _ => {
                    let why = RecordError::Torn {
                        expected: total,
                        found: capacity - pos,
                    };
                    damaged.push((pos, format!("{why} (past the end of the file)")));
                    pos += a;
                    continue;
                }
            };
            let decoded = if pos + total <= base + filled as u64 {
                let at = (pos - base) as usize;
                decode_found(&window[at..at + total as usize], pos, span)
            } else {
                // Longer than what the window holds: read it whole. Its length comes from an
                // unchecked header, but it is bounded by the file.
                let whole = IoBuf::new(span as usize, self.align);
                let (whole, read) = self.disk.read_at(DATA_FILE, pos, whole).await;
                let n = read?;
                decode_found(&whole[..n], pos, span)
            };
            match decoded {
                Ok(found) => {
                    records.push(found);
                    pos += span;
                }
                Err(e) => {
                    damaged.push((pos, e.to_string()));
                    pos += a;
                }
            }
        }
        Ok((records, damaged))
    }

    /// Keeps the highest version of each key (the later record on a tie); the others are
    /// listed as dropped and their offsets added to `invalid`.
    fn drop_superseded(
        &self,
        records: Vec<Found>,
        found: &mut Recovered,
        invalid: &mut Vec<u64>,
    ) -> Vec<Found> {
        let mut best: HashMap<String, Found> = HashMap::new();
        for record in records {
            let loser = match best.get(&record.key) {
                Some(held) if (held.version, held.offset) > (record.version, record.offset) => {
                    record
                }
                _ => match best.insert(record.key.clone(), record) {
                    Some(loser) => loser,
                    None => continue,
                },
            };
            let winner = &best[&loser.key];
            let why = format!(
                "superseded by write {} at {}",
                winner.version, winner.offset
            );
            info!(key = %loser.key, offset = loser.offset, "dropping on recovery: {why}");
            found
                .dropped
                .push((format!("{DATA_FILE}@{}", loser.offset), why));
            invalid.push(loser.offset);
        }
        let mut kept: Vec<Found> = best.into_values().collect();
        kept.sort_by_key(|k| k.offset);
        kept
    }
}

fn decode_found(bytes: &[u8], offset: u64, span: u64) -> Result<Found, RecordError> {
    let record = record::decode(bytes)?;
    Ok(Found {
        key: record.key.to_string(),
        version: record.version,
        value_len: record.value.len() as u64,
        checksum: record.checksum,
        offset,
        span,
    })
}

/// An allocator over `[0, capacity)` whose allocations are exactly the spans of `kept`
/// (sorted by offset, not overlapping).
///
/// A fresh allocator carves each allocation from the start of its one free block, so
/// allocating the records and the gaps between them in offset order lays them out exactly;
/// the gaps are freed at the end. Each offset is checked, so a change in the allocator's
/// strategy fails recovery rather than corrupting the layout.
fn rebuild_allocator(capacity: u64, kept: &[Found]) -> io::Result<OffsetAllocator> {
    let mut allocator = OffsetAllocator::new(capacity);
    let mut place = |offset: u64, size: u64| {
        let got = allocator.allocate(size).filter(|a| a.offset == offset);
        got.ok_or_else(|| {
            io::Error::other(format!(
                "rebuilding the allocator: could not place {size} bytes at offset {offset}"
            ))
        })
    };
    let mut gaps = Vec::new();
    let mut at = 0u64;
    for k in kept {
        if k.offset > at {
            gaps.push(place(at, k.offset - at)?);
        }
        place(k.offset, k.span)?;
        at = k.offset + k.span;
    }
    for gap in gaps {
        allocator.free(gap);
    }
    Ok(allocator)
}

impl Backend for OffsetFile {
    fn name(&self) -> &'static str {
        "offset-file"
    }

    fn alignment(&self) -> usize {
        self.disk.alignment()
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
