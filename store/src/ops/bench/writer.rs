//! The writer process: contributes a segment, puts each size's objects on request, and
//! reports the put latencies; with an embedded master, runs that too.

use std::io::{BufRead, Write};
use std::time::Instant;

use mooring_core::{ErrorCode, MasterConfig, ReplicateConfig, Result};

use super::objects::{key, objects_for, value};
use super::protocol_error;
use super::report::Phase;
use crate::client::Client;
use crate::client::connect::ClientConfig;
use crate::master::RunningMaster;
use crate::transports::TransportChoice;

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
                // On a thread of their own: making a gigabyte of values (first-touched
                // memory, seconds on a VM) on the runtime would hold up the writer's
                // heartbeats.
                let (made, values) = tokio::sync::oneshot::channel::<Vec<Vec<u8>>>();
                std::thread::spawn(move || {
                    let _ = made.send((0..objects).map(|i| value(size, i)).collect());
                });
                let values = values
                    .await
                    .map_err(|e| protocol_error(format!("making the values failed: {e}")))?;
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
