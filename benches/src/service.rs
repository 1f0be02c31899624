//! A master service (`mooring::master::MasterService`, what each RPC connection calls) driven
//! through its requests, with many in flight, as clients would: for the benches of its journal
//! and of its restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mooring::master::MasterService;
use mooring_core::{Checksum, ReplicateConfig, SegmentSpec};
use mooring_proto::transport::{Answer, RpcHandler};
use mooring_proto::wire::{
    Hello, MasterRequest, MasterResponse, MountSegment, PutEnd, PutStart, Reply,
};

use crate::CLIENT;

async fn answer(service: &MasterService, request: MasterRequest) -> MasterResponse {
    match service.answer(request) {
        Answer::Now(response) => response,
        Answer::WhenDurable(durable) => durable.await,
    }
}

/// Says hello as [`CLIENT`] and mounts one segment of `pool_bytes` (metadata only: no memory
/// behind it).
pub fn mounted(service: &MasterService, pool_bytes: u64) {
    service.handle(Hello { client: CLIENT }.into()).unwrap();
    service
        .handle(
            MountSegment {
                client: CLIENT,
                spec: SegmentSpec {
                    name: "bench".into(),
                    base: 0,
                    size: pool_bytes,
                    endpoint: "bench:1".into(),
                    key: 1,
                    rdma_key: None,
                },
            }
            .into(),
        )
        .unwrap();
}

/// What [`put_pairs`] puts.
pub struct Pairs {
    /// The next object's number, shared by the tasks (and by successive calls).
    pub next: Arc<AtomicU64>,
    /// Each object's size.
    pub object_size: u64,
    /// Object `i`'s key.
    pub key: fn(u64) -> String,
    /// Pairs in flight at once.
    pub in_flight: usize,
    /// Whether each pair replaces a value already there (an upsert) rather than adding one.
    pub upsert: bool,
}

/// Puts (or upserts) objects `next..next + count` (PutStart then PutEnd, each answered once durable)
/// with `pairs.in_flight` tasks; returns how long they took.
pub fn put_pairs(
    runtime: &tokio::runtime::Runtime,
    service: &Arc<MasterService>,
    pairs: &Pairs,
    count: u64,
) -> Duration {
    let started = Instant::now();
    let end = pairs.next.load(Ordering::Relaxed) + count;
    runtime.block_on(async {
        let tasks: Vec<_> = (0..pairs.in_flight)
            .map(|_| {
                let (service, next) = (service.clone(), pairs.next.clone());
                let (key, object_size, upsert) = (pairs.key, pairs.object_size, pairs.upsert);
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= end {
                            break;
                        }
                        let key = key(i);
                        let start = PutStart {
                            client: CLIENT,
                            key: key.clone(),
                            size: object_size,
                            config: ReplicateConfig::single(),
                            upsert,
                        };
                        let Ok(Reply::PutStart(grant)) = answer(&service, start.into()).await
                        else {
                            panic!("put start refused");
                        };
                        let end = PutEnd {
                            client: CLIENT,
                            key,
                            write: grant.write_id,
                            checksum: Checksum::of(b""),
                        };
                        answer(&service, end.into()).await.expect("put end");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a put task");
        }
    });
    // The tasks may have claimed numbers past the end before seeing it.
    pairs.next.store(end, Ordering::Relaxed);
    started.elapsed()
}
