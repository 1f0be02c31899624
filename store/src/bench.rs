//! `mooring bench`: put/get/exist throughput and latency, measured the way Mooncake Store's
//! numbers in the cluster issue were: writer and reader in separate processes, the objects in
//! the writer's own segment (so every read crosses processes over TCP), one thread, one
//! operation at a time, every value verified.
//!
//! The reader (this process) starts the writer as a child (`mooring bench-writer`), tells it
//! which size to write next over its stdin, and reads its put measurements from its stdout.
//! Throughput is computed from the time spent inside the store's calls, not the benchmark's
//! own value checking, which happens between calls.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use mooring_core::{Error, ErrorCode, MasterConfig, ReplicateConfig, Result};
use serde::{Deserialize, Serialize};

use crate::client::Client;
use crate::connect::ClientConfig;
use crate::master_service::RunningMaster;
use crate::transports::TransportChoice;

/// Keys per exist batch.
const EXIST_BATCH: usize = 1000;
/// Largest total bytes of distinct objects per size (reads cycle over them).
const MAX_BYTES_PER_SIZE: u64 = 512 << 20;

/// Where the benchmark's master runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MasterPlacement {
    /// A running cluster's master at this address.
    Remote(String),
    /// A master started as its own process.
    Process,
    /// A master inside the writer process (an engine embedding the master).
    InWriter,
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Where the master runs.
    pub master: MasterPlacement,
    /// Value sizes.
    pub sizes: Vec<u64>,
    /// Operations per size and phase.
    pub count: usize,
    /// Keys per get batch.
    pub batch: usize,
    /// Show progress bars on stderr.
    pub progress: bool,
    /// How the reader reaches the writer's segment (the writer serves RDMA unless `tcp`).
    pub transport: TransportChoice,
    /// Reader processes in the many-readers phase (1: no such phase).
    pub readers: usize,
}

/// One measured phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Phase {
    /// put, get, batch-get, exist, batch-exist.
    pub phase: String,
    /// Value size in bytes (0 for exist phases).
    pub size: u64,
    /// Calls made.
    pub calls: u64,
    /// Keys handled (calls x batch size for batches).
    pub keys: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Time spent inside the calls, in seconds.
    pub seconds: f64,
    /// Median call latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile call latency, microseconds.
    pub p99_us: f64,
}

impl Phase {
    fn from_latencies(phase: &str, size: u64, keys_per_call: u64, mut lat: Vec<Duration>) -> Phase {
        lat.sort_unstable();
        let pick = |q: f64| {
            lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        let calls = lat.len() as u64;
        Phase {
            phase: phase.into(),
            size,
            calls,
            keys: calls * keys_per_call,
            bytes: calls * keys_per_call * size,
            seconds: lat.iter().sum::<Duration>().as_secs_f64(),
            p50_us: pick(0.50),
            p99_us: pick(0.99),
        }
    }

    /// Keys per second.
    pub fn keys_per_sec(&self) -> f64 {
        self.keys as f64 / self.seconds.max(1e-9)
    }

    /// Bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }
}

/// Every phase's results.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// The phases, in the order run.
    pub phases: Vec<Phase>,
}

impl Report {
    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }

    /// The report as a table.
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "{:<12} {:>9} {:>12} {:>11} {:>10} {:>10}\n",
            "phase", "size", "keys/s", "GB/s", "p50 µs", "p99 µs"
        );
        for p in &self.phases {
            out += &format!(
                "{:<12} {:>9} {:>12.0} {:>11.3} {:>10.1} {:>10.1}\n",
                p.phase,
                human_size(p.size),
                p.keys_per_sec(),
                p.bytes_per_sec() / 1e9,
                p.p50_us,
                p.p99_us
            );
        }
        out
    }
}

fn human_size(n: u64) -> String {
    match n {
        0 => "-".into(),
        n if n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    }
}

