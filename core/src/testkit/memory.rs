//! The bytes: a stand-in for the nodes' registered memory, so the harness can write values the
//! way clients would and judge every read by content.
//!
//! Every value written is a pattern derived from a globally unique version number, so a read
//! tells exactly which version it saw, and torn, stale or foreign bytes cannot pass.

use std::collections::BTreeMap;

use crate::ids::SegmentId;
use crate::object::ReplicaDescriptor;

/// The byte at position `i` of the value of `version`.
pub fn pattern_byte(version: u64, i: u64) -> u8 {
    let mut z = version
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i / 8);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> ((i % 8) * 8)) as u8
}

/// The whole value of `version`, `len` bytes.
pub fn pattern(version: u64, len: u64) -> Vec<u8> {
    (0..len).map(|i| pattern_byte(version, i)).collect()
}

/// One mounted segment's memory.
struct Region {
    base: u64,
    bytes: Vec<u8>,
}

/// All mounted segments' memory, by segment id.
#[derive(Default)]
pub struct Memory {
    regions: BTreeMap<SegmentId, Region>,
}

impl Memory {
    /// A node registered `size` zeroed bytes at `base` for segment `id`.
    pub fn mount(&mut self, id: SegmentId, base: u64, size: u64) {
        self.regions.insert(
            id,
            Region {
                base,
                bytes: vec![0; size as usize],
            },
        );
    }

    /// The node went away with its memory.
    pub fn unmount(&mut self, id: SegmentId) {
        self.regions.remove(&id);
    }

    /// Writes the first `upto` bytes of `version`'s value into a replica. Returns false if the
    /// segment's memory is gone (the write went nowhere) or the range is outside it.
    pub fn write(&mut self, replica: &ReplicaDescriptor, version: u64, upto: u64) -> bool {
        let Some(region) = self.regions.get_mut(&replica.segment) else {
            return false;
        };
        let Some(start) = replica.addr.checked_sub(region.base) else {
            return false;
        };
        let end = start + upto.min(replica.len);
        if end as usize > region.bytes.len() {
            return false;
        }
        for (i, byte) in region.bytes[start as usize..end as usize]
            .iter_mut()
            .enumerate()
        {
            *byte = pattern_byte(version, i as u64);
        }
        true
    }

    /// Reads a replica's bytes, or `None` if its memory is gone or out of range.
    pub fn read(&self, replica: &ReplicaDescriptor) -> Option<Vec<u8>> {
        let region = self.regions.get(&replica.segment)?;
        let start = replica.addr.checked_sub(region.base)? as usize;
        let end = start.checked_add(replica.len as usize)?;
        region.bytes.get(start..end).map(<[u8]>::to_vec)
    }

    /// Copies one replica's bytes to another (a copy task's transfer).
    pub fn copy(&mut self, from: &ReplicaDescriptor, to: &ReplicaDescriptor) -> bool {
        let Some(bytes) = self.read(from) else {
            return false;
        };
        let Some(region) = self.regions.get_mut(&to.segment) else {
            return false;
        };
        let Some(start) = to.addr.checked_sub(region.base) else {
            return false;
        };
        let start = start as usize;
        match region.bytes.get_mut(start..start + bytes.len()) {
            Some(dest) => {
                dest.copy_from_slice(&bytes);
                true
            }
            None => false,
        }
    }
}

/// Which version `bytes` is, among `candidates`, if any.
pub fn identify(bytes: &[u8], candidates: &[u64]) -> Option<u64> {
    candidates.iter().copied().find(|&version| {
        bytes
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern_byte(version, i as u64))
    })
}
