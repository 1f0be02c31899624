//! Finding an RDMA device to open, and saying exactly what is missing when there is none: no
//! kernel support, no device (or none of the names asked for), a memlock limit too low for
//! the memory to register, or a build without the ibverbs implementation.

use std::path::Path;

use mooring_core::{Error, ErrorCode, Result};

/// Where the kernel lists RDMA devices.
const SYSFS_DEVICES: &str = "/sys/class/infiniband";

/// A device that can be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceChoice {
    /// Its name (`mlx5_0`, `rxe0`).
    pub name: String,
}

/// Picks the first of `names` (comma-separated lists already split; empty: any device) that
/// this machine has, checking that `register_bytes` can be registered under the memlock limit.
pub fn choose(names: &[String], register_bytes: u64) -> Result<DeviceChoice> {
    choose_in(
        Path::new(SYSFS_DEVICES),
        memlock_limit(),
        names,
        register_bytes,
    )
}

/// [`choose`] against a given device directory and memlock limit (`None`: unlimited).
pub fn choose_in(
    sysfs: &Path,
    memlock: Option<u64>,
    names: &[String],
    register_bytes: u64,
) -> Result<DeviceChoice> {
    let missing =
        |message: String| Err(Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, message));
    let Ok(entries) = std::fs::read_dir(sysfs) else {
        return missing(format!(
            "this machine has no RDMA kernel support ({} is missing): load your NIC's RDMA \
             driver (mlx5_ib, irdma, ...) or rdma_rxe for soft-RoCE, or serve --transports tcp",
            sysfs.display()
        ));
    };
    let mut found: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    if found.is_empty() {
        return missing(
            "no RDMA device found (the kernel supports RDMA but lists no device): check the \
             NIC and its driver with `ibv_devices`, or serve --transports tcp"
                .to_string(),
        );
    }
    let name = if names.is_empty() {
        found[0].clone()
    } else {
        match names.iter().find(|n| found.contains(n)) {
            Some(n) => n.clone(),
            None => {
                return missing(format!(
                    "none of the RDMA devices asked for ({}) exists here; found: {}",
                    names.join(","),
                    found.join(",")
                ));
            }
        }
    };
    if let Some(limit) = memlock.filter(|&l| l < register_bytes) {
        return missing(format!(
            "the memlock limit ({limit} bytes) is below the {register_bytes} bytes RDMA must \
             register: raise it (`ulimit -l unlimited`, or LimitMEMLOCK=infinity in the \
             systemd unit)"
        ));
    }
    if !cfg!(feature = "ibverbs") {
        return missing(format!(
            "RDMA device {name} is present, but this build of mooring has no ibverbs support: \
             install libibverbs-dev librdmacm-dev clang libclang-dev and build with \
             `cargo build --release -p mooring --features rdma`"
        ));
    }
    Ok(DeviceChoice { name })
}

/// Opens the device [`choose`] picks.
#[cfg(feature = "ibverbs")]
pub fn open(names: &[String], register_bytes: u64) -> Result<crate::sys::SysVerbs> {
    let choice = choose(names, register_bytes)?;
    crate::sys::SysVerbs::open(&choice.name).map_err(|e| {
        Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
            format!("cannot open RDMA device {}: {e}", choice.name),
        )
    })
}

/// The soft limit on locked memory, from `/proc/self/limits` (`None`: unlimited or unknown).
fn memlock_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_and_message(r: Result<DeviceChoice>) -> (ErrorCode, String) {
        let e = r.unwrap_err();
        (e.code, e.to_string())
    }

    #[test]
    fn each_missing_piece_is_named() {
        let dir = std::env::temp_dir().join(format!("mooring-rdma-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (code, message) = code_and_message(choose_in(&dir, None, &[], 1));
        assert_eq!(code, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
        assert!(message.contains("no RDMA kernel support"), "{message}");

        std::fs::create_dir_all(&dir).unwrap();
        let (_, message) = code_and_message(choose_in(&dir, None, &[], 1));
        assert!(message.contains("no RDMA device found"), "{message}");

        std::fs::create_dir_all(dir.join("rxe0")).unwrap();
        std::fs::create_dir_all(dir.join("mlx5_0")).unwrap();
        let asked = vec!["mlx5_9".to_string()];
        let (_, message) = code_and_message(choose_in(&dir, None, &asked, 1));
        assert!(
            message.contains("mlx5_9") && message.contains("mlx5_0,rxe0"),
            "{message}"
        );

        let asked = vec!["mlx5_9".to_string(), "rxe0".to_string()];
        let (_, message) = code_and_message(choose_in(&dir, Some(8 << 20), &asked, 1 << 30));
        assert!(
            message.contains("memlock limit (8388608 bytes)"),
            "{message}"
        );

        let chosen = choose_in(&dir, Some(8 << 20), &asked, 1 << 20);
        if cfg!(feature = "ibverbs") {
            assert_eq!(chosen.unwrap().name, "rxe0");
        } else {
            let (_, message) = code_and_message(chosen);
            assert!(message.contains("rxe0 is present") && message.contains("--features rdma"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
