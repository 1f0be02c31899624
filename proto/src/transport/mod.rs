//! The transport seam: what services need from a network, as traits every transport (TCP,
//! RDMA, the simulation) implements.
//!
//! Two planes. The control plane is request/response RPC to the master. The data plane is
//! one-sided: a client reads or writes byte ranges of a node's registered segment memory,
//! batched, without the node's application code taking part (RDMA READ/WRITE verbs; over TCP a
//! small data server on the node copies between socket and memory; in the caller's own process
//! a memcpy). Nodes make memory reachable with a [`DataServer`].
//!
//! The traits are object-safe (futures are boxed) so services hold `Arc<dyn ...>` and stay
//! transport-agnostic.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `planes` | the [`ControlPlane`], [`DataPlane`] and [`DataServer`] traits, and what they pass |
//! | `memory` | [`SegmentMemory`]: a node's registered bytes and copies in and out of them |
//! | `export` | the [`ExportTable`]: exported segments by access key |
//!
//! Every item is re-exported here: callers name `transport::X`, never the submodule.

mod export;
mod memory;
mod planes;

pub use export::*;
pub use memory::*;
pub use planes::*;
