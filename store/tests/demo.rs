//! The README's main command: `mooring demo` (and `mooring demo --peer`) runs to the end and
//! says every check passed.

use std::process::{Command, Stdio};

mod common;

use common::BIN;

#[test]
fn the_demo_passes() {
    let out = Command::new(BIN)
        .arg("demo")
        .env_remove("MOORING_TOKEN_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("run mooring demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("every check passed"),
        "mooring demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mooring demo --peer`: the workload on a peer cluster, through a silent stop and a
/// goodbye, every block checked.
#[test]
fn the_peer_demo_passes() {
    let out = Command::new(BIN)
        .args(["demo", "--peer"])
        .env_remove("MOORING_TOKEN_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("run mooring demo --peer");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.contains("every check passed")
            && stdout.contains("found again")
            && stdout.contains("left with a goodbye"),
        "mooring demo --peer failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
