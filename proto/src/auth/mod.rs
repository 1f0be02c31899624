//! Who may talk to a Mooring process: the cluster secret, member credentials issued from it,
//! and the mutual challenge-response handshake that opens every control and data connection.
//!
//! No key crosses the wire. The server opens with a nonce and whether it requires a token; the
//! client answers with its own nonce, the client id it will speak for and an HMAC-SHA256 over
//! both nonces and the id under its key; the server checks it and answers with its own HMAC
//! over the nonces in the other order, which the client checks. Each side thus proves it holds
//! the key, and a recorded exchange is useless against fresh nonces.
//!
//! Which key depends on the plane (see [`credential`]): to a master, the secret or a member's
//! own key, whose claims travel with the answer and fix the peer's roles and the client ids it
//! may use; to a node's data server, the data-plane key every member holds. A process without a
//! token meets only peers without one (and, by the CLI's rule, listens on loopback only unless
//! told `--insecure`).
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

pub mod credential;
pub mod peer;

pub use credential::{Claims, Credential, DEFAULT_TENANT, MAX_CLAIMS, Roles, TOKEN_LEN};
pub use peer::{Gate, Peer, Plane, Revocations};

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &[u8; TOKEN_LEN], label: &[u8], first: &[u8], second: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(label);
    mac.update(first);
    mac.update(second);
    mac
}

/// The client's MAC: over both nonces and the client id it claims, so the claim cannot be
/// changed on the way.
fn client_mac(
    key: &[u8; TOKEN_LEN],
    server: &[u8; NONCE_LEN],
    client: &[u8; NONCE_LEN],
    id: u128,
) -> HmacSha256 {
    let mut mac = mac(key, CLIENT_LABEL, server, client);
    mac.update(&id.to_le_bytes());
    mac
}

/// The client's proof under `key` for a server nonce, its own nonce and the id it claims.
pub fn client_proof(
    key: &[u8; TOKEN_LEN],
    server: &[u8; NONCE_LEN],
    client: &[u8; NONCE_LEN],
    id: u128,
) -> [u8; 32] {
    client_mac(key, server, client, id)
        .finalize()
        .into_bytes()
        .into()
}

/// The server's proof under `key` for a client nonce and its own.
pub fn server_proof(
    key: &[u8; TOKEN_LEN],
    client: &[u8; NONCE_LEN],
    server: &[u8; NONCE_LEN],
) -> [u8; 32] {
    mac(key, SERVER_LABEL, client, server)
        .finalize()
        .into_bytes()
        .into()
}

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
        /// Server → client, first: a fresh nonce, and whether a token is required.
        Challenge {
            nonce: [u8; NONCE_LEN],
            token_required: bool,
        },
        /// Client → server: its nonce, the client id the connection will speak for (0: none,
        /// a data connection) and its proof under the secret (to a master) or the data-plane
        /// key (to a node); all zero when no token is required.
        Answer {
            nonce: [u8; NONCE_LEN],
            client: u128,
            proof: [u8; 32],
        },
        /// Client → master: as `Answer`, from a member credential: its claims (the text the
        /// secret signed) and its proof under the member key.
        MemberAnswer {
            nonce: [u8; NONCE_LEN],
            client: u128,
            claims: Vec<u8>,
            proof: [u8; 32],
        },
        /// Server → client: accepted; the server's proof (all zero without a token).
        Welcome { proof: [u8; 32] },
        /// Server → client: refused, and why; the server closes the connection.
        Refused { reason: String },
    }
}

wire_message!(Handshake, FrameKind::Handshake);

/// The key a holder of `credential` proves itself with on `plane`.
fn key_for(credential: &Credential, plane: Plane) -> &[u8; TOKEN_LEN] {
    match plane {
        Plane::Control => credential.control_key(),
        Plane::Data => credential.data_key(),
    }
}

