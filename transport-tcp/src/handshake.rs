//! The handshake that opens every TCP connection (see `mooring_proto::auth`): the server
//! challenges, the client proves its credential (to a master: the secret or its member
//! credential; to a node: the data-plane key), the server proves it back. A
//! peer that fails gets one clear refusal frame and the connection closes; it never reaches a
//! request handler.

use std::time::Duration;

use mooring_core::client::FenceRule;
use tokio::time::Instant;

use mooring_proto::auth::{
    Credential, Gate, Handshake, NONCE_LEN, Peer, Plane, answer_challenge, check_welcome,
    judge_answer,
};

use crate::framed::{Framed, ReadError};

/// Longest handshake message accepted: they are a few dozen bytes, and the peer has not
/// proved anything yet when the first arrives.
const MAX_HANDSHAKE: usize = 64 << 10;

/// How long a server waits for a new connection's answer. Short: a peer that connects and
/// says nothing holds a connection slot for no more than this.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// A fresh nonce (in simulation builds, from the run's seeded generator, so seeds replay).
fn nonce() -> [u8; NONCE_LEN] {
    #[cfg(madsim)]
    return madsim::rand::random();
    #[cfg(not(madsim))]
    {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the operating system's random source");
        nonce
    }
}

/// The client's clock for a connection: send times are measured from `origin` (send time
/// zero, a message the server notes the arrival of: the handshake's answer, or a data
/// connection's probe), and the shortest round trip seen bounds how late the server's view
/// of this clock may be (see `PeerClock`).
#[derive(Clone, Copy, Debug)]
pub struct ConnectionClock {
    /// When the message at send time zero went out.
    pub origin: Instant,
    /// The shortest round trip seen on the connection.
    pub rtt: Duration,
}

impl ConnectionClock {
    /// A message sent now, to be acted on no later than `deadline`: its send time and the
    /// validity to announce (what is left, less the round trip the server's view of this
    /// clock may lag by), both in microseconds. `None` when nothing would be left.
    pub fn stamp(&self, deadline: Instant) -> Option<(u64, u64)> {
        let now = Instant::now();
        let remaining = deadline.saturating_duration_since(now).as_micros() as u64;
        let valid_for = FenceRule::announced_validity(remaining, self.rtt.as_micros() as u64)?;
        let sent_at = now.saturating_duration_since(self.origin);
        Some((sent_at.as_micros() as u64, valid_for))
    }

    /// Notes a round trip that took `rtt`.
    pub fn saw_round_trip(&mut self, rtt: Duration) {
        self.rtt = self.rtt.min(rtt);
    }
}

/// The client's side on `plane`, speaking for client id `client` (0: none): answers the
/// server's challenge and checks its welcome.
pub async fn client(
    conn: &mut Framed,
    token: Option<&Credential>,
    plane: Plane,
    client: u128,
) -> Result<ConnectionClock, String> {
    let exchange = async {
        let (_, challenge) = conn
            .read_message_at_most::<Handshake>(MAX_HANDSHAKE)
            .await
            .map_err(unreadable)?;
        let own = nonce();
        let answer = answer_challenge(token, plane, &challenge, &own, client)?;
        let origin = Instant::now();
        conn.write_message(0, &answer, &[])
            .await
            .map_err(|e| format!("handshake send failed: {e}"))?;
        let (_, last) = conn
            .read_message_at_most::<Handshake>(MAX_HANDSHAKE)
            .await
            .map_err(unreadable)?;
        let rtt = origin.elapsed();
        check_welcome(token, plane, &own, &challenge, &last)?;
        Ok(ConnectionClock { origin, rtt })
    };
    match tokio::time::timeout(HANDSHAKE_DEADLINE, exchange).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!(
            "the server did not finish the handshake within {HANDSHAKE_DEADLINE:?}"
        )),
    }
}

/// The server's side behind `gate`: challenges, judges the answer, and welcomes or refuses
/// (then the caller closes). Returns who the peer proved it is and when its answer arrived
/// (its send time zero; see [`ConnectionClock`]). Bounded by [`HANDSHAKE_DEADLINE`].
pub async fn server(conn: &mut Framed, gate: &Gate) -> Result<(Peer, Instant), String> {
    let exchange = async {
        let own = nonce();
        let challenge = Handshake::Challenge {
            nonce: own,
            token_required: gate.credential().is_some(),
        };
        conn.write_message(0, &challenge, &[])
            .await
            .map_err(|e| format!("challenge send failed: {e}"))?;
        let (_, answer) = conn
            .read_message_at_most::<Handshake>(MAX_HANDSHAKE)
            .await
            .map_err(unreadable)?;
        let answered = Instant::now();
        match judge_answer(gate, &own, &answer, unix_now()) {
            Ok((welcome, peer)) => conn
                .write_message(0, &welcome, &[])
                .await
                .map(|()| (peer, answered))
                .map_err(|e| format!("welcome send failed: {e}")),
            Err(reason) => {
                let refusal = Handshake::Refused {
                    reason: reason.clone(),
                };
                let _ = conn.write_message(0, &refusal, &[]).await;
                Err(reason)
            }
        }
    };
    match tokio::time::timeout(HANDSHAKE_DEADLINE, exchange).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!(
            "no handshake within {HANDSHAKE_DEADLINE:?}; closing"
        )),
    }
}

/// Seconds since the Unix epoch, by the wall clock credentials' expiry is written in.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn unreadable(e: ReadError) -> String {
    match e {
        ReadError::Closed => "the peer closed the connection during the handshake (wrong port, \
                              or it refused us)"
            .into(),
        ReadError::Io(e) => format!("handshake failed: {e}"),
        ReadError::Frame(e) => format!("handshake failed: not a Mooring peer? {e}"),
    }
}
