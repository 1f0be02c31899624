//! The data plane: what a client asks of a node's data server (byte ranges of segment
//! memory to write or read, staging a disk copy, connecting RDMA or same-host memory) and what
//! the node answers.

use rkyv::rancor;
use rkyv::util::AlignedVec;

use mooring_core::{Error, ErrorCode};

use super::frame::{FrameError, FrameKind, MAX_DATA_REQUEST, WireMessage, wire_message};

/// A byte range of a node's segment memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct Range {
    /// Absolute address (as in a [`mooring_core::ReplicaDescriptor`]).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

pub use request::DataRequest;

#[allow(missing_docs)] // rkyv's generated archive types carry no docs
mod request {
    use super::*;

    /// A one-sided transfer request to a node's data server.
    #[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    #[rkyv(derive(Debug))]
    pub enum DataRequest {
        /// Write the bulk bytes that follow this frame into `ranges`, in order.
        Write {
            /// The segment's access key.
            key: u64,
            /// Where the bytes go.
            ranges: Vec<Range>,
            /// When the writer sent this, in microseconds on the sender's clock for this
            /// connection (see [`DataRequest::Probe`]).
            sent_at_us: u64,
            /// How long after `sent_at_us` the node may still put bytes into the segment. The
            /// master may hand the ranges to another writer once the writer's grant times
            /// out; bytes delayed in the network past this must not land.
            valid_for_us: u64,
        },
        /// Send back the bytes of `ranges`, in order.
        Read {
            /// The segment's access key.
            key: u64,
            /// Where the bytes come from.
            ranges: Vec<Range>,
            /// Some of the reader's destinations do not start on a cache line. A node on TCP
            /// then copies the bytes into its socket rather than lending it the segment's
            /// pages: the reader's kernel copies lent pages into such a destination at about
            /// 60% of its speed for copied ones (measured on loopback, 32 x 4 MiB reads into
            /// memory 16 bytes past a page boundary, where malloc puts large arrays).
            unaligned: bool,
        },
        /// Load the disk copy of `object` (`size` bytes) into the node's staging buffer and
        /// answer where it is ([`DataReply::Staged`]); the reader pulls it with `Read` and then
        /// sends `Unstage`.
        Stage {
            /// The object's key.
            object: String,
            /// Its length, as the master described it.
            size: u64,
            /// The write the master described (a node holding another write of the key
            /// refuses).
            write: u64,
        },
        /// Free a staging slot (a slot never freed is reclaimed after its TTL).
        Unstage {
            /// The slot, from [`DataReply::Staged`].
            slot: u64,
        },
        /// Connect a new RDMA queue pair on the node to the sender's `client` queue pair and
        /// answer the node's ([`DataReply::RdmaConnected`]). `replaces` names a queue pair the
        /// node accepted earlier for the same sender port, which it may drop (the sender
        /// reset its side).
        RdmaConnect {
            /// The sender's queue pair.
            client: QpAddress,
            /// The node's queue pair the new one replaces, if any.
            replaces: Option<u32>,
            /// The segment the sender means to reach through it: a node that does not serve
            /// it (restarted, remounted) refuses, so descriptors from an earlier incarnation
            /// never reach a later one's memory under a memory key it happens to reuse.
            key: u64,
        },
        /// Offer the sender, if it runs on this node's host, a ticket with which to map the
        /// segment with `key` and read and write it by memcpy ([`DataReply::ShmOffer`]).
        /// Asked over this authenticated connection, so only peers holding the cluster token
        /// learn a ticket.
        ShmAttach {
            /// The segment's access key.
            key: u64,
        },
        /// The first request on a connection: answered at once, so the sender learns the
        /// round trip (which bounds this message's delay) and the node can relate the
        /// sender's clock to its own (see `Write::valid_for_us`).
        Probe {
            /// When the sender sent this, on its clock for this connection.
            sent_at_us: u64,
        },
    }

    impl DataRequest {
        /// The request's name, for logs.
        pub fn name(&self) -> &'static str {
            match self {
                DataRequest::Write { .. } => "Write",
                DataRequest::Read { .. } => "Read",
                DataRequest::Stage { .. } => "Stage",
                DataRequest::Unstage { .. } => "Unstage",
                DataRequest::Probe { .. } => "Probe",
                DataRequest::RdmaConnect { .. } => "RdmaConnect",
                DataRequest::ShmAttach { .. } => "ShmAttach",
            }
        }

