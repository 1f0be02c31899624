//! Tenants: each names a namespace of keys, so two tenants' `k` are two objects, and listing,
//! regex queries and `remove_all` see only the asking tenant's keys.
//!
//! The master stores a tenant's key as the tenant's name, the [`SEPARATOR`] byte and the key
//! (the default tenant's keys as they are), so leases, pins, holds, disk copies and every other
//! per-key rule apply per tenant with no change. No key a client gives may hold the
//! separator: clients scope their keys with [`stored_key`], and the master refuses a member's
//! key outside its own tenant (see the proto crate's `auth`).

use std::collections::BTreeMap;

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

/// What one tenant stores: its objects and their value bytes (each value once, however many
/// replicas it has), and the bytes of those with a disk copy.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct Usage {
    /// Objects, being written or readable.
    pub objects: u64,
    /// Their values' bytes.
    pub bytes: u64,
    /// Bytes of their values with a copy on a node's disk.
    pub disk_bytes: u64,
}

/// [`Usage`] per tenant, kept by the object table as objects come and go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantUsage(BTreeMap<String, Usage>);

impl TenantUsage {
    pub(crate) fn add(&mut self, stored: &str, bytes: u64) {
        let tenant = tenant_of(stored);
        let usage = match self.0.get_mut(tenant) {
            Some(usage) => usage,
            None => self.0.entry(tenant.to_string()).or_default(),
        };
        usage.objects += 1;
        usage.bytes += bytes;
    }

    /// A value of `bytes` of `stored`'s tenant gained (`true`) or lost its disk copy.
    pub(crate) fn count_disk(&mut self, stored: &str, bytes: u64, gained: bool) {
        let tenant = tenant_of(stored);
        if let Some(usage) = self.0.get_mut(tenant) {
            match gained {
                true => usage.disk_bytes += bytes,
                false => usage.disk_bytes -= bytes,
            }
        }
    }

    pub(crate) fn take(&mut self, stored: &str, bytes: u64) {
        let tenant = tenant_of(stored);
        if let Some(usage) = self.0.get_mut(tenant) {
            usage.objects -= 1;
            usage.bytes -= bytes;
            if usage.objects == 0 {
                self.0.remove(tenant);
            }
        }
    }

    /// `tenant`'s usage.
    pub fn of(&self, tenant: &str) -> Usage {
        self.0.get(tenant).copied().unwrap_or_default()
    }

    /// Every tenant that stores anything, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Usage)> {
        self.0
            .iter()
            .map(|(tenant, usage)| (tenant.as_str(), *usage))
    }
}

/// Limits on what one tenant may store, set in the master's configuration. A limit of 0 is no
/// limit.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct TenantQuota {
    /// The tenant.
    pub tenant: String,
    /// Most objects.
    pub objects: u64,
    /// Most value bytes (each value counted once, however many replicas).
    pub bytes: u64,
    /// Most value bytes in unfinished puts, over all of the tenant's members.
    pub unfinished: u64,
    /// Most bytes of its values with a copy on the nodes' disks: past it, values are not
    /// offloaded (they stay in memory only, and eviction drops them).
    pub disk: u64,
}

impl TenantQuota {
    /// Why a new value of `size` bytes (`new_object`: not replacing one of the key) would
    /// take `tenant`, now at `usage` with `unfinished` bytes in unfinished puts, past this
    /// quota; `None` if it would not.
    pub fn refusal(
        &self,
        usage: Usage,
        unfinished: u64,
        size: u64,
        replaced: u64,
        new_object: bool,
    ) -> Option<Error> {
        let over = |what: &str, held: u64, adding: u64, limit: u64| {
            (limit != 0 && held.saturating_add(adding) > limit).then(|| {
                Error::new(
                    ErrorCode::NO_AVAILABLE_HANDLE,
                    format!(
                        "tenant {:?} holds {held} {what}, and this put would pass its quota of \
                         {limit}; remove some of its objects, or raise its quota",
                        self.tenant
                    ),
                )
            })
        };
        over(
            "objects",
            usage.objects,
            u64::from(new_object),
            self.objects,
        )
        .or_else(|| {
            over(
                "bytes of values",
                usage.bytes.saturating_sub(replaced),
                size,
                self.bytes,
            )
        })
        .or_else(|| {
            over(
                "bytes in unfinished puts",
                unfinished,
                size,
                self.unfinished,
            )
        })
    }

    /// Whether `tenant`, now at `usage`, may keep one more value of `size` bytes on disk.
    pub fn allows_on_disk(&self, usage: Usage, size: u64) -> bool {
        self.disk == 0 || usage.disk_bytes.saturating_add(size) <= self.disk
    }

    /// Parses `TENANT:objects=N,bytes=N,unfinished=N,disk=N` (sizes as bytes; any may be left
    /// out).
    pub fn parse(
        text: &str,
        size: impl Fn(&str) -> std::result::Result<u64, String>,
    ) -> std::result::Result<TenantQuota, String> {
        let (tenant, limits) = text.split_once(':').ok_or_else(|| {
            format!("{text:?}: write TENANT:objects=N,bytes=SIZE,unfinished=SIZE,disk=SIZE")
        })?;
        if !valid_tenant(tenant) {
            return Err(format!("{tenant:?} cannot name a tenant"));
        }
        let mut quota = TenantQuota {
            tenant: tenant.to_string(),
            ..TenantQuota::default()
        };
        for limit in limits.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            let (what, value) = limit.split_once('=').ok_or_else(|| {
                format!("{limit:?}: write objects=N, bytes=SIZE, unfinished=SIZE or disk=SIZE")
            })?;
            match what {
                "objects" => {
                    quota.objects = value
                        .parse()
                        .map_err(|_| format!("objects={value:?} is not a whole number"))?
                }
                "bytes" => quota.bytes = size(value)?,
                "unfinished" => quota.unfinished = size(value)?,
                "disk" => quota.disk = size(value)?,
                other => {
                    return Err(format!(
                        "unknown quota {other:?}: objects, bytes, unfinished or disk"
                    ));
                }
            }
        }
        Ok(quota)
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
