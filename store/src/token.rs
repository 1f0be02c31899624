//! The cluster token as processes get it: made fresh (`mooring token new`), read from a file
//! (`--token-file`), or from the file `MOORING_TOKEN_FILE` names, so programs that pass no
//! token (Mooncake-style clients) still authenticate.

use std::path::Path;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::auth::ClusterToken;

/// The environment variable naming the token file.
pub const TOKEN_FILE_VAR: &str = "MOORING_TOKEN_FILE";

/// A fresh random token (in simulation builds, from the run's seeded generator).
pub fn generate() -> ClusterToken {
    #[cfg(madsim)]
    return ClusterToken::from_bytes(madsim::rand::random());
    #[cfg(not(madsim))]
    {
        let mut bytes = [0u8; mooring_proto::auth::TOKEN_LEN];
        getrandom::fill(&mut bytes).expect("the operating system's random source");
        ClusterToken::from_bytes(bytes)
    }
}

/// Reads the token in `path`, which only its owner may read: a token others can read lets
/// them join the cluster as anyone (as ssh refuses a private key others can read).
pub fn load(path: &Path) -> Result<ClusterToken> {
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
    ClusterToken::parse(&text).map_err(|e| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("cluster token file {}: {e}", path.display()),
        )
    })
}

/// The token in `path` if given, else in the file `MOORING_TOKEN_FILE` names, else none.
pub fn resolve(path: Option<&Path>) -> Result<Option<ClusterToken>> {
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
    file.write_all(generate().to_file_text().as_bytes())
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
        assert!(
            load(&path)
                .unwrap_err()
                .to_string()
                .contains("hex digits only")
        );
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
