//! Validation of the relative names a [`Disk`](mooring_proto::disk::Disk) addresses files by.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Makes `dir` (with any missing parents) owner-only (0700), or checks the one that is there:
/// a symbolic link, something other than a directory, or a directory other users may write
/// (they could swap its files) is refused with what to do. What lives in it (key names, values,
/// the master's journal) is for this user alone.
pub fn owner_only_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: {why}", dir.display()),
        ))
    };
    let meta = fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return refuse("is a symbolic link; give the directory it points to".into());
    }
    if !meta.is_dir() {
        return refuse("is not a directory".into());
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        return refuse(format!(
            "other users may write it (mode {mode:o}); run `chmod go-w {}` (0700 is best)",
            dir.display()
        ));
    }
    Ok(())
}

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
    fn a_directory_others_may_write_or_a_symlink_is_refused() {
        let base = std::env::temp_dir().join(format!("mooring-owner-only-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let fresh = base.join("a/b");
        owner_only_dir(&fresh).unwrap();
        assert_eq!(fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);
        owner_only_dir(&fresh).unwrap();
        let open = base.join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let e = owner_only_dir(&open).unwrap_err().to_string();
        assert!(e.contains("chmod go-w"), "{e}");
        let link = base.join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        let e = owner_only_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        fs::remove_dir_all(&base).unwrap();
    }

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
