//! The simulated transport under madsim: calls and transfers work, and every fault does what
//! it says (`--cfg madsim` builds only).
#![cfg(madsim)]

use std::net::{IpAddr, SocketAddr};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use madsim::runtime::Runtime;
use mooring_core::{Checksum, ErrorCode};
use mooring_proto::transport::{
    ControlPlane, DataPlane, DataServer, ReadOp, RpcHandler, SegmentMemory, WriteOp,
};
use mooring_proto::wire::{MasterRequest, MasterResponse, RemoveAll, Reply};
use mooring_transport_sim::{
    NetFaults, SimControlPlane, SimDataPlane, SimDataServer, SimNet, serve_rpc,
};

/// Answers every request with how many it has handled.
#[derive(Default)]
struct Counter(AtomicU64);

impl RpcHandler for Counter {
    fn handle(&self, _: MasterRequest) -> MasterResponse {
        Ok(Reply::RemoveAll(self.0.fetch_add(1, Ordering::Relaxed) + 1))
    }
}

const SERVER: &str = "10.0.0.1:700";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Runs `client` on one node against a server node running `server`.
fn scenario<S, C, SF, CF>(seed: u64, server: S, client: C)
where
    S: Fn(Arc<SimNet>) -> SF + Send + Sync + 'static,
    SF: std::future::Future<Output = ()> + 'static,
    C: FnOnce(Arc<SimNet>) -> CF + Send + 'static,
    CF: std::future::Future<Output = ()> + Send + 'static,
{
    let runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
    let net = Arc::new(SimNet::new());
    let server_net = net.clone();
    runtime
        .create_node()
        .ip(ip("10.0.0.1"))
        .init(move || server(server_net.clone()))
        .build();
    let node = runtime.create_node().ip(ip("10.0.0.2")).build();
    runtime.block_on(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        node.spawn(client(net)).await.unwrap();
    });
}

#[test]
fn rpc_round_trips_and_faults_behave() {
    scenario(
        1,
        |net| async move {
            let handler: Arc<dyn RpcHandler> = Arc::new(Counter::default());
            let _task = serve_rpc(net, SERVER.parse().unwrap(), handler)
                .await
                .unwrap();
            std::future::pending::<()>().await;
        },
        |net| async move {
            let master: SocketAddr = SERVER.parse().unwrap();
            let control = SimControlPlane::new(
                net.clone(),
                ip("10.0.0.2"),
                master,
                Duration::from_millis(500),
            )
            .await
            .unwrap();
            let call = || {
                control.send(MasterRequest::from(RemoveAll {
                    tenant: "default".into(),
                }))
            };
            assert!(matches!(call().await, Ok(Reply::RemoveAll(1))));

            net.set_faults(NetFaults {
                loss: 1.0,
                ..NetFaults::default()
            });
            assert_eq!(call().await.unwrap_err().code, ErrorCode::RPC_FAIL);

            net.set_faults(NetFaults {
                corrupt: 1.0,
                ..NetFaults::default()
            });
            assert_eq!(call().await.unwrap_err().code, ErrorCode::RPC_FAIL);
            assert!(net.stats().refused >= 1, "the corrupt request was refused");

            net.set_faults(NetFaults {
                duplicate: 1.0,
                ..NetFaults::default()
            });
            let Ok(Reply::RemoveAll(before)) = call().await else {
                panic!("call failed")
            };
            net.heal();
            let Ok(Reply::RemoveAll(after)) = call().await else {
                panic!("call failed")
            };
            assert_eq!(after, before + 1, "a duplicated request is handled once");
            assert!(net.stats().deduplicated >= 1);

            net.block(ip("10.0.0.2"), ip("10.0.0.1"));
            assert_eq!(call().await.unwrap_err().code, ErrorCode::RPC_FAIL);
            net.unblock(ip("10.0.0.2"), ip("10.0.0.1"));
            net.block(ip("10.0.0.1"), ip("10.0.0.2"));
            assert_eq!(
                call().await.unwrap_err().code,
                ErrorCode::RPC_FAIL,
                "replies are cut"
            );
            net.heal();

            net.set_faults(NetFaults {
                max_delay: Duration::from_millis(100),
                ..NetFaults::default()
            });
            let results = futures_util::future::join_all((0..20).map(|_| call())).await;
            assert!(
                results.iter().all(|r| r.is_ok()),
                "delayed and reordered calls all complete"
            );
        },
    );
}