/// What a server behind `gate` decides about a client's answer at `now_unix` (seconds): its
/// welcome and who the peer proved it is, or why not.
pub fn judge_answer(
    gate: &Gate,
    server_nonce: &[u8; NONCE_LEN],
    answer: &Handshake,
    now_unix: u64,
) -> Result<(Handshake, Peer), String> {
    let wrong = || {
        "authentication failed: wrong or missing cluster token (give every member the cluster's \
         token file or a credential issued from it: --token-file or MOORING_TOKEN_FILE)"
            .to_string()
    };
    let Some(held) = gate.credential() else {
        return match answer {
            Handshake::Answer { client, .. } | Handshake::MemberAnswer { client, .. } => Ok((
                Handshake::Welcome { proof: [0; 32] },
                Peer::trusted(*client, "anyone"),
            )),
            _ => Err("authentication failed: the peer did not answer the challenge".into()),
        };
    };
    let (nonce, key, peer) = match (answer, gate.plane()) {
        (
            Handshake::Answer {
                nonce,
                client,
                proof,
            },
            plane,
        ) => {
            let key = *key_for(held, plane);
            if client_mac(&key, server_nonce, nonce, *client)
                .verify_slice(proof)
                .is_err()
            {
                return Err(wrong());
            }
            let name = match plane {
                Plane::Control => "cluster-secret",
                Plane::Data => "member",
            };
            (nonce, key, Peer::trusted(*client, name))
        }
        (
            Handshake::MemberAnswer {
                nonce,
                client,
                claims,
                proof,
            },
            Plane::Control,
        ) => {
            let parsed =
                Claims::decode(claims).map_err(|e| format!("authentication failed: {e}"))?;
            let key = held.member_key(claims).ok_or_else(wrong)?;
            if client_mac(&key, server_nonce, nonce, *client)
                .verify_slice(proof)
                .is_err()
            {
                return Err(
                    "authentication failed: the member credential was not issued from this \
                     cluster's token (or was altered); issue a new one with `mooring token issue`"
                        .into(),
                );
            }
            if *client != 0 && (*client >> 64) as u64 != parsed.id_tag() {
                return Err(format!(
                    "authentication failed: client id {client:#x} does not belong to member \
                     {}/{} (a member's ids carry its own tag; let the library choose the id)",
                    parsed.tenant, parsed.name
                ));
            }
            let peer = Peer::member(*client, &parsed);
            gate.still_valid(&peer, now_unix)
                .map_err(|e| format!("authentication failed: {e}"))?;
            (nonce, key, peer)
        }
        (Handshake::MemberAnswer { .. }, Plane::Data) => {
            return Err(
                "authentication failed: a data server takes the data-plane key, not a \
                        member's claims"
                    .into(),
            );
        }
        _ => return Err("authentication failed: the peer did not answer the challenge".into()),
    };
    let welcome = Handshake::Welcome {
        proof: server_proof(&key, nonce, server_nonce),
    };
    Ok((welcome, peer))
}

/// What a client holding `credential` (or none) and speaking for `client` (0: none) answers a
/// challenge on `plane` with, or why it will not go on.
pub fn answer_challenge(
    credential: Option<&Credential>,
    plane: Plane,
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
    match (credential, token_required) {
        (Some(held), true) => {
            let proof = client_proof(key_for(held, plane), nonce, client_nonce, client);
            Ok(match (held.claims(), plane) {
                (Some(claims), Plane::Control) => Handshake::MemberAnswer {
                    nonce: *client_nonce,
                    client,
                    claims: claims.encode().into_bytes(),
                    proof,
                },
                _ => Handshake::Answer {
                    nonce: *client_nonce,
                    client,
                    proof,
                },
            })
        }
        (None, false) => Ok(Handshake::Answer {
            nonce: *client_nonce,
            client,
            proof: [0; 32],
        }),
        (None, true) => Err(
            "authentication failed: the server requires a cluster token; give this process the \
             cluster's token file or a credential issued from it (--token-file or \
             MOORING_TOKEN_FILE)"
                .into(),
        ),
        (Some(_), false) => Err(
            "authentication failed: the server runs without a cluster token, so it cannot prove \
             it belongs to this cluster; start it with the token file"
                .into(),
        ),
    }
}

