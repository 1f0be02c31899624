//! The life of a data server's connections, over loopback against a real server, with the
//! requests a client would send: a write that trickles in stops landing once its segment is
//! unexported (a remount, after which the master may give the ranges to other writers), a
//! read answers the same bytes whether its reader asks for them lent or copied, and
//! a dropped server lets go of its port though clients stay connected.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_proto::transport::{DataServer, SegmentMemory};
use mooring_proto::wire::{DataRequest, DataResponse, Range};
use mooring_transport_tcp::{Framed, LocalSegments, TcpDataServer, handshake};

const HALF: usize = 1 << 20;
/// What the server may still take in after the unexport: the step it was already waiting
/// for when the unexport came (it checks before each 256 KiB).
const STEP: usize = 256 << 10;

/// A data server on a free loopback port, without a cluster token, its keys from `seed`.
async fn server(seed: u64) -> Arc<TcpDataServer> {
    let segments = Arc::new(LocalSegments::default());
    TcpDataServer::start("127.0.0.1:0", None, segments, seed, Duration::ZERO, None)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_write_under_way_stops_landing_when_its_segment_is_unexported() {
    let owner = Arc::new(Mutex::new(vec![0u8; 2 * HALF]));
    let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
    // SAFETY: the vector lives as long as `owner`, which the segment keeps alive.
    let memory = unsafe { SegmentMemory::new(ptr, 2 * HALF, owner.clone()) };
    let server = server(7).await;
    let node = server.export(memory.clone()).unwrap();

    let mut conn = Framed::connect(&node.endpoint, Duration::ZERO)
        .await
        .unwrap();
    let clock = handshake::client(&mut conn, None, mooring_proto::auth::Plane::Control, 0x77)
        .await
        .unwrap();
    let write = DataRequest::Write {
        key: node.key,
        ranges: vec![Range {
            addr: memory.base(),
            len: 2 * HALF as u64,
        }],
        sent_at_us: clock.origin.elapsed().as_micros() as u64,
        valid_for_us: 30_000_000,
    };
    // The request and the first half of its bytes; the rest comes later (a slow link).
    conn.write_message(1, &write, &[&vec![0xAB; HALF]])
        .await
        .unwrap();
    let landed = |at: usize| {
        let mut byte = [0u8];
        assert!(memory.copy_out(memory.base() + at as u64, &mut byte));
        byte[0]
    };
    for _ in 0..500 {
        if landed(HALF - 1) == 0xAB {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(landed(HALF - 1), 0xAB, "the first half never landed");

    // The node remounts: the old key goes. Then the rest of the write arrives (any bytes
    // will do: the server takes what follows as the write's).
    server.unexport(node.key);
    let rest = vec![0xCD; HALF];
    let _ = conn
        .write_message(2, &DataRequest::Probe { sent_at_us: 0 }, &[&rest])
        .await;
    // The server answers or closes the connection, either way done with the write.
    let _ =
        tokio::time::timeout(Duration::from_secs(10), conn.read_message::<DataResponse>()).await;

    let after: Vec<u8> = (HALF + STEP..2 * HALF).map(landed).collect();
    assert!(
        after.iter().all(|&b| b == 0),
        "{} bytes landed after the segment was unexported",
        after.iter().filter(|&&b| b != 0).count()
    );
}

#[tokio::test]
async fn a_dropped_server_frees_its_port_while_a_client_stays_connected() {
    let server = server(9).await;
    let endpoint = server.endpoint().to_string();
    // A client with an idle pooled connection, as every reader keeps one.
    let mut conn = Framed::connect(&endpoint, Duration::ZERO).await.unwrap();
    handshake::client(&mut conn, None, mooring_proto::auth::Plane::Control, 0x78)
        .await
        .unwrap();
    drop(server);
    let mut bound = None;
    for _ in 0..200 {
        match tokio::net::TcpListener::bind(&endpoint).await {
            Ok(listener) => {
                bound = Some(listener);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert!(
        bound.is_some(),
        "{endpoint} still taken by a dropped server with a client connected"
    );
    // The client's next request finds the connection closed.
    let probe = DataRequest::Probe { sent_at_us: 0 };
    let _ = conn.write_message(1, &probe, &[]).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), conn.read_message::<DataResponse>())
        .await
        .expect("the connection closes");
    assert!(answer.is_err(), "a dropped server answered: {answer:?}");
}

/// A read answers the same bytes whether the reader asks for them lent (spliced from the
/// segment's pages, for 64 KiB-2 MiB slices) or copied (`unaligned`, for a destination off a
/// cache line).
#[tokio::test]
async fn a_read_answers_the_same_bytes_lent_or_copied() {
    let pattern: Vec<u8> = (0..2 * HALF).map(|i| (i * 7 + i / 4096) as u8).collect();
    let owner = Arc::new(Mutex::new(pattern.clone()));
    let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
    // SAFETY: the vector lives as long as `owner`, which the segment keeps alive.
    let memory = unsafe { SegmentMemory::new(ptr, 2 * HALF, owner.clone()) };
    let server = server(11).await;
    let node = server.export(memory.clone()).unwrap();
    let mut conn = Framed::connect(&node.endpoint, Duration::ZERO)
        .await
        .unwrap();
    handshake::client(&mut conn, None, mooring_proto::auth::Plane::Control, 0x78)
        .await
        .unwrap();
    for (id, unaligned) in [(1, false), (2, true), (3, false)] {
        // A 1 MiB slice (spliced when lent) and a small one after it, both off the start.
        let ranges = vec![
            Range {
                addr: memory.base() + 16,
                len: HALF as u64,
            },
            Range {
                addr: memory.base() + HALF as u64 + 40,
                len: 1000,
            },
        ];
        let read = DataRequest::Read {
            key: node.key,
            ranges,
            unaligned,
        };
        conn.write_message(id, &read, &[]).await.unwrap();
        let (reply_id, reply) = conn.read_message::<DataResponse>().await.unwrap();
        assert_eq!(reply_id, id);
        reply.unwrap();
        let mut got = vec![0u8; HALF + 1000 + 1];
        // Into a destination one byte off, as an unaligned reader's would be.
        conn.read_exact(&mut got[1..]).await.unwrap();
        assert!(
            got[1..=HALF] == pattern[16..HALF + 16],
            "read {id}: first range"
        );
        assert!(
            got[HALF + 1..] == pattern[HALF + 40..HALF + 1040],
            "read {id}: second range"
        );
    }
}
