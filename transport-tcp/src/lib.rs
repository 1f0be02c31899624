//! # mooring-transport-tcp
//!
//! Mooring's TCP transport. The control plane is framed request/response RPC
//! ([`TcpControlPlane`], [`spawn_rpc_server`]); the data plane emulates one-sided RDMA reads and
//! writes with a small data server on each node ([`TcpDataServer`], [`TcpDataPlane`]). Frames
//! are `mooring_proto::wire` frames: checksummed, size-limited, rkyv-validated; a bad frame
//! closes its connection with a logged reason and never panics the process.
//!
//! Every connection opens with the cluster-token handshake ([`handshake`]).
//!
//! Built on `madsim-tokio`, so the same code runs on real sockets and inside the simulator.

mod accept;
mod data;
mod framed;
pub mod handshake;
mod lanes;
pub mod limits;
mod peer;
mod peer_clock;
mod rpc;
mod socket;
#[cfg(all(target_os = "linux", not(madsim)))]
mod splice;

pub use data::{DataPlaneConfig, LocalSegments, TcpDataPlane, TcpDataServer};
pub use framed::{Framed, ReadError, bound_late_writes, user_timeout};
pub use peer::{PeerCaller, PeerLinks, PeerService, spawn_peer_server};
pub use rpc::{Discover, TcpControlPlane, spawn_rpc_server, spawn_rpc_server_with_limits};
