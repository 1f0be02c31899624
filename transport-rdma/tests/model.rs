//! The RDMA transport's logic over the software HCA: registration and keys, bounds, batching
//! and striping, every completion error, reconnection, and no late write after a reported
//! failure.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::{ErrorCode, Result};
use mooring_proto::transport::{BoxFuture, ReadOp, SegmentMemory, WriteOp};
use mooring_transport_rdma::model::{Fabric, Fault, FaultRates, ModelVerbs};
use mooring_transport_rdma::verbs::{
    Access, Completion, DeviceCaps, MemoryKeys, Opcode, QpEndpoint, QpState, Sge, Verbs,
    VerbsError, WcStatus, WorkRequest,
};
use mooring_transport_rdma::{Handshake, Peer, PollConfig, RdmaClient, RdmaConfig, RdmaServer};

const SEGMENT: usize = 1 << 20;

/// A verbs wrapper that records what the transport posts and registers.
struct Spy {
    inner: ModelVerbs,
    posts: Mutex<Vec<(u32, WorkRequest)>>,
    registrations: AtomicUsize,
}

impl Spy {
    fn new(inner: ModelVerbs) -> Spy {
        Spy {
            inner,
            posts: Mutex::new(Vec::new()),
            registrations: AtomicUsize::new(0),
        }
    }

    fn posted(&self) -> Vec<(u32, WorkRequest)> {
        std::mem::take(&mut *self.posts.lock().unwrap())
    }
}

impl Verbs for Spy {
    fn caps(&self) -> &DeviceCaps {
        self.inner.caps()
    }
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<MemoryKeys, VerbsError> {
        self.registrations.fetch_add(1, Ordering::Relaxed);
        unsafe { self.inner.register(addr, len, access) }
    }
    fn deregister(&self, lkey: u32) {
        self.inner.deregister(lkey)
    }
    fn create_qp(&self, depth: u32) -> Result<u32, VerbsError> {
        self.inner.create_qp(depth)
    }
    fn endpoint(&self, qpn: u32) -> Result<QpEndpoint, VerbsError> {
        self.inner.endpoint(qpn)
    }
    fn modify_qp(
        &self,
        qpn: u32,
        state: QpState,
        remote: Option<&QpEndpoint>,
    ) -> Result<(), VerbsError> {
        self.inner.modify_qp(qpn, state, remote)
    }
    fn qp_state(&self, qpn: u32) -> Result<QpState, VerbsError> {
        self.inner.qp_state(qpn)
    }
    unsafe fn post_send(&self, qpn: u32, requests: &[WorkRequest]) -> Result<(), VerbsError> {
        self.posts
            .lock()
            .unwrap()
            .extend(requests.iter().map(|wr| (qpn, wr.clone())));
        unsafe { self.inner.post_send(qpn, requests) }
    }
    fn poll_cq(&self, qpn: u32, max: usize, out: &mut Vec<Completion>) -> usize {
        self.inner.poll_cq(qpn, max, out)
    }
    fn destroy_qp(&self, qpn: u32) {
        self.inner.destroy_qp(qpn)
    }
}

/// The node side reached in-process, counting handshakes.
struct Direct {
    server: Mutex<Arc<RdmaServer<ModelVerbs>>>,
    handshakes: AtomicUsize,
}

impl Direct {
    fn new(server: Arc<RdmaServer<ModelVerbs>>) -> Arc<Direct> {
        Arc::new(Direct {
            server: Mutex::new(server),
            handshakes: AtomicUsize::new(0),
        })
    }
}

impl Handshake for Direct {
    fn connect(
        &self,
        local: QpEndpoint,
        replaces: Option<u32>,
    ) -> BoxFuture<'_, Result<QpEndpoint>> {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        let server = self.server.lock().unwrap().clone();
        Box::pin(async move { server.accept(local, replaces) })
    }
}

/// Memory that outlives every registration of it.
fn memory(len: usize) -> SegmentMemory {
    let owner = Arc::new(Mutex::new(vec![0u8; len]));
    let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
    // SAFETY: the Vec is never resized; `owner` keeps it alive.
    unsafe { SegmentMemory::new(ptr, len, owner) }
}