/// Checks the server's last word on `plane`: its welcome and proof, or its refusal.
pub fn check_welcome(
    credential: Option<&Credential>,
    plane: Plane,
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
    match credential {
        Some(held)
            if mac(key_for(held, plane), SERVER_LABEL, client_nonce, server)
                .verify_slice(proof)
                .is_err() =>
        {
            Err(
                "authentication failed: the server could not prove it holds the cluster token"
                    .into(),
            )
        }
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
    use super::*;

    #[test]
    fn secrets_match_only_when_equal() {
        assert!(secrets_match(b"Bearer s3cret", b"Bearer s3cret"));
        assert!(!secrets_match(b"Bearer s3cre", b"Bearer s3cret"));
        assert!(!secrets_match(b"Bearer s3cret!", b"Bearer s3cret"));
        assert!(!secrets_match(b"", b"Bearer s3cret"));
    }

    fn secret(b: u8) -> Credential {
        Credential::from_secret([b; TOKEN_LEN])
    }

    fn member(of: &Credential, name: &str, roles: Roles, expires: u64) -> Credential {
        of.issue(Claims {
            name: name.into(),
            tenant: DEFAULT_TENANT.into(),
            roles,
            serial: 9,
            expires,
        })
        .unwrap()
    }

    /// Runs a whole handshake on `plane` between a client and a server holding these; returns
    /// who the server took the client for.
    fn shake(
        client: Option<&Credential>,
        server: Option<&Credential>,
        plane: Plane,
        id: u128,
    ) -> Result<Peer, String> {
        let (cn, sn) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let gate = Gate::new(server.cloned(), plane)?;
        let challenge = Handshake::Challenge {
            nonce: sn,
            token_required: server.is_some(),
        };
        let answer = answer_challenge(client, plane, &challenge, &cn, id)?;
        let (last, peer) = match judge_answer(&gate, &sn, &answer, 100) {
            Ok((welcome, peer)) => (welcome, Some(peer)),
            Err(reason) => (Handshake::Refused { reason }, None),
        };
        check_welcome(client, plane, &cn, &challenge, &last)?;
        Ok(peer.expect("welcomed"))
    }

    #[test]
    fn only_holders_of_the_same_token_meet() {
        let (a, b) = (secret(7), secret(8));
        for plane in [Plane::Control, Plane::Data] {
            assert_eq!(
                shake(Some(&a), Some(&a), plane, 5).unwrap().roles,
                Roles::ALL
            );
            assert_eq!(shake(None, None, plane, 5).unwrap().client, 5);
            for (client, server) in [(Some(&a), Some(&b)), (None, Some(&a)), (Some(&a), None)] {
                let err = shake(client, server, plane, 5).unwrap_err();
                assert!(err.starts_with("authentication failed"), "{err}");
            }
        }
    }

    #[test]
    fn members_are_who_their_credential_says() {
        let a = secret(7);
        let node = member(&a, "n1", Roles::NODE, 0);
        let id = node.client_id(5);
        let peer = shake(Some(&node), Some(&a), Plane::Control, id).unwrap();
        assert_eq!(
            (peer.name.as_str(), peer.roles, peer.client),
            ("n1", Roles::NODE, id)
        );
        // Its own id, or none; never another member's or a bare one.
        assert!(shake(Some(&node), Some(&a), Plane::Control, 0).is_ok());
        let other = member(&a, "n2", Roles::NODE, 0).client_id(5);
        assert!(
            shake(Some(&node), Some(&a), Plane::Control, other)
                .unwrap_err()
                .contains("does not belong")
        );
        assert!(shake(Some(&node), Some(&a), Plane::Control, 5).is_err());
        // Issued from another cluster's secret, or expired: refused.
        let stranger = member(&secret(8), "n1", Roles::ALL, 0);
        assert!(
            shake(
                Some(&stranger),
                Some(&a),
                Plane::Control,
                stranger.client_id(5)
            )
            .is_err()
        );
        let old = member(&a, "n1", Roles::NODE, 50);
        assert!(
            shake(Some(&old), Some(&a), Plane::Control, id)
                .unwrap_err()
                .contains("expired")
        );
        // On the data plane every member proves the same key.
        assert_eq!(
            shake(Some(&node), Some(&a), Plane::Data, 0).unwrap().name,
            "member"
        );
        assert!(shake(Some(&node), Some(&node), Plane::Data, 0).is_ok());
        assert!(shake(Some(&stranger), Some(&node), Plane::Data, 0).is_err());
    }

    #[test]
    fn claims_changed_on_the_way_are_refused() {
        let a = secret(7);
        let client = member(&a, "c1", Roles::CLIENT, 0);
        let (cn, sn) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let gate = Gate::new(Some(a.clone()), Plane::Control).unwrap();
        let challenge = Handshake::Challenge {
            nonce: sn,
            token_required: true,
        };
        let Handshake::MemberAnswer {
            nonce,
            client: id,
            proof,
            ..
        } = answer_challenge(
            Some(&client),
            Plane::Control,
            &challenge,
            &cn,
            client.client_id(1),
        )
        .unwrap()
        else {
            panic!("a member answer");
        };
        let mut raised = client.claims().unwrap().clone();
        raised.roles = Roles::ALL;
        let forged = Handshake::MemberAnswer {
            nonce,
            client: id,
            claims: raised.encode().into_bytes(),
            proof,
        };
        assert!(judge_answer(&gate, &sn, &forged, 0).is_err());
        // A data-plane answer (the key every member holds) does not open the control plane.
        let data = answer_challenge(Some(&client), Plane::Data, &challenge, &cn, 0).unwrap();
        assert!(judge_answer(&gate, &sn, &data, 0).is_err());
    }

    #[test]
    fn a_server_without_the_token_cannot_fake_its_proof() {
        let a = secret(7);
        let (cn, sn) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let challenge = Handshake::Challenge {
            nonce: sn,
            token_required: true,
        };
        // It replays the client's own proof as its welcome.
        let Handshake::Answer { proof, .. } =
            answer_challenge(Some(&a), Plane::Control, &challenge, &cn, 5).unwrap()
        else {
            panic!("an answer");
        };
        let fake = Handshake::Welcome { proof };
        assert!(check_welcome(Some(&a), Plane::Control, &cn, &challenge, &fake).is_err());
        // A claim changed on the way no longer matches its proof.
        let forged = Handshake::Answer {
            nonce: cn,
            client: 6,
            proof,
        };
        let gate = Gate::new(Some(a), Plane::Control).unwrap();
        assert!(judge_answer(&gate, &sn, &forged, 0).is_err());
    }
}
