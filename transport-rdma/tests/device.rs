//! On a real RDMA device (built with `--features ibverbs`): a node's segment exported and a
//! client writing and reading it back over a loopback queue pair. Where there is no device
//! (or no ibverbs build) the test says why and skips.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::Result;
use mooring_proto::transport::{BoxFuture, ReadOp, SegmentMemory, WriteOp};
use mooring_transport_rdma::verbs::{QpEndpoint, Verbs};
use mooring_transport_rdma::{Handshake, RdmaClient, RdmaConfig, RdmaServer};

struct Loopback<V: Verbs>(Arc<RdmaServer<V>>);

impl<V: Verbs> Handshake for Loopback<V> {
    fn connect(
        &self,
        local: QpEndpoint,
        replaces: Option<u32>,
    ) -> BoxFuture<'_, Result<QpEndpoint>> {
        Box::pin(async move { self.0.accept(local, replaces) })
    }
}

/// Exports 1 MiB on `server`'s device, writes a pattern through `client` and reads it back.
#[cfg_attr(not(feature = "ibverbs"), allow(dead_code))]
async fn round_trip<V: Verbs>(server: V, client: V) {
    let owner = Arc::new(Mutex::new(vec![0u8; 1 << 20]));
    let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
    // SAFETY: the Vec is never resized and `owner` keeps it alive.
    let segment = unsafe { SegmentMemory::new(ptr, 1 << 20, owner.clone()) };
    let server = Arc::new(RdmaServer::new(Arc::new(server), 16));
    let rkey = server.export(segment.clone()).unwrap().rkey;
    let client = RdmaClient::new(Arc::new(client), RdmaConfig::default());
    let peer = client.peer(Arc::new(Loopback(server.clone())));
    let value: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let ops = [WriteOp {
        addr: segment.base() + 4096,
        src: &value,
    }];
    client
        .write(&peer, rkey, &ops, Duration::from_secs(5))
        .await
        .unwrap();
    let mut back = vec![0u8; value.len()];
    let mut ops = [ReadOp {
        addr: segment.base() + 4096,
        dest: &mut back,
    }];
    client.read(&peer, rkey, &mut ops).await.unwrap();
    assert_eq!(back, value);
}

#[tokio::test(flavor = "current_thread")]
async fn put_and_get_over_a_real_device() {
    #[cfg(feature = "ibverbs")]
    {
        use mooring_transport_rdma::device;
        let names: Vec<String> = std::env::var("MOORING_RDMA_DEVICE")
            .map(|d| d.split(',').map(String::from).collect())
            .unwrap_or_default();
        let (server, client) = match (device::open(&names, 1 << 20), device::open(&names, 1 << 20))
        {
            (Ok(s), Ok(c)) => (s, c),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("SKIPPED: no usable RDMA device: {e}");
                return;
            }
        };
        round_trip(server, client).await;
    }
    #[cfg(not(feature = "ibverbs"))]
    eprintln!(
        "SKIPPED: built without the ibverbs feature; run \
         `cargo test -p mooring-transport-rdma --features ibverbs` where a device exists"
    );
}
