//! The file-per-key backend: one record file per object under two levels of hashed
//! directories (`ab/cd/abcd….rec`), written to a temporary file, synced, then renamed into
//! place, so a crash leaves the old record or the new one, never a mix.
//!
//! Written against the [`Disk`] trait: the same code runs on [`crate::PosixDisk`] and, under
//! the simulator, on the simulated disk with torn writes and lost unsynced data.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mooring_core::disk::Disk;
use tracing::warn;

use crate::AlignedBuf;
use crate::record::{self, RecordError};

/// Where writes in progress live until renamed into place; emptied by recovery.
const TMP_DIR: &str = "tmp";
/// Record files' extension.
const EXTENSION: &str = ".rec";

/// What a recovery scan found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Every intact object: key, version and value length, in file-name order.
    pub objects: Vec<(String, u64, u64)>,
    /// Files removed because they were unfinished writes or damaged records, with why.
    pub dropped: Vec<(String, String)>,
}

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
        if key.len() > record::MAX_KEY_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "key of {} bytes; at most {}",
                    key.len(),
                    record::MAX_KEY_LEN
                ),
            ));
        }
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = format!("{TMP_DIR}/{:016x}.{n}", key_hash(key));
        let bytes =
            AlignedBuf::copy_of(&record::encode(key, version, value), self.disk.alignment());
        self.disk.create(&tmp).await?;
        let written = async {
            self.disk.write_at(&tmp, 0, &bytes).await?;
            self.disk.sync(&tmp).await?;
            self.disk.rename(&tmp, &Self::file_name(key)).await
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
                Ok(record) if Self::file_name(record.key) == name => found.objects.push((
                    record.key.to_string(),
                    record.version,
                    record.value.len() as u64,
                )),
                Ok(record) => {
                    let why = format!("holds key {:?}, which belongs elsewhere", record.key);
                    self.drop_file(&mut found, name, why).await?;
                }
                Err(e) => self.drop_file(&mut found, name, e.to_string()).await?,
            }
        }
        Ok(found)
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
        let mut buf = AlignedBuf::new(len, self.disk.alignment());
        let whole = buf.len();
        let n = self.disk.read_at(name, 0, &mut buf[..whole]).await?;
        Ok(buf[..n.min(len)].to_vec())
    }
}
