//! # mooring-transport-sim
//!
//! The simulation side of Mooring's seams, for seeded whole-cluster runs under madsim:
//!
//! - [`disk::SimDisk`]: an in-memory [`mooring_proto::disk::Disk`] with latency, EIO, torn
//!   writes and loss of unsynced data on crash (madsim's own file system injects no faults).
//!   It works in any build; its randomness is seeded.
//! - [`state_dir::SimStateDir`]: the master's state directory (journals, snapshots) on a
//!   [`disk::SimDisk`], so its faults reach the journal too; a full disk refuses growing
//!   writes with `StorageFull` ([`disk::DiskFaults::capacity`]).
//! - [`shm::SimSockets`]: same-host shared memory with segments handed over by a call instead
//!   of on a Unix socket (any build).
//! - (`--cfg madsim` builds only) [`SimNet`], [`SimControlPlane`], [`SimDataPlane`],
//!   [`SimDataServer`] and [`serve_rpc`]: the transport traits over madsim endpoints, carrying
//!   the same checksummed frames as TCP, with per-message loss, delay (hence reordering),
//!   duplication, corruption and one-way partitions that a test switches on and off. Like an
//!   RDMA reliable connection, the receiving side drops duplicates and corrupt datagrams;
//!   unlike TCP, nothing is retransmitted: a lost message is a timeout for the caller.

pub mod disk;
pub mod shm;
pub mod state_dir;

#[cfg(madsim)]
mod data;
#[cfg(madsim)]
mod datagram;
#[cfg(madsim)]
mod mux;
#[cfg(madsim)]
mod net;
#[cfg(madsim)]
mod rpc;
#[cfg(madsim)]
mod server;

#[cfg(madsim)]
pub use data::{SimDataPlane, SimDataServer};
#[cfg(madsim)]
pub use net::{NetFaults, NetStats, SimNet};
#[cfg(madsim)]
pub use rpc::{SimControlPlane, serve_rpc};
