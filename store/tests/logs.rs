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

/// A get's trace id, printed in the client's DEBUG line, is found in the master's line for its
/// replica-list request and in the node's line for its read: one slow operation can be
/// followed through the three processes.
#[test]
fn one_trace_id_follows_a_get_through_master_and_node() {
    let dir = std::env::temp_dir().join(format!("mooring-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log_file = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    let mut master = Command::new(BIN)
        .args(["master", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", TRACING)
        .env_remove("MOORING_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file("master.log"))
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(master.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let master = scopeguard(master);
    let addr = line.trim().rsplit(' ').next().unwrap().to_string();
    let node = Command::new(BIN)
        .args(["node", "--master", &addr, "--size", "8MiB", "--no-prefault"])
        .env("RUST_LOG", TRACING)
        .env_remove("MOORING_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file("node.log"))
        .spawn()
        .unwrap();
    let node = scopeguard(node);
    let cli = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .args(["--master", &addr])
            .env("RUST_LOG", "warn,mooring::client=debug")
            .env_remove("MOORING_TOKEN_FILE")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let mut stored = false;
    for _ in 0..50 {
        if cli(&["put", "--value", "traced value", "traced"])
            .status
            .success()
        {
            stored = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(stored, "the node never mounted");
    let get = cli(&["get", "traced"]);
    assert!(get.status.success());
    let client_log = String::from_utf8_lossy(&get.stderr).to_string();
    let done = client_log
        .lines()
        .find(|l| l.contains("op=\"get\"") && l.contains("done"))
        .unwrap_or_else(|| panic!("no DEBUG line for the get:\n{client_log}"));
    let trace = trace_of(done).unwrap_or_else(|| panic!("no trace id in {done:?}"));
    // Let the servers' log lines reach their files.
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(node);
    drop(master);
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let (master_log, node_log) = (read("master.log"), read("node.log"));
    let _ = std::fs::remove_dir_all(&dir);
    let carrying = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| trace_of(l) == Some(trace.clone()))
            .map(str::to_string)
            .collect()
    };
    let at_master = carrying(&master_log);
    assert!(
        at_master
            .iter()
            .any(|l| l.contains("GetReplicaList") && l.contains("served")),
        "trace {trace} not in the master's log:\n{master_log}"
    );
    let at_node = carrying(&node_log);
    assert!(
        at_node
            .iter()
            // Over TCP the node serves the Read; on this host the client maps the segment
            // (ShmAttach) and copies the bytes itself.
            .any(|l| (l.contains("Read") || l.contains("ShmAttach")) && l.contains("data request")),
        "trace {trace} not in the node's log:\n{node_log}"
    );
    // The put before it was another operation, with another id.
    assert!(
        !at_master.iter().any(|l| l.contains("PutStart")),
        "{at_master:#?}"
    );
}

/// The filter an operator sets to follow operations: the servers' request spans and lines.
const TRACING: &str = "info,mooring=debug,mooring_transport_tcp=debug";

/// The 16 hex digits after `trace=` in a log line, if any.
fn trace_of(line: &str) -> Option<String> {
    let at = line.find("trace=")? + "trace=".len();
    let id = line.get(at..at + 16)?;
    id.chars()
        .all(|c| c.is_ascii_hexdigit())
        .then(|| id.to_string())
}
