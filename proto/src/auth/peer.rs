//! Who a connection proved it is, and the gate that decides: which roles a peer holds, which
//! client ids it may speak for, and whether its credential still holds (expiry, revocation).

use std::collections::HashSet;
use std::sync::RwLock;

use super::credential::{Claims, Credential, DEFAULT_TENANT, Roles, checked_name};

/// Which kind of connection a handshake opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    /// To a master: members prove who they are (the secret, or a member credential).
    Control,
    /// To a node's data server: members prove they belong (the data-plane key).
    Data,
}

/// What a handshake proved about the peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The client id the connection speaks for (0: none).
    pub client: u128,
    /// Its name: a member credential's, else `cluster-secret` or `anyone` (no token).
    pub name: String,
    /// The tenant it acts in.
    pub tenant: String,
    /// What it may do.
    pub roles: Roles,
    /// Its credential's serial and expiry (unix seconds, 0: never), if it proved a member
    /// credential.
    pub credential: Option<(u64, u64)>,
}

impl Peer {
    /// A peer that proved the cluster secret or the data-plane key, or any peer when the
    /// cluster runs without a token: every role.
    pub fn trusted(client: u128, name: &str) -> Peer {
        Peer {
            client,
            name: name.into(),
            tenant: DEFAULT_TENANT.into(),
            roles: Roles::ALL,
            credential: None,
        }
    }

    /// A peer that proved the member credential with `claims`, speaking for `client`.
    pub fn member(client: u128, claims: &Claims) -> Peer {
        Peer {
            client,
            name: claims.name.clone(),
            tenant: claims.tenant.clone(),
            roles: claims.roles,
            credential: Some((claims.serial, claims.expires)),
        }
    }
}

/// Credentials the master no longer accepts: by serial (one credential) or by member name (every
/// credential issued to it). Read from a file of lines `serial HEX` or `name [TENANT/]NAME`;
/// `#` starts a comment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revocations {
    serials: HashSet<u64>,
    names: HashSet<(String, String)>,
}

impl Revocations {
    /// Parses a revocation list, naming the first bad line.
    pub fn parse(text: &str) -> Result<Revocations, String> {
        let mut list = Revocations::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |why: String| format!("revocation list line {}: {why}", n + 1);
            match line.split_once(' ') {
                Some(("serial", hex)) => {
                    let serial = u64::from_str_radix(hex.trim(), 16)
                        .map_err(|_| bad(format!("{hex:?} is not a hex serial")))?;
                    list.serials.insert(serial);
                }
                Some(("name", who)) => {
                    let (tenant, name) =
                        who.trim().split_once('/').unwrap_or((DEFAULT_TENANT, who));
                    let tenant = checked_name("tenant", tenant.trim()).map_err(bad)?;
                    let name = checked_name("member name", name.trim()).map_err(bad)?;
                    list.names.insert((tenant, name));
                }
                _ => return Err(bad("expected `serial HEX` or `name [TENANT/]NAME`".into())),
            }
        }
        Ok(list)
    }

    /// Whether `peer`'s credential is on the list.
    pub fn revokes(&self, peer: &Peer) -> bool {
        let by_serial = peer
            .credential
            .is_some_and(|(serial, _)| self.serials.contains(&serial));
        let by_name = peer.credential.is_some()
            && self
                .names
                .contains(&(peer.tenant.clone(), peer.name.clone()));
        by_serial || by_name
    }
}

/// A server's side of authentication: the credential it holds, which plane it serves, and the
/// credentials it no longer accepts (replaceable while it runs).
#[derive(Debug)]
pub struct Gate {
    credential: Option<Credential>,
    plane: Plane,
    revoked: RwLock<Revocations>,
}

impl Gate {
    /// A gate for `plane` holding `credential` (`None`: a cluster without a token). A control
    /// gate must hold the secret: with a member credential it could verify no one.
    pub fn new(credential: Option<Credential>, plane: Plane) -> Result<Gate, String> {
        if plane == Plane::Control && credential.as_ref().is_some_and(|c| !c.is_secret()) {
            return Err(
                "a master must hold the cluster token itself (the file `mooring token new` made), \
                 not a member credential: it verifies every member's credential with it"
                    .into(),
            );
        }
        Ok(Gate {
            credential,
            plane,
            revoked: RwLock::new(Revocations::default()),
        })
    }

    /// The credential it holds.
    pub fn credential(&self) -> Option<&Credential> {
        self.credential.as_ref()
    }

    /// The plane it serves.
    pub fn plane(&self) -> Plane {
        self.plane
    }

    /// Replaces the revocation list.
    pub fn set_revoked(&self, list: Revocations) {
        *self.revoked.write().unwrap_or_else(|e| e.into_inner()) = list;
    }

    /// Whether `peer` may still act at `now_unix` (seconds): its credential has not expired
    /// and is not revoked; why not, if not.
    pub fn still_valid(&self, peer: &Peer, now_unix: u64) -> Result<(), String> {
        let Some((serial, expires)) = peer.credential else {
            return Ok(());
        };
        if expires != 0 && now_unix >= expires {
            return Err(format!(
                "the credential of {}/{} (serial {serial:016x}) expired; issue a new one with \
                 `mooring token issue`",
                peer.tenant, peer.name
            ));
        }
        if self
            .revoked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .revokes(peer)
        {
            return Err(format!(
                "the credential of {}/{} (serial {serial:016x}) is revoked",
                peer.tenant, peer.name
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(serial: u64, expires: u64) -> Peer {
        Peer::member(
            1,
            &Claims {
                name: "c1".into(),
                tenant: "t".into(),
                roles: Roles::CLIENT,
                serial,
                expires,
            },
        )
    }

    #[test]
    fn expired_and_revoked_credentials_stop_acting() {
        let gate = Gate::new(None, Plane::Control).unwrap();
        assert!(gate.still_valid(&peer(1, 0), 10).is_ok());
        assert!(gate.still_valid(&peer(1, 10), 10).is_err());
        gate.set_revoked(Revocations::parse("serial 2\n# note\n").unwrap());
        assert!(gate.still_valid(&peer(1, 0), 10).is_ok());
        assert!(gate.still_valid(&peer(2, 0), 10).is_err());
        gate.set_revoked(Revocations::parse("name t/c1").unwrap());
        assert!(gate.still_valid(&peer(1, 0), 10).is_err());
        assert!(
            gate.still_valid(&Peer::trusted(1, "cluster-secret"), 10)
                .is_ok()
        );
        assert!(
            Revocations::parse("serial zz")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(Revocations::parse("nobody").is_err());
    }

    #[test]
    fn a_master_needs_the_secret() {
        let secret = Credential::from_secret([3; 32]);
        let member = secret
            .issue(Claims {
                name: "n".into(),
                tenant: "default".into(),
                roles: Roles::NODE,
                serial: 1,
                expires: 0,
            })
            .unwrap();
        assert!(Gate::new(Some(member.clone()), Plane::Control).is_err());
        assert!(Gate::new(Some(member), Plane::Data).is_ok());
        assert!(Gate::new(Some(secret), Plane::Control).is_ok());
    }
}
