//! # mooring
//!
//! The services of Mooring, a distributed KV-cache store for LLM inference, built on the pure
//! core (`mooring-core`) and the transports. A folder per role:
//!
//! - [`master`]: the master, serving metadata RPCs and running the core's timers, with its
//!   journal (`master::journal`);
//! - [`ha`]: standby masters: shipping the journal, following it, taking over through etcd;
//! - [`node`]: a storage node contributing segment memory ([`Node`]), its disk tier, and the
//!   standalone node process ([`StandaloneNode`]);
//! - [`client`]: the client library (put, get, batches, upsert, exist, remove, queries), how a
//!   member joins and heartbeats (`client::presence`) and connects over TCP
//!   (`client::connect`); its rules are `mooring_core::client`'s;
//! - [`ops`]: running and watching a cluster: metrics and the dashboard over HTTP, the
//!   benchmark, the demo;
//! - [`cluster`]: an embedded cluster (master, nodes, clients in one process).
//!
//! Shared by all of them: [`config`] (the config file), [`token`] (the cluster token),
//! [`transports`] (choosing a transport), [`clock`], [`tuning`], and the simulation's
//! [`buggify`] and [`coverage`], which compile away outside simulation builds.
//!
//! The `mooring` binary (`src/bin/mooring/`) wraps these in a CLI.

pub use mooring_proto::buggify;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod coverage;
pub mod ha;
pub mod master;
pub mod node;
pub mod ops;
pub mod peer;
pub mod token;
pub mod transports;
pub mod tuning;

pub use client::Client;
pub use client::connect::{ClientConfig, SegmentConfig, client_id_for, random_client_id};
pub use client::presence::{Contribution, Presence};
pub use cluster::{EmbeddedCluster, EmbeddedConfig};
pub use master::{MasterService, RunningMaster};
pub use node::standalone::StandaloneNode;
pub use node::{Node, NodeConfig};
pub use tuning::{client_spin, server_spin};
