//! The adversary: a process that keeps knocking on the master's and the nodes' ports during
//! the fault phase, beside honest traffic. As a stranger (another cluster's token) it tries
//! handshakes, garbage, frames announced and never finished, and connections that say nothing:
//! it may cost a connection slot for a handshake deadline, and must never get a request
//! served. As an insider it holds valid credentials of its own (a node's, as a compromised
//! node would, and a client's) and tries to act as the members it can see (claim their ids,
//! say their goodbyes, unmount their segments) and beyond its roles (mount or report a disk as
//! a client, remove everything, follow the log): every such request the master serves is a violation. Neither
//! may harm a value or stop honest clients (the history and the liveness checks judge that).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use madsim::rand::Rng as _;
use mooring_core::{ClientId, DiskReport, Error, ErrorCode, SegmentId, SegmentSpec};
use mooring_proto::auth::{
    Claims, Credential, DEFAULT_TENANT, Handshake, NONCE_LEN, Plane, Roles, answer_challenge,
    client_proof,
};
use mooring_proto::transport::ControlPlane;
use mooring_proto::wire::{
    DiskSync, Follow, Goodbye, Heartbeat, ListKeys, ListSegments, MountSegment, Remove, RemoveAll,
    StateFile, UnmountSegment,
};
use mooring_transport_tcp::{Framed, TcpControlPlane};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::debug;

use crate::plan::Member;
use crate::world::{DATA_PORT, World, ip, master_addr};

/// What an attempt reports when a server let the stranger in.
const ADMITTED: &str = "admitted";

/// The stranger's address.
pub fn stranger_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 4, 1))
}

