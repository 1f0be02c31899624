//! The backend seam: how a node's disk tier stores, finds and deletes values, whatever the
//! layout (spec 001's bucket, file-per-key and offset-allocator backends).
//!
//! Every backend stores values as [`record`](crate::record)s, each starting at an offset
//! aligned to the disk's alignment, so a reader can load a whole record with one aligned read
//! straight into its destination (the staging buffer) and check it there.

use std::io;
use std::ops::Range;

use mooring_proto::transport::BoxFuture;

use crate::record;

/// One value to store.
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
    /// The eviction unit it belongs to: values of one unit are stored, and best evicted,
    /// together (a bucket; a single value in the other backends).
    pub unit: u64,
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

    /// Stores `items` (distinct keys) durably, replacing earlier values of their keys, and
    /// returns where each went. All or nothing: on error none of them is stored.
    fn put<'a>(&'a self, items: &'a [Item<'a>]) -> BoxFuture<'a, io::Result<Vec<Held>>>;

    /// Loads the record of `key`'s write `version` into `buf` (aligned to
    /// [`Backend::alignment`], at least [`read_len`] bytes) and returns where the value lies
    /// in `buf`. `NotFound` if the backend does not hold that write; `InvalidData` if its
    /// record is damaged. The bytes in the returned range are checked against the record's
    /// checksum.
    fn read<'a>(
        &'a self,
        key: &'a str,
        version: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, io::Result<Range<usize>>>;

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
