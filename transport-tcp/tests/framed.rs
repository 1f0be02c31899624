//! Bulk bytes read back over loopback exactly as sent, whatever the mix of piece sizes: small
//! pieces go through the read buffer (one receive lands many of them), larger ones straight
//! into their destination, and the frame after them still reads whole.

use std::time::Duration;

use mooring_proto::wire::DataRequest;
use mooring_transport_tcp::Framed;
use tokio::net::TcpListener;

/// Piece `i` of `len` bytes: a pattern that differs per piece and per offset.
fn piece(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|at| (i * 131 + at * 7 + at / 251) as u8)
        .collect()
}

#[tokio::test]
async fn pieces_of_every_size_arrive_in_order_and_the_next_frame_after_them() {
    // Around the buffered limit (16 KiB) and the buffer itself (64 KiB), and many small ones
    // in a row so the buffer fills and is compacted several times.
    let sizes: Vec<usize> = (0..300)
        .map(|i| [1, 4095, 4096, 4097, 16 << 10, (16 << 10) + 1, 70_000, 37][i % 8])
        .collect();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let sent_sizes = sizes.clone();
    let sender = tokio::spawn(async move {
        let mut conn = Framed::connect(&addr, Duration::ZERO).await.unwrap();
        let pieces: Vec<Vec<u8>> = sent_sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| piece(i, len))
            .collect();
        let bulk: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let first = DataRequest::Probe { sent_at_us: 1 };
        conn.write_message(1, &first, &bulk).await.unwrap();
        let second = DataRequest::Probe { sent_at_us: 2 };
        conn.write_message(2, &second, &[]).await.unwrap();
        // Stay connected until the reader is done.
        let _ = conn.read_message::<DataRequest>().await;
    });
    let (stream, _) = listener.accept().await.unwrap();
    let mut conn = Framed::new(stream, Duration::from_micros(20));
    let (id, _) = conn.read_message::<DataRequest>().await.unwrap();
    assert_eq!(id, 1);
    for (i, &len) in sizes.iter().enumerate() {
        let mut got = vec![0u8; len];
        conn.read_exact(&mut got).await.unwrap();
        assert!(
            got == piece(i, len),
            "piece {i} ({len} bytes) read back wrong"
        );
    }
    let (id, next) = conn.read_message::<DataRequest>().await.unwrap();
    assert_eq!(id, 2, "the frame after the pieces");
    assert!(matches!(next, DataRequest::Probe { sent_at_us: 2 }));
    drop(conn);
    sender.await.unwrap();
}
