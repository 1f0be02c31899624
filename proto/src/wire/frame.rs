//! The frame: its 24-byte checksummed header, the checks a receiver makes before decoding,
//! and the [`WireMessage`] trait every message type implements to travel in one.

use rkyv::util::AlignedVec;

use mooring_core::{Error, ErrorCode};

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"MOOR";
/// The wire format version this build speaks.
pub const WIRE_VERSION: u8 = 15;
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
    /// A [`MasterRequest`](super::MasterRequest).
    MasterRequest = 1,
    /// A [`MasterResponse`](super::MasterResponse).
    MasterResponse = 2,
    /// A [`DataRequest`](super::DataRequest) (bulk bytes follow for writes).
    DataRequest = 3,
    /// A [`DataResponse`](super::DataResponse) (bulk bytes follow for successful reads).
    DataResponse = 4,
    /// A [`Handshake`](crate::auth::Handshake) step, the first frames of every connection.
    Handshake = 5,
    /// A [`PeerRequest`](super::PeerRequest) (peer mode).
    PeerRequest = 6,
    /// A [`PeerResponse`](super::PeerResponse) (peer mode).
    PeerResponse = 7,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::MasterRequest,
            2 => FrameKind::MasterResponse,
            3 => FrameKind::DataRequest,
            4 => FrameKind::DataResponse,
            5 => FrameKind::Handshake,
            6 => FrameKind::PeerRequest,
            7 => FrameKind::PeerResponse,
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

pub(crate) use wire_message;
