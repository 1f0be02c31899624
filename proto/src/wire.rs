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

use rkyv::rancor;
use rkyv::util::AlignedVec;

use mooring_core::{
    Checksum, ClientId, CopyGrant, DiskReport, DiskSyncAck, Error, ErrorCode, HeartbeatAck, HoldId,
    KeyListing, Millis, PrefetchGrant, PutGrant, ReplicaList, ReplicateConfig, SegmentId,
    SegmentInfo, SegmentSpec, StatsReport, TaskId, TaskReport, WriteId,
};

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"MOOR";
/// The wire format version this build speaks.
pub const WIRE_VERSION: u8 = 14;
/// Length of the frame header.
pub const HEADER_LEN: usize = 24;
/// Largest frame payload accepted (a batch of many keys fits; bulk data travels outside).
pub const MAX_FRAME: usize = 16 << 20;
/// Most bulk bytes one data request may move; clients split larger transfers.
pub const MAX_DATA_REQUEST: u64 = 1 << 30;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A [`MasterRequest`].
    MasterRequest = 1,
    /// A [`MasterResponse`].
    MasterResponse = 2,
    /// A [`DataRequest`] (bulk bytes follow for writes).
    DataRequest = 3,
    /// A [`DataResponse`] (bulk bytes follow for successful reads).
    DataResponse = 4,
    /// A [`Handshake`](crate::auth::Handshake) step, the first frames of every connection.
    Handshake = 5,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::MasterRequest,
            2 => FrameKind::MasterResponse,
            3 => FrameKind::DataRequest,
            4 => FrameKind::DataResponse,
            5 => FrameKind::Handshake,
            _ => return None,
        })
    }
}

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the payload is.
    pub kind: FrameKind,
    /// The sending operation's trace id (see [`crate::trace`]); a response echoes its
    /// request's, which is how a client checks that a reply answers what it asked.
    pub request_id: u64,
    /// Payload length in bytes.
    pub len: u32,
    /// crc32c of the header's first 20 bytes and the payload, as sent.
    pub crc: u32,
    /// crc32c of the header's first 20 bytes, as received (the payload's is appended to it).
    pub prefix_crc: u32,
}

/// Why a frame was refused. The connection it arrived on is closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The first four bytes are not [`MAGIC`] (not a Mooring peer, or a desynchronized stream).
    BadMagic([u8; 4]),
    /// A version this build does not speak.
    BadVersion(u8),
    /// An unknown frame kind.
    BadKind(u8),
    /// A frame of a kind this endpoint does not accept here.
    UnexpectedKind(FrameKind),
    /// Payload longer than [`MAX_FRAME`].
    TooLarge(u32),
    /// The payload does not match its checksum.
    Checksum {
        /// What the header said.
        expected: u32,
        /// What the payload hashes to.
        actual: u32,
    },
    /// The payload passed its checksum but is not a valid message.
    Decode(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::BadMagic(m) => write!(f, "bad magic {m:02x?} (not a Mooring peer?)"),
            FrameError::BadVersion(v) => {
                write!(f, "wire version {v}, this build speaks {WIRE_VERSION}")
            }
            FrameError::BadKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::UnexpectedKind(k) => write!(f, "unexpected frame kind {k:?}"),
            FrameError::TooLarge(n) => write!(f, "frame of {n} bytes exceeds {MAX_FRAME}"),
            FrameError::Checksum { expected, actual } => write!(
                f,
                "checksum mismatch (header {expected:08x}, payload {actual:08x})"
            ),
            FrameError::Decode(e) => write!(f, "undecodable payload: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<FrameError> for Error {
    fn from(e: FrameError) -> Error {
        Error::new(ErrorCode::RPC_FAIL, e.to_string())
    }
}

/// Parses and checks a frame header.
pub fn parse_header(bytes: &[u8; HEADER_LEN]) -> Result<FrameHeader, FrameError> {
    let magic: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if bytes[4] != WIRE_VERSION {
        return Err(FrameError::BadVersion(bytes[4]));
    }
    let kind = FrameKind::from_u8(bytes[5]).ok_or(FrameError::BadKind(bytes[5]))?;
    let request_id = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
    if len as usize > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(FrameHeader {
        kind,
        request_id,
        len,
        crc,
        prefix_crc: crc32c::crc32c(&bytes[..20]),
    })
}

/// Builds a frame header for `payload`.
pub fn header(kind: FrameKind, request_id: u64, payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = WIRE_VERSION;
    h[5] = kind as u8;
    h[8..16].copy_from_slice(&request_id.to_le_bytes());
    h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..20]), payload);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A message type that travels in frames of one kind.
