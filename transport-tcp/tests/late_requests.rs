//! A request that reaches the master after its sender stopped waiting is refused, not applied:
//! over loopback, against a real master server, with the send times a client would stamp.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mooring_core::ErrorCode;
use mooring_proto::transport::{ControlPlane, RpcHandler};
use mooring_proto::wire::{ControlRequest, GetStats, MasterRequest, MasterResponse, Reply};
use mooring_transport_tcp::{Framed, TcpControlPlane, handshake, spawn_rpc_server};

/// Counts the requests it is handed.
#[derive(Default)]
struct Counter(AtomicUsize);

impl RpcHandler for Counter {
    fn handle(&self, _: MasterRequest) -> MasterResponse {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Reply::GetStats(Default::default()))
    }
}

async fn server() -> (String, Arc<Counter>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let counter = Arc::new(Counter::default());
    spawn_rpc_server(listener, counter.clone(), Duration::ZERO, None).unwrap();
    (addr, counter)
}

/// Sends GetStats stamped `sent_at` on the connection's clock, valid for `valid_for`, and
/// returns the master's answer.
async fn send(conn: &mut Framed, sent_at: Duration, valid_for: Duration) -> MasterResponse {
    let request = ControlRequest {
        sent_at_us: sent_at.as_micros() as u64,
        valid_for_us: valid_for.as_micros() as u64,
        request: GetStats {}.into(),
    };
    conn.write_message(7, &request, &[]).await.unwrap();
    let (id, response) = conn.read_message::<MasterResponse>().await.unwrap();
    assert_eq!(id, 7);
    response
}

#[tokio::test]
async fn a_request_past_its_validity_is_refused_and_not_applied() {
    let (addr, counter) = server().await;
    let mut conn = Framed::connect(&addr, Duration::ZERO).await.unwrap();
    let clock = handshake::client(&mut conn, None, mooring_proto::auth::Plane::Control, 1)
        .await
        .unwrap();

    // Sent now, valid for a second: applied.
    let response = send(&mut conn, clock.origin.elapsed(), Duration::from_secs(1)).await;
    assert!(
        response.is_ok(),
        "a timely request was refused: {response:?}"
    );
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);

    // Stamped 300 ms ago and valid for 100 ms (as a request held up in the network would
    // arrive): refused, and the handler never sees it.
    let stamped = clock.origin.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let response = send(&mut conn, stamped, Duration::from_millis(100)).await;
    let refusal = response.expect_err("a late request was applied");
    assert_eq!(refusal.code, ErrorCode::RPC_FAIL);
    assert!(
        refusal.to_string().contains("after its sender's deadline"),
        "unclear refusal: {refusal}"
    );
    assert_eq!(
        counter.0.load(Ordering::SeqCst),
        1,
        "the late request was applied"
    );

    // The connection still serves timely requests.
    let response = send(&mut conn, clock.origin.elapsed(), Duration::from_secs(1)).await;
    assert!(response.is_ok());
    assert_eq!(counter.0.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_client_stamps_requests_the_master_accepts() {
    let (addr, counter) = server().await;
    let plane: Arc<dyn ControlPlane> = TcpControlPlane::new(
        &addr,
        Duration::from_secs(2),
        Duration::ZERO,
        None,
        mooring_core::ClientId(1),
    );
    for _ in 0..20 {
        plane.call(GetStats {}).await.unwrap();
    }
    assert_eq!(counter.0.load(Ordering::SeqCst), 20);
}
