//! The many-processes phases: reader processes that get at once (`--readers N`), client
//! processes that ask the master whether keys exist at once (`--clients N`, the master's
//! ceiling), each reporting its own result; and the loopback limit measured beside the
//! readers.

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

/// What a helper process of the many-processes phases does, one call at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HelperOp {
    /// Gets values into its buffer, verifying each (one master request and one transfer).
    Get,
    /// Asks whether keys exist (one master request each, no transfer).
    Exist,
}

impl HelperOp {
    fn name(self) -> &'static str {
        match self {
            HelperOp::Get => "get",
            HelperOp::Exist => "exist",
        }
    }
}

/// How many processes of a many-processes phase run, and how many calls each makes.
pub(super) struct Helpers {
    /// What each process does.
    pub(super) op: HelperOp,
    /// Processes at once.
    pub(super) processes: usize,
    /// Calls per process.
    pub(super) count: usize,
    /// The process whose CPU time the phase reports (the master's), if this host runs it.
    pub(super) master_pid: Option<u32>,
}

/// What one helper process is asked to do (its command line).
pub struct HelperJob {
    /// The master's address.
    pub master: String,
    /// The run whose objects it reads.
    pub run: String,
    /// The objects' size.
    pub size: u64,
    /// Calls to make.
    pub count: usize,
    /// Objects of that size the writer wrote.
    pub objects: usize,
    /// The object it starts at.
    pub first: usize,
    /// The call.
    pub op: HelperOp,
}

/// What one helper process of the many-processes phases reports.
#[derive(Serialize, Deserialize)]
struct ReaderResult {
    /// Its gets.
    phase: Phase,
    /// From its first get's start to its last get's end, in seconds.
    wall_seconds: f64,
}

/// `helpers.processes` processes each make `helpers.count` calls of `size`-byte objects at
/// once, one at a time (every value verified); the phase's throughput is all their keys and
/// bytes over the slowest one's wall time, its latencies the worst process's, and its CPU
/// the master's over that time.
pub(super) async fn many_processes(
    exe: &PathBuf,
    token: Option<&Path>,
    master: &str,
    config: &BenchConfig,
    run: &str,
    size: u64,
    helpers: &Helpers,
) -> Result<Phase> {
    let (size_arg, count) = (size.to_string(), helpers.count.to_string());
    // The objects the writer wrote of this size: calls cycle over them.
    let objects = objects_for(size, config.count).to_string();
    let mut readers = Vec::with_capacity(helpers.processes);
    for first in 0..helpers.processes {
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
            "--objects",
            &objects,
            "--first",
            &first,
            "--transport",
            config.transport.name(),
            "--op",
            helpers.op.name(),
        ];
        readers.push(Writer::spawn_args(exe, token, &args)?);
    }
    for reader in &mut readers {
        reader.expect("ready").await?;
    }
    let cpu_before = helpers.master_pid.and_then(cpu_seconds);
    let started = Instant::now();
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
    // The master's CPU over the whole phase, from the first `go` to the last result: a little
    // longer than the calls, so its share of a core is if anything understated.
    let master_cpu = match (cpu_before, helpers.master_pid.and_then(cpu_seconds)) {
        (Some(before), Some(after)) => Some((after - before) / started.elapsed().as_secs_f64()),
        _ => None,
    };
    let wall = results.iter().map(|r| r.wall_seconds).fold(0.0, f64::max);
    let worst = |f: fn(&Phase) -> f64| results.iter().map(|r| f(&r.phase)).fold(0.0, f64::max);
    let sum = |f: fn(&Phase) -> u64| results.iter().map(|r| f(&r.phase)).sum::<u64>();
    let phase = match helpers.op {
        HelperOp::Get => format!("get-{}readers", helpers.processes),
        HelperOp::Exist => format!("exist-{}clients", helpers.processes),
    };
    Ok(Phase {
        phase,
        size: if helpers.op == HelperOp::Exist {
            0
        } else {
            size
        },
        calls: sum(|p| p.calls),
        keys: sum(|p| p.keys),
        bytes: sum(|p| p.bytes),
        seconds: wall,
        p50_us: worst(|p| p.p50_us),
        p99_us: worst(|p| p.p99_us),
        master_cpu,
    })
}

/// The CPU time process `pid` has used so far, in seconds (user and system, every thread),
/// from `/proc`; `None` where it cannot be read.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it are plain numbers.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15, in units of USER_HZ (100 per second on Linux).
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
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
        master_cpu: None,
    })
}

/// A helper process of the many-processes phases: connects, says `ready`, and on `go` makes
/// `count` calls of `op`, cycling over the run's first `objects` objects of `size` bytes
/// from object `first` (so helpers do not all ask for the same object at once), verifying
/// each; then reports its result.
pub async fn run_reader(job: HelperJob, transport: TransportChoice) -> Result<()> {
    let HelperJob {
        master,
        run,
        size,
        count,
        objects,
        first,
        op,
    } = job;
    let mut config = ClientConfig::new(master);
    config.transport = transport;
    let reader = Client::connect(config).await?;
    let expected: Vec<Vec<u8>> = match op {
        HelperOp::Get => (0..objects).map(|i| value(size, i)).collect(),
        HelperOp::Exist => Vec::new(),
    };
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
        let k = key(&run, size, i);
        let t = Instant::now();
        let right = match op {
            HelperOp::Get => {
                let len = reader.get_into(&k, &mut buf).await?;
                len == size as usize && buf == expected[i]
            }
            HelperOp::Exist => reader.exist(&k).await?,
        };
        lat.push(t.elapsed());
        if !right {
            return Err(protocol_error(format!("{k} read back wrong")));
        }
    }
    let moved = match op {
        HelperOp::Get => size,
        HelperOp::Exist => 0,
    };
    let result = ReaderResult {
        wall_seconds: started.elapsed().as_secs_f64(),
        phase: Phase::from_latencies(op.name(), moved, 1, lat),
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
