//! The file-per-key backend: one record file per object under two levels of hashed
//! directories (`ab/cd/abcd….rec`), written to a temporary file, synced, then renamed into
//! place, so a crash leaves the old record or the new one, never a mix.
//!
//! Written against the [`Disk`] trait: the same code runs on [`crate::PosixDisk`] and, under
//! the simulator, on the simulated disk with torn writes and lost unsynced data.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mooring_proto::disk::{Disk, IoBuf, IoResult};
use mooring_proto::transport::BoxFuture;
use tracing::warn;

use crate::backend::{Backend, Held, Recovered, check_record};
use crate::record::{self, RecordBuf, RecordError};

/// Where writes in progress live until renamed into place; emptied by recovery.
const TMP_DIR: &str = "tmp";
/// Record files' extension.
const EXTENSION: &str = ".rec";

/// A stored value and which write of its key it is.
#[derive(Debug, PartialEq, Eq)]
pub struct Stored {
    /// The version (the master's write id) it was stored with.
    pub version: u64,
    /// The bytes.
    pub value: Vec<u8>,
}

/// One record file per key on a [`Disk`].
pub struct FilePerKey {
    disk: Arc<dyn Disk>,
    next_tmp: AtomicU64,
    /// Eviction units: every value is its own.
    next_unit: AtomicU64,
}

/// A 64-bit hash of a key (two crc32c with different seeds: stable across builds and
/// platforms, which a file name must be).
fn key_hash(key: &str) -> u64 {
    let low = crc32c::crc32c(key.as_bytes());
    let high = crc32c::crc32c_append(0x9E37_79B9, key.as_bytes());
    (u64::from(high) << 32) | u64::from(low)
}

fn invalid_data(name: &str, e: RecordError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}"))
}

impl FilePerKey {
    /// The backend on `disk`. Call [`FilePerKey::recover`] before serving from a disk that
    /// may hold an earlier run's files.
    pub fn new(disk: Arc<dyn Disk>) -> FilePerKey {
        FilePerKey {
            disk,
            next_tmp: AtomicU64::new(0),
            next_unit: AtomicU64::new(1),
        }
    }

    /// The file that holds `key`.
    pub fn file_name(key: &str) -> String {
        let h = key_hash(key);
        format!(
            "{:02x}/{:02x}/{h:016x}{EXTENSION}",
            h >> 56,
            (h >> 48) & 0xff
        )
    }

    /// Stores `value` under `key` as `version`, durably, replacing any earlier value.
    pub async fn put(&self, key: &str, version: u64, value: &[u8]) -> io::Result<()> {
        let record = RecordBuf::encode(key, version, value, self.disk.alignment())?;
        self.put_record(record).await
    }

    /// Stores `record` durably, replacing any earlier value of its key, writing its buffer as
    /// it is.
    pub async fn put_record(&self, record: RecordBuf) -> io::Result<()> {
        let key = record.key().to_string();
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = format!("{TMP_DIR}/{:016x}.{n}", key_hash(&key));
        let record = record.aligned_to(self.disk.alignment());
        self.disk.create(&tmp).await?;
        let written = async {
            self.disk.write_at(&tmp, 0, record.into_buf()).await.1?;
            self.disk.sync(&tmp).await?;
            self.disk.rename(&tmp, &Self::file_name(&key)).await
        }
        .await;
        if written.is_err() {
            let _ = self.disk.remove(&tmp).await;
        }
        written
    }

