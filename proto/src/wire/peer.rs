//! Peer mode's wire: what peers tell each other about the directory (see
//! `mooring_core::peer`), and what a reader asks of a key's owner or of the data's peer.
//!
//! The sending peer's name is never in a message: a receiver takes it from the connection's
//! credential, so a peer cannot publish into, or unpublish from, another peer's pool.

use rkyv::rancor;
use rkyv::util::AlignedVec;

use mooring_core::peer::directory::Location;
use mooring_core::peer::membership::MemberInfo;
use mooring_core::peer::state::DirectoryMessage;
use mooring_core::{Error, ErrorCode};

use super::frame::{FrameError, FrameKind, WireMessage, wire_message};

/// The most directory messages or keys one request carries.
pub const MAX_PEER_BATCH: usize = 4096;
/// The longest key a peer accepts (the master's default limit).
pub const MAX_PEER_KEY: usize = 4096;
/// The longest peer name a location may carry.
pub const MAX_PEER_NAME: usize = 255;

pub use request::{PeerReply, PeerRequest};

#[allow(missing_docs)] // rkyv's generated archive types carry no docs
mod request {
    use super::*;

    /// What one peer asks of another.
    #[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    #[rkyv(derive(Debug))]
    pub enum PeerRequest {
        /// Directory messages from the sending peer, in order.
        Directory {
            /// The messages.
            messages: Vec<DirectoryMessage>,
        },
        /// Where each key's latest value is, as the receiver's shard knows.
        Lookup {
            /// The keys.
            keys: Vec<String>,
        },
        /// Bring `key`'s value back from the receiver's disk into its pool.
        Promote {
            /// The key.
            key: String,
        },
        /// A membership greeting: the sender describes itself and the peers it knows of.
        Hello {
            /// The sender, as it describes itself (its name must be its credential's).
            me: MemberInfo,
            /// The peers it knows of.
            known: Vec<String>,
        },
        /// From a client with no pool of its own: store `value` under `key` in the
        /// receiver's pool and publish it.
        Put {
            /// The key.
            key: String,
            /// The value.
            value: Vec<u8>,
        },
        /// From a client with no pool of its own: find `key` and read its latest value.
        Get {
            /// The key.
            key: String,
        },
        /// From a client with no pool of its own: whether each key has a value.
        Exists {
            /// The keys.
            keys: Vec<String>,
        },
        /// From a client with no pool of its own: remove `key`.
        Remove {
            /// The key.
            key: String,
        },
        /// The sending peer (the one that greeted on this connection) is leaving: drop it
        /// from the ring now rather than after its silence.
        Leave,
    }

    /// A peer's answer.
    #[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    #[rkyv(derive(Debug))]
    pub enum PeerReply {
        /// What the directory messages caused for their sender (answers to its publishes).
        Directory {
            /// The messages for the sender.
            replies: Vec<DirectoryMessage>,
        },
        /// One answer per key looked up, in order.
        Locations {
            /// Where each key is, if known.
            found: Vec<Option<Location>>,
        },
        /// Where the promoted value is now (`None`: the peer no longer holds it).
        Promoted {
            /// Its location.
            location: Option<Location>,
        },
        /// The answer to a greeting: the receiver describes itself and the peers it knows of.
        Welcome {
            /// The receiver.
            me: MemberInfo,
            /// The peers it knows of.
            known: Vec<String>,
        },
        /// The value was stored and its owners hold its entry.
        Stored,
        /// The value read (`None`: no value, or none still held).
        Value {
            /// The bytes.
            value: Option<Vec<u8>>,
        },
        /// One answer per key asked about, in order.
        Exist {
            /// Whether each has a value.
            found: Vec<bool>,
        },
        /// The removal is done; whether there was a value to remove.
        Removed {
            /// Whether an owner held an entry.
            existed: bool,
        },
        /// The leaving peer is off the receiver's ring.
        Left,
    }
}

/// A peer's answer to a request, or why it refused.
pub type PeerResponse = Result<PeerReply, Error>;

wire_message!(PeerRequest, FrameKind::PeerRequest);
wire_message!(PeerResponse, FrameKind::PeerResponse);

impl PeerRequest {
    /// Checks what decoding cannot: batch sizes, key and name lengths, and locations that
    /// describe a value. A peer refuses a request that fails, with the reason.
    pub fn check(&self) -> Result<(), Error> {
        match self {
            PeerRequest::Directory { messages } => {
                check_batch(messages.len())?;
                messages.iter().try_for_each(check_message)
            }
            PeerRequest::Lookup { keys } => {
                check_batch(keys.len())?;
                keys.iter().try_for_each(|key| check_key(key))
            }
            PeerRequest::Promote { key }
            | PeerRequest::Get { key }
            | PeerRequest::Remove { key } => check_key(key),
            PeerRequest::Exists { keys } => {
                check_batch(keys.len())?;
                keys.iter().try_for_each(|key| check_key(key))
            }
            PeerRequest::Hello { me, known } => {
                check_batch(known.len())?;
                check_name("a peer's name", &me.name)?;
                check_name("a peer's address", &me.address)?;
                check_name("a data endpoint", &me.data_endpoint)?;
                known
                    .iter()
                    .try_for_each(|name| check_name("a peer's name", name))
            }
            PeerRequest::Leave => Ok(()),
            PeerRequest::Put { key, value } => {
                check_key(key)?;
                if value.is_empty() {
                    return Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!("an empty value for {key:?}: values take at least one byte"),
                    ));
                }
                Ok(())
            }
        }
    }
}

