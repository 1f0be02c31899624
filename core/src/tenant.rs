//! Tenants: each names a namespace of keys, so two tenants' `k` are two objects, and listing,
//! regex queries and `remove_all` see only the asking tenant's keys.
//!
//! The master stores a tenant's key as the tenant's name, the [`SEPARATOR`] byte and the key
//! (the default tenant's keys as they are), so leases, pins, holds, disk copies and every other
//! per-key rule apply per tenant with no change. No key a client gives may hold the
//! separator: clients scope their keys with [`stored_key`], and the master refuses a member's
//! key outside its own tenant (see the proto crate's `auth`).

use crate::error::{Error, ErrorCode, Result};

/// The byte between a tenant's name and a key (ASCII unit separator).
pub const SEPARATOR: char = '\u{1f}';
/// The tenant of keys stored without a prefix: every key before tenants existed.
pub const DEFAULT_TENANT: &str = "default";

/// The key the master stores for `tenant`'s `key`.
pub fn stored_key(tenant: &str, key: &str) -> Result<String> {
    if key.contains(SEPARATOR) {
        return Err(Error::new(
            ErrorCode::INVALID_KEY,
            "a key may not contain the byte 0x1f (unit separator): it separates tenants from keys",
        ));
    }
    Ok(match tenant {
        DEFAULT_TENANT => key.to_string(),
        tenant => format!("{tenant}{SEPARATOR}{key}"),
    })
}

/// The tenant a stored key belongs to.
pub fn tenant_of(stored: &str) -> &str {
    stored
        .split_once(SEPARATOR)
        .map_or(DEFAULT_TENANT, |(tenant, _)| tenant)
}

/// A stored key as its tenant named it.
pub fn local_key(stored: &str) -> &str {
    stored.split_once(SEPARATOR).map_or(stored, |(_, key)| key)
}

/// Whether `name` can name a tenant: 1 to 64 letters, digits, '.', '_' or '-'.
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Why `stored` is no key a tenant could have given, if it is not: a separator after a
/// name that cannot be a tenant's, or a second separator.
pub fn check_stored(stored: &str) -> Result<()> {
    match stored.split_once(SEPARATOR) {
        None => Ok(()),
        Some((tenant, key))
            if valid_tenant(tenant) && tenant != DEFAULT_TENANT && !key.contains(SEPARATOR) =>
        {
            Ok(())
        }
        Some(_) => Err(Error::new(
            ErrorCode::INVALID_KEY,
            "a key may not contain the byte 0x1f (unit separator): it separates tenants from keys",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_keys_round_trip_and_never_meet() {
        let a = stored_key("team-a", "k").unwrap();
        let b = stored_key("team-b", "k").unwrap();
        let d = stored_key(DEFAULT_TENANT, "k").unwrap();
        assert_eq!(d, "k", "the default tenant's keys are stored as they were");
        assert!(a != b && a != d);
        for (stored, tenant) in [(&a, "team-a"), (&b, "team-b"), (&d, DEFAULT_TENANT)] {
            assert_eq!(tenant_of(stored), tenant);
            assert_eq!(local_key(stored), "k");
            check_stored(stored).unwrap();
        }
        assert!(stored_key("team-a", "x\u{1f}y").is_err());
        assert!(check_stored("default\u{1f}k").is_err());
        assert!(check_stored("a b\u{1f}k").is_err());
        assert!(check_stored("t\u{1f}k\u{1f}k").is_err());
    }
}