pub trait WireMessage: Sized {
    /// The frame kind that carries it.
    const KIND: FrameKind;
    /// Serializes to a payload.
    fn to_payload(&self) -> AlignedVec;
    /// Validates and deserializes a payload (whose checksum has been checked).
    fn from_payload(payload: &[u8]) -> Result<Self, FrameError>;

    /// A whole frame: header then payload.
    fn to_frame(&self, request_id: u64) -> Vec<u8> {
        let payload = self.to_payload();
        let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
        frame.extend_from_slice(&header(Self::KIND, request_id, &payload));
        frame.extend_from_slice(&payload);
        frame
    }

    /// Checks a received frame's kind and checksum and decodes its payload.
    fn from_frame(header: &FrameHeader, payload: &[u8]) -> Result<Self, FrameError> {
        if header.kind != Self::KIND {
            return Err(FrameError::UnexpectedKind(header.kind));
        }
        let actual = crc32c::crc32c_append(header.prefix_crc, payload);
        if actual != header.crc {
            return Err(FrameError::Checksum {
                expected: header.crc,
                actual,
            });
        }
        Self::from_payload(payload)
    }
}

/// Implements [`WireMessage`] for a message type carried in frames of one kind.
macro_rules! wire_message {
    ($ty:ty, $kind:expr) => {
        impl WireMessage for $ty {
            const KIND: FrameKind = $kind;

            fn to_payload(&self) -> AlignedVec {
                rkyv::to_bytes::<rancor::Error>(self).expect("in-memory serialization")
            }

            fn from_payload(payload: &[u8]) -> Result<Self, FrameError> {
                let decode = |bytes: &[u8]| {
                    rkyv::from_bytes::<$ty, rancor::Error>(bytes)
                        .map_err(|e| FrameError::Decode(e.to_string()))
                };
                if (payload.as_ptr() as usize).is_multiple_of(16) {
                    decode(payload)
                } else {
                    let mut aligned = AlignedVec::<16>::with_capacity(payload.len());
                    aligned.extend_from_slice(payload);
                    decode(&aligned)
                }
            }
        }
    };
}

/// The master's settings that clients need to follow the protocol.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct ClusterInfo {
    /// How long a read lease lasts; readers finish within it or retry.
    pub lease_ttl: Millis,
    /// After this long an unfinished write may be preempted.
    pub put_start_discard_timeout: Millis,
    /// Writers stop writing a grant this long after starting it (their self-fence).
    pub put_start_release_timeout: Millis,
    /// Clients heartbeat well within this.
    pub client_ttl: Millis,
    /// Longest key accepted.
    pub max_key_len: u32,
}

pub use messages::*;

/// A request to the master that names its reply: `control.call(GetReplicaList { key })`
/// returns a [`ReplicaList`], and a reply of another kind is an error, not an arm at every
/// call site. Every request type travels as its [`MasterRequest`] variant of the same name,
/// answered by the [`Reply`] variant of that name.
pub trait Call: Into<MasterRequest> {
    /// What the master answers this request with.
    type Reply;
    /// The request's name, for errors and logs.
    const NAME: &'static str;
    /// The reply of this request's kind, or the reply as received if it is another kind.
    fn from_reply(reply: Reply) -> Result<Self::Reply, Box<Reply>>;
}

