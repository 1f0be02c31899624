//! End-to-end value checksums: the crc32c of a value, computed by the client that puts it,
//! kept by the master with the object, and checked by every reader against the bytes it got.
//!
//! A replica whose bytes do not match is damaged (a bad DIMM, a stray write, a node serving
//! the wrong block): the reader tries another replica and, when none matches, fails instead of
//! returning wrong bytes. The value's checksum does not change when the value moves (copy,
//! move, offload to disk, prefetch back), only when a new value is written.
//!
//! crc32c is hardware-accelerated on x86-64 (SSE 4.2) and aarch64, and composes: checksums of
//! consecutive pieces combine into the checksum of the whole ([`Checksum::then`]), so readers
//! can check pieces as they land, in parallel, and never make a second pass over the value.

/// The crc32c (Castagnoli) of a value's bytes.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq, Eq))]
pub struct Checksum(pub u32);

impl Checksum {
    /// The checksum of no bytes.
    pub const EMPTY: Checksum = Checksum(0);

    /// The checksum of `bytes`.
    pub fn of(bytes: &[u8]) -> Checksum {
        Checksum(crc32c::crc32c(bytes))
    }

    /// The checksum of the bytes this is the checksum of, followed by `more`.
    pub fn append(self, more: &[u8]) -> Checksum {
        Checksum(crc32c::crc32c_append(self.0, more))
    }

    /// The checksum of the bytes this is the checksum of, followed by `next_len` bytes whose
    /// checksum is `next`.
    pub fn then(self, next: Checksum, next_len: u64) -> Checksum {
        let len = usize::try_from(next_len).expect("a piece larger than memory");
        Checksum(crc32c::crc32c_combine(self.0, next.0, len))
    }
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "crc32c {:08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_combine_into_the_whole() {
        let value: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let whole = Checksum::of(&value);
        for cut in [0, 1, 4095, 4096, 9_999, 10_000] {
            let (a, b) = value.split_at(cut);
            assert_eq!(Checksum::of(a).then(Checksum::of(b), b.len() as u64), whole);
            assert_eq!(Checksum::of(a).append(b), whole);
        }
        assert_eq!(Checksum::of(&[]), Checksum::EMPTY);
    }

    #[test]
    fn one_flipped_bit_changes_it() {
        let mut value = vec![0xA5u8; 4096];
        let good = Checksum::of(&value);
        value[1234] ^= 0x10;
        assert_ne!(Checksum::of(&value), good);
    }
}
