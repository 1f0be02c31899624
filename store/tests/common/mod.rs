//! Real `mooring` processes for the multi-process tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};

/// The `mooring` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mooring");

/// Runs `mooring args...` to completion with no token in its environment.
pub fn run_without_token(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("MOORING_TOKEN_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("run mooring")
}

/// `mooring token issue` for `name` with `roles` (as `--role` takes them), through the CLI,
/// into `file`; the credential written.
pub fn issue(
    secret: &std::path::Path,
    name: &str,
    roles: &str,
    file: &std::path::Path,
) -> mooring_proto::auth::Credential {
    let out = run_without_token(&[
        "token",
        "issue",
        "--token-file",
        secret.to_str().unwrap(),
        "--name",
        name,
        "--role",
        roles,
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    mooring_proto::auth::Credential::parse(&std::fs::read_to_string(file).unwrap()).unwrap()
}

/// An empty scratch directory for `test`, unique to this test process.
pub fn scratch(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mooring-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A loopback port free a moment ago (for a listener a test names in advance).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Owned arguments for [`Proc::start_on_free_ports`].
pub fn args(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// A master on loopback without a cluster token whose metrics endpoint wants the bearer
/// token in `token_file`: the process and its metrics address.
pub fn start_master_with_scrape_token(token_file: &std::path::Path) -> (Proc, String) {
    let token_path = token_file.to_str().unwrap().to_string();
    let (master, [metrics]) = Proc::start_on_free_ports(false, |[metrics]| {
        args(&[
            "master",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            metrics,
            "--metrics-token-file",
            &token_path,
        ])
    });
    (master, metrics)
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

    /// Starts `mooring` with the arguments `args` makes from `N` loopback addresses free a
    /// moment ago; when the process exits before its first line (another test took one of
    /// the ports between the pick and the bind), picks new ones, up to five times. With
    /// `token` false, no cluster token comes from the environment. Returns the process and
    /// the addresses.
    pub fn start_on_free_ports<const N: usize>(
        token: bool,
        args: impl Fn(&[String; N]) -> Vec<String>,
    ) -> (Proc, [String; N]) {
        let mut last = String::new();
        for _ in 0..5 {
            let addrs: [String; N] = std::array::from_fn(|_| format!("127.0.0.1:{}", free_port()));
            let mut command = Command::new(BIN);
            command.args(args(&addrs));
            if !token {
                command.env_remove("MOORING_TOKEN_FILE");
            }
            match Proc::try_spawn(&mut command) {
                Ok(proc) => return (proc, addrs),
                Err(why) => last = why,
            }
        }
        panic!("{last}")
    }

    /// [`Proc::start`], but a process that exits before its first line (a port taken
    /// meanwhile, say) is an `Err` saying so rather than a panic.
    pub fn try_start(args: &[&str]) -> Result<Proc, String> {
        Proc::try_spawn(Command::new(BIN).args(args))
    }

    fn spawn(command: &mut Command) -> Proc {
        Proc::try_spawn(command).unwrap_or_else(|why| panic!("{why}"))
    }

    fn try_spawn(command: &mut Command) -> Result<Proc, String> {
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
        if line.is_empty() {
            let _ = child.wait();
            return Err(format!("mooring {command:?} exited without output"));
        }
        Ok(Proc { child, line })
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

/// `count` storage nodes of `size` named node0, node1, ... serving the master at `master`.
pub fn start_nodes(master: &str, count: usize, size: &str) -> Vec<Proc> {
    (0..count)
        .map(|i| {
            Proc::start(&[
                "node",
                "--master",
                master,
                "--size",
                size,
                "--listen",
                "127.0.0.1:0",
                "--name",
                &format!("node{i}"),
                "--no-prefault",
            ])
        })
        .collect()
}

/// A value of `len` bytes that differs for every `seed` (xorshift).
pub fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Waits (up to ten seconds) until `client` sees `count` mounted segments.
pub async fn wait_for_segments(client: &mooring::Client, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while client.segments().await.unwrap().len() != count {
        assert!(
            std::time::Instant::now() < deadline,
            "{count} segments never mounted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// GETs `path` from `addr`: the status and the body.
pub fn http_get(addr: &str, path: &str, bearer: Option<&str>) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The value of the sample `name` (with its labels, if any) in a Prometheus exposition.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}
