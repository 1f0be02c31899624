//! Same-host shared memory as users meet it: a master and nodes as real processes on this
//! host, clients in this process that map the nodes' segments and copy by memcpy, with the
//! nodes' own counters showing that no value crossed their TCP data servers.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mooring::transports::TransportChoice;
use mooring::{Client, ClientConfig};
use mooring_core::{ErrorCode, ReplicateConfig, SegmentInfo};
use mooring_proto::transport::NodeAddr;

mod common;

use common::{BIN, Proc, args, http_get, sample, value};

/// The node's metrics page.
fn node_metrics(addr: &str) -> String {
    http_get(addr, "/metrics", None).1
}

/// A counter's value on a metrics page.
fn counter(text: &str, name: &str) -> f64 {
    sample(text, name).unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// A 32 MiB node named `name` serving `transports`; returns it and where its metrics are.
fn start_node(master: &str, name: &str, transports: &str) -> (Proc, String) {
    let (node, [metrics]) = Proc::start_on_free_ports(true, |[metrics]| {
        args(&[
            "node",
            "--master",
            master,
            "--size",
            "32MiB",
            "--name",
            name,
            "--transports",
            transports,
            "--metrics-listen",
            metrics,
        ])
    });
    (node, metrics)
}

async fn client(master: &str, transport: TransportChoice) -> Client {
    let mut config = ClientConfig::new(master);
    config.transport = transport;
    Client::connect(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_values_move_by_memcpy_and_stay_verified() {
    let master = Proc::start(&["master", "--listen", "127.0.0.1:0"]);
    let addr = master.announced_addr();
    // Both serve shared memory (the default) beside TCP.
    let (_a, metrics_a) = start_node(&addr, "node-a", "tcp,shm");
    let (_b, [metrics_b]) = Proc::start_on_free_ports(true, |[metrics]| {
        args(&[
            "node",
            "--master",
            &addr,
            "--size",
            "32MiB",
            "--name",
            "node-b",
            "--metrics-listen",
            metrics,
        ])
    });
    let shm = client(&addr, TransportChoice::Shm).await;
    let two = ReplicateConfig::replicas(2);
    let sizes: Vec<usize> = (0..24).map(|i| 1 + (i * 7919 * 37) % 1_500_000).collect();
    for (i, &len) in sizes.iter().enumerate() {
        shm.put(&format!("k{i}"), &value(i as u64, len), &two)
            .await
            .unwrap();
    }
    let other = client(&addr, TransportChoice::Auto).await;
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(
            shm.get(&format!("k{i}")).await.unwrap(),
            value(i as u64, len)
        );
        assert_eq!(
            other.get(&format!("k{i}")).await.unwrap(),
            value(i as u64, len)
        );
    }
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (i, got) in other.batch_get(&keys).await.into_iter().enumerate() {
        assert_eq!(got.unwrap(), value(i as u64, sizes[i]), "k{i}");
    }
    // Every value went in and out by memcpy: neither node's TCP data server moved one.
    for metrics in [&metrics_a, &metrics_b] {
        let page = node_metrics(metrics);
        assert_eq!(counter(&page, "mooring_node_reads_total"), 0.0, "{page}");
        assert_eq!(counter(&page, "mooring_node_writes_total"), 0.0, "{page}");
    }
    // A client that asks for TCP gets TCP, with the same bytes.
    let tcp = client(&addr, TransportChoice::Tcp).await;
    assert_eq!(tcp.get("k3").await.unwrap(), value(3, sizes[3]));
    let page = node_metrics(&metrics_a);
    let page_b = node_metrics(&metrics_b);
    assert!(
        counter(&page, "mooring_node_reads_total") + counter(&page_b, "mooring_node_reads_total")
            >= 1.0,
        "{page}"
    );
    // An upsert through shared memory is seen whole by a TCP reader.
    shm.upsert("k3", &value(99, 777_777), &two).await.unwrap();
    assert_eq!(tcp.get("k3").await.unwrap(), value(99, 777_777));
    for c in [shm, other, tcp] {
        c.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_is_refused_where_it_cannot_run_and_auto_falls_back() {
    let master = Proc::start(&["master", "--listen", "127.0.0.1:0"]);
    let addr = master.announced_addr();
    let (_tcp_only, metrics) = start_node(&addr, "tcp-only", "tcp");
    // Forced shared memory to a node that does not serve it: a clear error, no data.
    let shm = client(&addr, TransportChoice::Shm).await;
    let err = shm
        .put("k", &value(1, 5000), &ReplicateConfig::single())
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("shared memory") && message.contains("--transport auto"),
        "{message}"
    );
    // auto reaches it over TCP.
    let auto = client(&addr, TransportChoice::Auto).await;
    auto.put("k", &value(1, 5000), &ReplicateConfig::single())
        .await
        .unwrap();
    assert_eq!(auto.get("k").await.unwrap(), value(1, 5000));
    assert!(counter(&node_metrics(&metrics), "mooring_node_writes_total") >= 1.0);
    // A node cannot serve shm without TCP, and says so before mapping anything.
    let out = Command::new(BIN)
        .args([
            "node",
            "--master",
            &addr,
            "--size",
            "8MiB",
            "--transports",
            "shm",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("must include tcp"), "{stderr}");
}

/// A connection to the node socket an offer names.
fn connect(socket: &[u8; 16]) -> std::os::unix::net::UnixStream {
    let (address, _) = mooring_transport_shm::socket_address(socket).unwrap();
    std::os::unix::net::UnixStream::connect_addr(&address).unwrap()
}

/// Sends `bytes` on the node socket an offer names: whether a descriptor came back, and the
/// reply.
fn send(socket: &[u8; 16], bytes: &[u8]) -> (bool, mooring_transport_shm::handoff::Reply) {
    let stream = connect(socket);
    (&stream).write_all(bytes).unwrap();
    let (reply, fd) = mooring_transport_shm::handoff::recv_reply(&stream).unwrap();
    (fd.is_some(), reply)
}

/// Presents `ticket` on the node socket an offer names.
fn redeem(socket: &[u8; 16], ticket: &[u8; 16]) -> (bool, mooring_transport_shm::handoff::Reply) {
    send(
        socket,
        &mooring_transport_shm::handoff::encode_request(ticket),
    )
}

/// The first segment the master at `addr` lists, and its node's address, asked as a peer
/// that is no client.
async fn first_segment(addr: &str) -> (SegmentInfo, NodeAddr) {
    use mooring_proto::transport::ControlPlane;
    use mooring_proto::wire::ListSegments;
    use mooring_transport_tcp::TcpControlPlane;
    let control = TcpControlPlane::new(
        addr,
        Duration::from_secs(5),
        Duration::ZERO,
        None,
        mooring_core::ClientId(0x5A),
    );
    let control: &dyn ControlPlane = &*control;
    let info = control.call(ListSegments {}).await.unwrap().remove(0);
    let node = NodeAddr {
        endpoint: info.endpoint.clone().into(),
        key: info.key,
        rdma_key: None,
    };
    (info, node)
}

/// A TCP data plane of its own (no segment of this process's).
fn tcp_data_plane() -> Arc<mooring_transport_tcp::TcpDataPlane> {
    use mooring_transport_tcp::{DataPlaneConfig, LocalSegments, TcpDataPlane};
    TcpDataPlane::new(
        Arc::new(LocalSegments::default()),
        DataPlaneConfig::default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_come_only_through_the_data_server_and_work_once() {
    use mooring_proto::transport::DataPlane;
    use mooring_proto::wire::DataRequest;
    use mooring_transport_shm::handoff::Reply;
    let master = Proc::start(&["master", "--listen", "127.0.0.1:0"]);
    let addr = master.announced_addr();
    let (_node, _) = start_node(&addr, "node-a", "tcp,shm");
    let (_, node) = first_segment(&addr).await;
    let data = tcp_data_plane();
    let ask = |key| data.request(&node, DataRequest::ShmAttach { key });
    let offer = ask(node.key).await.unwrap().into_shm_offer("node").unwrap();
    assert_eq!(offer.host, mooring_transport_shm::host_id().unwrap());
    // A ticket never issued, then a real one twice: only the real one's first use maps.
    let (fd, reply) = redeem(&offer.socket, &[0x42; 16]);
    assert!(
        !fd && matches!(reply, Reply::Refused(ref why) if why.contains("ticket")),
        "{reply:?}"
    );
    let (fd, reply) = redeem(&offer.socket, &offer.ticket);
    assert!(fd, "{reply:?}");
    assert!(
        matches!(reply, Reply::Granted { len, proof, .. } if len == 32 << 20 && proof == offer.proof),
        "{reply:?}"
    );
    let (fd, reply) = redeem(&offer.socket, &offer.ticket);
    assert!(
        !fd && matches!(reply, Reply::Refused(_)),
        "a ticket works once: {reply:?}"
    );
    // No ticket for a key the node does not serve.
    let err = ask(node.key ^ 0xFF00).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "{err}");
    // Garbage on the socket is refused, a client that says nothing is let go, and the node
    // keeps serving.
    let (fd, reply) = send(&offer.socket, &[0xEE; 21]);
    assert!(!fd && matches!(reply, Reply::Refused(_)), "{reply:?}");
    drop(connect(&offer.socket));
    let offer = ask(node.key).await.unwrap().into_shm_offer("node").unwrap();
    assert!(redeem(&offer.socket, &offer.ticket).0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_memory_write_past_its_window_copies_nothing() {
    use mooring_core::Checksum;
    use mooring_proto::transport::{DataPlane, ReadOp, WriteOp};
    use mooring_transport_shm::ShmDataPlane;
    let master = Proc::start(&["master", "--listen", "127.0.0.1:0"]);
    let addr = master.announced_addr();
    let (_node, metrics) = start_node(&addr, "node-a", "tcp,shm");
    let (info, node) = first_segment(&addr).await;
    let shm = ShmDataPlane::new(tcp_data_plane(), true).unwrap();
    // Nothing is allocated in the fresh segment: these bytes are this test's to write.
    let at = info.base + (1 << 20);
    let bytes = value(5, 3 << 20);
    let write = |valid_for| {
        shm.write(
            &node,
            vec![WriteOp {
                addr: at,
                src: &bytes,
            }],
            valid_for,
        )
    };
    let err = write(Duration::ZERO).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::TRANSFER_FAIL, "{err}");
    assert!(err.to_string().contains("window passed"), "{err}");
    let mut back = vec![0u8; bytes.len()];
    let read = shm
        .read(
            &node,
            vec![ReadOp {
                addr: at,
                dest: &mut back,
            }],
        )
        .await;
    assert_ne!(back, bytes, "a write past its window copied bytes");
    assert_eq!(read.unwrap(), vec![Checksum::of(&back)]);
    // Within its window the same write lands whole, summed as it is copied.
    let sums = write(Duration::from_secs(10)).await.unwrap();
    assert_eq!(sums, vec![Checksum::of(&bytes)]);
    let read = shm
        .read(
            &node,
            vec![ReadOp {
                addr: at,
                dest: &mut back,
            }],
        )
        .await;
    assert_eq!(read.unwrap(), vec![Checksum::of(&bytes)]);
    assert_eq!(back, bytes);
    let page = node_metrics(&metrics);
    assert_eq!(counter(&page, "mooring_node_writes_total"), 0.0, "{page}");
}