/// The value of object `i` of `size` bytes: cheap to generate, distinct per object.
fn value(size: u64, i: usize) -> Vec<u8> {
    let mut out = vec![0u8; size as usize];
    let seed = (size ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
    for (n, chunk) in out.chunks_mut(8).enumerate() {
        let word = seed.wrapping_mul(n as u64 + 1).rotate_left(17);
        chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
    }
    out
}

fn key(run: &str, size: u64, i: usize) -> String {
    format!("bench/{run}/{size}/{i:07}")
}

fn objects_for(size: u64, count: usize) -> usize {
    count.min((MAX_BYTES_PER_SIZE / size.max(1)).max(16) as usize)
}

fn protocol_error(what: impl Into<String>) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, what.into())
}

/// The writer child process and its line protocol.
struct Writer {
    child: Child,
    stdin: ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Writer {
    /// Starts `exe bench-writer ...`.
    fn spawn(
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
    fn spawn_args(exe: &PathBuf, token: Option<&Path>, args: &[&str]) -> Result<Writer> {
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

    fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| protocol_error(format!("bench writer gone: {e}")))
    }

    async fn expect(&mut self, prefix: &str) -> Result<String> {
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

fn progress(enabled: bool, len: u64, label: String) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>22} [{bar:30}] {pos}/{len} {per_sec}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label);
    bar
}

/// A fresh cluster token in a private temporary directory, removed when dropped.
struct TokenDir {
    dir: PathBuf,
    file: PathBuf,
}

impl TokenDir {
    fn new(run: &str) -> Result<TokenDir> {
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

/// Runs the benchmark; `exe` is this program (started again as the writer).
pub async fn run(config: &BenchConfig, exe: PathBuf) -> Result<Report> {
    if config.sizes.is_empty() || config.count == 0 || config.batch == 0 || config.readers == 0 {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "need at least one size, a positive count, a positive batch and at least one reader",
        ));
    }
    if config.transport == TransportChoice::Rdma {
        // Say what is missing before starting any process.
        mooring_transport_rdma::device::choose(&[], 0)?;
    }
    let run = format!("{:016x}", crate::connect::random_client_id().0 as u64);
    // A cluster the bench starts shares a fresh token; a remote one's comes from the
    // environment (MOORING_TOKEN_FILE), as for any client.
    let own_token = match config.master {
        MasterPlacement::Remote(_) => None,
        _ => Some(TokenDir::new(&run)?),
    };
    let token = own_token.as_ref().map(|t| t.file.as_path());
    let mut master_process = None;
    let (mut writer, master) = match &config.master {
        MasterPlacement::Remote(addr) => {
            let writer = Writer::spawn(&exe, token, addr, config, &run)?;
            (writer, addr.clone())
        }
        MasterPlacement::Process => {
            let mut master =
                Writer::spawn_args(&exe, token, &["master", "--listen", "127.0.0.1:0"])?;
            let addr = master.expect("mooring master listening on").await?;
            master_process = Some(master);
            let writer = Writer::spawn(&exe, token, &addr, config, &run)?;
            (writer, addr)
        }
        MasterPlacement::InWriter => {
            let mut writer = Writer::spawn(&exe, token, "embedded", config, &run)?;
            let addr = writer.expect("master").await?;
            (writer, addr)
        }
    };
    writer.expect("ready").await?;
    let mut reader_config = ClientConfig::new(master.clone());
    reader_config.token = token.map(crate::token::load).transpose()?;
    reader_config.transport = config.transport;
    let reader = Client::connect(reader_config).await?;
    let mut report = Report::default();
    for &size in &config.sizes {
        writer.send(&format!("put {size}"))?;
        let put: Phase = serde_json::from_str(&writer.expect("result").await?)
            .map_err(|e| protocol_error(format!("bad writer result: {e}")))?;
        report.phases.push(put);
        report
            .phases
            .extend(read_phases(&reader, config, &run, size).await?);
        if config.readers > 1 {
            report
                .phases
                .push(many_readers(&exe, token, &master, config, &run, size).await?);
            report.phases.push(loopback(config.readers, size)?);
        }
    }
    report
        .phases
        .extend(exist_phases(&reader, config, &run).await?);
    reader.close().await?;
    drop(writer);
    // The master holds nothing worth a graceful stop (it does not read commands).
    if let Some(mut master) = master_process {
        let _ = master.child.kill();
    }
    Ok(report)
}

