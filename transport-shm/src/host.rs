//! Which host a process runs on: the kernel's boot id, the same for every process (and
//! container) on one running kernel and different on every other machine and every reboot.

use std::sync::OnceLock;

use mooring_core::{Error, ErrorCode, Result};

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This host's id (read once per process).
pub fn host_id() -> Result<[u8; 16]> {
    static ID: OnceLock<std::result::Result<[u8; 16], String>> = OnceLock::new();
    ID.get_or_init(|| {
        let text =
            std::fs::read_to_string(BOOT_ID).map_err(|e| format!("cannot read {BOOT_ID}: {e}"))?;
        parse_boot_id(&text).ok_or_else(|| format!("{BOOT_ID} holds {text:?}, not a boot id"))
    })
    .clone()
    .map_err(|why| {
        Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
            format!("cannot tell which host this is, so same-host memory is off: {why}"),
        )
    })
}

/// The 16 bytes of a boot id written as a UUID (`8-4-4-4-12` hex digits).
fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = text.trim().bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let pair = std::str::from_utf8(pair).ok()?;
        id[i] = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_ids_parse_and_garbage_does_not() {
        let id = parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n").unwrap();
        assert_eq!(id[0], 0x0f);
        assert_eq!(id[15], 0xf0);
        assert_eq!(parse_boot_id("0f1e2d3c"), None);
        assert_eq!(parse_boot_id("zz1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"), None);
        assert_eq!(parse_boot_id("é1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"), None);
        assert!(host_id().is_ok(), "Linux has a boot id");
        assert_eq!(host_id().unwrap(), host_id().unwrap());
    }
}
