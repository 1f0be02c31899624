//! Peer mode's requests in, replies out: a peer's whole request handling as a pure function
//! over the core's [`PeerState`], so every peer driver (TCP, simulation) serves the protocol
//! identically. The driver sends the returned messages for other peers; what is for the
//! sender travels back in the reply.

use mooring_core::Millis;
use mooring_core::peer::state::{DirectoryMessage, Outgoing, PeerState};

use crate::wire::{PeerReply, PeerRequest, PeerResponse};

/// Most rounds of its own messages a peer handles before answering a directory request
/// (a bound; the protocol's own exchanges with itself end in one or two).
const MAX_OWN_ROUNDS: usize = 4;

/// What handling a request gives: the reply for the sender, and messages for other peers.
#[derive(Debug)]
pub struct Handled {
    /// The reply.
    pub response: PeerResponse,
    /// Messages the driver sends on (to peers other than the sender).
    pub onward: Vec<Outgoing>,
    /// Whether the driver delivers `onward` before it answers. So it does for a peer told to
    /// free a write (a `Drop`) or told of a removal (`Removed`, which frees a covered write it
    /// holds, and sends the Drops for the entries it held): the withdrawals from the owners
    /// the write was published to land before the remover's call returns, so a removal that
    /// returns leaves no owner answering for the write, even one only this peer's view of the
    /// ring names. Other messages go on in the background: nobody waits on them.
    pub deliver_first: bool,
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
            deliver_first: false,
        });
    }
    Ok(match request {
        PeerRequest::Directory { messages } => {
            let me: Box<str> = peer.name().into();
            let deliver_first = messages.iter().any(|m| {
                matches!(m, DirectoryMessage::Drop { .. })
                    || matches!(m, DirectoryMessage::Removed { .. })
            });
            let mut replies = Vec::new();
            let mut onward = Vec::new();
            let mut received: Vec<(Box<str>, DirectoryMessage)> =
                messages.into_iter().map(|m| (from.into(), m)).collect();
            // What the peer tells itself is handled before the reply, a few rounds deep, so
            // the sender's call returns with this peer's own directory caught up (a Drop's
            // withdrawal from this peer's shard, above all); the rest goes on.
            for round in 0..=MAX_OWN_ROUNDS {
                let mut own = Vec::new();
                for (sender, message) in received {
                    for out in peer.receive(&sender, message, now) {
                        if *out.to == *from {
                            replies.push(out.message);
                        } else if out.to == me && round < MAX_OWN_ROUNDS {
                            own.push((me.clone(), out.message));
                        } else {
                            onward.push(out);
                        }
                    }
                }
                if own.is_empty() {
                    break;
                }
                received = own;
            }
            Handled {
                response: Ok(PeerReply::Directory { replies }),
                onward,
                deliver_first,
            }
        }
        PeerRequest::Lookup { keys } => Handled {
            response: Ok(PeerReply::Locations {
                found: keys.iter().map(|key| peer.lookup(key)).collect(),
            }),
            onward: Vec::new(),
            deliver_first: false,
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
    use std::collections::BTreeMap;

    use mooring_core::peer::directory::{Location, Stamp};
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

    fn ring_of(names: &[&str]) -> Ring {
        Ring::new(
            names.iter().map(|name| RingMember {
                name: (*name).into(),
                weight: 1,
            }),
            DEFAULT_VNODES,
        )
    }

    /// A peer state for each of `names`, all seeing `ring`.
    fn peers_of(names: &[&'static str], ring: &Ring) -> BTreeMap<&'static str, PeerState> {
        names
            .iter()
            .map(|n| (*n, PeerState::new(n, 1 << 20, ring.clone(), 2, Millis(0))))
            .collect()
    }

    /// `writer` puts `key` and publishes it to its owners; where the value is.
    fn put_and_publish(peers: &mut BTreeMap<&str, PeerState>, writer: &str, key: &str) -> Location {
        let peer = peers.get_mut(writer).unwrap();
        let (location, out) = peer.put(key, 100, Checksum(5), Millis(10)).unwrap();
        call_all(peers, writer, out);
        location
    }

    /// Delivers `out` from `sender` as its driver's calls do: each recipient handles its
    /// messages and its answers come back to the sender. What a recipient sends on is
    /// delivered before it answers when the handling says so, and otherwise travels later, so
    /// it is left undelivered here.
    fn call_all(peers: &mut BTreeMap<&str, PeerState>, sender: &str, out: Vec<Outgoing>) {
        let mut pending = out;
        while !pending.is_empty() {
            let mut answers = Vec::new();
            for Outgoing { to, message } in pending {
                let handled = if *to == *sender {
                    let me = peers.get_mut(sender).unwrap();
                    answers.extend(me.receive(sender, message, Millis(20)));
                    continue;
                } else {
                    let peer = peers.get_mut(&*to).unwrap();
                    let request = PeerRequest::Directory {
                        messages: vec![message],
                    };
                    handle(peer, sender, request, Millis(20)).unwrap()
                };
                if handled.deliver_first {
                    call_all(peers, &to, handled.onward);
                }
                let Ok(PeerReply::Directory { replies }) = handled.response else {
                    panic!("{to} refused: {:?}", handled.response);
                };
                let me = peers.get_mut(sender).unwrap();
                for reply in replies {
                    answers.extend(me.receive(&to, reply, Millis(20)));
                }
            }
            pending = answers;
        }
    }

    /// A peer that joined a moment ago writes a key it owns; a remover that has not heard of
    /// it yet removes the key through its own view of the owners. By the time the removal's
    /// calls return, no owner in either view answers for the write, the writer's own shard
    /// included: the remover tells the write's peer to free it, and that peer withdraws its
    /// own entry before it answers.
    #[test]
    fn a_removal_returns_with_no_owner_answering_even_one_that_just_joined() {
        let old = ["a", "b", "c"];
        let joined = ["a", "b", "c", "new"];
        let (old_ring, new_ring) = (ring_of(&old), ring_of(&joined));
        let key = (0..1000)
            .map(|i| format!("kv/{i}"))
            .find(|k| {
                let writers = new_ring.owners(k, 2);
                writers[0] == "new" && old_ring.owners(k, 2).contains(&writers[1])
            })
            .expect("some key the new peer owns first");
        let mut peers = peers_of(&old, &old_ring);
        // The peer the new one greeted has it on its ring; the remover has not.
        let greeted = new_ring.owners(&key, 2)[1];
        let remover = *old.iter().find(|n| **n != greeted).unwrap();
        let caught_up = peers
            .get_mut(greeted)
            .unwrap()
            .ring_changed(new_ring.clone(), Millis(5));
        assert!(caught_up.is_empty(), "nothing held yet");
        peers.insert(
            "new",
            PeerState::new("new", 1 << 20, new_ring.clone(), 2, Millis(0)),
        );
        let location = put_and_publish(&mut peers, "new", &key);
        assert_eq!(peers["new"].lookup(&key), Some(location.clone()));
        assert_eq!(peers[greeted].lookup(&key), Some(location.clone()));

        let known: Vec<Location> = peers[remover]
            .owners_of(&key)
            .iter()
            .filter_map(|owner| peers[&**owner].lookup(&key))
            .collect();
        assert_eq!(
            known,
            vec![location],
            "the remover's owners answer with the write"
        );
        let out = peers
            .get_mut(remover)
            .unwrap()
            .removal(&key, Millis(15), &known);
        call_all(&mut peers, remover, out);
        for (name, peer) in &peers {
            assert_eq!(
                peer.lookup(&key),
                None,
                "{name} still answers for the removed write"
            );
        }
    }

    /// A remover that still counts a departed peer alive removes a key whose owners, in its
    /// view, include the departed peer in place of one the writer published to. The remover
    /// reaches only some of the writer's owners; the writer, told to free the write, withdraws
    /// it from the rest before it answers, so none answers once the removal returns.
    #[test]
    fn a_removal_returns_with_no_owner_answering_even_one_only_the_writer_names() {
        let live = ["a", "b", "c", "writer"];
        let with_departed = ["a", "b", "c", "writer", "departed"];
        let (writers_ring, removers_ring) = (ring_of(&live), ring_of(&with_departed));
        let key = (0..1000)
            .map(|i| format!("kv/{i}"))
            .find(|k| {
                let theirs = writers_ring.owners(k, 2);
                let removers = removers_ring.owners(k, 2);
                removers.contains(&"departed")
                    && !theirs.contains(&"writer")
                    && theirs.iter().any(|o| removers.contains(o))
                    && theirs.iter().any(|o| !removers.contains(o))
            })
            .expect("some key the departed peer owns beside one of the writer's owners");
        let mut peers = peers_of(&live, &writers_ring);
        let remover = *live
            .iter()
            .find(|n| **n != "writer" && !writers_ring.owners(&key, 2).contains(n))
            .unwrap();
        let view = peers
            .get_mut(remover)
            .unwrap()
            .ring_changed(removers_ring.clone(), Millis(5));
        assert!(view.is_empty(), "nothing held yet");
        let location = put_and_publish(&mut peers, "writer", &key);
        let missed: Vec<&str> = writers_ring
            .owners(&key, 2)
            .into_iter()
            .filter(|o| !removers_ring.owners(&key, 2).contains(o))
            .collect();
        assert_eq!(missed.len(), 1);
        assert_eq!(peers[missed[0]].lookup(&key), Some(location.clone()));

        let known: Vec<Location> = peers[remover]
            .owners_of(&key)
            .iter()
            .filter_map(|owner| peers.get(&**owner).and_then(|o| o.lookup(&key)))
            .collect();
        assert_eq!(known, vec![location]);
        let out: Vec<Outgoing> = peers
            .get_mut(remover)
            .unwrap()
            .removal(&key, Millis(15), &known)
            .into_iter()
            .filter(|o| &*o.to != "departed")
            .collect();
        call_all(&mut peers, remover, out);
        for (name, peer) in &peers {
            assert_eq!(
                peer.lookup(&key),
                None,
                "{name} still answers for the removed write"
            );
        }
    }

    /// A removal that reaches a peer late, after that peer wrote the key again: the newer
    /// write stays, in its pool and at every owner.
    #[test]
    fn a_late_removal_leaves_a_newer_write_where_it_is() {
        let mut peers = peers_of(&["a", "b"], &ring());
        let location = put_and_publish(&mut peers, "a", "kv/1");
        let covering = Stamp {
            clock: location.stamp.clock - 1,
            ..location.stamp
        };
        let removed = DirectoryMessage::Removed {
            key: "kv/1".into(),
            covering,
        };
        let handled = handle(
            peers.get_mut("a").unwrap(),
            "b",
            PeerRequest::Directory {
                messages: vec![removed],
            },
            Millis(30),
        )
        .unwrap();
        assert!(handled.onward.is_empty(), "{:?}", handled.onward);
        assert_eq!(peers["a"].pool().location("kv/1"), Some(location.clone()));
        for (name, peer) in &peers {
            assert_eq!(peer.lookup("kv/1"), Some(location.clone()), "{name}");
        }
    }

    /// A partition: the remover has lost one of the writer's owners ("far"), the writer is an
    /// owner only in the remover's view, and the owner both can reach lost its entry in a
    /// restart. The remover's owners know of no write, so no Drop goes out; the writer, told
    /// of the removal as an owner, frees its covered write and withdraws it from its own
    /// owners before it answers, so "far" no longer answers for it once the removal returns.
    #[test]
    fn a_removal_returns_with_no_owner_answering_even_one_across_a_partition() {
        let all = ["a", "remover", "writer", "far"];
        let reachable = ["a", "remover", "writer"];
        let (writers_ring, removers_ring) = (ring_of(&all), ring_of(&reachable));
        let key = (0..1000)
            .map(|i| format!("kv/{i}"))
            .find(|k| {
                let theirs = writers_ring.owners(k, 2);
                theirs.contains(&"far")
                    && !theirs.contains(&"writer")
                    && removers_ring.owners(k, 2).contains(&"writer")
            })
            .expect("some key far owns that the remover gives the writer");
        let mut peers = peers_of(&all, &writers_ring);
        let location = put_and_publish(&mut peers, "writer", &key);
        assert_eq!(peers["far"].lookup(&key), Some(location.clone()));
        // Every peer but the writer and far restarted, their shards empty; the remover's
        // view no longer holds far.
        for name in ["a", "remover"] {
            let ring = if name == "remover" {
                &removers_ring
            } else {
                &writers_ring
            };
            peers.insert(
                name,
                PeerState::new(name, 1 << 20, ring.clone(), 2, Millis(0)),
            );
        }
        let known: Vec<Location> = peers["remover"]
            .owners_of(&key)
            .iter()
            .filter_map(|owner| peers[&**owner].lookup(&key))
            .collect();
        assert!(known.is_empty(), "the remover's owners know of no write");
        let out = peers
            .get_mut("remover")
            .unwrap()
            .removal(&key, Millis(15), &known);
        assert!(out.iter().all(|o| &*o.to != "far"), "far is out of reach");
        call_all(&mut peers, "remover", out);
        assert_eq!(peers["writer"].pool().location(&key), None, "freed");
        for (name, peer) in &peers {
            assert_eq!(
                peer.lookup(&key),
                None,
                "{name} still answers for the removed write"
            );
        }
    }
}
