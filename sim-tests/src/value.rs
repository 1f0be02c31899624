//! Self-describing values: every value the workload writes says which key and which write it
//! belongs to, and carries a checksum, so any bytes a read returns can be judged on their own.
//!
//! Layout: `key hash (8) | version (8) | length (4) | crc32c (4) | body`, where the body is
//! pseudo-random bytes seeded by the key and version (so two writes of one key differ
//! everywhere, and a mix of them fails the checksum) and the checksum covers everything else.

/// Bytes before the body; the smallest value the workload writes.
pub const HEADER: usize = 24;

/// A stable 64-bit hash of a key (FNV-1a).
pub fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The value of write `version` of `key`, `len` bytes long (`len >= HEADER`).
pub fn encode(key: &str, version: u64, len: usize) -> Vec<u8> {
    assert!(len >= HEADER, "values are at least {HEADER} bytes");
    let hash = key_hash(key);
    let mut value = vec![0u8; len];
    value[0..8].copy_from_slice(&hash.to_le_bytes());
    value[8..16].copy_from_slice(&version.to_le_bytes());
    value[16..20].copy_from_slice(&(len as u32).to_le_bytes());
    let mut state = hash ^ version.rotate_left(32);
    for chunk in value[HEADER..].chunks_mut(8) {
        state = splitmix(state);
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    let crc = checksum(&value);
    value[20..24].copy_from_slice(&crc.to_le_bytes());
    value
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn checksum(value: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&value[..20]), &value[HEADER..])
}

/// What a read's bytes turn out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judged {
    /// An intact value of this key: the write with this version.
    Intact(u64),
    /// Not an intact value: torn, partial or garbage.
    Torn(String),
    /// An intact value of another key.
    Foreign(u64),
}

/// Judges bytes read for `key`.
pub fn judge(key: &str, bytes: &[u8]) -> Judged {
    if bytes.len() < HEADER {
        return Judged::Torn(format!("{} bytes, shorter than any value", bytes.len()));
    }
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
    if len != bytes.len() {
        return Judged::Torn(format!("header says {len} bytes, read {}", bytes.len()));
    }
    if checksum(bytes) != crc {
        return Judged::Torn(format!(
            "checksum mismatch (header claims version {} of key hash {:#x})",
            field(8),
            field(0)
        ));
    }
    if field(0) != key_hash(key) {
        return Judged::Foreign(field(0));
    }
    Judged::Intact(field(8))
}

/// The value whose disk record includes offset `at` of `bytes` (a disk file's contents), if
/// one of `keys` heads it: the key, the write's version, the value's length and where the
/// value starts. A record is
/// the node's `header` bytes, the key, then the value, every byte of which its checksum
/// covers, so a flip anywhere in it damages the value's copy.
pub fn value_at<'k>(
    bytes: &[u8],
    at: usize,
    keys: &'k [String],
    header: usize,
) -> Option<(&'k str, u64, usize, usize)> {
    let by_hash: std::collections::HashMap<u64, &str> =
        keys.iter().map(|k| (key_hash(k), k.as_str())).collect();
    let longest_key = keys.iter().map(String::len).max()?;
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let last_start = bytes.len().checked_sub(HEADER)?;
    // A value starts at most a record's header and key after `at`, or anywhere before it:
    // the nearest starts on either side are the only candidates.
    let after = (at + 1..=(at + header + longest_key).min(last_start))
        .find(|&p| by_hash.contains_key(&field(p)));
    let before = (0..=at.min(last_start))
        .rev()
        .find(|&p| by_hash.contains_key(&field(p)));
    [after, before].into_iter().flatten().find_map(|start| {
        let key = by_hash[&field(start)];
        let len = u32::from_le_bytes(bytes[start + 16..start + 20].try_into().expect("4 bytes"));
        let end = start + len as usize;
        let record = start.checked_sub(header + key.len())?;
        (record <= at && at < end && end <= bytes.len())
            .then(|| (key, field(start + 8), len as usize, start))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_judge_intact_and_every_kind_of_damage_is_seen() {
        let v = encode("k1", 7, 100);
        assert_eq!(judge("k1", &v), Judged::Intact(7));
        assert_eq!(judge("k2", &v), Judged::Foreign(key_hash("k1")));
        for at in 0..v.len() {
            let mut bad = v.clone();
            bad[at] ^= 4;
            assert!(matches!(judge("k1", &bad), Judged::Torn(_)), "flip at {at}");
        }
        let newer = encode("k1", 8, 100);
        let mut mixed = v.clone();
        mixed[60..].copy_from_slice(&newer[60..]);
        assert!(
            matches!(judge("k1", &mixed), Judged::Torn(_)),
            "half old, half new"
        );
        assert!(matches!(judge("k1", &v[..50]), Judged::Torn(_)));
        assert!(matches!(judge("k1", &[0u8; 100]), Judged::Torn(_)));
        assert_eq!(encode("k", 1, HEADER).len(), HEADER);
    }

    #[test]
    fn the_value_whose_record_spans_an_offset_is_found() {
        let keys = vec!["a".to_string(), "bb".to_string()];
        // Records as a node writes them: a 4-byte header (in this test), the key, the value.
        let mut file = vec![0xEEu8; 10];
        file.extend([0x11; 4]);
        file.extend(b"a");
        file.extend(encode("a", 3, 40)); // the value at 15..55
        file.extend([0xEE; 6]);
        file.extend([0x22; 4]);
        file.extend(b"bb");
        file.extend(encode("bb", 9, 30)); // the record at 61..97, its value at 67..97
        let find = |at| value_at(&file, at, &keys, 4);
        assert_eq!(find(5), None, "before any record");
        assert_eq!(
            find(10),
            Some(("a", 3, 40, 15)),
            "the first byte of a's record header"
        );
        assert_eq!(find(14), Some(("a", 3, 40, 15)), "a's key");
        assert_eq!(find(54), Some(("a", 3, 40, 15)), "a's value's last byte");
        assert_eq!(find(57), None, "between records");
        assert_eq!(find(61), Some(("bb", 9, 30, 67)), "bb's record header");
        assert_eq!(find(66), Some(("bb", 9, 30, 67)), "bb's key");
        assert_eq!(find(96), Some(("bb", 9, 30, 67)));
        assert_eq!(
            value_at(&file[..80], 70, &keys, 4),
            None,
            "a value cut short"
        );
        assert_eq!(
            value_at(&file, 30, &keys[1..], 4),
            None,
            "a key not asked about"
        );
    }
}
