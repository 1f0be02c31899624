//! # mooring-core
//!
//! The brain of Mooring, a distributed KV-cache store for LLM inference: the master's whole
//! policy as a pure, deterministic state machine. It decides where replicas go, who may read
//! and for how long, what is pinned, what an upsert does, what is evicted, and what a crashed
//! client leaves behind. It never reads a clock, touches a socket or a file, spawns, or draws
//! randomness it was not seeded with: time comes in as an argument to every call, effects come
//! out as return values and [`Event`]s. Services, simulations and tests drive the same code.
//!
//! The core holds decisions only: no async, no I/O, no `unsafe`. The wire messages, the
//! transport and disk traits and the mapping of requests onto these calls live in
//! `mooring-proto`.
//!
//! Start at [`Master`]. The modules, one concept each:
//!
//! | module | concept |
//! | --- | --- |
//! | `allocator` | per-segment O(1) bin-based offset allocator |
//! | `segments`, `placement` | mounted segments; where replicas go |
//! | `object`, `objects` | per-object metadata and predicates; the key-indexed table |
//! | [`checksum`] | end-to-end value checksums (crc32c) |
//! | `put` | two-phase put (start / end / revoke) |
//! | [`soft_pin`] | soft-pin actions (preserve, enable, disable) and what a write leaves |
//! | `upsert` | upsert by case (docs/upsert.md), with the torn-read window closed |
//! | `reads`, `holds` | replica lists, exist, leases; held reads (refcounts) |
//! | [`census`] | objects by state and the bytes they hold, counted on request |
//! | `remove` | remove, remove-all, remove-by-regex |
//! | `clear` | a client's hosts; clearing a client's own objects or their replicas on a segment |
//! | `eviction` | watermark- and pressure-driven LRU eviction with pin tiers |
//! | `offload` | the SSD tier: offload selection, disk replicas, tombstones, prefetch |
//! | [`disk_copies`], [`staging`] | a storage node's disk: its copies, disk eviction, two-phase deletion; its staging slots |
//! | `zombies`, `discard` | timed-out writes; delayed release of discarded blocks |
//! | `membership`, `clients` | heartbeats, mounts, client expiry |
//! | `replication` | copy and move tasks |
//! | [`tenant`], [`quota`] | tenants' key namespaces, usage and quotas; each member's share of unfinished puts |
//! | [`task_reports`] | what became of a task (QueryTask), the newest ended ones kept |
//! | `repair` | replicas lost with a segment, restored by copy tasks nodes carry out |
//! | `snapshot` | versioned, checksummed rkyv snapshot and restore |
//! | [`log_shipping`], [`leadership`] | standby masters: which records may be acknowledged, who may take over; the leader's lease |
//! | [`invariants`] | the checkers every test layer calls |
//! | [`client`] | the client's side: write fence, read plans and verdicts, write plans, membership timing |

#![forbid(unsafe_code)]

pub mod allocator;
pub mod census;
pub mod checksum;
mod chunked;
mod clear;
pub mod client;
mod clients;
pub mod config;
mod discard;
pub mod disk_copies;
pub mod error;
pub mod events;
mod eviction;
mod holds;
pub mod ids;
pub mod invariants;
mod key_arena;
pub mod key_events;
mod key_index;
pub mod leadership;
pub mod log_shipping;
pub mod master;
mod membership;
pub mod object;
mod objects;
mod offload;
pub mod parallel;
pub mod peer;
mod placement;
mod put;
pub mod quota;
mod reads;
mod remove;
mod repair;
mod replicas;
mod replication;
pub mod rng;
pub mod segments;
mod snapshot;
pub mod soft_pin;
pub mod staging;
pub mod task_reports;
pub mod tenant;
pub mod time;
mod upsert;
mod writers;
mod zombies;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use census::{Census, StatsReport};
pub use checksum::Checksum;
pub use config::{MasterConfig, ReplicateConfig};
pub use error::{Error, ErrorCode, Result};
pub use events::{DiscardCause, Event};
pub use ids::{ClientId, HoldId, SegmentId, TaskId, WriteId};
pub use key_arena::MAX_KEY_LEN;
pub use master::{Master, ReadCounts, Stats, UpsertCounts};
pub use membership::{HeartbeatAck, HeartbeatStatus};
pub use object::{MAX_VALUE_SIZE, Medium, ReplicaDescriptor, ReplicaStatus};
pub use offload::{DiskReport, DiskSyncAck, MAX_OFFLOAD_QUEUE, OffloadOrder, PrefetchGrant};
pub use parallel::{Parallel, Sequential};
pub use put::PutGrant;
pub use reads::{KeyListing, ReplicaList};
pub use replication::CopyGrant;
pub use segments::{SegmentInfo, SegmentSpec};
pub use snapshot::{EncodedSnapshot, SNAPSHOT_VERSION, SnapshotBuffer, SnapshotState};
pub use soft_pin::SoftPinAction;
pub use task_reports::{TaskAction, TaskReport, TaskState};
pub use time::Millis;
