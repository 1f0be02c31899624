//! Connection caps on a real master server over loopback: one identity cannot hold more than
//! its share, while another still gets in.

use std::sync::Arc;
use std::time::Duration;

use mooring_core::{Error, ErrorCode};
use mooring_proto::auth::ClusterToken;
use mooring_proto::transport::RpcHandler;
use mooring_proto::wire::{ControlRequest, GetStats, MasterRequest, MasterResponse};
use mooring_transport_tcp::limits::ConnectionLimits;
use mooring_transport_tcp::{Framed, handshake, spawn_rpc_server_with_limits};

/// Answers every request with the same refusal: enough to tell served from closed.
struct Refuser;

impl RpcHandler for Refuser {
    fn handle(&self, _: MasterRequest) -> MasterResponse {
        Err(Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
            "served",
        ))
    }
}

/// A connection that finished the handshake as `identity`, and whether a request on it is
/// answered.
async fn connect(addr: &str, token: &ClusterToken, identity: u128) -> (Framed, bool) {
    let mut conn = Framed::connect(addr, Duration::ZERO).await.unwrap();
    handshake::client(&mut conn, Some(token), identity)
        .await
        .unwrap();
    let request = ControlRequest {
        sent_at_us: 0,
        valid_for_us: 10_000_000,
        request: GetStats {}.into(),
    };
    conn.write_message(1, &request, &[]).await.unwrap();
    let served = matches!(
        conn.read_message::<MasterResponse>().await,
        Ok((1, Err(e))) if e.code == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
    );
    (conn, served)
}

#[tokio::test]
async fn one_identity_holds_at_most_its_share() {
    let token = ClusterToken::from_bytes([9; 32]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let limits = ConnectionLimits::new(16, 4, 2);
    let _server = spawn_rpc_server_with_limits(
        listener,
        Arc::new(Refuser),
        Duration::ZERO,
        Some(token.clone()),
        limits,
    );
    let (first, served) = connect(&addr, &token, 1).await;
    assert!(served);
    let (_second, served) = connect(&addr, &token, 1).await;
    assert!(served);
    let (_third, served) = connect(&addr, &token, 1).await;
    assert!(!served, "a third connection of identity 1 was served");
    let (_other, served) = connect(&addr, &token, 2).await;
    assert!(
        served,
        "identity 2 was refused while identity 1 is at its cap"
    );
    // Closing one frees its share.
    drop(first);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (_again, served) = connect(&addr, &token, 1).await;
    assert!(served, "identity 1 was refused after closing a connection");
}
