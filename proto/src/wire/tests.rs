//! Round trips of every kind of frame, and refusals of corrupt ones.

use mooring_core::{ClientId, Error, ErrorCode, ReplicateConfig};

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
        unaligned: true,
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
        unaligned: false,
    };
    assert_eq!(overflow.bulk_len(), None);
    let huge = DataRequest::Read {
        key: 0,
        ranges: vec![Range {
            addr: 0,
            len: MAX_DATA_REQUEST + 1,
        }],
        unaligned: false,
    };
    assert_eq!(huge.bulk_len(), None);
}
