//! # mooring
//!
//! The services of Mooring, a distributed KV-cache store for LLM inference, built on the pure
//! core (`mooring-core`) and a transport (`mooring-transport-tcp`):
//!
//! - [`master_service`]: the master, serving metadata RPCs and running the core's timers;
//! - [`node`]: a storage node contributing segment memory;
//! - [`client`]: the client library (put, get, batches, upsert, exist, remove, queries);
//! - [`presence`]: joining the cluster, heartbeats, and the writer's contact fence;
//! - [`connect`]: connecting clients and nodes over TCP;
//! - [`buggify`]: timing faults that exist only in simulation builds;
//! - [`cluster`]: an embedded cluster (master, nodes, clients in one process);
//! - [`demo`]: the prefill→decode demonstration behind `mooring demo`;
//! - [`metrics`], [`http`]: the master's Prometheus and JSON endpoints.
//!
//! The `mooring` binary (`src/bin/mooring.rs`) wraps these in a CLI.

pub mod bench;
pub mod buggify;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod connect;
pub mod coverage;
pub mod demo;
pub mod disk_tier;
pub mod ha;
pub mod http;
pub mod journal;
pub mod latest;
pub mod master_service;
pub mod memory;
pub mod metrics;
pub mod node;
pub mod preflight;
pub mod presence;
pub mod seq_waiters;
pub mod token;
pub mod transports;
pub mod tuning;

pub use client::Client;
pub use cluster::{EmbeddedCluster, EmbeddedConfig};
pub use connect::{ClientConfig, SegmentConfig, StandaloneNode, random_client_id};
pub use master_service::{MasterService, RunningMaster};
pub use node::{Node, NodeConfig};
pub use presence::{Contribution, Presence};
pub use tuning::{client_spin, server_spin};
