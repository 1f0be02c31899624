//! Where this client last read each value, remembered while that read's lease lasts, so the
//! next read of the key fetches the bytes at once, alongside asking the master, and keeps them
//! when the master's answer names the same value: one round trip instead of two.
//!
//! Why such bytes are the value: inside a lease the master neither frees nor overwrites the
//! replicas it listed (an upsert writes fresh buffers; eviction, removal and moves wait for the
//! lease to end), so bytes read from a remembered replica before its lease ends are the
//! remembered write's. A master answer given during this read that names the same write says
//! that value is still the key's current one, so the read returns what the key held at that
//! answer. The bytes are still checked against the value's checksum, as every read's are.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use mooring_core::{Medium, ReplicaDescriptor, ReplicaList, WriteId};
use tokio::time::Instant;

/// Keys remembered at most: a client reading more distinct keys within a lease remembers the
/// first ones (a few MiB of memory at most).
const CAPACITY: usize = 1 << 16;

/// One remembered read.
#[derive(Clone, Debug)]
pub(super) struct Remembered {
    /// The write whose value the replica holds.
    pub write: WriteId,
    /// A memory replica the lease covered.
    pub replica: ReplicaDescriptor,
    /// When the request that was granted the lease was sent.
    pub asked: Instant,
    /// How long after `asked` bytes read from the replica may still be trusted.
    pub usable: Duration,
}

impl Remembered {
    /// Whether bytes read from the replica until now are covered by the lease.
    pub fn inside_lease(&self) -> bool {
        self.asked.elapsed() < self.usable
    }
}

/// The remembered reads of one client.
#[derive(Default)]
pub(super) struct Locations {
    reads: Mutex<HashMap<Box<str>, Remembered>>,
}

impl Locations {
    /// Remembers that `key`'s value, as `list` (granted to a request sent at `asked`, usable
    /// for `usable`) describes it, was read from `replica`. Only memory replicas the list
    /// names are remembered: a disk copy needs its node to stage it anyway.
    pub fn remember(
        &self,
        key: &str,
        list: &ReplicaList,
        replica: &ReplicaDescriptor,
        asked: Instant,
        usable: Duration,
    ) {
        if replica.medium != Medium::Memory || !list.replicas.contains(replica) {
            return;
        }
        let mut reads = self.reads.lock().expect("locations lock");
        if reads.len() >= CAPACITY && !reads.contains_key(key) {
            reads.retain(|_, r| r.inside_lease());
            if reads.len() >= CAPACITY {
                return;
            }
        }
        reads.insert(
            key.into(),
            Remembered {
                write: list.write,
                replica: *replica,
                asked,
                usable,
            },
        );
    }

    /// `key`'s remembered read, if its lease still lasts.
    pub fn recall(&self, key: &str) -> Option<Remembered> {
        let mut reads = self.reads.lock().expect("locations lock");
        match reads.get(key) {
            Some(r) if r.inside_lease() => Some(r.clone()),
            Some(_) => {
                reads.remove(key);
                None
            }
            None => None,
        }
    }

    /// Forgets `key`'s remembered read (its replica proved unreadable or held another value).
    pub fn forget(&self, key: &str) {
        self.reads.lock().expect("locations lock").remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooring_core::{Checksum, Millis, ReplicaStatus, SegmentId};

    fn replica(addr: u64, medium: Medium) -> ReplicaDescriptor {
        ReplicaDescriptor {
            segment: SegmentId(1),
            addr,
            len: 4096,
            status: ReplicaStatus::Complete,
            medium,
        }
    }

    fn list(replicas: Vec<ReplicaDescriptor>) -> ReplicaList {
        ReplicaList {
            replicas,
            lease_ttl: Millis(5_000),
            checksum: Checksum(7),
            write: WriteId(3),
        }
    }

    #[tokio::test]
    async fn only_listed_memory_replicas_inside_their_lease_are_recalled() {
        let locations = Locations::default();
        let memory = replica(4096, Medium::Memory);
        let disk = replica(9, Medium::Disk);
        let listed = list(vec![memory, disk]);
        let long = Duration::from_secs(60);
        locations.remember("disk", &listed, &disk, Instant::now(), long);
        locations.remember(
            "unlisted",
            &listed,
            &replica(8192, Medium::Memory),
            Instant::now(),
            long,
        );
        locations.remember("k", &listed, &memory, Instant::now(), long);
        assert!(locations.recall("disk").is_none());
        assert!(locations.recall("unlisted").is_none());
        let recalled = locations.recall("k").expect("remembered");
        assert_eq!((recalled.write, recalled.replica), (WriteId(3), memory));
        locations.forget("k");
        assert!(locations.recall("k").is_none());

        let lapsed = Instant::now() - Duration::from_millis(10);
        locations.remember("old", &listed, &memory, lapsed, Duration::from_millis(5));
        assert!(locations.recall("old").is_none(), "its lease is over");
    }
}
