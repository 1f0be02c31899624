//! Criterion benchmark of the TCP data plane over loopback: one node's data server and one
//! client's data plane in this process, reading a batch of 32 values of 4 KiB (what a batch
//! get of small KV blocks asks one node for), one 4 KiB value, and 32 values of 64 KiB, each
//! in one request, checksums and all. The server and the client share a two-thread runtime,
//! so the figures are the data path's own costs (system calls, copies, sums) more than the
//! scheduling `mooring bench` also sees with its processes.
//!
//! Run: `cargo bench -p mooring-benches --bench tcp`. Throughput is reported in bytes/s.

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mooring_proto::transport::{DataPlane, DataServer, ReadOp};
use mooring_transport_tcp::{DataPlaneConfig, LocalSegments, TcpDataPlane, TcpDataServer};

/// Bytes of the node's segment the reads come from.
const SEGMENT: usize = 64 << 20;

fn batch_reads(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let memory =
        mooring::node::memory::segment_memory(SEGMENT, true, false).expect("segment memory");
    let base = memory.base();
    let (_server, plane, node) = runtime.block_on(async {
        let segments = Arc::new(LocalSegments::default());
        let server = TcpDataServer::start(
            "127.0.0.1:0",
            None,
            segments,
            1,
            Duration::from_micros(20),
            None,
        )
        .await
        .expect("a data server on loopback");
        let node = server.export(memory).expect("the segment exported");
        // The client's own segments are none of the node's, so every read crosses loopback.
        let plane = TcpDataPlane::new(
            Arc::new(LocalSegments::default()),
            DataPlaneConfig::default(),
        );
        (server, plane, node)
    });
    let mut group = c.benchmark_group("tcp read");
    for (count, size) in [(32usize, 4usize << 10), (1, 4 << 10), (32, 64 << 10)] {
        group.throughput(Throughput::Bytes((count * size) as u64));
        let mut buffers = vec![vec![0u8; size]; count];
        group.bench_function(format!("{count} x {} KiB", size >> 10), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let ops = buffers
                        .iter_mut()
                        .enumerate()
                        .map(|(i, dest)| ReadOp {
                            addr: base + (i * size) as u64,
                            dest,
                        })
                        .collect();
                    let sums = plane.read(&node, ops).await.expect("a read over loopback");
                    assert_eq!(sums.len(), count);
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, batch_reads);
criterion_main!(benches);
