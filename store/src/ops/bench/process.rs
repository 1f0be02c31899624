//! The helper processes (the writer, a master, the many readers) started as children of
//! this one, their line protocol over stdin and stdout, and the token they share.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use mooring_core::{Error, ErrorCode, Result};

use super::{BenchConfig, protocol_error};

/// The writer child process and its line protocol.
pub(super) struct Writer {
    pub(super) child: Child,
    stdin: ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Writer {
    /// Starts `exe bench-writer ...`.
    pub(super) fn spawn(
        exe: &PathBuf,
        token: Option<&Path>,
        master: &str,
        config: &BenchConfig,
        run: &str,
    ) -> Result<Writer> {
        let sizes: Vec<String> = config.sizes.iter().map(u64::to_string).collect();
        let transport = config.transport.name();
        let args = [
            "bench-writer",
            "--master",
            master,
            "--count",
            &config.count.to_string(),
            "--sizes",
            &sizes.join(","),
            "--run",
            run,
            "--transport",
            transport,
        ];
        Writer::spawn_args(exe, token, &args)
    }

    /// Starts `exe args...` with piped stdin and stdout, holding the token in `token` if
    /// given (else whatever this process's environment names).
    pub(super) fn spawn_args(exe: &PathBuf, token: Option<&Path>, args: &[&str]) -> Result<Writer> {
        let mut command = Command::new(exe);
        if let Some(token) = token {
            command.env(crate::token::TOKEN_FILE_VAR, token);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            // The helpers' routine logs (segments unmounting at the end) are not results.
            command.env("RUST_LOG", "error");
        }
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| protocol_error(format!("cannot start the bench writer: {e}")))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout)
                .lines()
                .map_while(std::io::Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Writer {
            child,
            stdin,
            lines,
        })
    }

    pub(super) fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| protocol_error(format!("bench writer gone: {e}")))
    }

    pub(super) async fn expect(&mut self, prefix: &str) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            match self.lines.try_recv() {
                Ok(line) if line.starts_with(prefix) => {
                    return Ok(line[prefix.len()..].trim().to_string());
                }
                Ok(_) => continue,
                Err(std::sync::mpsc::TryRecvError::Empty) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(_) => {
                    return Err(protocol_error(format!(
                        "bench writer stopped before sending {prefix:?}"
                    )));
                }
            }
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
    }
}

/// A fresh cluster token in a private temporary directory, removed when dropped.
pub(super) struct TokenDir {
    dir: PathBuf,
    pub(super) file: PathBuf,
}

impl TokenDir {
    pub(super) fn new(run: &str) -> Result<TokenDir> {
        let dir = std::env::temp_dir().join(format!("mooring-bench-{run}"));
        std::fs::create_dir_all(&dir).map_err(|e| {
            Error::new(
                ErrorCode::FILE_WRITE_FAIL,
                format!("{}: {e}", dir.display()),
            )
        })?;
        let file = dir.join("token");
        crate::token::write_new(&file)?;
        Ok(TokenDir { dir, file })
    }
}

impl Drop for TokenDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