fn bytes_at(memory: &SegmentMemory, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    assert!(memory.copy_out(memory.base() + offset, &mut out));
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

struct Cluster {
    fabric: Fabric,
    client: RdmaClient<Spy>,
    server: Arc<RdmaServer<ModelVerbs>>,
    handshake: Arc<Direct>,
    peer: Peer<Spy>,
    segment: SegmentMemory,
    rkey: u32,
}

impl Cluster {
    fn with(config: RdmaConfig, caps: DeviceCaps) -> Cluster {
        let fabric = Fabric::new();
        let server = Arc::new(RdmaServer::new(
            Arc::new(fabric.device("node0", caps.clone())),
            64,
        ));
        let segment = memory(SEGMENT);
        let rkey = server.export(segment.clone()).unwrap().rkey;
        let client = RdmaClient::new(Arc::new(Spy::new(fabric.device("client0", caps))), config);
        let handshake = Direct::new(server.clone());
        let peer = client.peer(handshake.clone());
        Cluster {
            fabric,
            client,
            server,
            handshake,
            peer,
            segment,
            rkey,
        }
    }

    fn new() -> Cluster {
        Cluster::with(RdmaConfig::default(), ModelVerbs::caps(1 << 30))
    }

    fn addr(&self, offset: u64) -> u64 {
        self.segment.base() + offset
    }

    async fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let ops = [WriteOp {
            addr: self.addr(offset),
            src,
        }];
        self.client
            .write(&self.peer, self.rkey, &ops, Duration::from_secs(10))
            .await
    }

    async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut dest = vec![0u8; len];
        let mut ops = [ReadOp {
            addr: self.addr(offset),
            dest: &mut dest,
        }];
        self.client.read(&self.peer, self.rkey, &mut ops).await?;
        Ok(dest)
    }
}