        /// The bulk bytes the request moves, or `None` if the total overflows or exceeds
        /// [`MAX_DATA_REQUEST`].
        pub fn bulk_len(&self) -> Option<u64> {
            let ranges = match self {
                DataRequest::Write { ranges, .. } | DataRequest::Read { ranges, .. } => ranges,
                DataRequest::Probe { .. }
                | DataRequest::Stage { .. }
                | DataRequest::Unstage { .. }
                | DataRequest::RdmaConnect { .. }
                | DataRequest::ShmAttach { .. } => return Some(0),
            };
            ranges
                .iter()
                .try_fold(0u64, |sum, r| sum.checked_add(r.len))
                .filter(|&n| n <= MAX_DATA_REQUEST)
        }
    }
}

/// An RDMA queue pair's address, as exchanged to connect two of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct QpAddress {
    /// Queue pair number.
    pub qpn: u32,
    /// The port's local identifier (InfiniBand).
    pub lid: u16,
    /// The port's global identifier (RoCE, routed InfiniBand).
    pub gid: [u8; 16],
    /// The first packet sequence number the queue pair sends.
    pub psn: u32,
}

/// Where a node staged a disk copy for a reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct StagedSlot {
    /// The staging buffer's access key on the node's data plane.
    pub key: u64,
    /// Its RDMA remote key, when the node serves RDMA.
    pub rdma_key: Option<u32>,
    /// Address of the value in the staging buffer.
    pub addr: u64,
    /// Length of the value.
    pub len: u64,
    /// The slot to unstage.
    pub slot: u64,
    /// The node reclaims the slot this long after staging it, released or not.
    pub ttl_ms: u64,
}

/// What a successful data request answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub enum DataReply {
    /// Done (read data follows a read's reply).
    Done,
    /// The value is staged here.
    Staged(StagedSlot),
    /// The node's queue pair, connected to the sender's.
    RdmaConnected(QpAddress),
    /// How a sender on the node's host maps a segment.
    ShmOffer(ShmOffer),
}

/// A node's offer of a segment to a client on the same host: present `ticket` on the node's
/// Unix socket `socket` (abstract namespace) and receive the segment's memory descriptor.
/// `host` lets the client see whether it shares the node's host before trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct ShmOffer {
    /// The node's host: its kernel boot id.
    pub host: [u8; 16],
    /// The node's socket: the abstract name `mooring-shm-` followed by these bytes in hex.
    pub socket: [u8; 16],
    /// A one-time ticket for this segment, valid for a few seconds.
    pub ticket: [u8; 16],
    /// What the node's socket sends back with the memory: the client maps only memory that
    /// comes with it (a process on the socket's name that did not make the offer lacks it).
    pub proof: [u8; 16],
}

impl DataReply {
    /// The staged slot of a reply to `Stage` from the node at `endpoint`.
    pub fn into_staged(self, endpoint: &str) -> Result<StagedSlot, Error> {
        match self {
            DataReply::Staged(slot) => Ok(slot),
            other => Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("node {endpoint} answered a stage with {other:?}"),
            )),
        }
    }
}

impl DataReply {
    /// The node's queue pair from a reply to `RdmaConnect` from the node at `endpoint`.
    pub fn into_rdma_connected(self, endpoint: &str) -> Result<QpAddress, Error> {
        match self {
            DataReply::RdmaConnected(address) => Ok(address),
            other => Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("node {endpoint} answered an RDMA connect with {other:?}"),
            )),
        }
    }
}

impl DataReply {
    /// The offer of a reply to `ShmAttach` from the node at `endpoint`.
    pub fn into_shm_offer(self, endpoint: &str) -> Result<ShmOffer, Error> {
        match self {
            DataReply::ShmOffer(offer) => Ok(offer),
            other => Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("node {endpoint} answered a same-host attach with {other:?}"),
            )),
        }
    }
}

/// A node's answer to a data request (read data follows a successful read's response).
pub type DataResponse = Result<DataReply, Error>;

wire_message!(DataRequest, FrameKind::DataRequest);
wire_message!(DataResponse, FrameKind::DataResponse);