/// Declares each master RPC once: its request type (fields), its reply type, and their
/// variants in [`MasterRequest`] and [`Reply`].
macro_rules! master_rpcs {
    ($(
        $(#[$meta:meta])*
        $name:ident { $($field:ident : $fty:ty),* $(,)? } => $reply:ty;
    )*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
            #[rkyv(derive(Debug))]
            pub struct $name { $(pub $field: $fty,)* }

            impl From<$name> for MasterRequest {
                fn from(request: $name) -> MasterRequest {
                    MasterRequest::$name(request)
                }
            }

            impl Call for $name {
                type Reply = $reply;
                const NAME: &'static str = stringify!($name);
                fn from_reply(reply: Reply) -> Result<$reply, Box<Reply>> {
                    match reply {
                        Reply::$name(r) => Ok(r),
                        other => Err(Box::new(other)),
                    }
                }
            }
        )*

        /// A request to the master. Every call that names a client counts as its heartbeat.
        #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
        #[rkyv(derive(Debug))]
        pub enum MasterRequest { $($name($name),)* }

        /// What the master answers: the variant named after the request, carrying its reply.
        #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
        #[rkyv(derive(Debug))]
        pub enum Reply { $($name($reply),)* }

        impl MasterRequest {
            /// The request's name, for errors and logs.
            pub fn name(&self) -> &'static str {
                match self { $(MasterRequest::$name(_) => stringify!($name),)* }
            }

            /// This request archived as its own type (not as the enum of every request,
            /// whose archive is as large as its largest variant), with its name.
            pub fn archive_alone(&self) -> (&'static str, AlignedVec) {
                match self {
                    $(MasterRequest::$name(request) => (
                        stringify!($name),
                        rkyv::to_bytes::<rancor::Error>(request).expect("in-memory serialization"),
                    ),)*
                }
            }

            /// The request named `name` from the bytes [`MasterRequest::archive_alone`]
            /// gave (aligned to 16); why not, if they are not one.
            pub fn from_archived_alone(name: &[u8], bytes: &[u8]) -> Result<MasterRequest, String> {
                $(if name == stringify!($name).as_bytes() {
                    return rkyv::from_bytes::<$name, rancor::Error>(bytes)
                        .map(MasterRequest::$name)
                        .map_err(|e| format!("a {} does not decode: {e}", stringify!($name)));
                })*
                Err(format!("no request is named {:?}", String::from_utf8_lossy(name)))
            }
        }
    };
}

/// The master's RPCs. Each is the master operation of the same name (see
/// [`Master`](mooring_core::Master)), with its arguments and its result; rkyv's generated
/// archive types carry no docs, hence the allowance.
#[allow(missing_docs)]
mod messages {
    use super::*;