async fn read_phases(
    reader: &Client,
    config: &BenchConfig,
    run: &str,
    size: u64,
) -> Result<Vec<Phase>> {
    let objects = objects_for(size, config.count);
    let expected: Vec<Vec<u8>> = (0..objects).map(|i| value(size, i)).collect();
    let mut buf = vec![0u8; size as usize];
    // The yardstick: one thread copying the same values (as many, as large, in the same
    // order) from memory into the same buffer.
    let mut lat = Vec::with_capacity(config.count);
    for n in 0..config.count {
        let source = &expected[n % objects];
        let t = Instant::now();
        buf.copy_from_slice(std::hint::black_box(source));
        std::hint::black_box(&mut buf);
        lat.push(t.elapsed());
    }
    let memcpy = Phase::from_latencies("memcpy", size, 1, lat);
    let bar = progress(
        config.progress,
        config.count as u64,
        format!("get {}", human_size(size)),
    );
    let mut lat = Vec::with_capacity(config.count);
    for n in 0..config.count {
        let i = n % objects;
        let k = key(run, size, i);
        let t = Instant::now();
        let len = reader.get_into(&k, &mut buf).await?;
        lat.push(t.elapsed());
        if len != size as usize || buf != expected[i] {
            return Err(protocol_error(format!("{k} read back wrong")));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut phases = vec![memcpy, Phase::from_latencies("get", size, 1, lat)];

    let batch = config.batch.min(objects);
    let rounds = config.count.div_ceil(batch);
    let bar = progress(
        config.progress,
        rounds as u64,
        format!("batch-{batch} get {}", human_size(size)),
    );
    let mut bufs = vec![vec![0u8; size as usize]; batch];
    let mut lat = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let first = (round * batch) % objects;
        let ids: Vec<usize> = (0..batch).map(|j| (first + j) % objects).collect();
        let keys: Vec<String> = ids.iter().map(|&i| key(run, size, i)).collect();
        let mut items: Vec<(&str, &mut [u8])> = keys
            .iter()
            .map(String::as_str)
            .zip(bufs.iter_mut().map(Vec::as_mut_slice))
            .collect();
        let t = Instant::now();
        let results = reader.batch_get_into(&mut items).await;
        lat.push(t.elapsed());
        for (j, r) in results.into_iter().enumerate() {
            r?;
            if bufs[j] != expected[ids[j]] {
                return Err(protocol_error(format!("{} read back wrong", keys[j])));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    phases.push(Phase::from_latencies(
        &format!("batch{batch}-get"),
        size,
        batch as u64,
        lat,
    ));
    Ok(phases)
}

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
async fn many_readers(
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
fn loopback(streams: usize, size: u64) -> Result<Phase> {
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

async fn exist_phases(reader: &Client, config: &BenchConfig, run: &str) -> Result<Vec<Phase>> {
    let size = config.sizes[0];
    let objects = objects_for(size, config.count);
    let bar = progress(config.progress, config.count as u64, "exist".into());
    let mut lat = Vec::with_capacity(config.count);
    for n in 0..config.count {
        let k = key(run, size, n % objects);
        let t = Instant::now();
        let found = reader.exist(&k).await?;
        lat.push(t.elapsed());
        if !found {
            return Err(protocol_error(format!("{k} should exist")));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut phases = vec![Phase::from_latencies("exist", 0, 1, lat)];
    let keys: Vec<String> = (0..EXIST_BATCH)
        .map(|i| key(run, size, i % objects))
        .collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let rounds = config.count.div_ceil(10).max(10);
    let mut lat = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let found = reader.batch_exist(&refs).await?;
        lat.push(t.elapsed());
        if !found.iter().all(|r| matches!(r, Ok(true))) {
            return Err(protocol_error("a batch exist missed a key"));
        }
    }
    phases.push(Phase::from_latencies(
        &format!("batch{EXIST_BATCH}-exist"),
        0,
        EXIST_BATCH as u64,
        lat,
    ));
    Ok(phases)
}

/// The writer process: contributes a segment large enough for every size's objects, writes
/// them on request (one put at a time), and reports put latencies.
/// With `master == "embedded"` the writer also runs the master (and announces its address).
pub async fn run_writer(
    master: &str,
    sizes: &[u64],
    count: usize,
    run: &str,
    transport: TransportChoice,
) -> Result<()> {
    let embedded = match master {
        "embedded" => Some(
            RunningMaster::start(
                "127.0.0.1:0",
                MasterConfig::default(),
                crate::token::resolve(None)?,
            )
            .await?,
        ),
        _ => None,
    };
    let master = match &embedded {
        Some(m) => {
            let addr = m.addr.to_string();
            let mut out = std::io::stdout();
            let _ = writeln!(out, "master {addr}");
            let _ = out.flush();
            addr
        }
        None => master.to_string(),
    };
    let master = master.as_str();
    let footprint: u64 = sizes
        .iter()
        .map(|&s| objects_for(s, count) as u64 * s.div_ceil(64) * 64)
        .sum();
    let segment = footprint + footprint / 4 + (64 << 20);
    let contributing = |rdma: bool, shm: bool| {
        let mut config = ClientConfig::new(master).contributing(segment, "127.0.0.1:0");
        if let Some(s) = config.segment.as_mut() {
            s.rdma_devices = rdma.then(Vec::new);
            s.node.shared = shm;
        }
        config
    };
    // The segment is served as the reader will reach it: over TCP only for `tcp` (private
    // memory, as before shared memory existed), in shared memory for `shm`, and under `auto`
    // both and RDMA where the machine has it.
    let writer = match transport {
        TransportChoice::Tcp => Client::connect(contributing(false, false)).await?,
        TransportChoice::Rdma => Client::connect(contributing(true, false)).await?,
        TransportChoice::Shm => Client::connect(contributing(false, true)).await?,
        TransportChoice::Auto => match Client::connect(contributing(true, true)).await {
            Ok(writer) => writer,
            Err(e) if e.code == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE => {
                Client::connect(contributing(false, true)).await?
            }
            Err(e) => return Err(e),
        },
    };
    let local = writer
        .segment_name()
        .map(|n| ReplicateConfig::single().preferring(n))
        .expect("the writer contributes a segment");
    let mut out = std::io::stdout();
    let say = |out: &mut std::io::Stdout, line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say(&mut out, "ready".into());
    // Commands arrive on stdin; read them on a thread so this process's runtime (which also
    // serves the segment) never blocks.
    let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin()
            .lock()
            .lines()
            .map_while(std::io::Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = commands.recv().await {
        let mut words = line.split_whitespace();
        match (
            words.next(),
            words.next().and_then(|w| w.parse::<u64>().ok()),
        ) {
            (Some("put"), Some(size)) => {
                let objects = objects_for(size, count);
                // Values are made before the timed loop and put back to back, each from
                // where it was made (as `python/bench.py`'s writer does, and as an engine
                // puts pages of a host pool): both writers leave the servers the same gaps.
                let values: Vec<Vec<u8>> = (0..objects).map(|i| value(size, i)).collect();
                let mut lat = Vec::with_capacity(objects);
                for (i, v) in values.iter().enumerate() {
                    let t = Instant::now();
                    writer.put(&key(run, size, i), v, &local).await?;
                    lat.push(t.elapsed());
                }
                let phase = Phase::from_latencies("put", size, 1, lat);
                say(
                    &mut out,
                    format!(
                        "result {}",
                        serde_json::to_string(&phase).expect("serializes")
                    ),
                );
            }
            (Some("exit"), _) | (None, _) => break,
            _ => return Err(protocol_error(format!("unknown writer command {line:?}"))),
        }
    }
    writer.close().await
}
