//! The on-disk record: one object, checksummed, so a torn or corrupt record is recognised
//! and never served.
//!
//! ```text
//! 0      4        5       6          8         12          20               28       32
//! | MKVR | version | flags | reserved | key_len | value_len | object version | crc32c | key | value | padding
//! ```
//!
//! Little-endian integers; the crc32c covers the first 28 header bytes, the key and the value.
//! It is computed as the crc32c of header and key combined with the value's own crc32c, which
//! is therefore known whenever a record is written or read, at no extra pass over the value:
//! that is the value's end-to-end [`Checksum`], which the master holds too.
//! Anything after `32 + key_len + value_len` is padding (direct I/O writes whole blocks). The
//! object version is the master's write id of the value, so a node can tell which write of a
//! key it holds (deletions are per write; see the core's `offload`).

use std::fmt;
use std::io;

use mooring_core::Checksum;
use mooring_proto::disk::IoBuf;

/// First bytes of every record.
pub const MAGIC: [u8; 4] = *b"MKVR";
/// The record format this build writes and reads.
pub const VERSION: u8 = 2;
/// Length of the record header.
pub const HEADER_LEN: usize = 32;
/// Where the checksum sits in the header (it covers everything before it).
const CRC_AT: usize = 28;
/// Longest key a record may carry.
pub const MAX_KEY_LEN: usize = 64 << 10;

/// A decoded record, borrowing from the bytes it was read from.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The object's key.
    pub key: &'a str,
    /// Which write of the key this is (the master's write id).
    pub version: u64,
    /// The object's bytes.
    pub value: &'a [u8],
    /// The value's checksum.
    pub checksum: Checksum,
}

/// Why bytes are not a record.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Fewer bytes than the header announces: a write that did not finish.
    Torn {
        /// Bytes the header announces.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// The bytes are damaged or not a record at all.
    Corrupt(&'static str),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Torn { expected, found } => write!(
                f,
                "torn record: {found} of {expected} bytes present (a write that did not finish)"
            ),
            RecordError::Corrupt(why) => write!(f, "corrupt record: {why}"),
        }
    }
}

impl std::error::Error for RecordError {}

/// Writes the header of a record of `key`'s write `version` into `out[..HEADER_LEN]`, and
/// the key after it, with the checksum over both and the value, which must already lie at
/// `out[HEADER_LEN + key.len()..][..value_len]`. Returns the value's checksum.
fn write_header(out: &mut [u8], key: &str, version: u64, value_len: usize) -> Checksum {
    let key_at = HEADER_LEN..HEADER_LEN + key.len();
    out[key_at.clone()].copy_from_slice(key.as_bytes());
    out[0..4].copy_from_slice(&MAGIC);
    out[4] = VERSION;
    out[5] = 0; // flags
    out[6..8].copy_from_slice(&0u16.to_le_bytes());
    out[8..12].copy_from_slice(&(key.len() as u32).to_le_bytes());
    out[12..20].copy_from_slice(&(value_len as u64).to_le_bytes());
    out[20..CRC_AT].copy_from_slice(&version.to_le_bytes());
    let value_at = HEADER_LEN + key.len();
    let value = Checksum::of(&out[value_at..value_at + value_len]);
    let crc = record_crc(&out[..CRC_AT], key.as_bytes(), value, value_len);
    out[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    value
}

/// The record checksum: over the header's first bytes and the key, then the value (whose
/// checksum is `value`).
fn record_crc(header: &[u8], key: &[u8], value: Checksum, value_len: usize) -> u32 {
    let head = Checksum::of(header).append(key);
    head.then(value, value_len as u64).0
}

/// Encodes `key`'s value `value`, written by write `version`, as one record.
pub fn encode(key: &str, version: u64, value: &[u8]) -> Vec<u8> {
    assert!(
        key.len() <= MAX_KEY_LEN,
        "key longer than {MAX_KEY_LEN} bytes"
    );
    let mut out = vec![0; HEADER_LEN + key.len() + value.len()];
    out[HEADER_LEN + key.len()..].copy_from_slice(value);
    write_header(&mut out, key, version, value.len());
    out
}

/// One record laid out in a buffer aligned for direct I/O and zero-padded to a multiple of
/// the alignment, ready to be written with no further copy: the value is copied once, from
/// wherever it lives, straight into its place, and the header is written around it.
#[derive(Debug)]
pub struct RecordBuf {
    key: String,
    version: u64,
    value_len: u64,
    checksum: Checksum,
    buf: IoBuf,
}

impl RecordBuf {
    /// The record of `key`'s write `version`, a `value_len`-byte value that `fill` copies into
    /// the slice it is given (exactly `value_len` bytes); padded to `align`. `None` if `fill`
    /// returns false. `InvalidInput` if the key is longer than [`MAX_KEY_LEN`].
    pub fn with_value(
        key: &str,
        version: u64,
        value_len: usize,
        align: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> io::Result<Option<RecordBuf>> {
        if key.len() > MAX_KEY_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("key of {} bytes; at most {MAX_KEY_LEN}", key.len()),
            ));
        }
        let value_at = HEADER_LEN + key.len();
        let len = value_at
            .checked_add(value_len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "value too large"))?;
        let mut buf = IoBuf::new(len, align);
        if !fill(&mut buf[value_at..len]) {
            return Ok(None);
        }
        let checksum = write_header(&mut buf, key, version, value_len);
        Ok(Some(RecordBuf {
            key: key.to_string(),
            version,
            value_len: value_len as u64,
            checksum,
            buf,
        }))
    }

    /// The record of `key`'s write `version` holding a copy of `value`, padded to `align`.
    pub fn encode(key: &str, version: u64, value: &[u8], align: usize) -> io::Result<RecordBuf> {
        let record = RecordBuf::with_value(key, version, value.len(), align, |out| {
            out.copy_from_slice(value);
            true
        })?;
        Ok(record.expect("filled"))
    }

    /// The object's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Which write of the key it is.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The value's length.
    pub fn value_len(&self) -> u64 {
        self.value_len
    }

    /// The value's checksum (computed while the record was built).
    pub fn checksum(&self) -> Checksum {
        self.checksum
    }

    /// The record's bytes, padding included.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// This record padded to a multiple of `align` (a copy only if it is not already).
    pub fn aligned_to(self, align: usize) -> RecordBuf {
        let align = align.max(1);
        if self.buf.len().is_multiple_of(align)
            && (self.buf.as_ptr() as usize).is_multiple_of(align)
        {
            return self;
        }
        let buf = IoBuf::copy_of(&self.buf, align);
        RecordBuf { buf, ..self }
    }

    /// The buffer to write.
    pub fn into_buf(self) -> IoBuf {
        self.buf
    }
}

