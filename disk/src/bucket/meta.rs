//! The `.meta` file format.
//!
//! ```text
//! 0      4        5          8          16          24      28
//! | MKVB | format | reserved | meta_len | bucket id | count | entries… | crc32c | padding
//! entry: key_len u32 | version u64 | offset u64 | value_len u64 | value crc32c u32 | key
//! ```
//!
//! Little-endian; `meta_len` counts every byte up to and including the crc32c, which covers
//! everything before it. The file is padded to the disk's alignment (direct I/O writes whole
//! blocks); the padding is ignored. Format 1 (before the value checksum) is not read: its
//! buckets are dropped on recovery, as damaged ones are.

use crate::record::MAX_KEY_LEN;
use mooring_core::Checksum;
use mooring_proto::disk::IoBuf;

const MAGIC: [u8; 4] = *b"MKVB";
const FORMAT: u8 = 2;
const HEADER_LEN: usize = 28;
const ENTRY_LEN: usize = 32;

/// One value of a bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MetaEntry {
    pub(super) key: String,
    pub(super) version: u64,
    /// Of its record in the data file.
    pub(super) offset: u64,
    pub(super) value_len: u64,
    pub(super) checksum: Checksum,
}

/// Bucket `id`'s meta listing `entries`, padded to `align`.
pub(super) fn encode(id: u64, entries: &[MetaEntry], align: usize) -> IoBuf {
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
        out.extend_from_slice(&e.checksum.0.to_le_bytes());
        out.extend_from_slice(e.key.as_bytes());
    }
    let meta_len = (out.len() + 4) as u64;
    out[8..16].copy_from_slice(&meta_len.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    IoBuf::copy_of(&out, align)
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
        let checksum = Checksum(c.u32()?);
        let key = std::str::from_utf8(c.take(key_len)?).map_err(|_| "key is not UTF-8")?;
        entries.push(MetaEntry {
            key: key.to_string(),
            version,
            offset,
            value_len,
            checksum,
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
                checksum: Checksum(i as u32 * 0x1234_5678),
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
