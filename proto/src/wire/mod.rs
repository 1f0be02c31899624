//! The wire: every message a client, node or master sends, and the frame that carries it.
//!
//! A frame is a 24-byte header, `MAGIC | version | kind | flags | request id | length | crc32c`
//! (little-endian), then `length` bytes of payload: an rkyv archive of the message. The
//! checksum covers the header's first 20 bytes and the payload, so a corrupted request id or
//! length is caught as surely as a corrupted payload. The receiver checks the header (magic,
//! version, kind, length against [`MAX_FRAME`]), then the checksum, and only then lets rkyv
//! validate and decode the payload: rkyv's validation keeps
//! untrusted bytes memory-safe but accepts many truncated or bit-flipped buffers as different
//! valid messages, so the checksum is what catches corruption. Any failure is a
//! [`FrameError`]; the transport closes that connection and logs why.
//!
//! Data-plane frames ([`DataRequest`]) announce byte ranges; the bulk bytes follow the frame on
//! the stream, outside the checksum (as RDMA payloads carry none either), so a node copies them
//! straight between socket and segment memory.
//!
//! Everything here is pure: encoding and decoding over byte slices, no I/O.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `frame` | the header, its checks, and the [`WireMessage`] trait |
//! | `master` | requests to the master ([`MasterRequest`]) and its replies ([`Reply`]) |
//! | `cluster` | the settings a master hands a client ([`ClusterInfo`]) |
//! | `standby` | what a standby copies from the leader ([`FollowChunk`]) |
//! | `data` | requests to a node's data server ([`DataRequest`]) and its replies |
//! | `peer` | what peers ask each other in peer mode ([`PeerRequest`]) and their replies |
//!
//! Every item is re-exported here: callers name `wire::X`, never the submodule.

mod cluster;
mod data;
mod frame;
mod master;
mod peer;
mod standby;

pub use cluster::*;
pub use data::*;
pub use frame::*;
pub use master::*;
pub use peer::*;
pub use standby::*;

pub(crate) use frame::wire_message;

#[cfg(test)]
mod tests;