fn quick() -> RdmaConfig {
    RdmaConfig {
        timeout: Duration::from_millis(300),
        ..RdmaConfig::default()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn written_bytes_read_back() {
    let c = Cluster::new();
    let value = pattern(5000, 1);
    c.write(100, &value).await.unwrap();
    assert_eq!(bytes_at(&c.segment, 100, 5000), value);
    assert_eq!(c.read(100, 5000).await.unwrap(), value);
    assert_eq!(
        c.handshake.handshakes.load(Ordering::Relaxed),
        1,
        "one queue pair, reused"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_wrong_rkey_is_refused_and_writes_nothing() {
    let c = Cluster::new();
    let value = pattern(64, 2);
    let ops = [WriteOp {
        addr: c.addr(0),
        src: &value,
    }];
    let err = c
        .client
        .write(&c.peer, c.rkey ^ 0x100, &ops, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL);
    assert!(
        err.to_string().contains("remote access"),
        "{}",
        err.to_string()
    );
    assert_eq!(bytes_at(&c.segment, 0, 64), vec![0u8; 64]);
    // The queue pair failed; the next transfer reconnects and works.
    c.write(0, &value).await.unwrap();
    assert_eq!(c.handshake.handshakes.load(Ordering::Relaxed), 2);
    assert_eq!(bytes_at(&c.segment, 0, 64), value);
}

#[tokio::test(flavor = "current_thread")]
async fn ranges_outside_the_segment_are_refused() {
    let c = Cluster::new();
    let value = pattern(200, 3);
    let err = c.write(SEGMENT as u64 - 100, &value).await.unwrap_err();
    assert!(
        err.to_string().contains("remote access"),
        "{}",
        err.to_string()
    );
    let err = c.read(SEGMENT as u64 - 1, 2).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL);
    // Below the base too.
    let mut dest = [0u8; 8];
    let mut ops = [ReadOp {
        addr: c.segment.base() - 8,
        dest: &mut dest,
    }];
    assert!(c.client.read(&c.peer, c.rkey, &mut ops).await.is_err());
    assert_eq!(
        bytes_at(&c.segment, SEGMENT as u64 - 100, 100),
        vec![0u8; 100]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_unexported_segment_is_unreachable() {
    let c = Cluster::new();
    c.write(0, b"before").await.unwrap();
    c.server.unexport(c.rkey);
    let err = c.write(0, b"after!").await.unwrap_err();
    assert!(
        err.to_string().contains("remote access"),
        "{}",
        err.to_string()
    );
    assert_eq!(bytes_at(&c.segment, 0, 6), b"before");
    // A fresh export has a fresh key; the old one stays dead.
    let rkey = c.server.export(c.segment.clone()).unwrap().rkey;
    assert_ne!(rkey, c.rkey);
    let ops = [WriteOp {
        addr: c.addr(0),
        src: b"again!",
    }];
    c.client
        .write(&c.peer, rkey, &ops, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(bytes_at(&c.segment, 0, 6), b"again!");
}

/// A queue pair on `a` connected to a new one on `b`, both in RTS; returns `a`'s.
fn connected_pair(a: &ModelVerbs, b: &ModelVerbs) -> u32 {
    let qa = a.create_qp(8).unwrap();
    let qb = b.create_qp(8).unwrap();
    for (v, q, peer) in [
        (a, qa, b.endpoint(qb).unwrap()),
        (b, qb, a.endpoint(qa).unwrap()),
    ] {
        v.modify_qp(q, QpState::Init, None).unwrap();
        v.modify_qp(q, QpState::ReadyToReceive, Some(&peer))
            .unwrap();
        v.modify_qp(q, QpState::ReadyToSend, None).unwrap();
    }
    qa
}

#[tokio::test(flavor = "current_thread")]
async fn the_model_enforces_access_rights_and_local_keys() {
    let fabric = Fabric::new();
    let a = fabric.device("a", ModelVerbs::caps(1 << 20));
    let b = fabric.device("b", ModelVerbs::caps(1 << 20));
    let local = memory(4096);
    let remote = memory(4096);
    let lkeys = unsafe { a.register(local.base(), 4096, Access::LOCAL) }.unwrap();
    // Registered for local use only: no remote access.
    let rkeys = unsafe { b.register(remote.base(), 4096, Access::LOCAL) }.unwrap();
    let qa = connected_pair(&a, &b);
    let wr = |id, lkey| WorkRequest {
        wr_id: id,
        opcode: Opcode::Write,
        sges: [Sge {
            addr: local.base(),
            len: 16,
            lkey,
        }]
        .into_iter()
        .collect(),
        remote_addr: remote.base(),
        rkey: rkeys.rkey,
        signaled: true,
    };
    unsafe { a.post_send(qa, &[wr(1, lkeys.lkey)]) }.unwrap();
    let mut out = Vec::new();
    a.poll_cq(qa, 8, &mut out);
    assert_eq!(
        out,
        vec![Completion {
            wr_id: 1,
            status: WcStatus::RemoteAccess
        }]
    );
    assert_eq!(a.qp_state(qa).unwrap(), QpState::Error);
    // A bad local key on a fresh queue pair.
    let qc = a.create_qp(8).unwrap();
    assert!(
        unsafe { a.post_send(qc, &[wr(2, lkeys.lkey)]) }.is_err(),
        "RESET refuses posts"
    );
    assert!(
        a.modify_qp(qc, QpState::ReadyToSend, None).is_err(),
        "RESET cannot jump to RTS"
    );
    a.destroy_qp(qc);
    let rkeys2 = unsafe { b.register(remote.base(), 4096, Access::REMOTE) }.unwrap();
    let qa2 = connected_pair(&a, &b);
    let mut bad_local = wr(3, lkeys.lkey + 99);
    bad_local.rkey = rkeys2.rkey;
    unsafe { a.post_send(qa2, &[bad_local]) }.unwrap();
    out.clear();
    a.poll_cq(qa2, 8, &mut out);
    assert_eq!(out[0].status, WcStatus::LocalProtection);
}

#[tokio::test(flavor = "current_thread")]
async fn large_transfers_split_and_stripe_over_queue_pairs() {
    let config = RdmaConfig {
        stripe_unit: 64 << 10,
        stripe_min: 64 << 10,
        queue_pairs_per_peer: 4,
        ..RdmaConfig::default()
    };
    let c = Cluster::with(config, ModelVerbs::caps(1 << 30));
    let value = pattern(700 << 10, 4);
    c.write(0, &value).await.unwrap();
    let posts = c.client.verbs().posted();
    assert!(posts.iter().all(|(_, wr)| wr.len() <= 64 << 10));
    assert_eq!(posts.iter().map(|(_, wr)| wr.len()).sum::<u64>(), 700 << 10);
    let qps: std::collections::BTreeSet<u32> = posts.iter().map(|(q, _)| *q).collect();
    assert_eq!(qps.len(), 4, "striped over every queue pair of the peer");
    assert_eq!(bytes_at(&c.segment, 0, 700 << 10), value);
    assert_eq!(c.read(0, 700 << 10).await.unwrap(), value);
    assert_eq!(c.peer.queue_pairs(), 4);
}

#[tokio::test(flavor = "current_thread")]
async fn the_device_message_limit_bounds_every_request() {
    let c = Cluster::with(RdmaConfig::default(), ModelVerbs::caps(3000));
    let value = pattern(10_000, 5);
    c.write(7, &value).await.unwrap();
    let posts = c.client.verbs().posted();
    assert!(posts.iter().all(|(_, wr)| wr.len() <= 3000));
    assert_eq!(posts.len(), 4);
    assert_eq!(c.read(7, 10_000).await.unwrap(), value);
}

#[tokio::test(flavor = "current_thread")]
async fn contiguous_remote_ranges_go_as_one_scatter_list() {
    let c = Cluster::new();
    let value = pattern(4 * 1024, 6);
    c.write(0, &value).await.unwrap();
    c.client.verbs().posted();
    let mut parts = [[0u8; 1024]; 4];
    let mut ops: Vec<ReadOp> = parts
        .iter_mut()
        .enumerate()
        .map(|(i, dest)| ReadOp {
            addr: c.addr(i as u64 * 1024),
            dest: &mut dest[..],
        })
        .collect();
    c.client.read(&c.peer, c.rkey, &mut ops).await.unwrap();
    let posts = c.client.verbs().posted();
    assert_eq!(posts.len(), 1, "four fragments, one request");
    assert_eq!(posts[0].1.sges.len(), 4);
    assert_eq!(parts.concat(), value);
}

#[tokio::test(flavor = "current_thread")]
async fn only_some_requests_are_signalled_and_the_queue_depth_holds() {
    let config = RdmaConfig {
        stripe_unit: 1024,
        stripe_min: 1 << 30,
        queue_depth: 32,
        poll: PollConfig {
            signal_every: 8,
            ..PollConfig::default()
        },
        ..RdmaConfig::default()
    };
    let c = Cluster::with(config, ModelVerbs::caps(1 << 30));
    let value = pattern(200 * 1024, 7);
    c.write(0, &value).await.unwrap();
    let posts = c.client.verbs().posted();
    assert_eq!(posts.len(), 200);
    let signalled = posts.iter().filter(|(_, wr)| wr.signaled).count();
    assert!(
        (25..50).contains(&signalled),
        "{signalled} of 200 signalled"
    );
    assert!(
        posts.last().unwrap().1.signaled,
        "the last request is always signalled"
    );
    // 200 requests through 32 send-queue slots: the model refuses any post past the depth,
    // so getting here means the transfer posted in windows as slots came back.
    assert_eq!(bytes_at(&c.segment, 0, 200 * 1024), value);
}

#[tokio::test(flavor = "current_thread")]
async fn registered_buffers_skip_registration_and_others_are_registered_per_transfer() {
    let c = Cluster::new();
    let mut buffer = vec![0u8; 8192];
    let before = c.client.verbs().registrations.load(Ordering::Relaxed);
    c.write(0, &pattern(4096, 8)).await.unwrap();
    let after_temp = c.client.verbs().registrations.load(Ordering::Relaxed);
    assert_eq!(
        after_temp,
        before + 1,
        "an unregistered source is registered for the transfer"
    );
    unsafe { c.client.register(buffer.as_mut_ptr() as u64, 8192) }.unwrap();
    let registered = c.client.verbs().registrations.load(Ordering::Relaxed);
    let mut ops = [ReadOp {
        addr: c.addr(0),
        dest: &mut buffer[100..4196],
    }];
    c.client.read(&c.peer, c.rkey, &mut ops).await.unwrap();
    assert_eq!(
        c.client.verbs().registrations.load(Ordering::Relaxed),
        registered
    );
    assert_eq!(&buffer[100..4196], &pattern(4096, 8)[..]);
    // A range running past the registered buffer is not covered by it.
    c.client.unregister(buffer.as_ptr() as u64);
    let mut ops = [ReadOp {
        addr: c.addr(0),
        dest: &mut buffer[..10],
    }];
    c.client.read(&c.peer, c.rkey, &mut ops).await.unwrap();
    assert_eq!(
        c.client.verbs().registrations.load(Ordering::Relaxed),
        registered + 1
    );
}

#[tokio::test(flavor = "current_thread")]
async fn retry_exceeded_fails_and_the_queue_pair_reconnects() {
    let c = Cluster::new();
    c.write(0, b"first").await.unwrap();
    c.fabric.inject(None, 0, Fault::RetryExceeded);
    let err = c.write(0, b"second").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL);
    assert!(
        err.to_string().contains("did not answer"),
        "{}",
        err.to_string()
    );
    assert_eq!(bytes_at(&c.segment, 0, 5), b"first");
    c.write(0, b"third").await.unwrap();
    assert_eq!(bytes_at(&c.segment, 0, 5), b"third");
    assert_eq!(c.handshake.handshakes.load(Ordering::Relaxed), 2);
    // The server dropped the queue pair the reconnect replaced.
    assert_eq!(c.server.queue_pairs(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn an_error_mid_batch_flushes_the_rest() {
    let config = RdmaConfig {
        stripe_unit: 1024,
        stripe_min: 1 << 30,
        ..RdmaConfig::default()
    };
    let c = Cluster::with(config, ModelVerbs::caps(1 << 30));
    c.fabric.inject(None, 3, Fault::RemoteAccess);
    let value = pattern(10 * 1024, 9);
    let err = c.write(0, &value).await.unwrap_err();
    assert!(
        err.to_string().contains("remote access"),
        "{}",
        err.to_string()
    );
    let counts = c.fabric.counts();
    assert_eq!(counts.executed, 3);
    assert_eq!(
        counts.flushed, 6,
        "the seven after the failed one, less none executed"
    );
    // The first three pieces landed, nothing after the failure did.
    assert_eq!(bytes_at(&c.segment, 0, 3 * 1024), value[..3 * 1024]);
    assert_eq!(
        bytes_at(&c.segment, 3 * 1024, 7 * 1024),
        vec![0u8; 7 * 1024]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_queue_pair_dying_mid_batch_fails_the_striped_transfer_everywhere() {
    let config = RdmaConfig {
        stripe_unit: 4096,
        stripe_min: 4096,
        queue_pairs_per_peer: 4,
        ..RdmaConfig::default()
    };
    let c = Cluster::with(config, ModelVerbs::caps(1 << 30));
    c.write(0, &[1u8; 64 * 1024]).await.unwrap();
    c.fabric.inject(None, 5, Fault::RetryExceeded);
    let err = c.write(0, &[2u8; 64 * 1024]).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL);
    // Whatever did not land by the failure never lands: keep the fabric busy and look again.
    let snapshot = bytes_at(&c.segment, 0, 64 * 1024);
    for _ in 0..3 {
        c.write(128 * 1024, &[3u8; 4096]).await.unwrap();
    }
    assert_eq!(bytes_at(&c.segment, 0, 64 * 1024), snapshot);
    assert!(
        snapshot.contains(&1),
        "some pieces were stopped by the failure"
    );
    c.write(0, &[4u8; 64 * 1024]).await.unwrap();
    assert_eq!(bytes_at(&c.segment, 0, 64 * 1024), vec![4u8; 64 * 1024]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_short_stall_is_waited_out() {
    let c = Cluster::with(quick(), ModelVerbs::caps(1 << 30));
    c.fabric.inject(None, 0, Fault::Stall { polls: 100 });
    c.write(0, b"late but fine").await.unwrap();
    assert_eq!(bytes_at(&c.segment, 0, 13), b"late but fine");
    assert_eq!(c.fabric.counts().stalls, 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_stall_past_the_deadline_fails_and_its_write_never_lands() {
    let c = Cluster::with(quick(), ModelVerbs::caps(1 << 30));
    c.write(0, b"old value").await.unwrap();
    c.fabric.inject(None, 0, Fault::Stall { polls: u32::MAX });
    let err = c.write(0, b"stale put").await.unwrap_err();
    assert!(
        err.to_string().contains("did not complete in time"),
        "{}",
        err.to_string()
    );
    assert!(err.to_string().contains("nothing of it is still in flight"));
    assert_eq!(bytes_at(&c.segment, 0, 9), b"old value");
    // The next writer of the range wins, and the stalled request, flushed, cannot follow.
    c.write(0, b"next put!").await.unwrap();
    for _ in 0..5 {
        c.read(0, 9).await.unwrap();
    }
    assert_eq!(bytes_at(&c.segment, 0, 9), b"next put!");
    assert!(c.fabric.counts().flushed >= 1);
}

#[tokio::test(flavor = "current_thread")]
async fn the_write_fence_bounds_how_long_a_write_may_try() {
    let c = Cluster::new();
    c.fabric.inject(None, 0, Fault::Stall { polls: u32::MAX });
    let started = tokio::time::Instant::now();
    let ops = [WriteOp {
        addr: c.addr(0),
        src: b"fenced",
    }];
    let err = c
        .client
        .write(&c.peer, c.rkey, &ops, Duration::from_millis(80))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL);
    assert!(
        started.elapsed() < Duration::from_millis(80),
        "gave up inside the fence"
    );
    assert_eq!(bytes_at(&c.segment, 0, 6), [0u8; 6]);
}

#[tokio::test(flavor = "current_thread")]
async fn an_abandoned_transfer_is_drained_before_its_buffer_is_free() {
    let c = Cluster::new();
    let mut dest = vec![0xAAu8; 4096];
    c.write(8192, &pattern(4096, 10)).await.unwrap();
    c.fabric.inject(None, 0, Fault::Stall { polls: u32::MAX });
    {
        let mut ops = [ReadOp {
            addr: c.addr(8192),
            dest: &mut dest,
        }];
        let read = c.client.read(&c.peer, c.rkey, &mut ops);
        // The caller gives up before the device answers.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), read)
                .await
                .is_err()
        );
    }
    // Nothing writes the buffer after the future is gone, whatever the fabric does next.
    dest.fill(0x55);
    c.write(0, b"traffic").await.unwrap();
    c.read(0, 7).await.unwrap();
    assert!(dest.iter().all(|&b| b == 0x55));
    assert!(c.fabric.counts().flushed >= 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_dead_node_fails_transfers_with_retry_exceeded() {
    let c = Cluster::new();
    c.write(0, b"alive").await.unwrap();
    let node_lid = 1;
    c.fabric.kill(node_lid);
    let err = c.write(0, b"dead!").await.unwrap_err();
    assert!(
        err.to_string().contains("did not answer"),
        "{}",
        err.to_string()
    );
    let err = c.read(0, 5).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL);
}

#[tokio::test(flavor = "current_thread")]
async fn a_partition_fails_transfers_until_it_heals() {
    let c = Cluster::new();
    c.write(0, b"before").await.unwrap();
    c.fabric.block("node0", "client0");
    let err = c.write(0, b"during").await.unwrap_err();
    assert!(err.to_string().contains("did not answer"), "{err}");
    assert_eq!(bytes_at(&c.segment, 0, 6), b"before");
    c.fabric.unblock("node0", "client0");
    c.write(0, b"after!").await.unwrap();
    assert_eq!(bytes_at(&c.segment, 0, 6), b"after!");
}

#[tokio::test(flavor = "current_thread")]
async fn a_restarted_node_is_reached_through_fresh_queue_pairs() {
    let c = Cluster::new();
    c.write(0, b"one").await.unwrap();
    // The node restarts: a new device (same fabric), a new export of new memory.
    let server = Arc::new(RdmaServer::new(
        Arc::new(c.fabric.device("node0-again", ModelVerbs::caps(1 << 30))),
        64,
    ));
    c.fabric.kill(1);
    let segment = memory(4096);
    let rkey = server.export(segment.clone()).unwrap().rkey;
    *c.handshake.server.lock().unwrap() = server.clone();
    let ops = [WriteOp {
        addr: segment.base(),
        src: b"two",
    }];
    // The old queue pair fails once, then reconnects to the new node.
    assert!(
        c.client
            .write(&c.peer, rkey, &ops, Duration::from_secs(5))
            .await
            .is_err()
    );
    c.client
        .write(&c.peer, rkey, &ops, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(bytes_at(&segment, 0, 3), b"two");
    assert_eq!(server.queue_pairs(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_transfers_share_a_bounded_pool() {
    let config = RdmaConfig {
        queue_pairs_per_peer: 2,
        ..RdmaConfig::default()
    };
    let c = Cluster::with(config, ModelVerbs::caps(1 << 30));
    c.fabric.inject(None, 0, Fault::Stall { polls: 200 });
    let values: Vec<Vec<u8>> = (0..8).map(|i| pattern(1000, i)).collect();
    let writes = values
        .iter()
        .enumerate()
        .map(|(i, v)| c.write(i as u64 * 1000, v));
    let results = futures_join(writes.collect()).await;
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert!(c.peer.queue_pairs() <= 2);
    for (i, v) in values.iter().enumerate() {
        assert_eq!(&bytes_at(&c.segment, i as u64 * 1000, 1000), v);
    }
}

async fn futures_join<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_node_at_its_queue_pair_limit_drops_the_oldest_and_its_client_reconnects() {
    let config = RdmaConfig {
        queue_pairs_per_peer: 1,
        ..RdmaConfig::default()
    };
    let fabric = Fabric::new();
    let server = Arc::new(RdmaServer::new(
        Arc::new(fabric.device("node0", ModelVerbs::caps(1 << 20))),
        2,
    ));
    let segment = memory(4096);
    let rkey = server.export(segment.clone()).unwrap().rkey;
    let handshake = Direct::new(server.clone());
    let clients: Vec<RdmaClient<ModelVerbs>> = (0..3)
        .map(|i| {
            RdmaClient::new(
                Arc::new(fabric.device(&format!("c{i}"), ModelVerbs::caps(1 << 20))),
                config,
            )
        })
        .collect();
    let peers: Vec<Peer<ModelVerbs>> = clients.iter().map(|c| c.peer(handshake.clone())).collect();
    let write = |i: usize| {
        let ops = [WriteOp {
            addr: segment.base() + i as u64 * 8,
            src: b"12345678",
        }];
        let (client, peer) = (&clients[i], &peers[i]);
        async move { client.write(peer, rkey, &ops, Duration::from_secs(5)).await }
    };
    write(0).await.unwrap();
    write(1).await.unwrap();
    assert_eq!(server.queue_pairs(), 2);
    // A third client: the oldest queue pair (client 0's) goes, and the limit holds.
    write(2).await.unwrap();
    assert_eq!(server.queue_pairs(), 2);
    // Client 0's next transfer fails once (its peer queue pair is gone), then reconnects.
    let err = write(0).await.unwrap_err();
    assert!(err.to_string().contains("did not answer"), "{err}");
    write(0).await.unwrap();
    assert_eq!(server.queue_pairs(), 2);
    // A client replacing its own queue pair frees the slot for the new one.
    let other = fabric.device("other", ModelVerbs::caps(1 << 20));
    let oq = other.create_qp(4).unwrap();
    let before = server.queue_pairs();
    let victim = server.accept(other.endpoint(oq).unwrap(), None).unwrap();
    assert_eq!(server.queue_pairs(), before);
    let again = other.create_qp(4).unwrap();
    server
        .accept(other.endpoint(again).unwrap(), Some(victim.qpn))
        .unwrap();
    assert_eq!(server.queue_pairs(), before);
}

#[tokio::test(flavor = "current_thread")]
async fn an_empty_batch_touches_nothing() {
    let c = Cluster::new();
    let ops: [WriteOp; 0] = [];
    c.client
        .write(&c.peer, c.rkey, &ops, Duration::from_secs(1))
        .await
        .unwrap();
    let mut none: [ReadOp; 0] = [];
    c.client.read(&c.peer, c.rkey, &mut none).await.unwrap();
    let empty = [WriteOp {
        addr: c.addr(0),
        src: &[],
    }];
    c.client
        .write(&c.peer, c.rkey, &empty, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(c.handshake.handshakes.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn under_random_faults_every_success_is_exact_and_every_failure_is_transfer_fail() {
    let config = RdmaConfig {
        stripe_unit: 2048,
        stripe_min: 4096,
        timeout: Duration::from_millis(200),
        ..RdmaConfig::default()
    };
    let c = Cluster::with(config, ModelVerbs::caps(1 << 30));
    c.fabric.set_rates(
        FaultRates {
            remote_access: 0.01,
            retry_exceeded: 0.01,
            stall: 0.02,
            stall_polls: 50,
        },
        7,
    );
    let (mut ok, mut failed) = (0, 0);
    for round in 0..200u64 {
        let len = 1 + (round as usize * 7919) % 20_000;
        let offset = (round * 4099) % (SEGMENT as u64 - 20_000);
        let value = pattern(len, round as u8);
        match c.write(offset, &value).await {
            Ok(()) => {
                ok += 1;
                assert_eq!(bytes_at(&c.segment, offset, len), value, "round {round}");
                if let Ok(back) = c.read(offset, len).await {
                    assert_eq!(back, value, "round {round}");
                }
            }
            Err(e) => {
                failed += 1;
                assert_eq!(e.code, ErrorCode::TRANSFER_FAIL);
            }
        }
    }
    assert!(ok > 100 && failed > 5, "{ok} succeeded, {failed} failed");
    let counts = c.fabric.counts();
    assert!(counts.remote_access > 0 && counts.retry_exceeded > 0 && counts.stalls > 0);
}
