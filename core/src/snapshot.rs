//! Snapshots: the whole metadata state (hard pins included) as bytes, and back.
//!
//! Layout: `MAGIC (8) | version u32 | payload length u64 | crc32c(payload) u32 | payload`, all
//! little-endian; the payload is an rkyv archive of the state. Restore checks the envelope,
//! the checksum, then rkyv's validation, then the invariant checker, so a truncated, corrupt
//! or hand-crafted snapshot is refused with a reason instead of producing a broken master.
//!
//! Times in the state are the old process's clock. Restore shifts them onto the new clock so
//! that every lease, pin, timeout and deadline keeps the time it had left.

use rkyv::rancor;
use rkyv::util::AlignedVec;

use crate::clients::Clients;
use crate::config::MasterConfig;
use crate::discard::Discarded;
use crate::error::{Error, ErrorCode, Result};
use crate::events::EventQueue;
use crate::holds::Holds;
use crate::invariants;
use crate::master::{Counters, Master};
use crate::objects::{ObjectTable, TableParts};
use crate::offload::Disks;
use crate::parallel::{Parallel, Sequential};
use crate::quota::Unfinished;
use crate::replication::Tasks;
use crate::rng::Rng;
use crate::segments::Segments;
use crate::time::Millis;
use crate::zombies::WriteDeadlines;

const MAGIC: [u8; 8] = *b"MOORSNAP";
/// The snapshot format this build writes and reads.
pub const SNAPSHOT_VERSION: u32 = 17;
/// Magic, version, payload length, checksum, and zeros to a 16-byte boundary: the payload of
/// a file mapped whole (page-aligned) is then aligned as the archive needs, and is read in
/// place.
const HEADER_LEN: usize = 8 + 4 + 8 + 4 + 8;

/// Everything a restored master needs.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct State {
    taken_at: Millis,
    rng: Rng,
    segments: Segments,
    objects: TableParts,
    clients: Clients,
    writes: WriteDeadlines,
    discarded: Discarded,
    holds: Holds,
    tasks: Tasks,
    disks: Disks,
    counters: Counters,
}

/// Wraps a payload in the snapshot envelope (header and checksum).
#[cfg(feature = "testkit")]
pub(crate) fn envelope(payload: &[u8]) -> Vec<u8> {
    let mut out = header(payload).to_vec();
    out.extend_from_slice(payload);
    out
}

/// The payload of an envelope built by [`envelope`].
#[cfg(feature = "testkit")]
pub(crate) fn payload(snapshot: &[u8]) -> &[u8] {
    &snapshot[HEADER_LEN.min(snapshot.len())..]
}

/// A master's whole state as of one moment, to be serialized away from the master: taking
/// it costs little (the big tables share their chunks with the master until it writes to
/// them), serializing it costs a pass over everything.
pub struct SnapshotState(State);

/// A serialized snapshot in two pieces, the envelope's header and the payload, so that
/// writing it needs no copy into one buffer.
pub struct EncodedSnapshot {
    header: [u8; HEADER_LEN],
    payload: AlignedVec,
}

impl EncodedSnapshot {
    /// The snapshot's bytes, in order: write them one after the other.
    pub fn pieces(&self) -> [&[u8]; 2] {
        [&self.header, &self.payload]
    }

    /// The snapshot's size in bytes.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Never: a snapshot has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The snapshot's bytes in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        out.extend_from_slice(&self.header);
        out.extend_from_slice(&self.payload);
        out
    }
}

/// A buffer to read a snapshot file into, placed so that its payload starts aligned as the
/// archive needs: a restore from it reads the payload in place instead of copying it (a
/// copy of gigabytes, for tens of millions of objects).
pub struct SnapshotBuffer {
    bytes: AlignedVec<16>,
}

/// Bytes before the file's first byte that put the payload on a 16-byte boundary.
const BUFFER_PAD: usize = HEADER_LEN.next_multiple_of(16) - HEADER_LEN;

impl SnapshotBuffer {
    /// A zeroed buffer for a file of `len` bytes.
    pub fn new(len: usize) -> SnapshotBuffer {
        let mut bytes = AlignedVec::<16>::with_capacity(BUFFER_PAD + len);
        bytes.resize(BUFFER_PAD + len, 0);
        SnapshotBuffer { bytes }
    }

    /// The file's bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[BUFFER_PAD..]
    }

    /// The file's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[BUFFER_PAD..]
    }
}

impl SnapshotState {
    /// Serializes the state, in a buffer of `capacity` bytes to start with (the size of
    /// the last snapshot saves growing it over and over).
    pub fn encode(&self, capacity: usize) -> EncodedSnapshot {
        let payload = rkyv::api::high::to_bytes_in::<_, rancor::Error>(
            &self.0,
            AlignedVec::with_capacity(capacity),
        )
        .expect("in-memory serialization");
        EncodedSnapshot {
            header: header(&payload),
            payload,
        }
    }
}

