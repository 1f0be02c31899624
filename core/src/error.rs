//! Errors, with Mooncake Store's numeric codes.
//!
//! Callers written against Mooncake read the same numbers (`OBJECT_NOT_FOUND = -704`, ...). Each
//! code also carries a sentence saying what it means and what to do about it; an [`Error`] may
//! add a detail naming the offending value.

// The variants keep Mooncake's SCREAMING_CASE names so grepping either codebase finds both.
#![allow(non_camel_case_types)]

use std::fmt;

/// Declares the codes once: the enum, Mooncake's number and the advice come from one table.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $name:ident = $code:literal, $advice:literal;)*) => {
        /// A Mooncake Store error code; [`ErrorCode::code`] is Mooncake's numeric value.
        #[derive(
            Clone,
            Copy,
            Debug,
            PartialEq,
            Eq,
            Hash,
            PartialOrd,
            Ord,
            rkyv::Archive,
            rkyv::Serialize,
            rkyv::Deserialize,
        )]
        #[rkyv(derive(Debug, PartialEq, Eq))]
        pub enum ErrorCode {
            $($(#[$doc])* $name,)*
        }

        impl ErrorCode {
            /// Every code, for tables and round-trip tests.
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$name,)*];

            /// Mooncake's numeric value.
            pub const fn code(self) -> i32 {
                match self {
                    $(ErrorCode::$name => $code,)*
                }
            }

            /// What the code means and what the caller can do about it.
            pub const fn advice(self) -> &'static str {
                match self {
                    $(ErrorCode::$name => $advice,)*
                }
            }
        }
    };
}

error_codes! {
    /// An unexpected internal failure; a bug report is warranted.
    INTERNAL_ERROR = -1, "internal error; please report it with the logs";
    /// A buffer was too small for the data.
    BUFFER_OVERFLOW = -10, "the destination buffer is smaller than the value; size it with get_size";
    /// The named segment is not mounted.
    SEGMENT_NOT_FOUND = -101, "no segment with that name is mounted";
    /// A segment with that name is already mounted.
    SEGMENT_ALREADY_EXISTS = -102, "a segment with that name is already mounted; unmount it first or pick another name";
    /// The client is not known to the master.
    CLIENT_NOT_FOUND = -103, "the master does not know this client; it must heartbeat and remount";
    /// No segment had room for even one replica.
    NO_AVAILABLE_HANDLE = -200, "no segment has room for the value, even after eviction; add nodes, free objects, or unpin some";
    /// A snapshot or frame carries a version this build does not read.
    INVALID_VERSION = -300, "incompatible format version; both sides must run compatible releases";
    /// The key is empty, too long, or otherwise unusable.
    INVALID_KEY = -400, "the key is empty or too long";
    /// Writing the value to its replicas failed.
    WRITE_FAIL = -500, "writing the value to its replicas failed; retry the put";
    /// An argument was out of range or inconsistent.
    INVALID_PARAMS = -600, "an argument is out of range or inconsistent";
    /// The operation came from a client other than the one that owns the write (or id, or
    /// segment), or from a member whose credential lacks the role it needs.
    ILLEGAL_CLIENT = -601, "this client may not do that: another client owns what it names (a write it was preempted from, another's id or segment), or its credential lacks the role";
    /// A write was invalid.
    INVALID_WRITE = -700, "the write is not valid in the object's current state";
    /// A read was invalid.
    INVALID_READ = -701, "the read is not valid in the object's current state";
    /// A replica was invalid.
    INVALID_REPLICA = -702, "the replica is not valid";
    /// The object exists but no replica is complete yet (a put or upsert is in progress).
    REPLICA_IS_NOT_READY = -703, "the object is being written (put or upsert in progress); retry after it completes";
    /// No object has that key.
    OBJECT_NOT_FOUND = -704, "no object has this key (it was never written, removed, or evicted)";
    /// An object with that key already exists (use upsert to replace it).
    OBJECT_ALREADY_EXISTS = -705, "an object with this key exists; objects are immutable, use upsert";
    /// A reader holds a lease on the object.
    OBJECT_HAS_LEASE = -706, "a reader holds a lease on the object; retry after the lease expires";
    /// The lease ran out before the transfer finished; the data read is not trusted.
    LEASE_EXPIRED = -707, "the read lease ran out before the transfer finished; retry the get";
    /// A copy, move or offload task is running on the object.
    OBJECT_HAS_REPLICATION_TASK = -708, "a copy, move or offload is running on the object; retry after it finishes";
    /// No replication task with that id exists.
    OBJECT_NO_REPLICATION_TASK = -709, "no copy or move task with that id is running (or, for a query, remembered)";
    /// The object has no replica where one was expected.
    REPLICA_NOT_FOUND = -710, "the object has no replica there";
    /// The object already has a replica on that segment.
    REPLICA_ALREADY_EXISTS = -711, "the object already has a replica on that segment";
    /// A held read refers to replicas that are gone.
    REPLICA_IS_GONE = -712, "the held replicas are gone (the object was replaced or removed)";
    /// Readers registered with the master are still reading the replicas.
    OBJECT_REPLICA_BUSY = -714, "readers registered with the master are still reading the object; retry after they finish";
    /// A data transfer failed.
    TRANSFER_FAIL = -800, "a data transfer failed; the peer may be down or the network unreliable";
    /// An RPC failed: the peer is unreachable, timed out, or sent a bad frame.
    RPC_FAIL = -900, "an RPC failed: the peer is unreachable, timed out, or sent a bad frame";
    /// The service is not in a state that allows the operation (shutting down, not ready).
    UNAVAILABLE_IN_CURRENT_STATUS = -1010, "the service cannot do this now (starting or stopping)";
    /// The operation is not available in this mode or build.
    UNAVAILABLE_IN_CURRENT_MODE = -1011, "this operation is not available in this mode or build";
    /// A file was not found.
    FILE_NOT_FOUND = -1100, "the file does not exist";
    /// A file could not be opened.
    FILE_OPEN_FAIL = -1101, "the file could not be opened";
    /// Reading a file failed.
    FILE_READ_FAIL = -1102, "reading the file failed";
    /// Writing a file failed.
    FILE_WRITE_FAIL = -1103, "writing the file failed";
}

