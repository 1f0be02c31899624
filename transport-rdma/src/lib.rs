//! # mooring-transport-rdma
//!
//! Mooring's RDMA transport: clients read and write nodes' segments with one-sided RDMA READ
//! and WRITE over reliable-connected queue pairs, so a node's CPU takes no part in a transfer.
//!
//! Everything above the raw verbs is ordinary Rust tested without hardware: the few verbs the
//! transport needs form the [`verbs::Verbs`] seam, implemented by a software HCA
//! ([`model::ModelVerbs`], used by the unit tests and the simulation) and, with the `ibverbs`
//! feature, by rdma-sys on a real device ([`device`]).
//!
//! - [`client::RdmaClient`]: batches of transfers planned into work requests (scatter-gather
//!   lists, pieces under the message limit, striped over several queue pairs per peer),
//!   posted with selective signalling and polled with a backing-off busy poll.
//! - [`peer::Peer`]: the pooled queue pairs to one node, connected by exchanging endpoints
//!   through a [`peer::Handshake`] and reset and reconnected after a failure.
//! - [`server::RdmaServer`]: a node's registrations and accepted queue pairs.
//! - [`RdmaDataServer`] and [`RdmaDataPlane`]: the above behind Mooring's transport seam, a
//!   node's data server and a client's data plane that carry data over RDMA and the rest
//!   (the queue-pair handshake, staging) over the transport they wrap.
//!
//! A failed completion becomes `TRANSFER_FAIL`, and a transfer reports failure only after
//! every queue pair it used is in the error state and drained: nothing of it lands later.

pub mod client;
mod data_plane;
pub mod device;
pub mod model;
pub mod peer;
mod plan;
pub mod server;
#[cfg(feature = "ibverbs")]
pub mod sys;
mod transfer;
pub mod verbs;

pub use client::{RdmaClient, RdmaConfig};
pub use data_plane::{RdmaDataPlane, RdmaDataServer};
pub use peer::{Handshake, Peer};
pub use server::RdmaServer;
pub use transfer::PollConfig;
