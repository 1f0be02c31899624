//! Who may talk to a Mooring process: a shared cluster token and the mutual
//! challenge-response handshake that opens every control and data connection.
//!
//! The token never crosses the wire. The server opens with a nonce and whether it requires
//! the token; the client answers with its own nonce and an HMAC-SHA256 over both nonces under
//! the token; the server checks it and answers with its own HMAC over the nonces in the other
//! order, which the client checks. Each side thus proves it holds the token, and a recorded
//! exchange is useless against fresh nonces. A process without a token meets only peers without
//! one (and, by the CLI's rule, listens on loopback only unless told `--insecure`).
//!
//! Threat model: authenticated, not encrypted. Anyone who can watch the fabric sees values
//! and keys, and anyone who can rewrite packets can inject into a connection after its
//! handshake (nothing binds later frames to it); run on a trusted network or put TLS in front.
//!
//! Everything here is pure: message types, MAC computation and checks. The transports move the
//! frames and draw the nonces.

use hmac::{Hmac, Mac};
use rkyv::rancor;
use rkyv::util::AlignedVec;
use sha2::Sha256;

use crate::wire::{FrameError, FrameKind, WireMessage, wire_message};

/// Bytes of a cluster token.
pub const TOKEN_LEN: usize = 32;

/// The secret every member of a cluster holds. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterToken([u8; TOKEN_LEN]);

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(…)")
    }
}

impl ClusterToken {
    /// A token from `TOKEN_LEN` random bytes (the caller draws them).
    pub fn from_bytes(bytes: [u8; TOKEN_LEN]) -> ClusterToken {
        ClusterToken(bytes)
    }

    /// Parses a token file's contents: 64 hex digits, surrounding white space ignored.
    pub fn parse(text: &str) -> Result<ClusterToken, String> {
        let text = text.trim();
        if !text.is_ascii() {
            return Err(
                "a cluster token is hex digits only, and this holds other characters (make one \
                 with `mooring token new FILE`)"
                    .into(),
            );
        }
        if text.len() != TOKEN_LEN * 2 {
            return Err(format!(
                "a cluster token is {} hex digits, this is {} characters (make one with `mooring token new FILE`)",
                TOKEN_LEN * 2,
                text.len()
            ));
        }
        let mut bytes = [0u8; TOKEN_LEN];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|_| "a cluster token is hex digits only".to_string())?;
        }
        Ok(ClusterToken(bytes))
    }

    /// The token as a file holds it: 64 hex digits and a newline.
    pub fn to_file_text(&self) -> String {
        let mut text: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        text.push('\n');
        text
    }

    fn mac(&self, label: &[u8], first: &[u8; NONCE_LEN], second: &[u8; NONCE_LEN]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(first);
        mac.update(second);
        mac
    }

    /// The client's MAC: over both nonces and the client id it claims, so the claim cannot
    /// be changed on the way.
    fn client_mac(
        &self,
        server: &[u8; NONCE_LEN],
        client: &[u8; NONCE_LEN],
        id: u128,
    ) -> HmacSha256 {
        let mut mac = self.mac(CLIENT_LABEL, server, client);
        mac.update(&id.to_le_bytes());
        mac
    }

    /// The client's proof for a server nonce, its own nonce and the client id it claims.
    pub fn client_proof(
        &self,
        server: &[u8; NONCE_LEN],
        client: &[u8; NONCE_LEN],
        id: u128,
    ) -> [u8; 32] {
        self.client_mac(server, client, id)
            .finalize()
            .into_bytes()
            .into()
    }

    /// The server's proof for a client nonce and its own.
    pub fn server_proof(&self, client: &[u8; NONCE_LEN], server: &[u8; NONCE_LEN]) -> [u8; 32] {
        self.mac(SERVER_LABEL, client, server)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `proof` is the client's proof for these nonces and id (constant time).
    pub fn check_client(
        &self,
        server: &[u8; NONCE_LEN],
        client: &[u8; NONCE_LEN],
        id: u128,
        proof: &[u8; 32],
    ) -> bool {
        self.client_mac(server, client, id)
            .verify_slice(proof)
            .is_ok()
    }

    /// Whether `proof` is the server's proof for these nonces (compared in constant time).
    pub fn check_server(
        &self,
        client: &[u8; NONCE_LEN],
        server: &[u8; NONCE_LEN],
        proof: &[u8; 32],
    ) -> bool {
        self.mac(SERVER_LABEL, client, server)
            .verify_slice(proof)
            .is_ok()
    }
}

