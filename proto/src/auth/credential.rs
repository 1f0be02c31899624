//! What a process holds to join a cluster: the cluster secret itself, or a member credential
//! issued from it.
//!
//! The secret (`mooring token new`) belongs to the masters and standbys: whoever holds it can
//! verify and issue credentials, so it counts as every role. Everyone else gets a member
//! credential (`mooring token issue`): a line of claims (name, tenant, roles, expiry, serial),
//! the member key (an HMAC of those claims under the secret) and the data-plane key. The member
//! proves its claims to the master with the member key; the master derives the same key from
//! the claims and its secret, so it keeps no table of members and a member cannot change a
//! claim without the secret. Nodes and clients meet on the data plane with the data-plane key,
//! which every credential carries and the secret derives; it proves membership, not identity.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Bytes of a secret or key.
pub const TOKEN_LEN: usize = 32;
/// Longest encoded claims accepted: a handshake carries them before anything is proven.
pub const MAX_CLAIMS: usize = 512;
/// Longest member or tenant name.
pub const MAX_NAME: usize = 64;
/// The tenant a credential without one belongs to.
pub const DEFAULT_TENANT: &str = "default";

const MEMBER_KEY_LABEL: &[u8] = b"mooring-member-key-v1";
const DATA_KEY_LABEL: &[u8] = b"mooring-data-plane-v1";
const ID_TAG_LABEL: &[u8] = b"mooring-member-id-v1";
const FILE_HEADER: &str = "mooring-credential v1";

type HmacSha256 = Hmac<Sha256>;

/// What a member may do. A credential carries one or more; the secret carries all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Roles(u8);

impl Roles {
    /// No role.
    pub const NONE: Roles = Roles(0);
    /// Mounts its own segments, serves data, syncs its disk and takes repairs.
    pub const NODE: Roles = Roles(1);
    /// Puts, gets and removes objects; holds its own leases and runs its own copy tasks.
    pub const CLIENT: Roles = Roles(2);
    /// Follows the leader's log.
    pub const STANDBY: Roles = Roles(4);
    /// Changes the cluster wholesale (`remove_all`).
    pub const ADMIN: Roles = Roles(8);
    /// Every role: the secret's holders, and everyone in a cluster without a token.
    pub const ALL: Roles = Roles(15);

    const NAMES: [(Roles, &'static str); 4] = [
        (Roles::NODE, "node"),
        (Roles::CLIENT, "client"),
        (Roles::STANDBY, "standby"),
        (Roles::ADMIN, "admin"),
    ];

    /// Both sets together.
    pub const fn union(self, other: Roles) -> Roles {
        Roles(self.0 | other.0)
    }

    /// Whether this set holds at least one role of `other`.
    pub const fn intersects(self, other: Roles) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether this set holds every role of `other`.
    pub const fn contains(self, other: Roles) -> bool {
        self.0 & other.0 == other.0
    }

    /// Parses a comma-separated list: `node`, `client`, `standby`, `admin`.
    pub fn parse(text: &str) -> Result<Roles, String> {
        let mut roles = Roles::NONE;
        for word in text.split(',').map(str::trim) {
            let Some((role, _)) = Roles::NAMES.iter().find(|(_, name)| *name == word) else {
                return Err(format!(
                    "unknown role {word:?}: roles are node, client, standby and admin, \
                     separated by commas"
                ));
            };
            roles = roles.union(*role);
        }
        Ok(roles)
    }
}

impl std::fmt::Display for Roles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = Roles::NAMES
            .iter()
            .filter(|(role, _)| self.contains(*role))
            .map(|(_, name)| *name)
            .collect();
        match names.is_empty() {
            true => f.write_str("none"),
            false => f.write_str(&names.join(",")),
        }
    }
}

/// What a member credential says about its holder. Signed as the exact text
/// [`Claims::encode`] gives, so there is one spelling of each set of claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    /// The member's name, unique in its tenant: `[A-Za-z0-9._-]`, at most [`MAX_NAME`].
    pub name: String,
    /// The tenant it acts in (same alphabet).
    pub tenant: String,
    /// What it may do; never empty.
    pub roles: Roles,
    /// Drawn at issue: a revocation list names credentials by it.
    pub serial: u64,
    /// Unix seconds after which the credential is refused; 0: never.
    pub expires: u64,
}

impl Claims {
    /// The canonical text: `v1 name=N tenant=T roles=R serial=HEX expires=SECS`.
    pub fn encode(&self) -> String {
        format!(
            "v1 name={} tenant={} roles={} serial={:016x} expires={}",
            self.name, self.tenant, self.roles, self.serial, self.expires
        )
    }

