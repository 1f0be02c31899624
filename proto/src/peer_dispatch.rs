//! Peer mode's requests in, replies out: a peer's whole request handling as a pure function
//! over the core's [`PeerState`], so every peer driver (TCP, simulation) serves the protocol
//! identically. The driver sends the returned messages for other peers; what is for the
//! sender travels back in the reply.

use mooring_core::Millis;
use mooring_core::peer::state::{Outgoing, PeerState};

use crate::wire::{PeerReply, PeerRequest, PeerResponse};

/// What handling a request gives: the reply for the sender, and messages for other peers.
#[derive(Debug)]
pub struct Handled {
    /// The reply.
    pub response: PeerResponse,
    /// Messages the driver sends on (to peers other than the sender).
    pub onward: Vec<Outgoing>,
}

/// Handles `request` from peer `from` (the name its credential proves) at `now`. A request
/// that fails its checks is refused whole, changing nothing. The requests that are not the
/// directory's (membership greetings and goodbyes, and promotes and a client's operations,
/// which move bytes) come back as `Err` for the driver to answer, checked.
pub fn handle(
    peer: &mut PeerState,
    from: &str,
    request: PeerRequest,
    now: Millis,
) -> Result<Handled, PeerRequest> {
    if let Err(refused) = request.check() {
        return Ok(Handled {
            response: Err(refused),
            onward: Vec::new(),
        });
    }
    Ok(match request {
        PeerRequest::Directory { messages } => {
            let mut replies = Vec::new();
            let mut onward = Vec::new();
            for message in messages {
                for out in peer.receive(from, message, now) {
                    if *out.to == *from {
                        replies.push(out.message);
                    } else {
                        onward.push(out);
                    }
                }
            }
            Handled {
                response: Ok(PeerReply::Directory { replies }),
                onward,
            }
        }
        PeerRequest::Lookup { keys } => Handled {
            response: Ok(PeerReply::Locations {
                found: keys.iter().map(|key| peer.lookup(key)).collect(),
            }),
            onward: Vec::new(),
        },
        PeerRequest::Promote { .. }
        | PeerRequest::Hello { .. }
        | PeerRequest::Put { .. }
        | PeerRequest::Get { .. }
        | PeerRequest::Exists { .. }
        | PeerRequest::Remove { .. }
        | PeerRequest::Leave => return Err(request),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooring_core::peer::ring::{DEFAULT_VNODES, Ring, RingMember};
    use mooring_core::peer::state::DirectoryMessage;
    use mooring_core::{Checksum, ErrorCode};

    fn ring() -> Ring {
        Ring::new(
            ["a", "b"].map(|name| RingMember {
                name: name.into(),
                weight: 1,
            }),
            DEFAULT_VNODES,
        )
    }

    #[test]
    fn a_publish_is_answered_to_its_sender_and_found_by_a_lookup() {
        let mut a = PeerState::new("a", 1 << 20, ring(), 2, Millis(0));
        let mut b = PeerState::new("b", 1 << 20, ring(), 2, Millis(0));
        let (location, out) = a.put("kv/1", 100, Checksum(5), Millis(10)).unwrap();
        let for_b: Vec<DirectoryMessage> = out
            .into_iter()
            .filter(|o| &*o.to == "b")
            .map(|o| o.message)
            .collect();
        assert_eq!(for_b.len(), 1, "b is one of the key's two owners");
        let handled = handle(
            &mut b,
            "a",
            PeerRequest::Directory { messages: for_b },
            Millis(11),
        )
        .unwrap();
        assert!(handled.onward.is_empty());
        assert_eq!(
            handled.response,
            Ok(PeerReply::Directory {
                replies: vec![DirectoryMessage::Held {
                    key: "kv/1".into(),
                    location: location.clone()
                }]
            })
        );
        let looked = handle(
            &mut b,
            "a",
            PeerRequest::Lookup {
                keys: vec!["kv/1".into(), "kv/2".into()],
            },
            Millis(12),
        )
        .unwrap();
        assert_eq!(
            looked.response,
            Ok(PeerReply::Locations {
                found: vec![Some(location), None]
            })
        );
    }

    #[test]
    fn a_peer_cannot_publish_another_peers_pool_and_bad_requests_change_nothing() {
        let mut a = PeerState::new("a", 1 << 20, ring(), 2, Millis(0));
        let mut b = PeerState::new("b", 1 << 20, ring(), 2, Millis(0));
        let (location, _) = a.put("kv/1", 100, Checksum(5), Millis(10)).unwrap();
        // "c" relays a's location: refused, nothing stored, nothing answered.
        let relayed = handle(
            &mut b,
            "c",
            PeerRequest::Directory {
                messages: vec![DirectoryMessage::Publish {
                    key: "kv/1".into(),
                    location: location.clone(),
                }],
            },
            Millis(11),
        )
        .unwrap();
        assert_eq!(
            relayed.response,
            Ok(PeerReply::Directory { replies: vec![] })
        );
        assert!(b.lookup("kv/1").is_none());
        let bad = handle(
            &mut b,
            "a",
            PeerRequest::Promote { key: String::new() },
            Millis(12),
        )
        .unwrap();
        assert_eq!(bad.response.unwrap_err().code, ErrorCode::INVALID_KEY);
        let moves_bytes = handle(
            &mut a,
            "b",
            PeerRequest::Promote {
                key: "kv/none".into(),
            },
            Millis(12),
        );
        assert!(
            moves_bytes.is_err(),
            "a promote is the driver's: it reads the disk"
        );
    }
}
