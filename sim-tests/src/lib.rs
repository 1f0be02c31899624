//! # mooring-sim-tests
//!
//! Seeded whole-cluster simulations of Mooring under madsim (build with `--cfg madsim`; see
//! `scripts/sim.sh`). A run starts a master, storage nodes and clients, each a madsim node
//! running the unchanged store code over transport-tcp (on madsim's simulated TCP) or
//! transport-sim (datagrams with injected faults), drives a random workload through a fault
//! plan expanded from the seed, and checks:
//!
//! - safety throughout: the master's invariant checkers every 20 ms of simulated time, and
//!   every value read judged against the history of writes ([`history`]);
//! - liveness at the end: after every fault heals, every client finishes, no key stays in
//!   flight past the discard timeout, every node is mounted again, every key reads back
//!   (or is gone), and once everything is removed the allocators hold no bytes.
//!
//! The same seed replays the same run exactly.

pub mod coverage;
pub mod history;
pub mod leaders;
pub mod peers;
pub mod plan;
pub mod takeover;
pub mod value;

#[cfg(madsim)]
mod group;
#[cfg(madsim)]
mod members;
#[cfg(madsim)]
mod recovery;
#[cfg(madsim)]
pub mod run;
#[cfg(madsim)]
pub mod runner;
#[cfg(madsim)]
mod stranger;
#[cfg(madsim)]
mod workload;
#[cfg(madsim)]
mod world;
