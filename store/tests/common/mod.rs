//! Real `mooring` processes for the multi-process tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The `mooring` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mooring");

/// A loopback port free a moment ago (for a listener a test names in advance).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed when dropped.
pub struct Proc {
    pub child: Child,
    /// Its first line of output.
    pub line: String,
}

impl Proc {
    /// Starts `mooring args...` and waits for its first stdout line.
    pub fn start(args: &[&str]) -> Proc {
        Proc::spawn(Command::new(BIN).args(args))
    }

    /// [`Proc::start`] with no cluster token in the environment (only what `args` give).
    pub fn start_without_token(args: &[&str]) -> Proc {
        Proc::spawn(
            Command::new(BIN)
                .args(args)
                .env_remove("MOORING_TOKEN_FILE"),
        )
    }

    fn spawn(command: &mut Command) -> Proc {
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mooring");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("first line");
        assert!(
            !line.is_empty(),
            "mooring {command:?} exited without output"
        );
        Proc { child, line }
    }

    /// The address a master announced in its first line.
    pub fn announced_addr(&self) -> String {
        self.line.trim().rsplit(' ').next().unwrap().to_string()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