fn check_name(what: &str, name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_PEER_NAME {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "{what} of {} bytes: names take 1 to {MAX_PEER_NAME}",
                name.len()
            ),
        ));
    }
    Ok(())
}

fn check_batch(len: usize) -> Result<(), Error> {
    if len > MAX_PEER_BATCH {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("{len} items in one peer request; send at most {MAX_PEER_BATCH}"),
        ));
    }
    Ok(())
}

fn check_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_PEER_KEY {
        return Err(Error::new(
            ErrorCode::INVALID_KEY,
            format!(
                "a key of {} bytes: keys take 1 to {MAX_PEER_KEY} bytes",
                key.len()
            ),
        ));
    }
    Ok(())
}

fn check_message(message: &DirectoryMessage) -> Result<(), Error> {
    match message {
        DirectoryMessage::Publish { key, location } | DirectoryMessage::Held { key, location } => {
            check_key(key)?;
            check_location(location)
        }
        DirectoryMessage::Unpublish { key, .. }
        | DirectoryMessage::Stale { key, .. }
        | DirectoryMessage::Removed { key, .. }
        | DirectoryMessage::Drop { key, .. } => check_key(key),
    }
}

fn check_location(location: &Location) -> Result<(), Error> {
    check_name("a location's peer", &location.peer)?;
    if location.len == 0 || location.offset.checked_add(location.len).is_none() {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "a location of {} bytes at {} describes no value",
                location.len, location.offset
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooring_core::Checksum;
    use mooring_core::peer::directory::Stamp;

    fn location(peer: &str, len: u64) -> Location {
        Location {
            peer: peer.into(),
            offset: 4096,
            len,
            stamp: Stamp {
                clock: 9,
                writer: 1,
            },
            checksum: Checksum(3),
            resident: true,
        }
    }

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused_with_a_reason() {
        let good = PeerRequest::Directory {
            messages: vec![DirectoryMessage::Publish {
                key: "kv/0".into(),
                location: location("10.0.0.1:7000", 100),
            }],
        };
        good.check().unwrap();
        let frame = good.to_frame(7);
        let (head, payload) = frame.split_at(super::super::frame::HEADER_LEN);
        let header = super::super::frame::parse_header(head.try_into().unwrap()).unwrap();
        assert_eq!(PeerRequest::from_frame(&header, payload).unwrap(), good);
        let empty_value = PeerRequest::Directory {
            messages: vec![DirectoryMessage::Publish {
                key: "kv/0".into(),
                location: location("p", 0),
            }],
        };
        assert_eq!(
            empty_value.check().unwrap_err().code,
            ErrorCode::INVALID_PARAMS
        );
        let nameless = PeerRequest::Directory {
            messages: vec![DirectoryMessage::Held {
                key: "k".into(),
                location: location("", 1),
            }],
        };
        assert!(nameless.check().is_err());
        let long_key = PeerRequest::Promote {
            key: "k".repeat(MAX_PEER_KEY + 1),
        };
        assert_eq!(long_key.check().unwrap_err().code, ErrorCode::INVALID_KEY);
        let too_many = PeerRequest::Lookup {
            keys: vec!["k".into(); MAX_PEER_BATCH + 1],
        };
        assert!(too_many.check().is_err());
        let empty = PeerRequest::Put {
            key: "k".into(),
            value: Vec::new(),
        };
        assert_eq!(empty.check().unwrap_err().code, ErrorCode::INVALID_PARAMS);
        let me = MemberInfo {
            name: "10.0.0.1:7000".into(),
            address: "10.0.0.1:7000".into(),
            data_endpoint: "10.0.0.1:7001".into(),
            data_key: 1,
            data_base: 0,
            weight: 1,
        };
        let hello = |me: MemberInfo, known: &str| PeerRequest::Hello {
            me,
            known: vec![known.into()],
        };
        hello(me.clone(), "10.0.0.2:7000").check().unwrap();
        assert!(hello(me.clone(), "").check().is_err(), "a nameless peer");
        let endless = MemberInfo {
            data_endpoint: "".into(),
            ..me
        };
        assert!(hello(endless, "p").check().is_err(), "no data endpoint");
    }
}