    master_rpcs! {
        /// Registers a client; the reply carries the settings it must follow.
        Hello { client: ClientId } => ClusterInfo;
        Heartbeat { client: ClientId } => HeartbeatAck;
        /// The client is done: forget it now rather than after the client TTL.
        Goodbye { client: ClientId } => ();
        MountSegment { client: ClientId, spec: SegmentSpec } => SegmentId;
        UnmountSegment { client: ClientId, name: String } => ();
        /// The segments with these ids (None for one not mounted).
        DescribeSegments { ids: Vec<SegmentId> } => Vec<Option<SegmentInfo>>;
        ListSegments {} => Vec<SegmentInfo>;
        /// Starts a put, or an upsert if `upsert`.
        PutStart {
            client: ClientId,
            key: String,
            size: u64,
            config: ReplicateConfig,
            upsert: bool,
        } => PutGrant;
        /// Ends a put or upsert; `checksum` is the crc32c of the value written.
        PutEnd {
            client: ClientId,
            key: String,
            write: WriteId,
            checksum: Checksum,
        } => ();
        PutRevoke { client: ClientId, key: String, write: WriteId } => ();
        PutAbort { client: ClientId, key: String, write: WriteId } => ();
        BatchPutStart {
            client: ClientId,
            items: Vec<(String, u64)>,
            config: ReplicateConfig,
            upsert: bool,
        } => Vec<Result<PutGrant, Error>>;
        /// Ends many writes: `(key, write, checksum)` each.
        BatchPutEnd {
            client: ClientId,
            items: Vec<(String, WriteId, Checksum)>,
        } => Vec<Result<(), Error>>;
        BatchPutRevoke {
            client: ClientId,
            items: Vec<(String, WriteId)>,
        } => Vec<Result<(), Error>>;
        GetReplicaList { key: String } => ReplicaList;
        BatchGetReplicaList { keys: Vec<String> } => Vec<Result<ReplicaList, Error>>;
        Exist { key: String } => bool;
        BatchExist { keys: Vec<String> } => Vec<Result<bool, Error>>;
        /// `exist(key, prefetch=true)` (docs/prefetch.md); `preferred` are the caller's own
        /// segments.
        ExistPrefetch {
            client: ClientId,
            key: String,
            preferred: Vec<String>,
        } => (bool, Option<PrefetchGrant>);
        BatchExistPrefetch {
            client: ClientId,
            keys: Vec<String>,
            preferred: Vec<String>,
        } => Vec<Result<(bool, Option<PrefetchGrant>), Error>>;
        DiskSync { client: ClientId, segment: SegmentId, report: DiskReport } => DiskSyncAck;
        GetSize { key: String } => u64;
        Remove { key: String } => ();
        /// Removes every removable object; answers how many.
        RemoveAll {} => u64;
        RemoveByRegex { pattern: String } => u64;
        QueryByRegex { pattern: String } => Vec<(String, ReplicaList)>;
        /// Keys matching `pattern` with sizes and replica counts; grants no lease.
        ListKeys { pattern: String } => Vec<KeyListing>;
        AcquireHold { client: ClientId, key: String } => (HoldId, ReplicaList);
        ReleaseHold { client: ClientId, hold: HoldId } => ();
        CopyStart { client: ClientId, key: String, targets: Vec<String> } => CopyGrant;
        MoveStart {
            client: ClientId,
            key: String,
            source: String,
            target: String,
        } => CopyGrant;
        TaskEnd { client: ClientId, task: TaskId } => ();
        TaskRevoke { client: ClientId, task: TaskId } => ();
        /// Gives up a task whose transfers may still land (see `Master::task_abort`).
        TaskAbort { client: ClientId, task: TaskId } => ();
        /// Repair copies for a storage node to carry out (see `Master::take_repairs`).
        TakeRepairs { client: ClientId, max: u32 } => Vec<(String, CopyGrant)>;
        /// The master's stats and census (boxed: the largest reply by far).
        GetStats {} => Box<StatsReport>;
        /// A standby master asks the leader for its state files from `offset` in `at` (the
        /// standby holds everything before that on disk, which acknowledges it); the leader
        /// answers at once when it has more, or after a short wait with nothing.
        Follow { follower: String, at: StateFile, offset: u64 } => FollowChunk;
        /// Mooncake's BatchQueryIp: the hosts of each client's mounted segments (clients
        /// with none are left out).
        BatchQueryIp { clients: Vec<ClientId> } => Vec<(ClientId, Vec<String>)>;
        /// Mooncake's BatchReplicaClear: clears the caller's own objects among `keys`, whole
        /// or (with `segment`) their replicas there; answers the keys cleared.
        BatchReplicaClear {
            client: ClientId,
            keys: Vec<String>,
            segment: Option<String>,
        } => Vec<String>;
        /// Mooncake's QueryTask: where a copy or move task stands (see `Master::query_task`).
        QueryTask { task: TaskId } => TaskReport;
    }
}

