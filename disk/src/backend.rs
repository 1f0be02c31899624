//! The backend seam: how a node's disk tier stores, finds and deletes values, whatever the
//! layout (the bucket, file-per-key and offset-allocator backends; see docs/ssd-tier.md).
//!
//! Every backend stores values as [`record`](crate::record)s, each starting at an offset
//! aligned to the disk's alignment, so a reader can load a whole record with one aligned read
//! straight into its destination (the staging buffer) and check it there. Writers hand the
//! backend records already laid out in aligned buffers ([`RecordBuf`]), which it writes as
//! they are.

use std::io;
use std::ops::Range;

use mooring_proto::transport::BoxFuture;

use crate::record::{self, RecordBuf};
use mooring_core::Checksum;
use mooring_proto::disk::{IoBuf, IoResult};

/// One value in memory to store (see [`Backend::put_items`]).
#[derive(Clone, Copy, Debug)]
pub struct Item<'a> {
    /// The object's key.
    pub key: &'a str,
    /// Which write of the key it is (the master's write id).
    pub version: u64,
    /// The bytes.
    pub value: &'a [u8],
}

/// A value the backend holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The object's key.
    pub key: String,
    /// Which write of the key it is.
    pub version: u64,
    /// The value's length.
    pub len: u64,
    /// The value's checksum.
    pub checksum: Checksum,
    /// The eviction unit it belongs to: values of one unit are stored, and best evicted,
    /// together (a bucket; a single value in the other backends).
    pub unit: u64,
}

impl Held {
    /// What a backend holds once `record` is stored, in eviction unit `unit`.
    pub fn of(record: &RecordBuf, unit: u64) -> Held {
        Held {
            key: record.key().to_string(),
            version: record.version(),
            len: record.value_len(),
            checksum: record.checksum(),
            unit,
        }
    }
}

/// What a recovery scan found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Every intact value.
    pub objects: Vec<Held>,
    /// What was removed because it was an unfinished write or damaged, with why.
    pub dropped: Vec<(String, String)>,
}

/// A layout of values on a disk.
pub trait Backend: Send + Sync {
    /// The backend's name, for logs.
    fn name(&self) -> &'static str;

    /// Alignment of the buffers [`Backend::read`] takes (the disk's).
    fn alignment(&self) -> usize;

    /// Whether values are best written in large groups (a bucket each): the caller then
    /// holds values back until a group fills, while more keep coming.
    fn groups_writes(&self) -> bool {
        false
    }

    /// Alignment the records handed to [`Backend::put`] are best padded to (their layout's:
    /// a record padded less is copied once more).
    fn record_alignment(&self) -> usize {
        self.alignment()
    }

    /// Stores `records` (distinct keys; see [`RecordBuf`]) durably, replacing earlier values
    /// of their keys, and returns where each went, writing each record's buffer as it is (no
    /// copy). All or nothing: on error none of them is stored.
    fn put(&self, records: Vec<RecordBuf>) -> BoxFuture<'_, io::Result<Vec<Held>>>;

    /// [`Backend::put`] of values in memory: each is copied once into its record.
    fn put_items<'a>(&'a self, items: &'a [Item<'a>]) -> BoxFuture<'a, io::Result<Vec<Held>>> {
        Box::pin(async move {
            let align = self.record_alignment();
            let records = items
                .iter()
                .map(|item| RecordBuf::encode(item.key, item.version, item.value, align))
                .collect::<io::Result<Vec<_>>>()?;
            self.put(records).await
        })
    }

    /// Loads the record of `key`'s write `version` into `buf` (aligned to
    /// [`Backend::alignment`], of at least [`read_len`] bytes of capacity), straight from the
    /// disk, and hands it back with where the value lies in it. `NotFound` if the backend does
    /// not hold that write; `InvalidData` if its record is damaged. The bytes in the returned
    /// range are checked against the record's checksum.
    fn read<'a>(
        &'a self,
        key: &'a str,
        version: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, Range<usize>>>;

    /// Removes these writes durably; a key holding another write keeps it.
    fn remove<'a>(&'a self, writes: &'a [(String, u64)]) -> BoxFuture<'a, io::Result<()>>;

    /// Scans the disk after a restart: removes unfinished writes and damaged data, and
    /// returns every intact value. Call once, before anything else.
    fn recover(&self) -> BoxFuture<'_, io::Result<Recovered>>;
}

/// Bytes a buffer for [`Backend::read`] of a `value_len`-byte value of `key` needs.
pub fn read_len(key: &str, value_len: u64, alignment: usize) -> usize {
    let record = record::HEADER_LEN + key.len() + value_len as usize;
    record.div_ceil(alignment.max(1)) * alignment.max(1)
}

/// Checks that `buf` holds the record of `key`'s write `version` and returns where its value
/// lies: the shared tail of every backend's [`Backend::read`].
pub fn check_record(buf: &[u8], key: &str, version: u64, at: &str) -> io::Result<Range<usize>> {
    let record = record::decode(buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{at}: {e}")))?;
    if record.key != key || record.version != version {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{at} holds write {} of {:?}, not write {version} of {key:?}",
                record.version, record.key
            ),
        ));
    }
    let start = record::HEADER_LEN + key.len();
    Ok(start..start + record.value.len())
}