/// Knocks until killed: a new attempt every 25 ms, each of a randomly chosen kind, on the
/// master or one of the `nodes` data servers; attempts that stall run beside the next ones.
pub async fn knock(world: Arc<World>) {
    let nodes = world.plan.shape.nodes;
    let wrong = Credential::from_secret([0xBA; 32]);
    loop {
        let (target, kind) = {
            let mut rng = madsim::rand::thread_rng();
            let target = match rng.gen_range(0..=nodes) {
                0 => (master_addr(), Plane::Control),
                i => (
                    SocketAddr::new(ip(Member::Node(i - 1)), DATA_PORT),
                    Plane::Data,
                ),
            };
            (target, rng.gen_range(0..7u8))
        };
        let (target, plane) = target;
        let (wrong, world) = (wrong.clone(), world.clone());
        if kind >= 4 {
            tokio::spawn(async move {
                if let Err(breach) = insider(&world, kind).await {
                    world.history().violation(breach);
                }
            });
            tokio::time::sleep(Duration::from_millis(25)).await;
            continue;
        }
        tokio::spawn(async move {
            if let Ok(stream) = TcpStream::connect(target).await {
                let outcome = attempt(stream, kind, &wrong, plane).await;
                debug!(%target, kind, "stranger attempt: {outcome:?}");
                if outcome.as_ref().is_err_and(|e| e == ADMITTED) {
                    world.history().violation(format!(
                        "a stranger with another cluster's token was welcomed at {target}"
                    ));
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The insider's credential with `roles` in `tenant`: valid, issued from the cluster's own
/// token.
fn insider_credential(roles: Roles, tenant: &str) -> Credential {
    crate::members::cluster_token()
        .issue(Claims {
            name: format!("insider-{roles}").replace(',', "-"),
            tenant: tenant.into(),
            roles,
            serial: 0x1d,
            expires: 0,
        })
        .expect("the cluster token issues")
}

/// Whether an answer to a request the insider may not make shows it got past the master's
/// checks: served, or refused for another reason than who is asking. Network failures
/// (`RPC_FAIL`, an unreachable or refusing master) prove nothing either way.
fn got_past<T: std::fmt::Debug>(what: &str, outcome: Result<T, Error>) -> Result<(), String> {
    match outcome {
        Err(e) if e.code == ErrorCode::ILLEGAL_CLIENT => {
            mooring::coverage::hit(mooring::coverage::Path::INSIDER_REFUSED);
            Ok(())
        }
        Err(e) if e.code == ErrorCode::RPC_FAIL => {
            if e.to_string().contains("authentication failed") {
                mooring::coverage::hit(mooring::coverage::Path::INSIDER_REFUSED);
            }
            Ok(())
        }
        Err(e) if e.code == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS => Ok(()),
        other => Err(format!(
            "an insider's {what} got past the master's checks: {other:?}"
        )),
    }
}

/// One insider attempt of `kind` (4: act as a node whose id it sees, 5: speak for it on its
/// own connection, 6: work beyond a client's role); a breach is returned as the violation.
async fn insider(world: &World, kind: u8) -> Result<(), String> {
    let control = |credential: &Credential, id: ClientId| -> Arc<dyn ControlPlane> {
        TcpControlPlane::new(
            world.master_target(),
            Duration::from_secs(1),
            Duration::ZERO,
            Some(credential.clone()),
            id,
        )
    };
    let node = insider_credential(Roles::NODE, DEFAULT_TENANT);
    let own = ClientId(node.client_id(madsim::rand::random()));
    let as_node = control(&node, own);
    if kind == 6 {
        let client = insider_credential(Roles::CLIENT, DEFAULT_TENANT);
        let own = ClientId(client.client_id(madsim::rand::random()));
        let as_client = control(&client, own);
        let spec = SegmentSpec {
            name: "insider".into(),
            base: 1 << 40,
            size: 1 << 20,
            endpoint: format!("{}:{DATA_PORT}", stranger_ip()),
            key: 1,
            rdma_key: None,
        };
        got_past(
            "mount as a client",
            as_client.call(MountSegment { client: own, spec }).await,
        )?;
        // A node's disk report, which claims and drops disk copies, for a segment no one
        // mounted: the role check must refuse it before the master looks for the segment.
        got_past(
            "disk report as a client",
            as_client
                .call(DiskSync {
                    client: own,
                    segment: SegmentId(u64::MAX),
                    report: DiskReport::default(),
                })
                .await,
        )?;
        got_past(
            "remove_all as a client",
            as_client
                .call(RemoveAll {
                    tenant: DEFAULT_TENANT.into(),
                })
                .await,
        )?;
        if forged_claims_welcomed(&client).await {
            return Err("an insider's claims, raised to every role, were welcomed".into());
        }
        // A client of another tenant reaches for the workload's keys, below the library.
        let outsider = insider_credential(Roles::CLIENT, "elsewhere");
        let own = ClientId(outsider.client_id(madsim::rand::random()));
        let as_outsider = control(&outsider, own);
        let victim = world.keys[madsim::rand::random::<usize>() % world.keys.len()].clone();
        got_past(
            "remove of another tenant's key",
            as_outsider.call(Remove { key: victim }).await,
        )?;
        got_past(
            "listing of another tenant",
            as_outsider
                .call(ListKeys {
                    tenant: DEFAULT_TENANT.into(),
                    pattern: ".*".into(),
                })
                .await,
        )?;
        return got_past(
            "follow as a client",
            as_client
                .call(Follow {
                    follower: "master-1".into(),
                    at: StateFile::Snapshot(0),
                    offset: 0,
                })
                .await,
        );
    }
    // A node sees who owns each segment: it picks one of another member's.
    let Ok(segments) = as_node.call(ListSegments {}).await else {
        return Ok(());
    };
    let Some(victim) = segments.into_iter().find(|s| s.owner != own) else {
        return Ok(());
    };
    if kind == 4 {
        let as_victim = control(&node, victim.owner);
        return got_past(
            "heartbeat as another member's id",
            as_victim
                .call(Heartbeat {
                    client: victim.owner,
                })
                .await,
        );
    }
    got_past(
        "unmount of another's segment",
        as_node
            .call(UnmountSegment {
                client: victim.owner,
                name: victim.name.clone(),
            })
            .await,
    )?;
    got_past(
        "goodbye for another member",
        as_node
            .call(Goodbye {
                client: victim.owner,
            })
            .await,
    )
}

/// Whether the master welcomes `held`'s claims raised to every role, proved with `held`'s own
/// member key (what a member would try to grant itself more).
async fn forged_claims_welcomed(held: &Credential) -> bool {
    let Ok(stream) = TcpStream::connect(master_addr()).await else {
        return false;
    };
    let mut conn = Framed::new(stream, Duration::ZERO);
    let Ok((_, Handshake::Challenge { nonce, .. })) = conn.read_message::<Handshake>().await else {
        return false;
    };
    let mut raised = held.claims().expect("a member credential").clone();
    raised.roles = Roles::ALL;
    let own = [0x22; NONCE_LEN];
    let answer = Handshake::MemberAnswer {
        nonce: own,
        client: 0,
        claims: raised.encode().into_bytes(),
        proof: client_proof(held.control_key(), &nonce, &own, 0),
    };
    if conn.write_message(0, &answer, &[]).await.is_err() {
        return false;
    }
    let welcomed = matches!(
        conn.read_message::<Handshake>().await,
        Ok((_, Handshake::Welcome { .. }))
    );
    if !welcomed {
        mooring::coverage::hit(mooring::coverage::Path::INSIDER_REFUSED);
    }
    welcomed
}

/// One attempt; what it got is only logged (the servers must refuse them all).
async fn attempt(
    mut stream: TcpStream,
    kind: u8,
    wrong: &Credential,
    plane: Plane,
) -> Result<(), String> {
    match kind {
        // A handshake with another cluster's token: the server must refuse it.
        0 => {
            let mut conn = Framed::new(stream, Duration::ZERO);
            let (_, challenge) = conn
                .read_message::<Handshake>()
                .await
                .map_err(|e| format!("{e:?}"))?;
            let answer = answer_challenge(Some(wrong), plane, &challenge, &[0x11; NONCE_LEN], 0)?;
            conn.write_message(0, &answer, &[])
                .await
                .map_err(|e| e.to_string())?;
            match conn.read_message::<Handshake>().await {
                Ok((_, Handshake::Welcome { .. })) => Err(ADMITTED.into()),
                other => {
                    debug!("stranger refused as it should be: {other:?}");
                    Ok(())
                }
            }
        }
        // Garbage.
        1 => stream
            .write_all(b"GET / HTTP/1.1\r\nHost: mooring\r\n\r\n")
            .await
            .map_err(|e| e.to_string()),
        // A frame header announcing 16 MiB, then silence.
        2 => {
            let mut header = Vec::from(*b"MOOR");
            header.extend_from_slice(&[mooring_proto::wire::WIRE_VERSION, 5, 0, 0]);
            header.extend_from_slice(&0u64.to_le_bytes());
            header.extend_from_slice(&(16u32 << 20).to_le_bytes());
            header.extend_from_slice(&0u32.to_le_bytes());
            stream.write_all(&header).await.map_err(|e| e.to_string())?;
            stream.flush().await.map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        }
        // Nothing at all.
        _ => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        }
    }
}
