//! The same-host transport: co-located clients read and write a node's segment by memcpy.
//!
//! A node that serves shm backs its segment with a sealed memfd ([`SharedMemory`]) and
//! listens on a Unix socket in the abstract namespace ([`ShmServer`]). A client asks the node,
//! over the authenticated data-server connection, for an offer ([`DataRequest::ShmAttach`]):
//! the node's host id, its socket name and a one-time ticket. A client on the same host
//! presents the ticket on the socket and receives the memfd (`SCM_RIGHTS`), maps it, and from
//! then on moves bytes with memcpy under the same leases and two-phase put as every other
//! transport ([`ShmDataPlane`]). Every other request (stage, unstage, the attach itself) goes
//! through the wrapped transport, which also carries transfers to nodes on other hosts.
//!
//! Trust: only a peer that passed the cluster-token handshake learns a ticket, and a ticket
//! names one segment and works once within [`TICKET_TTL`]. A client maps only a memfd sealed
//! against shrinking, so a node cannot make its reads fault by truncating the memory later.
//!
//! [`DataRequest::ShmAttach`]: mooring_proto::wire::DataRequest::ShmAttach

mod client;
pub mod handoff;
mod host;
mod memory;
mod peers;
mod server;

pub use client::{Handoff, ShmDataPlane};
pub use host::host_id;
pub use memory::SharedMemory;
pub use peers::{AllowedPeers, PeerCred, peer_cred};
pub use server::{ShmDataServer, ShmServer, TICKET_TTL, socket_address};
