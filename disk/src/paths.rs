//! Validation of the relative names a [`Disk`](mooring_proto::disk::Disk) addresses files by.

use std::io;
use std::path::{Path, PathBuf};

/// `root` joined with `name`, if `name` is a plain relative name: `/`-separated components,
/// none empty, `.` or `..`, no NUL bytes. Anything else is `InvalidInput`, so no name can
/// reach outside the disk's directory.
// Only the real disks resolve paths; they are not built under the simulator.
#[cfg_attr(madsim, allow(dead_code))]
pub(crate) fn resolve(root: &Path, name: &str) -> io::Result<PathBuf> {
    let bad = name.is_empty()
        || name.contains('\0')
        || name
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name:?} is not a relative file name (components must be non-empty, not . or ..)"
            ),
        ));
    }
    Ok(root.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_names_resolve() {
        let root = Path::new("/data");
        assert_eq!(
            resolve(root, "a/b.rec").unwrap(),
            Path::new("/data/a/b.rec")
        );
        for bad in ["", "/abs", "a//b", "a/../b", "..", "./a", "a/", "a\0b"] {
            assert_eq!(
                resolve(root, bad).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{bad:?}"
            );
        }
    }
}