    /// Reads claims from a peer or a file: only the canonical text is accepted.
    pub fn decode(bytes: &[u8]) -> Result<Claims, String> {
        if bytes.len() > MAX_CLAIMS {
            return Err(format!(
                "credential claims are at most {MAX_CLAIMS} bytes, these are {}",
                bytes.len()
            ));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "credential claims are not text")?;
        let mut fields = text.split(' ');
        if fields.next() != Some("v1") {
            return Err("credential claims of an unknown version (issue a new credential)".into());
        }
        let mut next = |key: &str| {
            fields
                .next()
                .and_then(|field| field.strip_prefix(key)?.strip_prefix('='))
                .ok_or_else(|| format!("credential claims lack {key}="))
        };
        let name = checked_name("member name", next("name")?)?;
        let tenant = checked_name("tenant", next("tenant")?)?;
        let roles = Roles::parse(next("roles")?)?;
        let serial = next("serial")?;
        let serial = match serial.len() == 16 {
            true => u64::from_str_radix(serial, 16).ok(),
            false => None,
        }
        .ok_or("a credential serial is 16 hex digits")?;
        let expires: u64 = next("expires")?
            .parse()
            .map_err(|_| "a credential's expiry is whole seconds")?;
        if fields.next().is_some() {
            return Err("credential claims carry unknown fields".into());
        }
        let claims = Claims {
            name,
            tenant,
            roles,
            serial,
            expires,
        };
        if claims.encode().as_bytes() != bytes {
            return Err("credential claims are not in their canonical form".into());
        }
        Ok(claims)
    }

    /// The high 64 bits every client id of this member carries, so one member cannot claim
    /// another's id: derived from its tenant and name, which only the secret can sign.
    pub fn id_tag(&self) -> u64 {
        let digest = Sha256::new()
            .chain_update(ID_TAG_LABEL)
            .chain_update(self.tenant.as_bytes())
            .chain_update([0])
            .chain_update(self.name.as_bytes())
            .finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
    }
}

/// Checks a member or tenant name's alphabet and length.
pub fn checked_name(what: &str, name: &str) -> Result<String, String> {
    let fits = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    match fits {
        true => Ok(name.to_string()),
        false => Err(format!(
            "a {what} is 1 to {MAX_NAME} letters, digits, '.', '_' or '-'; {name:?} is not"
        )),
    }
}

/// The cluster secret, or a member credential issued from it. Its `Debug` shows no key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    data_key: [u8; TOKEN_LEN],
    holder: Holder,
}

#[derive(Clone, PartialEq, Eq)]
enum Holder {
    Secret([u8; TOKEN_LEN]),
    Member {
        claims: Claims,
        key: [u8; TOKEN_LEN],
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.holder {
            Holder::Secret(_) => f.write_str("Credential(cluster secret)"),
            Holder::Member { claims, .. } => write!(f, "Credential({})", claims.encode()),
        }
    }
}

fn keyed(key: &[u8], label: &[u8], message: &[u8]) -> [u8; TOKEN_LEN] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(label);
    mac.update(message);
    mac.finalize().into_bytes().into()
}

impl Credential {
    /// The cluster secret from `TOKEN_LEN` random bytes (the caller draws them).
    pub fn from_secret(secret: [u8; TOKEN_LEN]) -> Credential {
        Credential {
            data_key: keyed(&secret, DATA_KEY_LABEL, b""),
            holder: Holder::Secret(secret),
        }
    }

    /// Whether this is the cluster secret (which masters and standbys need).
    pub fn is_secret(&self) -> bool {
        matches!(self.holder, Holder::Secret(_))
    }

    /// A member credential's claims; `None` for the secret.
    pub fn claims(&self) -> Option<&Claims> {
        match &self.holder {
            Holder::Secret(_) => None,
            Holder::Member { claims, .. } => Some(claims),
        }
    }

    /// What every member proves on the data plane.
    pub fn data_key(&self) -> &[u8; TOKEN_LEN] {
        &self.data_key
    }

    /// The key this holder proves itself with to the master: the secret, or its member key.
    pub fn control_key(&self) -> &[u8; TOKEN_LEN] {
        match &self.holder {
            Holder::Secret(secret) => secret,
            Holder::Member { key, .. } => key,
        }
    }

    /// The member key the secret gives `claims` (`None` unless this is the secret).
    pub fn member_key(&self, claims: &[u8]) -> Option<[u8; TOKEN_LEN]> {
        match &self.holder {
            Holder::Secret(secret) => Some(keyed(secret, MEMBER_KEY_LABEL, claims)),
            Holder::Member { .. } => None,
        }
    }

