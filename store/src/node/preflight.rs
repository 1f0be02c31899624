//! Checks a storage node's settings against the machine before anything is mapped or mounted,
//! so a mistyped flag fails at once with a message that says what to change, instead of
//! prefaulting toward the OOM killer or failing at the first offload.

use std::path::Path;

use mooring_core::{Error, ErrorCode, Result};

/// How much memory a segment may take here: the least of physical memory, the cgroup's limit
/// and the address-space and data limits, with where each came from.
fn memory_limits() -> Vec<(u64, &'static str)> {
    let mut limits = Vec::new();
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        limits.push((
            (pages as u64).saturating_mul(page as u64),
            "physical memory",
        ));
    }
    for file in [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ] {
        if let Some(limit) = std::fs::read_to_string(file)
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
        {
            limits.push((limit, "the cgroup's memory limit"));
        }
    }
    for (resource, name) in [
        (libc::RLIMIT_AS, "the address-space limit (ulimit -v)"),
        (libc::RLIMIT_DATA, "the data limit (ulimit -d)"),
    ] {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we pass; the result is checked.
        if unsafe { libc::getrlimit(resource, &mut limit) } == 0
            && limit.rlim_cur != libc::RLIM_INFINITY
        {
            limits.push((limit.rlim_cur, name));
        }
    }
    limits
}

/// Refuses a segment larger than this machine can hold.
pub fn check_segment_size(size: u64) -> Result<()> {
    if size == 0 {
        return Err(Error::new(ErrorCode::INVALID_PARAMS, "--size is zero"));
    }
    if let Some((limit, what)) = memory_limits().into_iter().min()
        && size > limit
    {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "--size {} exceeds {what} ({}); give a smaller --size, leaving room for the \
                 system",
                human(size),
                human(limit)
            ),
        ));
    }
    Ok(())
}

/// Checks the disk tier's directory: created if missing, a directory, writable, and with
/// room for `capacity` bytes (0: no limit asked).
pub fn check_disk_dir(dir: &Path, capacity: u64) -> Result<()> {
    let refuse = |what: String| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("--disk-dir {}: {what}", dir.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(|e| refuse(format!("cannot create it: {e}")))?;
    if !dir.is_dir() {
        return Err(refuse("not a directory".into()));
    }
    let probe = dir.join(".mooring-write-check");
    let written =
        std::fs::write(&probe, b"mooring").and_then(|()| std::fs::File::open(&probe)?.sync_all());
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| refuse(format!("not writable: {e}")))?;
    if capacity > 0 {
        let free =
            free_bytes(dir).map_err(|e| refuse(format!("cannot read its free space: {e}")))?;
        // Copies already there count toward the capacity; a fresh directory needs it all free.
        let used = used_bytes(dir);
        if free.saturating_add(used) < capacity {
            return Err(refuse(format!(
                "--disk-capacity {} exceeds the space there ({} free, {} used by copies); \
                 give a smaller --disk-capacity or another directory",
                human(capacity),
                human(free),
                human(used)
            )));
        }
    }
    Ok(())
}

/// Bytes free for this user on the file system holding `dir`.
fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: an all-zero statvfs is a valid value for the kernel to overwrite.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a live struct; the result is checked.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// Bytes of the files under `dir` (what an earlier run left there).
fn used_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(t) if t.is_dir() => used_bytes(&entry.path()),
            Ok(_) => entry.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// A byte count for people: `64.0 TiB`.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_beyond_the_machine_and_unusable_directories_are_refused() {
        assert!(check_segment_size(1 << 20).is_ok());
        let err = check_segment_size(64 << 40).unwrap_err();
        assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
        assert!(err.to_string().contains("64.0 TiB"), "{err}");
        assert!(check_segment_size(0).is_err());

        let dir = std::env::temp_dir().join(format!("mooring-preflight-{}", std::process::id()));
        check_disk_dir(&dir.join("tier"), 0).expect("a fresh directory is created");
        check_disk_dir(&dir.join("tier"), 1 << 20).expect("a megabyte fits");
        let err = check_disk_dir(&dir.join("tier"), u64::MAX / 2).unwrap_err();
        assert!(err.to_string().contains("exceeds the space"), "{err}");
        std::fs::write(dir.join("file"), b"x").unwrap();
        let err = check_disk_dir(&dir.join("file"), 0).unwrap_err();
        assert!(err.to_string().contains("--disk-dir"), "{err}");
        // procfs takes no new files, even from root.
        let err = check_disk_dir(Path::new("/proc/self"), 0).unwrap_err();
        assert!(err.to_string().contains("not writable"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(human(1536), "1.5 KiB");
    }
}
