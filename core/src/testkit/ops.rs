//! The language of scenarios: the operations ([`Op`], [`Pin`]) and their decoding from raw
//! bytes. Fields pick among the harness's few clients, keys, segments, grants and tasks, so any
//! bytes decode to meaningful steps; the variants, their order and their fields are the fuzz
//! corpora's format, so changing them changes what every stored input means.

use arbitrary::Arbitrary;

/// How a put asks to be pinned.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum Pin {
    /// No pin.
    None,
    /// Soft pin with the default TTL.
    Soft,
    /// Soft pin with its own TTL (ms).
    SoftTtl(u16),
    /// Hard pin.
    Hard,
    /// Drop any soft pin (`SoftPinAction::Disable`).
    Unpin,
}

/// One step of a scenario. Numeric fields pick among the harness's few clients, keys,
/// segments, grants and tasks (modulo their count), so any bytes make a meaningful step.
#[allow(missing_docs)]
#[derive(Clone, Debug, Arbitrary)]
pub enum Op {
    /// Time passes (no call).
    Advance { ms: u16 },
    /// The driver calls `tick`.
    Tick,
    /// The driver calls `tick` only if `next_deadline` has come.
    TickIfDue,
    /// A client heartbeats.
    Heartbeat { client: u8 },
    /// A client mounts a segment (or retries a mount).
    Mount { client: u8, segment: u8, kib: u8 },
    /// A client unmounts a segment.
    Unmount { client: u8, segment: u8 },
    /// PutStart.
    Put {
        client: u8,
        key: u8,
        size: u16,
        replicas: u8,
        pin: Pin,
        prefer: Option<u8>,
    },
    /// UpsertStart.
    Upsert {
        client: u8,
        key: u8,
        size: u16,
        replicas: u8,
        pin: Pin,
        prefer: Option<u8>,
    },
    /// A client writes (all or half of) the value of one of its grants.
    Transfer {
        client: u8,
        grant: u8,
        partial: bool,
    },
    /// PutEnd/UpsertEnd of one of a client's grants.
    End { client: u8, grant: u8 },
    /// PutRevoke/UpsertRevoke of one of a client's grants.
    Revoke { client: u8, grant: u8 },
    /// PutAbort of one of a client's grants (it may keep writing until its fence).
    Abort { client: u8, grant: u8 },
    /// GetReplicaList, reading the bytes at once; `keep` also remembers it for a later read.
    Get { key: u8, keep: bool },
    /// Carries out a remembered read, if its lease still allows.
    ReadLate { read: u8 },
    /// Exist.
    Exist { key: u8 },
    /// QueryByRegex on a key prefix.
    Query { prefix: u8 },
    /// Remove.
    Remove { key: u8 },
    /// RemoveAll.
    RemoveAll,
    /// RemoveByRegex on a key prefix.
    RemoveByRegex { prefix: u8 },
    /// A held read.
    Hold { client: u8, key: u8 },
    /// Releases a held read (possibly another client's).
    Release { client: u8, hold: u8, foreign: bool },
    /// CopyStart to a segment.
    Copy { client: u8, key: u8, target: u8 },
    /// MoveStart between segments.
    Move {
        client: u8,
        key: u8,
        source: u8,
        target: u8,
    },
    /// A client copies the bytes of one of its tasks.
    TaskTransfer { client: u8, task: u8 },
    /// Ends one of a client's tasks.
    TaskEnd { client: u8, task: u8 },
    /// Revokes one of a client's tasks.
    TaskRevoke { client: u8, task: u8 },
    /// Snapshot and restore; the restored master must be identical and carries on.
    Snapshot,
    /// A malformed request; it must be refused with the right code and change nothing.
    BadInput { kind: u8 },
    /// One round of a segment's node disk: carry out tombstones, copy the last orders (or
    /// fail them all), evict from disk (down to half its capacity if `evict`), write, and
    /// sync with the master taking up to `want % 5` new orders. After a (re)mount it reports
    /// everything on the disk as recovered.
    DiskSync {
        segment: u8,
        want: u8,
        fail: bool,
        evict: bool,
    },
    /// A client says goodbye (a CLI call ending, a store closing).
    Goodbye { client: u8 },
}

/// Decodes an op sequence from raw bytes (the fuzz target's input format).
pub fn ops_from_bytes(data: &[u8]) -> Vec<Op> {
    let mut u = arbitrary::Unstructured::new(data);
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < 512 {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    ops
}