impl MasterRequest {
    /// The client the request acts as, if it names one: a server that knows which client a
    /// connection speaks for refuses requests naming another.
    pub fn client(&self) -> Option<ClientId> {
        use MasterRequest as R;
        match self {
            R::Hello(Hello { client })
            | R::Heartbeat(Heartbeat { client })
            | R::Goodbye(Goodbye { client })
            | R::MountSegment(MountSegment { client, .. })
            | R::UnmountSegment(UnmountSegment { client, .. })
            | R::PutStart(PutStart { client, .. })
            | R::PutEnd(PutEnd { client, .. })
            | R::PutRevoke(PutRevoke { client, .. })
            | R::PutAbort(PutAbort { client, .. })
            | R::BatchPutStart(BatchPutStart { client, .. })
            | R::BatchPutEnd(BatchPutEnd { client, .. })
            | R::BatchPutRevoke(BatchPutRevoke { client, .. })
            | R::ExistPrefetch(ExistPrefetch { client, .. })
            | R::BatchExistPrefetch(BatchExistPrefetch { client, .. })
            | R::DiskSync(DiskSync { client, .. })
            | R::AcquireHold(AcquireHold { client, .. })
            | R::ReleaseHold(ReleaseHold { client, .. })
            | R::CopyStart(CopyStart { client, .. })
            | R::MoveStart(MoveStart { client, .. })
            | R::TaskEnd(TaskEnd { client, .. })
            | R::TaskRevoke(TaskRevoke { client, .. })
            | R::TaskAbort(TaskAbort { client, .. })
            | R::TakeRepairs(TakeRepairs { client, .. })
            | R::BatchReplicaClear(BatchReplicaClear { client, .. }) => Some(*client),
            R::DescribeSegments(_)
            | R::ListSegments(_)
            | R::GetReplicaList(_)
            | R::BatchGetReplicaList(_)
            | R::Exist(_)
            | R::BatchExist(_)
            | R::GetSize(_)
            | R::Remove(_)
            | R::RemoveAll(_)
            | R::RemoveByRegex(_)
            | R::QueryByRegex(_)
            | R::ListKeys(_)
            | R::GetStats(_)
            | R::Follow(_)
            | R::BatchQueryIp(_)
            | R::QueryTask(_) => None,
        }
    }

    /// Whether its answer acknowledges a change a client will rely on, so a master that keeps
    /// a journal sends it only once the request is on disk. Reads, existence checks, listings
    /// and heartbeats (a `Hello` is one) need not wait: if one is lost with a crash, so is
    /// everything after it, a restarted master grants every object a fresh lease
    /// (`Master::resume`), and a client it does not know registers again with its next
    /// heartbeat.
    pub fn needs_durability(&self) -> bool {
        use MasterRequest as R;
        !matches!(
            self,
            R::Heartbeat(_)
                | R::Hello(_)
                | R::DescribeSegments(_)
                | R::ListSegments(_)
                | R::GetReplicaList(_)
                | R::BatchGetReplicaList(_)
                | R::Exist(_)
                | R::BatchExist(_)
                | R::GetSize(_)
                | R::QueryByRegex(_)
                | R::ListKeys(_)
                | R::GetStats(_)
                | R::Follow(_)
                | R::BatchQueryIp(_)
                | R::QueryTask(_)
        )
    }

    /// Whether it changes the cluster wholesale (removes many objects, unmounts): logged with
    /// the peer that asked.
    pub fn is_admin(&self) -> bool {
        matches!(
            self,
            MasterRequest::RemoveAll(_)
                | MasterRequest::RemoveByRegex(_)
                | MasterRequest::UnmountSegment(_)
        )
    }
}

/// One of a master's state files (see the store's journal): the snapshot or the journal of a
/// generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub enum StateFile {
    /// `snapshot-G.snap`: the master's state when generation G began.
    Snapshot(u64),
    /// `journal-G.log`: the inputs applied since.
    Journal(u64),
}

