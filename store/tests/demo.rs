//! The README's main command: `mooring demo` runs to the end and says every check passed.

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
