//! The operation-sequence harness shared by the proptest model test and the fuzz targets: a
//! small language of operations ([`Op`]), and a [`Harness`] that runs them against
//! a real [`Master`](crate::master::Master) while a reference model ([`model`]) and a
//! byte-level memory ([`memory`]) judge every result and event, and
//! [`crate::invariants::check`] runs after every step.
//!
//! The harness plays honest clients, including zombies: a client whose write was preempted
//! keeps writing into its old grant until it learns otherwise (or the release timeout runs
//! out), which is exactly the behaviour the master's delayed release must survive. Reads are
//! judged by content: a get must return the bytes of the key's current version, and a read
//! issued earlier and carried out later, inside its lease, the bytes of the version current
//! when it was issued. Torn, stale or foreign bytes fail the run.
//!
//! It also plays each segment name's node disk (the SSD tier), driving the core's own
//! node-side policy ([`DiskCopies`](crate::disk_copies::DiskCopies)) as the real node does:
//! offload orders are copied out of memory inside their lease, written, evicted from disk in
//! two phases, deleted by tombstone, and reported as recovered after every (re)mount. The
//! model predicts which objects have disk copies (so reads of disk replicas are judged by
//! content too), disk-only objects after eviction, the tombstones, and which recovered
//! copies the master adopts.
//!
//! By concern: `ops` (the operations and their decoding), `harness` (the state and its
//! stepping), `membership`, `writes`, `reads`, `holds`, `removal`, `tasks` (copy and move),
//! `disk` (the node disks and disk syncs), `disk_report` (the model's prediction of a sync), `bad_input`, `events` (what the master reports,
//! evictions included) and `fuzz` (the fuzz entry points and the sample snapshot).

pub mod memory;
pub mod model;

mod bad_input;
mod disk;
mod disk_report;
mod events;
mod fuzz;
mod harness;
mod holds;
mod membership;
mod ops;
mod reads;
mod removal;
mod tasks;
mod writes;

use std::fmt::Debug;

use crate::config::MasterConfig;
use crate::error::{ErrorCode, Result as CoreResult};
use crate::ids::ClientId;
use crate::object::{ReplicaDescriptor, ReplicaStatus};
use crate::time::Millis;
use model::MReplica;

pub use fuzz::{fuzz_one, fuzz_snapshot};
pub use harness::Harness;
pub use ops::{Op, Pin, ops_from_bytes};

/// Clients the harness plays.
pub const CLIENTS: u8 = 3;
/// Segment names it mounts.
pub const SEGMENTS: u8 = 4;
/// Keys it uses (few, so operations collide).
pub const KEYS: u8 = 12;

/// The key numbered `k`.
pub fn key_name(k: u8) -> String {
    format!("k{}", k % KEYS)
}

fn client_id(c: u8) -> ClientId {
    ClientId(0xC11E_0000 + u128::from(c % CLIENTS))
}

fn client_index(id: ClientId) -> usize {
    (id.0 - 0xC11E_0000) as usize
}

fn segment_name(s: u8) -> String {
    format!("seg{}", s % SEGMENTS)
}

/// The configuration the harness runs with: short timeouts so they all fire.
pub fn harness_config(seed: u64) -> MasterConfig {
    MasterConfig {
        seed,
        lease_ttl: Millis(100),
        lease_grace: Millis(10),
        default_soft_pin_ttl: Millis(800),
        allow_evict_soft_pinned: seed.is_multiple_of(2),
        eviction_high_watermark: 0.85,
        eviction_ratio: 0.1,
        eviction_retry_interval: Millis(50),
        put_start_discard_timeout: Millis(400),
        put_start_release_timeout: Millis(1500),
        client_ttl: Millis(1200),
        max_key_len: 64,
        max_replicas: 4,
        // The harness plays a small disk for each segment name ([`Op::DiskSync`]): eviction
        // offloads to it, and disk-only objects, disk eviction, tombstones and recovery are
        // judged by the model like everything else.
        offload_on_evict: true,
        offload_write_through: false,
        offload_ahead_watermark: 0.3,
        // Low enough that a client's unfinished puts reach it now and then.
        unfinished_put_share: 0.5,
        tenant_quotas: Vec::new(),
    }
}

fn expect_code<T: Debug>(got: &CoreResult<T>, code: ErrorCode, what: &str) -> Result<(), String> {
    match got {
        Err(e) if e.code == code => Ok(()),
        other => Err(format!("{what}: expected {code}, got {other:?}")),
    }
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(what()) }
}

fn to_model_replica(r: &ReplicaDescriptor) -> MReplica {
    MReplica {
        segment: r.segment,
        addr: r.addr,
        complete: r.status == ReplicaStatus::Complete,
    }
}
