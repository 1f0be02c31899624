//! The adversary: a process without the cluster token that keeps knocking on the master's
//! and the nodes' ports during the fault phase (wrong-token handshakes, garbage, frames
//! announced and never finished, connections that say nothing), beside honest traffic. It may
//! cost a connection slot for a handshake deadline; it must never get a request served, harm
//! a value or stop honest clients (the history and the liveness checks judge that).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use madsim::rand::Rng as _;
use mooring_proto::auth::{Credential, Handshake, NONCE_LEN, Plane, answer_challenge};
use mooring_transport_tcp::Framed;
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
            (target, rng.gen_range(0..4u8))
        };
        let (target, plane) = target;
        let (wrong, world) = (wrong.clone(), world.clone());
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
