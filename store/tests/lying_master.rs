//! A client talking to a master that lies: lengths no process could allocate, replicas that
//! disagree, batch replies of the wrong count. Every call must fail with an error that says
//! so; none may abort or hang the client.

use std::sync::Arc;
use std::time::Duration;

use mooring::{Client, ClientConfig};
use mooring_core::{
    Checksum, ErrorCode, HeartbeatAck, HeartbeatStatus, Medium, Millis, ReplicaDescriptor,
    ReplicaList, ReplicaStatus, SegmentId,
};
use mooring_proto::transport::RpcHandler;
use mooring_proto::wire::{ClusterInfo, MasterRequest, MasterResponse, Reply};
use mooring_transport_tcp::spawn_rpc_server;

/// A list with one memory replica per length.
fn list(lens: &[u64]) -> ReplicaList {
    ReplicaList {
        replicas: lens
            .iter()
            .map(|&len| ReplicaDescriptor {
                segment: SegmentId(1),
                addr: 1 << 40,
                len,
                status: ReplicaStatus::Complete,
                medium: Medium::Memory,
            })
            .collect(),
        lease_ttl: Millis(5_000),
        checksum: Checksum::EMPTY,
    }
}

struct Liar;

impl RpcHandler for Liar {
    fn handle(&self, request: MasterRequest) -> MasterResponse {
        Ok(match request {
            MasterRequest::Hello(_) => Reply::Hello(ClusterInfo {
                lease_ttl: Millis(5_000),
                put_start_discard_timeout: Millis(30_000),
                put_start_release_timeout: Millis(600_000),
                client_ttl: Millis(10_000),
                max_key_len: 256,
            }),
            MasterRequest::Heartbeat(_) => Reply::Heartbeat(HeartbeatAck {
                status: HeartbeatStatus::Known,
                segments: Vec::new(),
            }),
            MasterRequest::GetReplicaList(g) => Reply::GetReplicaList(match g.key.as_str() {
                "huge" => list(&[1 << 62]),
                "disagree" => list(&[10, 1 << 40]),
                _ => list(&[]),
            }),
            // Three results for however many keys were asked.
            MasterRequest::BatchGetReplicaList(_) => Reply::BatchGetReplicaList(vec![
                Ok(list(&[1 << 62])),
                Ok(list(&[u64::MAX])),
                Ok(list(&[])),
            ]),
            // A reply to another request.
            _ => Reply::RemoveAll(7),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lies_become_errors_not_aborts() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _server = spawn_rpc_server(listener, Arc::new(Liar), Duration::ZERO, None).unwrap();
    let client = Client::connect(ClientConfig::new(&addr)).await.unwrap();
    for key in ["huge", "disagree", "empty"] {
        let err = client.get(key).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::INTERNAL_ERROR, "{key}: {err}");
        let message = err.to_string();
        assert!(
            message.contains("the master described") || message.contains("cannot allocate"),
            "{key}: {err}"
        );
    }
    let mut small = [0u8; 16];
    assert!(client.get_into("huge", &mut small).await.is_err());
    for keys in [&["a", "b", "c"][..], &["a", "b"]] {
        let results = client.batch_get(keys).await;
        assert_eq!(results.len(), keys.len());
        assert!(results.iter().all(Result::is_err), "{results:?}");
    }
    let err = client.get_size("k").await.unwrap_err();
    assert!(err.to_string().contains("another request"), "{err}");
}
