//! A client given a group of masters over loopback: what it reports when time runs out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mooring_core::{ClientId, Error, ErrorCode};
use mooring_proto::transport::{ControlPlane, RpcHandler};
use mooring_proto::wire::{GetStats, MasterRequest, MasterResponse, Reply, STANDBY_REFUSAL};
use mooring_transport_tcp::{TcpControlPlane, spawn_rpc_server};

/// A master that does not lead: refuses everything, applying nothing.
struct Standby;

impl RpcHandler for Standby {
    fn handle(&self, _: MasterRequest) -> MasterResponse {
        Err(Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
            format!("{STANDBY_REFUSAL}: no leader is elected yet; retry shortly"),
        ))
    }
}

/// A master that leads now but answers late: it applies each request, then its reply is held
/// up past the client's timeout.
struct SlowLeader {
    applied: AtomicUsize,
    delay: Duration,
}

impl RpcHandler for SlowLeader {
    fn handle(&self, _: MasterRequest) -> MasterResponse {
        self.applied.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        Ok(Reply::RemoveAll(0))
    }
}

/// Serves `handler` on loopback from a runtime of its own (a handler that holds up its reply
/// must not hold up the client's timer); returns its address.
fn serve(handler: Arc<dyn RpcHandler>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap().to_string()).unwrap();
            let _ = spawn_rpc_server(listener, handler, Duration::ZERO, None)
                .unwrap()
                .await;
        });
    });
    rx.recv().unwrap()
}

/// A standby refused first, then the request reached a master that applied it but whose
/// reply came too late: the outcome is unknown, so the error must not be the earlier
/// refusal, which says nothing was done (a group simulation seed caught a write reported
/// refused that had committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_with_a_try_in_flight_is_not_reported_as_the_earlier_refusal() {
    let timeout = Duration::from_millis(300);
    let leader = Arc::new(SlowLeader {
        applied: AtomicUsize::new(0),
        delay: timeout * 3,
    });
    let standby_addr = serve(Arc::new(Standby));
    let leader_addr = serve(leader.clone());
    let plane = TcpControlPlane::new(
        format!("{standby_addr},{leader_addr}"),
        timeout,
        Duration::ZERO,
        None,
        ClientId(7),
    );
    let err = plane.send(GetStats {}.into()).await.unwrap_err();
    assert_eq!(
        leader.applied.load(Ordering::SeqCst),
        1,
        "the leader got the request"
    );
    assert_eq!(err.code, ErrorCode::RPC_FAIL, "{err}");
    assert!(err.to_string().contains("did not answer"), "{err}");
}

/// With only refusals (no try in flight when time runs out), the refusal is what is
/// reported: it names why nothing was done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_only_refusals_reports_the_refusal() {
    let first = serve(Arc::new(Standby));
    let second = serve(Arc::new(Standby));
    let plane = TcpControlPlane::new(
        format!("{first},{second}"),
        // Mid-way through a pause between rounds (every 100 ms), not during a try.
        Duration::from_millis(350),
        Duration::ZERO,
        None,
        ClientId(7),
    );
    let err = plane.send(GetStats {}.into()).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "{err}");
    assert!(err.to_string().contains(STANDBY_REFUSAL), "{err}");
}