fn segment(len: usize) -> SegmentMemory {
    let owner = Arc::new(std::sync::Mutex::new(vec![0u8; len]));
    let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
    // SAFETY: the Vec lives as long as `owner`, which the segment keeps.
    unsafe { SegmentMemory::new(ptr, len, owner.clone()) }
}

#[test]
fn transfers_move_exact_bytes_and_refuse_dead_keys() {
    let key = Arc::new(std::sync::Mutex::new(None));
    let seen = key.clone();
    scenario(
        2,
        move |net| {
            let key = key.clone();
            async move {
                let server = SimDataServer::start(net, SERVER.parse().unwrap(), 7)
                    .await
                    .unwrap();
                let memory = segment(4 << 20);
                let addr = server.export(memory.clone()).unwrap();
                *key.lock().unwrap() = Some((addr, memory.base()));
                std::future::pending::<()>().await;
            }
        },
        move |net| async move {
            let (node, base) = seen.lock().unwrap().clone().unwrap();
            let data = SimDataPlane::new(net.clone(), ip("10.0.0.2"), Duration::from_millis(500))
                .await
                .unwrap();
            // Larger than one datagram, and two ranges at once.
            let big: Vec<u8> = (0..(3 << 20) / 2).map(|i| (i % 251) as u8).collect();
            data.write(
                &node,
                vec![
                    WriteOp {
                        addr: base,
                        src: &big,
                    },
                    WriteOp {
                        addr: base + (2 << 20),
                        src: b"tail",
                    },
                ],
                Duration::from_secs(5),
            )
            .await
            .unwrap();
            let mut back = vec![0u8; big.len()];
            let mut tail = [0u8; 4];
            let sums = data
                .read(
                    &node,
                    vec![
                        ReadOp {
                            addr: base,
                            dest: &mut back,
                        },
                        ReadOp {
                            addr: base + (2 << 20),
                            dest: &mut tail,
                        },
                    ],
                )
                .await
                .unwrap();
            assert!(back == big && &tail == b"tail");
            // Each operation's checksum, assembled from the pieces it was cut into.
            assert_eq!(sums, [Checksum::of(&big), Checksum::of(b"tail")]);

            let outside = data
                .write(
                    &node,
                    vec![WriteOp {
                        addr: base + (4 << 20),
                        src: b"x",
                    }],
                    Duration::from_secs(5),
                )
                .await;
            assert_eq!(outside.unwrap_err().code, ErrorCode::INVALID_PARAMS);
            let mut wrong_key = node.clone();
            wrong_key.key ^= 2;
            let gone = data
                .read(
                    &wrong_key,
                    vec![ReadOp {
                        addr: base,
                        dest: &mut tail,
                    }],
                )
                .await;
            assert_eq!(gone.unwrap_err().code, ErrorCode::REPLICA_IS_GONE);

            // Corruption never lands: every corrupted write is refused, memory keeps the old bytes.
            net.set_faults(NetFaults {
                corrupt: 1.0,
                ..NetFaults::default()
            });
            let junk = vec![0xEEu8; 4096];
            assert!(
                data.write(
                    &node,
                    vec![WriteOp {
                        addr: base,
                        src: &junk
                    }],
                    Duration::from_secs(5)
                )
                .await
                .is_err()
            );
            net.heal();
            let mut head = vec![0u8; 4096];
            data.read(
                &node,
                vec![ReadOp {
                    addr: base,
                    dest: &mut head,
                }],
            )
            .await
            .unwrap();
            assert_eq!(head, big[..4096]);

            // A write that reaches the node after its deadline is refused, never applied.
            let late = data
                .write(
                    &node,
                    vec![WriteOp {
                        addr: base,
                        src: &junk,
                    }],
                    Duration::ZERO,
                )
                .await;
            assert_eq!(late.unwrap_err().code, ErrorCode::TRANSFER_FAIL);
            data.read(
                &node,
                vec![ReadOp {
                    addr: base,
                    dest: &mut head,
                }],
            )
            .await
            .unwrap();
            assert_eq!(head, big[..4096]);
        },
    );
}