type HmacSha256 = Hmac<Sha256>;

/// Whether `presented` equals `expected` (a bearer token, say), in time that says nothing
/// about where they differ or how long either is: both are hashed under a fixed key and the
/// digests compared in constant time.
pub fn secrets_match(presented: &[u8], expected: &[u8]) -> bool {
    let digest = |bytes: &[u8]| {
        let mut mac = HmacSha256::new_from_slice(b"mooring secret comparison")
            .expect("HMAC takes keys of any length");
        mac.update(bytes);
        mac
    };
    let expected = digest(expected).finalize().into_bytes();
    digest(presented).verify_slice(&expected).is_ok()
}

/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 32;
const CLIENT_LABEL: &[u8] = b"mooring-handshake-client-v1";
const SERVER_LABEL: &[u8] = b"mooring-handshake-server-v1";

pub use messages::Handshake;

#[allow(missing_docs)] // rkyv's generated archive types carry no docs
mod messages {
    use super::*;

    /// One step of the handshake that opens every connection.
    #[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    #[rkyv(derive(Debug))]
    pub enum Handshake {
        /// Server → client, first: a fresh nonce, and whether the token is required.
        Challenge {
            nonce: [u8; NONCE_LEN],
            token_required: bool,
        },
        /// Client → server: its nonce, the client id the connection will speak for (0: none,
        /// a data connection) and its proof (all zero when no token is required).
        Answer {
            nonce: [u8; NONCE_LEN],
            client: u128,
            proof: [u8; 32],
        },
        /// Server → client: accepted; the server's proof (all zero without a token).
        Welcome { proof: [u8; 32] },
        /// Server → client: refused, and why; the server closes the connection.
        Refused { reason: String },
    }
}

wire_message!(Handshake, FrameKind::Handshake);

/// What a server decides about a client's answer: its welcome and the client id the
/// connection speaks for (0: none), or why not.
pub fn judge_answer(
    token: Option<&ClusterToken>,
    server_nonce: &[u8; NONCE_LEN],
    answer: &Handshake,
) -> Result<(Handshake, u128), String> {
    let Handshake::Answer {
        nonce,
        client,
        proof,
    } = answer
    else {
        return Err("authentication failed: the peer did not answer the challenge".into());
    };
    match token {
        None => Ok((Handshake::Welcome { proof: [0; 32] }, *client)),
        Some(token) if token.check_client(server_nonce, nonce, *client, proof) => Ok((
            Handshake::Welcome {
                proof: token.server_proof(nonce, server_nonce),
            },
            *client,
        )),
        Some(_) => Err(
            "authentication failed: wrong or missing cluster token (give every member the same \
             token file: --token-file or MOORING_TOKEN_FILE)"
                .into(),
        ),
    }
}

/// What a client speaking for `client` (0: none) answers a challenge with, or why it will
/// not go on.
pub fn answer_challenge(
    token: Option<&ClusterToken>,
    challenge: &Handshake,
    client_nonce: &[u8; NONCE_LEN],
    client: u128,
) -> Result<Handshake, String> {
    let Handshake::Challenge {
        nonce,
        token_required,
    } = challenge
    else {
        return Err(refusal_or(
            "the server did not open with a challenge",
            challenge,
        ));
    };
    match (token, token_required) {
        (Some(token), true) => Ok(Handshake::Answer {
            nonce: *client_nonce,
            client,
            proof: token.client_proof(nonce, client_nonce, client),
        }),
        (None, false) => Ok(Handshake::Answer {
            nonce: *client_nonce,
            client,
            proof: [0; 32],
        }),
        (None, true) => Err(
            "authentication failed: the server requires a cluster token; give this process the \
             cluster's token file (--token-file or MOORING_TOKEN_FILE)"
                .into(),
        ),
        (Some(_), false) => Err(
            "authentication failed: the server runs without a cluster token, so it cannot prove \
             it belongs to this cluster; start it with the token file"
                .into(),
        ),
    }
}