    /// The value of `key`: `None` if absent. A damaged record is an `InvalidData` error and
    /// its bytes are never returned (a hash collision's record, for another key, reads as
    /// absent).
    pub async fn get(&self, key: &str) -> io::Result<Option<Stored>> {
        let name = Self::file_name(key);
        let bytes = match self.read_file(&name).await {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let record = record::decode(&bytes).map_err(|e| invalid_data(&name, e))?;
        Ok((record.key == key).then(|| Stored {
            version: record.version,
            value: record.value.to_vec(),
        }))
    }

    /// Removes `key` if it holds `version` (a newer write of the key stays); returns whether
    /// it did. A damaged record of the key is removed too: it could never be served.
    pub async fn remove_version(&self, key: &str, version: u64) -> io::Result<bool> {
        match self.get(key).await {
            Ok(Some(stored)) if stored.version == version => self.remove(key).await,
            Ok(_) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => self.remove(key).await,
            Err(e) => Err(e),
        }
    }

    /// Removes `key`; returns whether it was there.
    pub async fn remove(&self, key: &str) -> io::Result<bool> {
        match self.disk.remove(&Self::file_name(key)).await {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Scans the disk after a restart: removes unfinished writes and damaged records, and
    /// returns every intact object, to be registered with the master again.
    pub async fn recover(&self) -> io::Result<Recovered> {
        let mut found = Recovered::default();
        for name in self.disk.list().await? {
            if name.starts_with(&format!("{TMP_DIR}/")) {
                self.drop_file(&mut found, name, "an unfinished write".into())
                    .await?;
                continue;
            }
            if !name.ends_with(EXTENSION) {
                continue; // not ours
            }
            let bytes = match self.read_file(&name).await {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.drop_file(&mut found, name, e.to_string()).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match record::decode(&bytes) {
                Ok(record) if Self::file_name(record.key) == name => found.objects.push(Held {
                    key: record.key.to_string(),
                    version: record.version,
                    len: record.value.len() as u64,
                    checksum: record.checksum,
                    unit: self.next_unit.fetch_add(1, Ordering::Relaxed),
                }),
                Ok(record) => {
                    let why = format!("holds key {:?}, which belongs elsewhere", record.key);
                    self.drop_file(&mut found, name, why).await?;
                }
                Err(e) => self.drop_file(&mut found, name, e.to_string()).await?,
            }
        }
        Ok(found)
    }

    /// [`Backend::put`]: one file each, written concurrently (their syncs overlap), and the
    /// group's other files removed if one fails.
    async fn put_group(&self, records: Vec<RecordBuf>) -> io::Result<Vec<Held>> {
        let written: Vec<Held> = records
            .iter()
            .map(|r| Held::of(r, self.next_unit.fetch_add(1, Ordering::Relaxed)))
            .collect();
        let writes = records.into_iter().map(|record| self.put_record(record));
        let results = futures_util::future::join_all(writes).await;
        if let Some(pos) = results.iter().position(Result::is_err) {
            for (held, result) in written.iter().zip(&results) {
                if result.is_ok()
                    && let Err(undo) = self.remove_version(&held.key, held.version).await
                {
                    warn!(key = %held.key, "could not undo a failed group write: {undo}");
                }
            }
            let mut results = results;
            return Err(results.swap_remove(pos).expect_err("the failed write"));
        }
        Ok(written)
    }

    /// [`Backend::read`]: the whole file into `buf`.
    async fn read_record(
        &self,
        key: &str,
        version: u64,
        buf: IoBuf,
    ) -> IoResult<IoBuf, Range<usize>> {
        let name = Self::file_name(key);
        let (buf, read) = self.disk.read_at(&name, 0, buf).await;
        let checked =
            read.and_then(|n| check_record(&buf[..n.min(buf.len())], key, version, &name));
        (buf, checked)
    }

    async fn drop_file(&self, found: &mut Recovered, name: String, why: String) -> io::Result<()> {
        warn!(file = %name, "dropping on recovery: {why}");
        match self.disk.remove(&name).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        found.dropped.push((name, why));
        Ok(())
    }

    /// The whole file, read with the disk's alignment.
    async fn read_file(&self, name: &str) -> io::Result<Vec<u8>> {
        let len = self.disk.len(name).await?;
        let len = usize::try_from(len).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{name}: too large"))
        })?;
        let buf = IoBuf::new(len, self.disk.alignment());
        let (buf, read) = self.disk.read_at(name, 0, buf).await;
        let n = read?;
        Ok(buf[..n.min(len)].to_vec())
    }
}

impl Backend for FilePerKey {
    fn name(&self) -> &'static str {
        "file-per-key"
    }

    fn alignment(&self) -> usize {
        self.disk.alignment()
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
        Box::pin(async move {
            for (key, version) in writes {
                self.remove_version(key, *version).await?;
            }
            Ok(())
        })
    }

    fn recover(&self) -> BoxFuture<'_, io::Result<Recovered>> {
        Box::pin(FilePerKey::recover(self))
    }
}
