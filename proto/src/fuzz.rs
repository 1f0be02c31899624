//! Entry points for fuzzing every decoder that reads network bytes: the frame header and each
//! message type on both sides. Each takes arbitrary bytes and panics only on a real defect: a
//! decoder that panics, or a message that does not survive encoding and decoding again.
//! `cargo fuzz` drives them (`fuzz/fuzz_targets/`), and `proto/tests/fuzz_corpus.rs` replays
//! their corpora on every test run.

use crate::auth::Handshake;
use crate::wire::{
    ControlRequest, DataRequest, DataResponse, FrameKind, HEADER_LEN, MasterRequest,
    MasterResponse, WireMessage, header, parse_header,
};

/// Raw bytes as a frame off the wire: the header is parsed and, if it passes, the rest is
/// offered to every message type (only the one of the header's kind may accept it).
pub fn frame(data: &[u8]) {
    let Some((head, payload)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let Ok(h) = parse_header(head) else {
        return;
    };
    let accepted = [
        ControlRequest::from_frame(&h, payload).is_ok(),
        MasterResponse::from_frame(&h, payload).is_ok(),
        DataRequest::from_frame(&h, payload).is_ok(),
        DataResponse::from_frame(&h, payload).is_ok(),
        Handshake::from_frame(&h, payload).is_ok(),
    ];
    assert!(
        accepted.iter().filter(|&&ok| ok).count() <= 1,
        "one frame decoded as two message kinds"
    );
}

/// Arbitrary bytes as a [`ControlRequest`] payload (a [`MasterRequest`] with its send time
/// and validity) behind a valid header and checksum (so the fuzzer reaches validation and
/// decoding, not just the checksum).
pub fn master_request(payload: &[u8]) {
    payload_roundtrip::<ControlRequest>(payload);
}

/// As [`master_request`], for the master's replies.
pub fn master_response(payload: &[u8]) {
    payload_roundtrip::<MasterResponse>(payload);
}

/// As [`master_request`], for what one peer asks another in peer mode; a request that decodes
/// is checked as a peer checks it (refused with a reason or accepted, never a panic).
pub fn peer_request(payload: &[u8]) {
    if let Some(request) = payload_roundtrip::<crate::wire::PeerRequest>(payload) {
        let _ = request.check();
    }
}

/// As [`master_request`], for a peer's replies.
pub fn peer_response(payload: &[u8]) {
    payload_roundtrip::<crate::wire::PeerResponse>(payload);
}

/// As [`master_request`], for requests to a node's data server.
pub fn data_request(payload: &[u8]) {
    if let Some(request) = payload_roundtrip::<DataRequest>(payload) {
        // The bound every data server relies on before moving bulk bytes.
        let _ = request.bulk_len();
    }
}

/// As [`master_request`], for a data server's replies.
pub fn data_response(payload: &[u8]) {
    payload_roundtrip::<DataResponse>(payload);
}

/// As [`master_request`], for the handshake that opens every connection (the first bytes a
/// server reads from a stranger).
pub fn handshake(payload: &[u8]) {
    payload_roundtrip::<Handshake>(payload);
}

/// Arbitrary bytes as a member's credential claims (the text a stranger's handshake carries
/// to the master), a token file and a revocation list: refused with a reason or accepted, and
/// accepted claims keep their one spelling.
pub fn credential(data: &[u8]) {
    use crate::auth::{Claims, Credential, Revocations};
    if let Ok(claims) = Claims::decode(data) {
        assert_eq!(claims.encode().as_bytes(), data, "claims have one spelling");
        assert_eq!(Claims::decode(claims.encode().as_bytes()), Ok(claims));
    }
    let text = String::from_utf8_lossy(data);
    if let Ok(credential) = Credential::parse(&text) {
        let again = Credential::parse(&credential.to_file_text()).expect("a written file parses");
        assert_eq!(again, credential, "a credential changed through its file");
    }
    let _ = Revocations::parse(&text);
}

/// Seeds of the credential corpus: claims, a member's file, the secret's, a revocation list.
pub fn sample_credentials() -> Vec<Vec<u8>> {
    use crate::auth::{Claims, Credential, Roles};
    let secret = Credential::from_secret([5; 32]);
    let claims = Claims {
        name: "node-1".into(),
        tenant: "team-a".into(),
        roles: Roles::NODE.union(Roles::CLIENT),
        serial: 0x1234_5678_9abc_def0,
        expires: 1_900_000_000,
    };
    let member = secret.issue(claims.clone()).expect("the secret issues");
    vec![
        claims.encode().into_bytes(),
        member.to_file_text().into_bytes(),
        secret.to_file_text().into_bytes(),
        b"serial 123456789abcdef0\nname team-a/node-1 # gone\n".to_vec(),
    ]
}

/// Arbitrary bytes as either message of the same-host handoff (a node reads requests from any
/// local process; a client reads replies from whatever answers on the socket): refused
/// cleanly, or decoded to a value that survives encoding again.
pub fn shm_handoff(data: &[u8]) {
    use crate::handoff::{Reply, decode_reply, decode_request, encode_reply, encode_request};
    if let Ok(ticket) = decode_request(data) {
        assert_eq!(encode_request(&ticket).as_slice(), data);
    }
    if let Ok(reply) = decode_reply(data) {
        let again = decode_reply(&encode_reply(&reply)).expect("an encoded reply decodes");
        match (&reply, &again) {
            // A message that was not UTF-8 decodes lossily and may be cut when sent again.
            (Reply::Refused(_), Reply::Refused(_)) => {}
            _ => assert_eq!(again, reply, "a reply changed through encode and decode"),
        }
    }
}

/// Seeds of the handoff corpus: a request and each kind of reply.
pub fn sample_handoffs() -> Vec<Vec<u8>> {
    use crate::handoff::{Reply, encode_reply, encode_request};
    vec![
        encode_request(&[7; 16]).to_vec(),
        encode_reply(&Reply::Granted {
            base: 0x7f00_0000_0000,
            len: 1 << 30,
            proof: [9; 16],
        }),
        encode_reply(&Reply::Refused("ticket unknown".into())),
    ]
}

/// Arbitrary bytes as a master's journal file (read back at restart from a disk that may hold
/// anything): decoding stops cleanly at the first bad record, and what it accepts survives
/// encoding and decoding again.
pub fn journal(data: &[u8]) {
    use crate::journal::{
        FILE_HEADER, MAGIC, decode, file_header, needed, payload, record, replay,
    };
    // The generation the file's header names, if it has one (else any: the file is refused).
    let generation = data
        .get(MAGIC.len()..FILE_HEADER)
        .map_or(0, |g| u64::from_le_bytes(g.try_into().expect("8 bytes")));
    let decoded = decode(generation, data);
    assert!(decoded.intact <= data.len());
    // Damage is reported where decoding stopped, vouched for by a mark past it.
    if let Some(damage) = decoded.damaged {
        assert_eq!(
            damage.at, decoded.intact,
            "damage is where decoding stopped"
        );
        assert!(
            damage.synced_to > damage.at as u64,
            "a mark vouches past the damage"
        );
        assert!(decoded.stopped.is_some() && !decoded.foreign);
    }
    // Recovery reads a file in growing pieces until `needed` says it has enough: what it
    // decodes from there is what the whole file decodes to (a mark's reach covers any file
    // this small).
    let mut have = data.len().min(16);
    while let Some(at_least) = needed(generation, &data[..have], data.len() as u64) {
        assert!(at_least > have as u64 && at_least <= data.len() as u64);
        have = (at_least as usize).max(have * 2).min(data.len());
    }
    let read = decode(generation, &data[..have]);
    assert_eq!(
        (
            &read.entries,
            read.intact,
            read.foreign,
            read.ended,
            read.damaged
        ),
        (
            &decoded.entries,
            decoded.intact,
            decoded.foreign,
            decoded.ended,
            decoded.damaged
        ),
        "a journal read as far as needed decodes as the whole file does"
    );
    // A replay reads the file a piece at a time, holding one piece while records are intact:
    // whatever the piece, it hands on and reports what decoding the whole file does.
    for piece in [1 + data.len() % 199, crate::journal::REPLAY_PIECE] {
        let mut entries = Vec::new();
        let read = |buf: &mut [u8], offset: u64| {
            let at = offset as usize;
            buf.copy_from_slice(&data[at..at + buf.len()]);
            Ok::<(), std::convert::Infallible>(())
        };
        let Ok(replayed) = replay(generation, data.len() as u64, piece, read, |now, input| {
            entries.push((now, input));
            Ok(())
        });
        assert_eq!(
            (
                &entries,
                replayed.intact,
                &replayed.stopped,
                replayed.foreign,
                replayed.ended,
                replayed.damaged
            ),
            (
                &decoded.entries,
                decoded.intact,
                &decoded.stopped,
                decoded.foreign,
                decoded.ended,
                decoded.damaged
            ),
            "a replay in pieces of {piece} bytes reports what decoding the whole file does"
        );
    }
    let mut again = file_header(generation).to_vec();
    for (now, input) in &decoded.entries {
        record(generation, *now, &payload(input), &mut again);
    }
    let redecoded = decode(generation, &again);
    assert_eq!(redecoded.stopped, None);
    assert_eq!(
        redecoded.entries, decoded.entries,
        "a journal record changed through encode and decode"
    );
}

/// A short journal of every kind of input, sync marks among them: the seed of the journal
/// corpus.
pub fn sample_journal() -> Vec<u8> {
    use crate::journal::{Input, file_header, payload, record};
    use mooring_core::{ClientId, MasterConfig, Millis, ReplicateConfig};

    use crate::wire::{GetReplicaList, PutStart};
    let inputs = [
        Input::Config(MasterConfig::default()),
        Input::Resume,
        Input::Request(
            PutStart {
                client: ClientId(3),
                key: "kv/layer-0/block-7".into(),
                size: 4096,
                config: ReplicateConfig::replicas(2).hard_pinned(),
                upsert: false,
            }
            .into(),
        ),
        Input::Request(GetReplicaList { key: "k".into() }.into()),
        Input::Synced(0),
        Input::Tick,
    ];
    const GENERATION: u64 = 4;
    let mut out = file_header(GENERATION).to_vec();
    for (i, input) in inputs.iter().enumerate() {
        // A mark vouches for everything written before it.
        let input = match input {
            Input::Synced(_) => Input::Synced(out.len() as u64),
            other => other.clone(),
        };
        record(
            GENERATION,
            Millis(10 * i as u64),
            &payload(&input),
            &mut out,
        );
    }
    record(GENERATION, Millis(50), &payload(&Input::End), &mut out);
    out
}

/// [`sample_journal`] with one bit flipped in a record a mark vouches for: damage, the seed
/// of the journal corpus's refusal path.
pub fn sample_damaged_journal() -> Vec<u8> {
    let mut journal = sample_journal();
    journal[crate::journal::FILE_HEADER + 20] ^= 0x08;
    journal
}

/// Decodes `payload` as a `T` behind a valid header; a decoded message must encode and
/// decode to itself.
fn payload_roundtrip<T: WireMessage + PartialEq + std::fmt::Debug>(payload: &[u8]) -> Option<T> {
    if payload.len() > crate::wire::MAX_FRAME {
        return None;
    }
    let h = header(T::KIND, 1, payload);
    let parsed = parse_header(&h).expect("a header this build made");
    let message = T::from_frame(&parsed, payload).ok()?;
    let frame = message.to_frame(2);
    let (head, rest) = frame
        .split_first_chunk::<HEADER_LEN>()
        .expect("a whole frame");
    let again = T::from_frame(&parse_header(head).expect("our own header"), rest)
        .expect("a message this build encoded decodes");
    assert_eq!(
        again, message,
        "a message changed through encode and decode"
    );
    Some(message)
}

/// A few valid frames of every kind: the seeds of the fuzz corpora.
pub fn sample_frames() -> Vec<(FrameKind, Vec<u8>)> {
    use mooring_core::{
        Checksum, ClientId, Error, ErrorCode, KeyListing, ReplicateConfig, WriteId,
    };

    use crate::auth::Handshake;
    use crate::wire::{
        BatchExist, DataReply, Follow, FollowChunk, GetReplicaList, Goodbye, Hello, ListKeys,
        PutEnd, PutStart, QpAddress, Range, Reply, ShmOffer, StagedSlot, StateFile, TakeRepairs,
        TaskAbort,
    };
    let requests: Vec<MasterRequest> = vec![
        Hello {
            client: ClientId(3),
        }
        .into(),
        Goodbye {
            client: ClientId(3),
        }
        .into(),
        PutStart {
            client: ClientId(3),
            key: "kv/layer-0/block-7".into(),
            size: 4096,
            config: ReplicateConfig::replicas(2).hard_pinned(),
            upsert: false,
        }
        .into(),
        PutEnd {
            client: ClientId(3),
            key: "k".into(),
            write: WriteId(9),
            checksum: Checksum::of(b"value"),
        }
        .into(),
        GetReplicaList { key: "k".into() }.into(),
        ListKeys {
            tenant: "team-a".into(),
            pattern: "^kv/".into(),
        }
        .into(),
        BatchExist {
            keys: vec!["a".into(), "b".into()],
        }
        .into(),
        TaskAbort {
            client: ClientId(3),
            task: mooring_core::TaskId(4),
        }
        .into(),
        TakeRepairs {
            client: ClientId(3),
            max: 20,
        }
        .into(),
        crate::wire::BatchQueryIp {
            clients: vec![ClientId(3), ClientId(4)],
        }
        .into(),
        crate::wire::QueryTask {
            task: mooring_core::TaskId(9),
        }
        .into(),
        crate::wire::BatchReplicaClear {
            client: ClientId(3),
            keys: vec!["a".into(), "b".into()],
            segment: Some("node0".into()),
        }
        .into(),
        Follow {
            follower: "10.0.0.2:50051#12345".into(),
            at: StateFile::Journal(3),
            offset: 4096,
        }
        .into(),
    ];
    let responses: Vec<MasterResponse> = vec![
        Ok(Reply::Exist(true)),
        Ok(Reply::BatchExist(vec![
            Ok(true),
            Err(ErrorCode::OBJECT_NOT_FOUND.into()),
        ])),
        Ok(Reply::GetSize(4096)),
        Ok(Reply::Follow(FollowChunk {
            file: StateFile::Snapshot(3),
            offset: 0,
            bytes: vec![7; 64],
            complete: true,
        })),
        Ok(Reply::ListKeys(vec![KeyListing {
            key: "kv/1".into(),
            size: 10,
            replicas: 2,
            on_disk: true,
        }])),
        Ok(Reply::QueryTask(mooring_core::TaskReport {
            task: mooring_core::TaskId(9),
            key: "kv/1".into(),
            action: mooring_core::TaskAction::Move,
            client: ClientId(3),
            state: mooring_core::TaskState::Failed,
            started: mooring_core::Millis(100),
            updated: mooring_core::Millis(250),
            message: "writing the new replicas failed".into(),
            now: mooring_core::Millis(300),
        })),
        Err(Error::new(ErrorCode::OBJECT_HAS_LEASE, "leased")),
    ];
    let data_requests = [
        DataRequest::Probe { sent_at_us: 5 },
        DataRequest::Read {
            key: 7,
            ranges: vec![Range {
                addr: 4096,
                len: 64,
            }],
            unaligned: true,
        },
        DataRequest::Write {
            key: 7,
            ranges: vec![Range { addr: 0, len: 8 }, Range { addr: 64, len: 8 }],
            sent_at_us: 1,
            valid_for_us: 1_000,
        },
        DataRequest::Stage {
            object: "k".into(),
            size: 10,
            write: 2,
        },
        DataRequest::Unstage { slot: 3 },
        DataRequest::RdmaConnect {
            client: QpAddress {
                qpn: 0x11,
                lid: 1,
                gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
                psn: 0x1234,
            },
            replaces: Some(0x10),
            key: 0x66,
        },
        DataRequest::ShmAttach { key: 0x55 },
    ];
    let data_responses: Vec<DataResponse> = vec![
        Ok(DataReply::Done),
        Ok(DataReply::Staged(StagedSlot {
            key: 1,
            rdma_key: Some(0x77),
            addr: 2,
            len: 3,
            slot: 4,
            ttl_ms: 5,
        })),
        Ok(DataReply::RdmaConnected(QpAddress {
            qpn: 0x11,
            lid: 1,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            psn: 0x1234,
        })),
        Ok(DataReply::ShmOffer(ShmOffer {
            host: [1; 16],
            socket: [2; 16],
            ticket: [3; 16],
            proof: [4; 16],
        })),
        Err(ErrorCode::TRANSFER_FAIL.into()),
    ];
    let mut frames = Vec::new();
    frames.extend(requests.into_iter().enumerate().map(|(i, request)| {
        let sent = ControlRequest {
            sent_at_us: i as u64 * 1_000,
            valid_for_us: 2_000_000,
            request,
        };
        (ControlRequest::KIND, sent.to_frame(1))
    }));
    frames.extend(
        responses
            .iter()
            .map(|m| (MasterResponse::KIND, m.to_frame(1))),
    );
    frames.extend(
        data_requests
            .iter()
            .map(|m| (DataRequest::KIND, m.to_frame(1))),
    );
    frames.extend(
        data_responses
            .iter()
            .map(|m| (DataResponse::KIND, m.to_frame(1))),
    );
    let handshakes = [
        Handshake::Challenge {
            nonce: [7; 32],
            token_required: true,
        },
        Handshake::Answer {
            nonce: [8; 32],
            client: 3,
            proof: [9; 32],
        },
        Handshake::MemberAnswer {
            nonce: [8; 32],
            client: 7 << 64,
            claims: b"v1 name=n1 tenant=default roles=node serial=0000000000000009 expires=0"
                .to_vec(),
            proof: [9; 32],
        },
        Handshake::Welcome { proof: [10; 32] },
        Handshake::Refused {
            reason: "authentication failed".into(),
        },
    ];
    frames.extend(handshakes.iter().map(|m| (Handshake::KIND, m.to_frame(0))));
    frames.extend(sample_peer_frames());
    frames
}

/// Peer-mode frames of each kind, for the fuzz corpora.
fn sample_peer_frames() -> Vec<(FrameKind, Vec<u8>)> {
    use mooring_core::Checksum;
    use mooring_core::peer::directory::{Location, Stamp};
    use mooring_core::peer::membership::MemberInfo;
    use mooring_core::peer::state::DirectoryMessage;

    use crate::wire::{PeerReply, PeerRequest, PeerResponse};
    let stamp = Stamp {
        clock: 1_764_300_000_123,
        writer: 0x6d38_bc58_a03d_b1d0,
    };
    let location = Location {
        peer: "10.0.0.7:7100".into(),
        offset: 1 << 20,
        len: 65536,
        stamp,
        checksum: Checksum(0x1234_5678),
        resident: true,
    };
    let member = MemberInfo {
        name: "10.0.0.7:7100".into(),
        address: "10.0.0.7:7100".into(),
        data_endpoint: "10.0.0.7:7101".into(),
        data_key: 0x5eed,
        data_base: 0x7f00_0000_0000,
        weight: 1,
    };
    let requests = [
        PeerRequest::Directory {
            messages: vec![
                DirectoryMessage::Publish {
                    key: "kv/layer-0/block-7".into(),
                    location: location.clone(),
                },
                DirectoryMessage::Unpublish {
                    key: "kv/layer-0/block-8".into(),
                    stamp,
                },
                DirectoryMessage::Removed {
                    key: "kv/old".into(),
                    covering: stamp,
                },
            ],
        },
        PeerRequest::Lookup {
            keys: vec!["kv/layer-0/block-7".into(), "kv/missing".into()],
        },
        PeerRequest::Promote {
            key: "kv/layer-0/block-7".into(),
        },
        PeerRequest::Hello {
            me: member.clone(),
            known: vec!["10.0.0.8:7100".into(), "10.0.0.9:7100".into()],
        },
        PeerRequest::Put {
            key: "kv/layer-1/block-0".into(),
            value: vec![7; 64],
        },
        PeerRequest::Get {
            key: "kv/layer-1/block-0".into(),
        },
        PeerRequest::Exists {
            keys: vec!["kv/a".into(), "kv/b".into()],
        },
        PeerRequest::Remove { key: "kv/a".into() },
        PeerRequest::Leave,
    ];
    let responses: [PeerResponse; 10] = [
        Ok(PeerReply::Directory {
            replies: vec![
                DirectoryMessage::Held {
                    key: "kv/layer-0/block-7".into(),
                    location: location.clone(),
                },
                DirectoryMessage::Stale {
                    key: "kv/a".into(),
                    stamp,
                    newer: Stamp {
                        clock: stamp.clock + 1,
                        writer: 3,
                    },
                },
                DirectoryMessage::Drop {
                    key: "kv/b".into(),
                    stamp,
                },
            ],
        }),
        Ok(PeerReply::Locations {
            found: vec![Some(location.clone()), None],
        }),
        Ok(PeerReply::Promoted {
            location: Some(location),
        }),
        Ok(PeerReply::Welcome {
            me: member,
            known: vec!["10.0.0.7:7100".into()],
        }),
        Ok(PeerReply::Stored),
        Ok(PeerReply::Value {
            value: Some(vec![7; 64]),
        }),
        Ok(PeerReply::Exist {
            found: vec![true, false],
        }),
        Ok(PeerReply::Removed { existed: true }),
        Ok(PeerReply::Left),
        Err(mooring_core::Error::new(
            mooring_core::ErrorCode::INVALID_KEY,
            "a key of 0 bytes: keys take 1 to 4096 bytes",
        )),
    ];
    let mut frames: Vec<_> = requests
        .iter()
        .map(|r| (FrameKind::PeerRequest, r.to_frame(11)))
        .collect();
    frames.extend(
        responses
            .iter()
            .map(|r| (FrameKind::PeerResponse, r.to_frame(11))),
    );
    frames
}