/// Checks the server's last word: its welcome and proof, or its refusal.
pub fn check_welcome(
    token: Option<&ClusterToken>,
    client_nonce: &[u8; NONCE_LEN],
    challenge: &Handshake,
    last: &Handshake,
) -> Result<(), String> {
    let Handshake::Challenge { nonce: server, .. } = challenge else {
        return Err("the server did not open with a challenge".into());
    };
    let Handshake::Welcome { proof } = last else {
        return Err(refusal_or("the server did not welcome the answer", last));
    };
    match token {
        Some(token) if !token.check_server(client_nonce, server, proof) => Err(
            "authentication failed: the server could not prove it holds the cluster token".into(),
        ),
        _ => Ok(()),
    }
}

fn refusal_or(what: &str, step: &Handshake) -> String {
    match step {
        Handshake::Refused { reason } => reason.clone(),
        _ => format!("authentication failed: {what}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_match_only_when_equal() {
        assert!(secrets_match(b"Bearer s3cret", b"Bearer s3cret"));
        assert!(!secrets_match(b"Bearer s3cre", b"Bearer s3cret"));
        assert!(!secrets_match(b"Bearer s3cret!", b"Bearer s3cret"));
        assert!(!secrets_match(b"", b"Bearer s3cret"));
    }

    use super::*;

    fn token(b: u8) -> ClusterToken {
        ClusterToken::from_bytes([b; TOKEN_LEN])
    }

    /// Runs a whole handshake between a client and a server holding these tokens.
    fn shake(client: Option<&ClusterToken>, server: Option<&ClusterToken>) -> Result<(), String> {
        let (cn, sn) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let challenge = Handshake::Challenge {
            nonce: sn,
            token_required: server.is_some(),
        };
        let answer = answer_challenge(client, &challenge, &cn, 5)?;
        let last = match judge_answer(server, &sn, &answer) {
            Ok((welcome, id)) => {
                assert_eq!(id, 5, "the claimed id reaches the server");
                welcome
            }
            Err(reason) => Handshake::Refused { reason },
        };
        check_welcome(client, &cn, &challenge, &last)
    }

    #[test]
    fn only_holders_of_the_same_token_meet() {
        let (a, b) = (token(7), token(8));
        assert_eq!(shake(Some(&a), Some(&a)), Ok(()));
        assert_eq!(shake(None, None), Ok(()));
        for (client, server) in [(Some(&a), Some(&b)), (None, Some(&a)), (Some(&a), None)] {
            let err = shake(client, server).unwrap_err();
            assert!(err.starts_with("authentication failed"), "{err}");
        }
    }

    #[test]
    fn a_server_without_the_token_cannot_fake_its_proof() {
        let a = token(7);
        let (cn, sn) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let challenge = Handshake::Challenge {
            nonce: sn,
            token_required: true,
        };
        // It replays the client's own proof as its welcome.
        let Handshake::Answer { proof, .. } =
            answer_challenge(Some(&a), &challenge, &cn, 5).unwrap()
        else {
            panic!("an answer");
        };
        let fake = Handshake::Welcome { proof };
        assert!(check_welcome(Some(&a), &cn, &challenge, &fake).is_err());
        // A claim changed on the way no longer matches its proof.
        let forged = Handshake::Answer {
            nonce: cn,
            client: 6,
            proof,
        };
        assert!(judge_answer(Some(&a), &sn, &forged).is_err());
    }

    #[test]
    fn token_files_round_trip_and_bad_ones_are_explained() {
        let t = token(0xab);
        assert_eq!(ClusterToken::parse(&t.to_file_text()).unwrap(), t);
        assert!(
            ClusterToken::parse("abc")
                .unwrap_err()
                .contains("64 hex digits")
        );
        assert!(ClusterToken::parse(&"zz".repeat(32)).is_err());
        assert_eq!(format!("{t:?}"), "ClusterToken(…)");
    }
}
