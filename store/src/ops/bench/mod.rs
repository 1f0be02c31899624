//! `mooring bench`: put/get/exist throughput and latency, measured the way Mooncake Store's
//! numbers in the cluster issue were: writer and reader in separate processes, the objects in
//! the writer's own segment (so every read crosses processes over TCP), one thread, one
//! operation at a time, every value verified.
//!
//! The reader (this process) starts the writer as a child (`mooring bench-writer`), tells it
//! which size to write next over its stdin, and reads its put measurements from its stdout.
//! Throughput is computed from the time spent inside the store's calls, not the benchmark's
//! own value checking, which happens between calls.

//!
//! | module | what it holds |
//! | --- | --- |
//! | `report` | each measured [`Phase`], and the [`Report`] of them all |
//! | `objects` | the keys and values a run writes and verifies |
//! | `process` | the child processes and their line protocol |
//! | `reader` | the phases this process measures as the reader |
//! | `many` | the many-readers and many-clients phases, and a helper process of them ([`run_reader`]) |
//! | `writer` | the writer process ([`run_writer`]) |
//! | `peers` | peer mode's rows (`--peer`): a peer process and one in this process |

mod many;
mod objects;
mod peers;
mod process;
mod reader;
mod report;
mod writer;

use std::path::PathBuf;

use mooring_core::{Error, ErrorCode, Result};

use crate::client::Client;
use crate::client::connect::ClientConfig;
use crate::transports::TransportChoice;
use many::{Helpers, loopback, many_processes};
use process::{TokenDir, Writer};
use reader::{exist_phases, read_phases};

pub use many::{HelperJob, HelperOp, run_reader};
pub use report::{Phase, Report};
pub use writer::run_writer;

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
    /// Client processes in the many-clients phase, each asking the master whether keys
    /// exist, one request at a time (0: no such phase).
    pub clients: usize,
    /// Also measure peer mode (a cluster with no master), beside master mode.
    pub peer: bool,
}

/// Calls each client of the many-clients phase makes, per `--count`: enough that the
/// master's CPU time (counted in hundredths of a second) is measured to a few percent.
const CLIENT_CALLS_PER_COUNT: usize = 10;

pub(super) fn protocol_error(what: impl Into<String>) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, what.into())
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
    let run = format!(
        "{:016x}",
        crate::client::connect::random_client_id().0 as u64
    );
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
            let readers = Helpers {
                op: HelperOp::Get,
                processes: config.readers,
                count: config.count,
                master_pid: None,
            };
            report
                .phases
                .push(many_processes(&exe, token, &master, config, &run, size, &readers).await?);
            report.phases.push(loopback(config.readers, size)?);
        }
    }
    report
        .phases
        .extend(exist_phases(&reader, config, &run).await?);
    if config.clients > 0 {
        // The master's own process, where this host runs it: its CPU over the phase says how
        // close to its ceiling the clients drove it.
        let master_pid = match &master_process {
            Some(m) => Some(m.child.id()),
            None if config.master == MasterPlacement::InWriter => Some(writer.child.id()),
            None => None,
        };
        let clients = Helpers {
            op: HelperOp::Exist,
            processes: config.clients,
            count: config.count * CLIENT_CALLS_PER_COUNT,
            master_pid,
        };
        let size = config.sizes[0];
        report
            .phases
            .push(many_processes(&exe, token, &master, config, &run, size, &clients).await?);
    }
    reader.close().await?;
    drop(writer);
    if config.peer {
        report
            .phases
            .extend(peers::peer_phases(config, &exe, token, &run).await?);
    }
    // The master holds nothing worth a graceful stop (it does not read commands).
    if let Some(mut master) = master_process {
        let _ = master.child.kill();
    }
    Ok(report)
}