impl ErrorCode {
    /// The code with Mooncake's numeric value `value`, if there is one.
    pub fn from_code(value: i32) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.code() == value)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} ({})", self.code())
    }
}

/// An error from the core or any service built on it: a Mooncake code plus, where it helps, a
/// detail naming the offending value.
#[derive(Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct Error {
    /// The Mooncake error code.
    pub code: ErrorCode,
    /// What exactly was wrong, when the code alone does not say.
    pub detail: Option<Box<str>>,
}

impl Error {
    /// An error with a detail message.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Error {
        Error {
            code,
            detail: Some(detail.into().into_boxed_str()),
        }
    }
}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Error {
        Error { code, detail: None }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.detail {
            Some(detail) => write!(f, "{}: {detail}; {}", self.code, self.code.advice()),
            None => write!(f, "{}: {}", self.code, self.code.advice()),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

impl PartialEq<ErrorCode> for Error {
    fn eq(&self, other: &ErrorCode) -> bool {
        self.code == *other
    }
}

/// The core's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_mooncake_numbers() {
        assert_eq!(ErrorCode::OBJECT_NOT_FOUND.code(), -704);
        assert_eq!(ErrorCode::OBJECT_HAS_LEASE.code(), -706);
        assert_eq!(ErrorCode::OBJECT_REPLICA_BUSY.code(), -714);
        assert_eq!(ErrorCode::NO_AVAILABLE_HANDLE.code(), -200);
        assert_eq!(ErrorCode::REPLICA_IS_NOT_READY.code(), -703);
        assert_eq!(ErrorCode::INVALID_PARAMS.code(), -600);
        assert_eq!(ErrorCode::ILLEGAL_CLIENT.code(), -601);
    }

    #[test]
    fn every_code_round_trips_through_its_number() {
        for &code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_code(code.code()), Some(code));
            assert!(!code.advice().is_empty());
        }
        assert_eq!(ErrorCode::from_code(0), None);
        assert_eq!(ErrorCode::from_code(-99999), None);
    }

    #[test]
    fn display_names_code_number_detail_and_advice() {
        let e = Error::new(ErrorCode::INVALID_KEY, "key is 5000 bytes, limit 4096");
        let s = e.to_string();
        assert!(s.contains("INVALID_KEY (-400)"), "{s}");
        assert!(s.contains("5000 bytes"), "{s}");
        assert!(s.contains("too long"), "{s}");
    }
}