/// The whole record's length as its header announces it (header included), after checking
/// what the header alone can show.
pub fn announced_len(header: &[u8]) -> Result<u64, RecordError> {
    if header.len() < HEADER_LEN {
        return Err(RecordError::Torn {
            expected: HEADER_LEN as u64,
            found: header.len() as u64,
        });
    }
    if header[0..4] != MAGIC {
        return Err(RecordError::Corrupt("bad magic"));
    }
    if header[4] != VERSION {
        return Err(RecordError::Corrupt("unknown record version"));
    }
    let key_len = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) as u64;
    let value_len = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    if key_len > MAX_KEY_LEN as u64 {
        return Err(RecordError::Corrupt("key length out of range"));
    }
    (HEADER_LEN as u64 + key_len)
        .checked_add(value_len)
        .ok_or(RecordError::Corrupt("value length out of range"))
}

/// Decodes a record from `bytes` (trailing padding allowed), checking its checksum.
pub fn decode(bytes: &[u8]) -> Result<Record<'_>, RecordError> {
    let total = announced_len(bytes)?;
    if (bytes.len() as u64) < total {
        return Err(RecordError::Torn {
            expected: total,
            found: bytes.len() as u64,
        });
    }
    let key_len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    let version = u64::from_le_bytes(bytes[20..CRC_AT].try_into().expect("8 bytes"));
    let stored = u32::from_le_bytes(bytes[CRC_AT..HEADER_LEN].try_into().expect("4 bytes"));
    let body = &bytes[HEADER_LEN..total as usize];
    let (key, value) = body.split_at(key_len);
    let checksum = Checksum::of(value);
    if record_crc(&bytes[..CRC_AT], key, checksum, value.len()) != stored {
        return Err(RecordError::Corrupt("checksum mismatch"));
    }
    let key = std::str::from_utf8(key).map_err(|_| RecordError::Corrupt("key is not UTF-8"))?;
    Ok(Record {
        key,
        version,
        value,
        checksum,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_crc_is_one_pass_over_header_key_and_value() {
        // Records written before the value checksum was split out must still verify.
        let (header, key, value) = ([7u8; CRC_AT], b"key/1", vec![0x5Au8; 5000]);
        let mut whole = header.to_vec();
        whole.extend_from_slice(key);
        whole.extend_from_slice(&value);
        let got = record_crc(&header, key, Checksum::of(&value), value.len());
        assert_eq!(got, crc32c::crc32c(&whole));
    }

    #[test]
    fn round_trips_with_padding() {
        let mut bytes = encode("layer/7", 42, b"kv-cache bytes");
        assert_eq!(announced_len(&bytes).unwrap(), bytes.len() as u64);
        bytes.extend_from_slice(&[0; 100]);
        assert_eq!(
            decode(&bytes).unwrap(),
            Record {
                key: "layer/7",
                version: 42,
                value: b"kv-cache bytes",
                checksum: Checksum::of(b"kv-cache bytes"),
            }
        );
        assert_eq!(decode(&encode("", 0, b"")).unwrap().value, b"");
    }

    #[test]
    fn record_buffers_hold_the_same_record_padded_and_aligned() {
        let record = RecordBuf::encode("layer/7", 42, b"kv-cache bytes", 512).unwrap();
        assert_eq!(record.bytes().len(), 512);
        assert_eq!(record.bytes().as_ptr() as usize % 512, 0);
        let plain = encode("layer/7", 42, b"kv-cache bytes");
        assert_eq!(&record.bytes()[..plain.len()], &plain[..]);
        assert!(record.bytes()[plain.len()..].iter().all(|&b| b == 0));
        assert_eq!(
            (record.key(), record.version(), record.value_len()),
            ("layer/7", 42, 14)
        );
        let wider = record.aligned_to(4096);
        assert_eq!(wider.bytes().len(), 4096);
        assert_eq!(decode(wider.bytes()).unwrap().value, b"kv-cache bytes");
        let not_filled = RecordBuf::with_value("k", 1, 10, 1, |_| false).unwrap();
        assert!(not_filled.is_none());
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert!(RecordBuf::encode(&long, 1, b"", 1).is_err());
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let bytes = encode("k", 7, b"value bytes");
        for at in 0..bytes.len() * 8 {
            let mut bad = bytes.clone();
            bad[at / 8] ^= 1 << (at % 8);
            assert!(decode(&bad).is_err(), "flip of bit {at} went unnoticed");
        }
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    decode(&bytes[..len]),
                    Err(RecordError::Torn { .. }) | Err(RecordError::Corrupt(_))
                ),
                "truncation to {len} went unnoticed"
            );
        }
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            Err(RecordError::Torn {
                expected: bytes.len() as u64,
                found: bytes.len() as u64 - 1
            })
        );
    }
}