/// The envelope's header for `payload`.
fn header(payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut out = [0; HEADER_LEN];
    out[..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    out[12..20].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    out[20..24].copy_from_slice(&mooring_crc::append(0, payload).to_le_bytes());
    out
}

impl Master {
    /// The whole state as of now, to serialize later (see [`SnapshotState`]).
    pub fn snapshot_state(&self) -> SnapshotState {
        SnapshotState(State {
            taken_at: self.now,
            rng: self.rng.clone(),
            segments: self.segments.clone(),
            objects: self.objects.parts(),
            clients: self.clients.clone(),
            writes: self.writes.clone(),
            discarded: self.discarded.clone(),
            holds: self.holds.clone(),
            tasks: self.tasks.clone(),
            disks: self.disks.clone(),
            counters: self.counters.clone(),
        })
    }

    /// Serializes the whole state.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_state().encode(0).to_vec()
    }

    /// A canonical dump of the whole state, for checking that a restore is identical.
    #[doc(hidden)]
    pub fn state_fingerprint(&self) -> String {
        format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
            self.now,
            self.rng,
            self.segments,
            self.objects.debug_parts(),
            self.clients,
            self.writes,
            self.discarded,
            self.holds,
            self.tasks,
            self.disks,
            self.counters
        )
    }

    /// Rebuilds a master from [`Master::snapshot`] bytes, with `config` (which may differ from
    /// the one that took the snapshot) and the new clock reading `now`.
    pub fn restore(config: MasterConfig, bytes: &[u8], now: Millis) -> Result<Master> {
        Master::restore_on(config, bytes, Some(now), &Sequential)
    }

    /// Rebuilds a master from [`Master::snapshot`] bytes on the clock that took them (no
    /// time shifted): a journal's entries, timed on that clock, are then replayed onto it.
    /// `parallel` runs the restore's two halves, deriving the key index from the objects and
    /// checking the rest of the state (see [`Parallel`]): a restarting server passes threads.
    pub fn restore_unshifted(
        config: MasterConfig,
        bytes: &[u8],
        parallel: &dyn Parallel,
    ) -> Result<Master> {
        Master::restore_on(config, bytes, None, parallel)
    }

    /// Restores onto the clock reading `now`, or the snapshot's own clock with `None`. After
    /// the archive is read, the key index and the other state derived from the objects are
    /// built while everything else is checked, two halves that read the same objects and
    /// write nothing the other reads, run by `parallel`.
    fn restore_on(
        config: MasterConfig,
        bytes: &[u8],
        now: Option<Millis>,
        parallel: &dyn Parallel,
    ) -> Result<Master> {
        config.validate()?;
        let bad = |what: &str| Error::new(ErrorCode::INVALID_PARAMS, format!("snapshot {what}"));
        if bytes.len() < HEADER_LEN || bytes[..8] != MAGIC {
            return Err(bad("is not a Mooring snapshot (bad magic or too short)"));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != SNAPSHOT_VERSION {
            return Err(Error::new(
                ErrorCode::INVALID_VERSION,
                format!("snapshot version {version}, this build reads {SNAPSHOT_VERSION}"),
            ));
        }
        let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
        let payload = &bytes[HEADER_LEN..];
        if payload.len() as u64 != len {
            return Err(bad(&format!(
                "is truncated or padded: header says {len} payload bytes, found {}",
                payload.len()
            )));
        }
        if mooring_crc::append(0, payload) != crc {
            return Err(bad("checksum mismatch (corrupt)"));
        }
        // Read in place when the payload is aligned (a [`SnapshotBuffer`]), else from a copy.
        let copied;
        let archive = if payload.as_ptr().align_offset(16) == 0 {
            payload
        } else {
            let mut aligned = AlignedVec::<16>::with_capacity(payload.len());
            aligned.extend_from_slice(payload);
            copied = aligned;
            &copied[..]
        };
        let mut state = rkyv::from_bytes::<State, rancor::Error>(archive)
            .map_err(|e| bad(&format!("does not decode: {e}")))?;
        let (from, to) = (state.taken_at, now.unwrap_or(state.taken_at));
        let shift = move |t: Millis| {
            if t >= from {
                to + (t - from)
            } else {
                to - (from - t)
            }
        };
        for object in state.objects.slots.iter_mut().flatten() {
            object.shift_times(shift);
        }
        state.clients.rebase(shift);
        state.writes.rebase(shift);
        state.discarded.rebase(shift);
        state.tasks.rebase(shift);
        state.counters.last_eviction_pass = shift(state.counters.last_eviction_pass);
        let mut master = Master {
            objects: ObjectTable::from_parts(config.seed, state.objects)
                .map_err(|e| bad(&format!("is inconsistent: {e}")))?,
            now: to,
            rng: state.rng,
            segments: state.segments,
            clients: state.clients,
            writes: state.writes,
            discarded: state.discarded,
            holds: state.holds,
            tasks: state.tasks,
            disks: state.disks,
            counters: state.counters,
            events: EventQueue::default(),
            key_changes: Default::default(),
            key_changes_paused: false,
            unfinished: Unfinished::default(),
            config,
        };
        let (mut derived, mut unfinished, mut checked) = (None, None, None);
        parallel.join(
            &mut || {
                derived = Some(master.objects.derive());
                unfinished = Some(Unfinished::rebuild(&master.objects));
            },
            &mut || checked = Some(invariants::check_restored(&master)),
        );
        let inconsistent = |e: &dyn std::fmt::Display| bad(&format!("is inconsistent: {e}"));
        let derived = derived
            .expect("both halves ran")
            .map_err(|e| inconsistent(&e))?;
        checked
            .expect("both halves ran")
            .map_err(|v| inconsistent(&v))?;
        master.objects.install(derived);
        master.unfinished = unfinished.expect("both halves ran");
        Ok(master)
    }

    /// Starts serving again after a restart at `now`: every readable object gets a fresh
    /// lease. A reader may have been granted a lease the restored state does not remember
    /// (its grant never reached the disk); until such a lease would have ended, nothing it
    /// may be reading is evicted, removed or overwritten.
    pub fn resume(&mut self, now: Millis) {
        let now = self.advance(now);
        let lease_ttl = self.config.lease_ttl;
        let slots: Vec<u32> = self
            .objects
            .iter()
            .filter(|(_, object)| object.is_readable())
            .map(|(slot, _)| slot)
            .collect();
        for slot in slots {
            // A lease only: the order eviction takes objects in (their last access) stays.
            self.objects.at_mut(slot).extend_lease(now + lease_ttl);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::Checksum;
    use crate::config::ReplicateConfig;
    use crate::ids::ClientId;
    use crate::segments::SegmentSpec;

    /// [`Parallel`] on two threads, as a server runs a restore.
    struct TwoThreads;

    impl Parallel for TwoThreads {
        fn join(&self, a: &mut (dyn FnMut() + Send), b: &mut (dyn FnMut() + Send)) {
            std::thread::scope(|scope| {
                let first = scope.spawn(a);
                b();
                first.join().expect("the first half ran");
            });
        }
    }

    /// A master with a segment, complete objects and one write in progress.
    fn busy_master() -> Master {
        let mut master = Master::new(MasterConfig::default()).expect("a valid config");
        let node = ClientId(0xA);
        let spec = SegmentSpec {
            name: "node:7000".into(),
            base: 1 << 40,
            size: 1 << 24,
            endpoint: "node:7000".into(),
            key: 7,
            rdma_key: None,
        };
        master
            .mount_segment(node, &spec, Millis(0))
            .expect("mounted");
        let one = ReplicateConfig::single();
        for i in 0..40 {
            let key = format!("tenant-{}/key-{i}", i % 3);
            let grant = master
                .put_start(node, &key, 4096, &one, Millis(1))
                .expect("room");
            if i != 7 {
                let sum = Checksum::of(key.as_bytes());
                master
                    .put_end(node, &key, grant.write_id, sum, Millis(2))
                    .expect("ended");
            }
        }
        master
    }

    #[test]
    fn a_restore_side_by_side_builds_what_one_after_the_other_does_and_refuses_the_same() {
        let master = busy_master();
        let bytes = master.snapshot();
        let config = MasterConfig::default();
        let one_by_one = Master::restore_unshifted(config.clone(), &bytes, &Sequential).unwrap();
        let side_by_side = Master::restore_unshifted(config.clone(), &bytes, &TwoThreads).unwrap();
        for restored in [&one_by_one, &side_by_side] {
            assert_eq!(restored.state_fingerprint(), master.state_fingerprint());
            // What the restore derived, checked the long way: the index finds every key, and
            // the usage per tenant and the unfinished writes' shares add up.
            invariants::check(restored).expect("whole after the restore");
            assert_eq!(restored.objects.tenants(), master.objects.tenants());
            assert_eq!(restored.unfinished, master.unfinished);
        }

        // Damage only the check finds (a counter that disagrees with the objects), and damage
        // only the derivation finds (a key held by two slots): refused either way.
        let mut miscounted = busy_master();
        miscounted.counters.writing_objects += 1;
        let mut twice = busy_master();
        let a = twice.objects.find("tenant-0/key-0").expect("in");
        let b = twice.objects.find("tenant-1/key-1").expect("in");
        let same = twice.objects.at(a).key;
        twice.objects.at_mut(b).key = same;
        for (damaged, why) in [(miscounted, "being written"), (twice, "shares bytes")] {
            let bytes = damaged.snapshot();
            for parallel in [&Sequential as &dyn Parallel, &TwoThreads] {
                let refused = Master::restore_unshifted(config.clone(), &bytes, parallel)
                    .err()
                    .expect("refused");
                assert!(refused.to_string().contains("is inconsistent"), "{refused}");
                assert!(refused.to_string().contains(why), "{refused}");
            }
        }
    }
}