/// Bytes of a leader's state file, for a standby to write at `offset` of `file`. When `file`
/// or `offset` differ from what the standby asked for, it starts over there: a new snapshot
/// at offset 0 replaces everything it holds; the next journal at offset 0 follows a
/// completed one.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct FollowChunk {
    /// The file the bytes belong to.
    pub file: StateFile,
    /// Where they go in it.
    pub offset: u64,
    /// The bytes (at most [`FOLLOW_CHUNK`]).
    pub bytes: Vec<u8>,
    /// Whether the file ends with them (a snapshot, or a journal the leader has moved past).
    pub complete: bool,
}

/// How every refusal from a master that does not lead begins (a standby, or a leader whose
/// lease lapsed): a caller given several masters tries the next one.
pub const STANDBY_REFUSAL: &str = "this master is a standby";

/// Most bytes of state file one [`FollowChunk`] carries.
pub const FOLLOW_CHUNK: usize = 1 << 20;

/// A master response: the reply or the error.
pub type MasterResponse = Result<Reply, Error>;

/// A [`MasterRequest`] as it travels, with when it was sent and how long it may still be
/// applied. A stream stalled by a partition delivers its bytes when the partition heals,
/// long after the sender stopped waiting; a master that applied such a request then would
/// act unseen (a remove the caller gave up on taking the value it wrote since). So the
/// master refuses a request that arrives past its validity.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct ControlRequest {
    /// When it was sent: microseconds on the sender's clock for this connection, which
    /// starts at zero as the client sends its handshake answer.
    pub sent_at_us: u64,
    /// How long after `sent_at_us` the master may still apply it: what the sender will still
    /// wait, less the shortest round trip it has seen on this connection (a bound on how far
    /// the master's view of the sender's clock may lag).
    pub valid_for_us: u64,
    /// The request.
    pub request: MasterRequest,
}

/// A byte range of a node's segment memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct Range {
    /// Absolute address (as in a [`mooring_core::ReplicaDescriptor`]).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

pub use data::DataRequest;

#[allow(missing_docs)] // rkyv's generated archive types carry no docs
mod data {
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

pub(crate) use wire_message;

wire_message!(ControlRequest, FrameKind::MasterRequest);
wire_message!(MasterResponse, FrameKind::MasterResponse);
wire_message!(DataRequest, FrameKind::DataRequest);
wire_message!(DataResponse, FrameKind::DataResponse);

#[cfg(test)]
mod tests {
    use super::*;

    /// `request` as a client sends it.
    fn control(request: impl Into<MasterRequest>) -> ControlRequest {
        ControlRequest {
            sent_at_us: 1_234,
            valid_for_us: 1_000_000,
            request: request.into(),
        }
    }

