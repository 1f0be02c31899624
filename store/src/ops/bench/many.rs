//! The many-readers phase: reader processes that get at once, each reporting its own result,
//! and the loopback limit measured beside it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mooring_core::Result;
use serde::{Deserialize, Serialize};

use super::objects::{key, objects_for, value};
use super::process::Writer;
use super::report::Phase;
use super::{BenchConfig, protocol_error};
use crate::client::Client;
use crate::client::connect::ClientConfig;
use crate::transports::TransportChoice;

/// What one reader process of the many-readers phase reports.
#[derive(Serialize, Deserialize)]
struct ReaderResult {
    /// Its gets.
    phase: Phase,
    /// From its first get's start to its last get's end, in seconds.
    wall_seconds: f64,
}

/// `config.readers` reader processes each get `config.count` values of `size` bytes at once
/// (every value verified); the phase's throughput is all their bytes over the slowest one's
/// wall time, its latencies the worst reader's.
pub(super) async fn many_readers(
    exe: &PathBuf,
    token: Option<&Path>,
    master: &str,
    config: &BenchConfig,
    run: &str,
    size: u64,
) -> Result<Phase> {
    let (size_arg, count) = (size.to_string(), config.count.to_string());
    let mut readers = Vec::with_capacity(config.readers);
    for first in 0..config.readers {
        let first = (first * 7919).to_string();
        let args = [
            "bench-reader",
            "--master",
            master,
            "--run",
            run,
            "--size",
            &size_arg,
            "--count",
            &count,
            "--first",
            &first,
            "--transport",
            config.transport.name(),
        ];
        readers.push(Writer::spawn_args(exe, token, &args)?);
    }
    for reader in &mut readers {
        reader.expect("ready").await?;
    }
    for reader in &mut readers {
        reader.send("go")?;
    }
    let mut results = Vec::with_capacity(readers.len());
    for reader in &mut readers {
        let line = reader.expect("result").await?;
        let result: ReaderResult = serde_json::from_str(&line)
            .map_err(|e| protocol_error(format!("bad reader result: {e}")))?;
        results.push(result);
    }
    let wall = results.iter().map(|r| r.wall_seconds).fold(0.0, f64::max);
    let worst = |f: fn(&Phase) -> f64| results.iter().map(|r| f(&r.phase)).fold(0.0, f64::max);
    let sum = |f: fn(&Phase) -> u64| results.iter().map(|r| f(&r.phase)).sum::<u64>();
    Ok(Phase {
        phase: format!("get-{}readers", config.readers),
        size,
        calls: sum(|p| p.calls),
        keys: sum(|p| p.keys),
        bytes: sum(|p| p.bytes),
        seconds: wall,
        p50_us: worst(|p| p.p50_us),
        p99_us: worst(|p| p.p99_us),
    })
}

/// The loopback limit beside the many-readers phase: `streams` TCP connections on 127.0.0.1
/// each sending `size`-byte writes for a quarter second at once, as many bytes per second as
/// the kernel moves between processes' sockets here (threads of this process, for
/// simplicity; the copies are the same).
pub(super) fn loopback(streams: usize, size: u64) -> Result<Phase> {
    use std::net::{TcpListener, TcpStream};
    let io = |e: std::io::Error| protocol_error(format!("loopback measurement: {e}"));
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let chunk = (size as usize).clamp(4096, 4 << 20);
    let run_for = Duration::from_millis(250);
    let start = Instant::now();
    let mut threads = Vec::new();
    for _ in 0..streams {
        let mut sender = TcpStream::connect(addr).map_err(io)?;
        let (mut receiver, _) = listener.accept().map_err(io)?;
        threads.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; chunk];
            let mut got = 0u64;
            while let Ok(n) = std::io::Read::read(&mut receiver, &mut buf) {
                if n == 0 {
                    break;
                }
                got += n as u64;
            }
            got
        }));
        threads.push(std::thread::spawn(move || {
            let buf = vec![1u8; chunk];
            while start.elapsed() < run_for {
                if sender.write_all(&buf).is_err() {
                    break;
                }
            }
            0
        }));
    }
    let bytes: u64 = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    let seconds = start.elapsed().as_secs_f64();
    Ok(Phase {
        phase: format!("tcp-loopback-{streams}"),
        size,
        calls: 0,
        keys: 0,
        bytes,
        seconds,
        p50_us: 0.0,
        p99_us: 0.0,
    })
}

/// A reader process of the many-readers phase: connects, says `ready`, and on `go` gets
/// `count` of the run's values of `size` bytes, starting at object `first` (so readers do
/// not all read the same value at once), verifying each; then reports its result.
pub async fn run_reader(
    master: &str,
    run: &str,
    size: u64,
    count: usize,
    first: usize,
    transport: TransportChoice,
) -> Result<()> {
    let mut config = ClientConfig::new(master);
    config.transport = transport;
    let reader = Client::connect(config).await?;
    let objects = objects_for(size, count);
    let expected: Vec<Vec<u8>> = (0..objects).map(|i| value(size, i)).collect();
    let mut buf = vec![0u8; size as usize];
    let mut out = std::io::stdout();
    let say = |out: &mut std::io::Stdout, line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say(&mut out, "ready".into());
    // Wait for `go` on a thread, as the writer reads its commands, so the runtime runs on.
    let (tx, go) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = go.await.unwrap_or_default();
    if line.trim() != "go" {
        return reader.close().await;
    }
    let mut lat = Vec::with_capacity(count);
    let started = Instant::now();
    for n in 0..count {
        let i = (first + n) % objects;
        let k = key(run, size, i);
        let t = Instant::now();
        let len = reader.get_into(&k, &mut buf).await?;
        lat.push(t.elapsed());
        if len != size as usize || buf != expected[i] {
            return Err(protocol_error(format!("{k} read back wrong")));
        }
    }
    let result = ReaderResult {
        wall_seconds: started.elapsed().as_secs_f64(),
        phase: Phase::from_latencies("get", size, 1, lat),
    };
    say(
        &mut out,
        format!(
            "result {}",
            serde_json::to_string(&result).expect("serializes")
        ),
    );
    reader.close().await
}
