//! The master's default log stays readable under routine traffic: CLI calls say goodbye, and
//! their comings and goings are DEBUG lines, not INFO.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

mod common;

use common::BIN;

#[test]
fn a_hundred_cli_calls_leave_the_master_log_quiet() {
    let mut master = Command::new(BIN)
        // A short client TTL, so a call that left without a word would have expired (one INFO
        // line each) by the time the log is read.
        .args(["master", "--listen", "127.0.0.1:0", "--client-ttl", "1s"])
        .env_remove("RUST_LOG")
        .env_remove("MOORING_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(master.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().rsplit(' ').next().unwrap().to_string();
    let node = Command::new(BIN)
        .args(["node", "--master", &addr, "--size", "8MiB", "--no-prefault"])
        .env_remove("MOORING_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let node = scopeguard(node);
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .args(["--master", &addr])
            .env_remove("MOORING_TOKEN_FILE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // The node mounts in the background; the first put waits for it.
    for _ in 0..50 {
        let out = Command::new(BIN)
            .args(["put", "--value", "v", "warmup", "--master", &addr])
            .env_remove("MOORING_TOKEN_FILE")
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for i in 0..25 {
        let key = format!("k{i}");
        run(&["put", "--value", "hello", &key]);
        run(&["get", &key]);
        run(&["ls", "^k"]);
        run(&["stat"]);
    }
    std::thread::sleep(std::time::Duration::from_millis(2500));
    master.kill().unwrap();
    master.wait().unwrap();
    drop(node);
    let mut log = String::new();
    master
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let lines = log.lines().count();
    assert!(lines < 30, "{lines} lines for 100 calls:\n{log}");
    assert!(!log.contains("client expired"), "{log}");
}

/// Kills the node when the test ends, however it ends.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scopeguard(child: std::process::Child) -> Guard {
    Guard(child)
}