    fn roundtrip<T: WireMessage + PartialEq + std::fmt::Debug>(msg: &T) {
        let frame = msg.to_frame(42);
        let header = parse_header(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(header.request_id, 42);
        assert_eq!(header.len as usize, frame.len() - HEADER_LEN);
        let back = T::from_frame(&header, &frame[HEADER_LEN..]).unwrap();
        assert_eq!(&back, msg);
    }

    #[test]
    fn messages_roundtrip() {
        roundtrip(&control(PutStart {
            client: ClientId(7),
            key: "k".into(),
            size: 4096,
            config: ReplicateConfig::replicas(2).hard_pinned().preferring("seg"),
            upsert: true,
        }));
        roundtrip(&control(BatchExist {
            keys: vec!["a".into(), "b".into()],
        }));
        roundtrip::<MasterResponse>(&Ok(Reply::BatchExist(vec![
            Ok(true),
            Err(ErrorCode::INVALID_PARAMS.into()),
        ])));
        roundtrip::<MasterResponse>(&Err(Error::new(ErrorCode::OBJECT_NOT_FOUND, "gone")));
        roundtrip(&DataRequest::Probe { sent_at_us: 77 });
        roundtrip(&DataRequest::Read {
            key: 9,
            ranges: vec![Range {
                addr: 1 << 40,
                len: 4096,
            }],
        });
        roundtrip::<DataResponse>(&Ok(DataReply::Done));
        roundtrip(&DataRequest::Stage {
            object: "k".into(),
            size: 10,
            write: 3,
        });
        roundtrip::<DataResponse>(&Ok(DataReply::Staged(StagedSlot {
            key: 1,
            rdma_key: None,
            addr: 2,
            len: 3,
            slot: 4,
            ttl_ms: 5,
        })));
    }

    #[test]
    fn each_request_accepts_only_its_own_reply() {
        assert_eq!(GetSize::from_reply(Reply::GetSize(7)), Ok(7));
        assert_eq!(
            GetSize::from_reply(Reply::RemoveAll(7)),
            Err(Box::new(Reply::RemoveAll(7))),
            "same payload type, other request: refused"
        );
        assert_eq!(Remove::from_reply(Reply::Remove(())), Ok(()));
        let request = MasterRequest::from(GetStats {});
        assert_eq!(request.name(), "GetStats");
        assert_eq!(<GetStats as Call>::NAME, "GetStats");
    }

    #[test]
    fn corrupt_frames_are_refused_not_misread() {
        let frame = control(Exist { key: "abc".into() }).to_frame(1);
        let header = parse_header(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        for i in HEADER_LEN..frame.len() {
            for bit in 0..8 {
                let mut bad = frame.clone();
                bad[i] ^= 1 << bit;
                assert!(matches!(
                    ControlRequest::from_frame(&header, &bad[HEADER_LEN..]),
                    Err(FrameError::Checksum { .. })
                ));
            }
        }
        // The request id and the flags are covered too.
        for i in [6, 8, 15] {
            let mut h: [u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().unwrap();
            h[i] ^= 1;
            let header = parse_header(&h).unwrap();
            assert!(matches!(
                ControlRequest::from_frame(&header, &frame[HEADER_LEN..]),
                Err(FrameError::Checksum { .. })
            ));
        }
        let truncated = &frame[HEADER_LEN..frame.len() - 1];
        assert!(ControlRequest::from_frame(&header, truncated).is_err());
        let mut h: [u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().unwrap();
        h[0] = b'X';
        assert!(matches!(parse_header(&h), Err(FrameError::BadMagic(_))));
        h[0] = b'M';
        h[4] = 99;
        assert_eq!(parse_header(&h), Err(FrameError::BadVersion(99)));
        h[4] = WIRE_VERSION;
        h[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_header(&h), Err(FrameError::TooLarge(u32::MAX)));
        assert_eq!(
            DataRequest::from_frame(&header, &frame[HEADER_LEN..]),
            Err(FrameError::UnexpectedKind(FrameKind::MasterRequest))
        );
    }

    #[test]
    fn checksummed_garbage_is_refused_by_validation() {
        // A payload with a correct checksum but random content must decode to an error,
        // never panic.
        let mut rng = mooring_core::rng::Rng::seeded(5);
        for len in [0usize, 1, 7, 16, 64, 333] {
            let payload: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let h = header(FrameKind::MasterRequest, 0, &payload);
            let header = parse_header(&h).unwrap();
            let _ = ControlRequest::from_frame(&header, &payload);
        }
    }

    #[test]
    fn bulk_length_is_bounded() {
        let ok = DataRequest::Write {
            key: 0,
            ranges: vec![Range { addr: 0, len: 10 }, Range { addr: 64, len: 20 }],
            sent_at_us: 5,
            valid_for_us: 1_000,
        };
        assert_eq!(ok.bulk_len(), Some(30));
        assert_eq!(DataRequest::Probe { sent_at_us: 0 }.bulk_len(), Some(0));
        let overflow = DataRequest::Read {
            key: 0,
            ranges: vec![
                Range {
                    addr: 0,
                    len: u64::MAX,
                },
                Range { addr: 0, len: 2 },
            ],
        };
        assert_eq!(overflow.bulk_len(), None);
        let huge = DataRequest::Read {
            key: 0,
            ranges: vec![Range {
                addr: 0,
                len: MAX_DATA_REQUEST + 1,
            }],
        };
        assert_eq!(huge.bulk_len(), None);
    }
}
