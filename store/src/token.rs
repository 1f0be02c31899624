//! The cluster token and member credentials as processes get them: made fresh (`mooring token
//! new`), issued from the token (`mooring token issue`), read from a file (`--token-file`), or
//! from the file `MOORING_TOKEN_FILE` names, so programs that pass no token (Mooncake-style
//! clients) still authenticate. Also the master's revocation list.

use std::path::Path;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::auth::credential::checked_name;
use mooring_proto::auth::{Claims, Credential, Gate, Revocations, Roles};

/// The environment variable naming the token file.
pub const TOKEN_FILE_VAR: &str = "MOORING_TOKEN_FILE";

/// A fresh random token (in simulation builds, from the run's seeded generator).
pub fn generate() -> Credential {
    #[cfg(madsim)]
    return Credential::from_secret(madsim::rand::random());
    #[cfg(not(madsim))]
    {
        let mut bytes = [0u8; mooring_proto::auth::TOKEN_LEN];
        getrandom::fill(&mut bytes).expect("the operating system's random source");
        Credential::from_secret(bytes)
    }
}

/// Reads the token in `path`, which only its owner may read: a token others can read lets
/// them join the cluster as anyone (as ssh refuses a private key others can read).
pub fn load(path: &Path) -> Result<Credential> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| {
            Error::new(
                ErrorCode::FILE_READ_FAIL,
                format!("cluster token file {}: {e}", path.display()),
            )
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "cluster token file {} can be read by others (mode {:04o}): anyone who reads it \
                 can join the cluster; make it the owner's alone with `chmod 600 {}`",
                path.display(),
                mode & 0o7777,
                path.display()
            ),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            ErrorCode::FILE_READ_FAIL,
            format!("cluster token file {}: {e}", path.display()),
        )
    })?;
    Credential::parse(&text).map_err(|e| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("cluster token file {}: {e}", path.display()),
        )
    })
}

/// The token in `path` if given, else in the file `MOORING_TOKEN_FILE` names, else none.
pub fn resolve(path: Option<&Path>) -> Result<Option<Credential>> {
    match path {
        Some(path) => load(path).map(Some),
        None => match std::env::var_os(TOKEN_FILE_VAR) {
            Some(path) if !path.is_empty() => load(Path::new(&path)).map(Some),
            _ => Ok(None),
        },
    }
}

/// Writes a fresh token to `path`, readable by its owner only; refuses to replace a file.
pub fn write_new(path: &Path) -> Result<()> {
    write_private(path, &generate())
}

/// Draws a serial for a new credential.
fn serial() -> u64 {
    u64::from_le_bytes(generate().data_key()[..8].try_into().expect("8 bytes"))
}

/// Issues a member credential for `name` in `tenant` with `roles`, valid for `valid_for`
/// seconds (`None`: until revoked), signed with the cluster token in `secret`; writes it to
/// `path` (owner-only, never replacing a file) and returns its claims.
pub fn issue(
    secret: &Path,
    name: &str,
    tenant: &str,
    roles: Roles,
    valid_for: Option<u64>,
    path: &Path,
) -> Result<Claims> {
    let invalid = |e: String| Error::new(ErrorCode::INVALID_PARAMS, e);
    let secret = load(secret)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if roles == Roles::NONE {
        return Err(invalid("a credential needs at least one role".into()));
    }
    let claims = Claims {
        name: checked_name("member name", name).map_err(invalid)?,
        tenant: checked_name("tenant", tenant).map_err(invalid)?,
        roles,
        serial: serial(),
        expires: valid_for.map_or(0, |secs| now.saturating_add(secs.max(1))),
    };
    let credential = secret.issue(claims.clone()).map_err(|e| {
        invalid(format!(
            "{e}: pass the cluster token (`mooring token new`) as --token-file"
        ))
    })?;
    write_private(path, &credential)?;
    Ok(claims)
}

/// Reads a revocation list (see [`Revocations`]).
pub fn load_revocations(path: &Path) -> Result<Revocations> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            ErrorCode::FILE_READ_FAIL,
            format!("revocation list {}: {e}", path.display()),
        )
    })?;
    Revocations::parse(&text).map_err(|e| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("revocation list {}: {e}", path.display()),
        )
    })
}

/// Loads the revocation list at `path` into `gate` now (failing if it cannot be read), then
/// again whenever the file changes, checked every `every`; a list that no longer reads is
/// reported and the last good one kept.
pub fn watch_revocations(
    gate: std::sync::Arc<Gate>,
    path: std::path::PathBuf,
    every: std::time::Duration,
) -> Result<tokio::task::JoinHandle<()>> {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    gate.set_revoked(load_revocations(&path)?);
    let mut seen = modified(&path);
    tracing::info!(list = %path.display(), "revocation list loaded");
    Ok(tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let now = modified(&path);
            if now == seen {
                continue;
            }
            seen = now;
            match load_revocations(&path) {
                Ok(list) => {
                    gate.set_revoked(list);
                    tracing::info!(list = %path.display(), "revocation list reloaded");
                }
                Err(e) => tracing::warn!("{e}; keeping the previous list"),
            }
        }
    }))
}

/// Writes `credential` to `path`, readable by its owner only; refuses to replace a file.
fn write_private(path: &Path, credential: &Credential) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| {
        Error::new(
            ErrorCode::FILE_WRITE_FAIL,
            format!("cannot write a token to {}: {e}", path.display()),
        )
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    file.write_all(credential.to_file_text().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_token_file_is_private_loads_back_and_is_never_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("mooring-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        write_new(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = load(&path).unwrap();
        assert_eq!(resolve(Some(&path)).unwrap(), Some(token.clone()));
        assert!(
            write_new(&path).is_err(),
            "an existing token is not replaced"
        );
        std::fs::write(&path, "not a token").unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("hex digits"));
        // 64 bytes, but not 64 characters: refused, not a panic.
        let odd = format!("é{}", "a".repeat(62));
        std::fs::write(&path, &odd).unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("hex digits"));
        // A token others can read is refused, saying how to fix it.
        std::fs::write(&path, token.to_file_text()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = load(&path).unwrap_err().to_string();
        assert!(
            open.contains("0644") && open.contains("chmod 600"),
            "{open}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load(&path).unwrap(), token);
        assert!(load(&dir.join("missing")).is_err());
        assert_ne!(generate(), generate());
        // A member credential issued from it loads back with its claims.
        let member = dir.join("member");
        let claims = issue(&path, "n1", "default", Roles::NODE, Some(60), &member).unwrap();
        let loaded = load(&member).unwrap();
        assert_eq!(loaded.claims(), Some(&claims));
        assert!(claims.expires > 0);
        assert!(issue(&member, "n2", "default", Roles::NODE, None, &dir.join("x")).is_err());
        assert!(issue(&path, "n 2", "default", Roles::NODE, None, &dir.join("x")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
