//! Connection caps on a real master server over loopback: one identity cannot hold more than
//! its share, while another still gets in.

use std::sync::Arc;
use std::time::Duration;

use mooring_core::{Error, ErrorCode};
use mooring_proto::auth::{Credential, Gate, Plane};
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
async fn connect(addr: &str, token: &Credential, identity: u128) -> (Framed, bool) {
    let mut conn = Framed::connect(addr, Duration::ZERO).await.unwrap();
    handshake::client(&mut conn, Some(token), Plane::Control, identity)
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

/// A master server with `limits` on a free loopback port, and its token.
async fn serve(limits: Arc<ConnectionLimits>) -> (String, Credential) {
    let token = Credential::from_secret([9; 32]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // The server runs until the test's runtime ends.
    drop(spawn_rpc_server_with_limits(
        listener,
        Arc::new(Refuser),
        Duration::ZERO,
        Arc::new(Gate::new(Some(token.clone()), Plane::Control).unwrap()),
        limits,
    ));
    (addr, token)
}

#[tokio::test]
async fn one_identity_holds_at_most_its_share() {
    let (addr, token) = serve(ConnectionLimits::new(16, 4, 2)).await;
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

#[tokio::test]
async fn strangers_holding_the_handshake_room_never_keep_a_member_out() {
    let room = 8;
    let (addr, token) = serve(ConnectionLimits::new(1024, room, 64)).await;
    // Far more silent sockets than the handshake room holds, all opened first.
    let mut strangers = Vec::new();
    for _ in 0..20 * room {
        strangers.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // A member arriving now is let in (the longest waiting stranger goes), well inside the
    // handshake deadline the strangers would otherwise hold their places for.
    for identity in 1..=3 {
        let (_member, served) = tokio::time::timeout(
            handshake::HANDSHAKE_DEADLINE / 2,
            connect(&addr, &token, identity),
        )
        .await
        .expect("a member's handshake finishes while strangers hold the room");
        assert!(served, "member {identity} was not served");
    }
}