    /// A credential for `claims`, signed with this secret.
    pub fn issue(&self, claims: Claims) -> Result<Credential, String> {
        let key = self
            .member_key(claims.encode().as_bytes())
            .ok_or("only the cluster secret can issue credentials, and this is a member's")?;
        Ok(Credential {
            data_key: self.data_key,
            holder: Holder::Member { claims, key },
        })
    }

    /// A client id for this holder from `random`: a member's carries its id tag in the high
    /// half (the master refuses any other), the secret's is `random` as it is.
    pub fn client_id(&self, random: u128) -> u128 {
        match self.claims() {
            Some(claims) => (u128::from(claims.id_tag()) << 64) | (random & u128::from(u64::MAX)),
            None => random,
        }
    }

    /// Parses a token file: the secret (64 hex digits) or a member credential (the text
    /// [`Credential::to_file_text`] writes). Surrounding white space is ignored.
    pub fn parse(text: &str) -> Result<Credential, String> {
        let text = text.trim();
        if !text.starts_with(FILE_HEADER) {
            return parse_hex("a cluster token", text).map(Credential::from_secret);
        }
        let mut lines = text.lines().map(str::trim).skip(1);
        let mut field = |name: &str| {
            lines
                .next()
                .and_then(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .ok_or_else(|| format!("a member credential lacks its {name} line"))
        };
        let claims = Claims::decode(field("claims")?.as_bytes())?;
        let key = parse_hex("a member key", field("key")?)?;
        let data_key = parse_hex("a data-plane key", field("data")?)?;
        Ok(Credential {
            data_key,
            holder: Holder::Member { claims, key },
        })
    }

    /// The text a token file holds.
    pub fn to_file_text(&self) -> String {
        match &self.holder {
            Holder::Secret(secret) => format!("{}\n", hex(secret)),
            Holder::Member { claims, key } => format!(
                "{FILE_HEADER}\nclaims {}\nkey {}\ndata {}\n",
                claims.encode(),
                hex(key),
                hex(&self.data_key)
            ),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(what: &str, text: &str) -> Result<[u8; TOKEN_LEN], String> {
    let advice = "make one with `mooring token new FILE`, or a member's with `mooring token issue`";
    if !text.is_ascii() || text.len() != TOKEN_LEN * 2 {
        return Err(format!(
            "{what} is {} hex digits, and this holds {} characters or a non-hex one ({advice})",
            TOKEN_LEN * 2,
            text.chars().count()
        ));
    }
    let mut bytes = [0u8; TOKEN_LEN];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{what} is hex digits only ({advice})"))?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            name: "n1".into(),
            tenant: DEFAULT_TENANT.into(),
            roles: Roles::NODE.union(Roles::CLIENT),
            serial: 0xabcd,
            expires: 0,
        }
    }

    #[test]
    fn claims_have_one_spelling() {
        let text = claims().encode();
        assert_eq!(
            text,
            "v1 name=n1 tenant=default roles=node,client serial=000000000000abcd expires=0"
        );
        assert_eq!(Claims::decode(text.as_bytes()).unwrap(), claims());
        for bad in [
            "v1 name=n1 tenant=default roles=client,node serial=000000000000abcd expires=0",
            "v1 name=n1 tenant=default roles=node,client serial=abcd expires=0",
            "v1 name=n 1 tenant=default roles=node serial=000000000000abcd expires=0",
            "v1 name=n1 tenant=default roles=root serial=000000000000abcd expires=0",
            "v1 name=n1 tenant=default roles=node serial=000000000000abcd expires=0 x=1",
            "v2 name=n1",
        ] {
            assert!(Claims::decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn issued_credentials_round_trip_and_hide_keys() {
        let secret = Credential::from_secret([7; TOKEN_LEN]);
        let member = secret.issue(claims()).unwrap();
        assert_eq!(Credential::parse(&member.to_file_text()).unwrap(), member);
        assert_eq!(Credential::parse(&secret.to_file_text()).unwrap(), secret);
        assert_eq!(member.data_key(), secret.data_key());
        assert_ne!(member.control_key(), secret.control_key());
        assert!(member.issue(claims()).is_err(), "a member cannot issue");
        assert!(!format!("{member:?}{secret:?}").contains("0707"));
        let id = member.client_id(0x1234);
        assert_eq!((id >> 64) as u64, claims().id_tag());
        assert_eq!(secret.client_id(0x1234), 0x1234);
    }

    #[test]
    fn bad_token_files_are_explained() {
        assert!(
            Credential::parse("abc")
                .unwrap_err()
                .contains("64 hex digits")
        );
        assert!(Credential::parse(&"zz".repeat(32)).is_err());
        assert!(Credential::parse("é").is_err());
        assert!(Credential::parse("mooring-credential v1\nclaims v1").is_err());
    }
}
