//! The `mooring` command: run a master or a storage node, use the store from the shell,
//! benchmark it, or watch a demo.

#![allow(clippy::print_stdout)] // this is the CLI; stdout is its output

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mooring::bench::{self, BenchConfig, MasterPlacement};
use mooring::config::{FileConfig, MasterSection, parse_size};
use mooring::disk_tier::DiskTierConfig;
use mooring::master_service::MasterService;
use mooring::{
    Client, ClientConfig, RunningMaster, SegmentConfig, StandaloneNode, demo, random_client_id,
};
use mooring_core::{Error, ErrorCode, ReplicateConfig};
use mooring_transport_tcp::LocalSegments;

/// Prints a line of the CLI's output. A closed stdout (`mooring stat | head -1`) ends the
/// process quietly, as for any Unix filter, instead of a panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            output_failed(e);
        }
    }};
}

#[cfg(not(madsim))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc options: transparent huge pages for its arenas (the master's metadata is a large,
/// randomly accessed heap).
#[cfg(not(madsim))]
#[allow(non_upper_case_globals)]
#[used]
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: &[u8; 31] = b"thp:always,metadata_thp:always\0";

const DEFAULT_MASTER: &str = "127.0.0.1:50051";

mod args;

use args::*;

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in log files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn usage_error(message: String) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, message)
}

async fn connect(args: &ClientArgs) -> Result<Client, Error> {
    let (master, rpc_timeout) = args.master_and_timeout()?;
    let mut config = ClientConfig::new(master);
    config.rpc_timeout = rpc_timeout;
    config.token = args.auth.token()?;
    config.transport = args.transport;
    config.rdma_devices = mooring::transports::device_names(args.rdma_device.as_deref());
    Client::connect(config).await
}

/// Runs `work` with a client of the master `args` name, then says goodbye whether the work
/// succeeded or not: a CLI call is a client's whole life, and one that ends without a word
/// would be noticed only when it expires (one log line on the master per call).
async fn with_client<T>(
    args: &ClientArgs,
    work: impl AsyncFnOnce(&Client) -> Result<T, Error>,
) -> Result<T, Error> {
    let client = connect(args).await?;
    let result = work(&client).await;
    if let Err(e) = client.close().await {
        tracing::debug!("closing the client: {e}");
    }
    result
}

async fn run_master(args: MasterArgs) -> Result<(), Error> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path).map_err(usage_error)?,
        None => FileConfig::default(),
    };
    let flags = MasterSection {
        listen: args.listen,
        lease_ttl: args.lease_ttl,
        soft_pin_ttl: args.soft_pin_ttl,
        allow_evict_soft_pinned: args.no_evict_soft_pinned.then_some(false),
        eviction_high_watermark: args.high_watermark,
        eviction_ratio: args.eviction_ratio,
        put_start_discard_timeout: args.discard_timeout,
        put_start_release_timeout: args.release_timeout,
        client_ttl: args.client_ttl,
        seed: args.seed,
        state_dir: args.state_dir,
        snapshot_after: args.snapshot_after,
        offload_write_through: args.offload_write_through.then_some(true),
        offload_ahead_watermark: args.offload_ahead,
    };
    let settings = file.master.overlay(flags);
    let config = settings.master_config().map_err(usage_error)?;
    let default_listen = match args.serve.auth.token()? {
        Some(_) => "0.0.0.0:50051",
        None => "127.0.0.1:50051",
    };
    let listen = settings.listen.unwrap_or_else(|| default_listen.into());
    let token = args.serve.token_for(&listen)?;
    if let Some(etcd) = &args.etcd {
        let snapshot_after = match &settings.snapshot_after {
            Some(size) => parse_size(size).map_err(usage_error)?,
            None => mooring::journal::SNAPSHOT_AFTER,
        };
        let group = GroupArgs {
            etcd,
            advertise: args.advertise.as_deref(),
            cluster: args.cluster.as_deref(),
            leader_ttl: args.leader_ttl.as_deref(),
            state_dir: settings
                .state_dir
                .clone()
                .expect("clap requires --state-dir"),
            snapshot_after,
            metrics: args.metrics.resolve()?,
        };
        return run_master_group(group, &listen, config, token).await;
    }
    let service = match &settings.state_dir {
        Some(dir) => {
            let snapshot_after = match &settings.snapshot_after {
                Some(size) => parse_size(size).map_err(usage_error)?,
                None => mooring::journal::SNAPSHOT_AFTER,
            };
            MasterService::persistent(dir, config, snapshot_after)?
        }
        None => MasterService::new(config)?,
    };
    let mut master = RunningMaster::serve(&listen, service, token).await?;
    if let Some((listen, bearer)) = args.metrics.resolve()? {
        // Its bound address is logged: stdout's one line is the master's address, which
        // scripts read (and it is printed once everything serves).
        master.serve_metrics(&listen, bearer).await?;
    }
    out!("mooring master listening on {}", master.addr);
    let _ = std::io::stdout().flush();
    wait_for_shutdown().await;
    drop(master);
    Ok(())
}

/// The flags of a master in a group.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
struct GroupArgs<'a> {
    etcd: &'a str,
    advertise: Option<&'a str>,
    cluster: Option<&'a str>,
    leader_ttl: Option<&'a str>,
    state_dir: std::path::PathBuf,
    snapshot_after: u64,
    /// Where to serve metrics (`--metrics-listen`), and the bearer token they need.
    metrics: Option<(String, Option<String>)>,
}

/// `mooring master --etcd`: serves as one of a group of masters (see `mooring::ha`).
#[cfg(feature = "etcd")]
async fn run_master_group(
    group: GroupArgs<'_>,
    listen: &str,
    config: mooring_core::MasterConfig,
    token: Option<mooring_proto::auth::ClusterToken>,
) -> Result<(), Error> {
    use mooring::config::parse_duration;
    use mooring::ha::etcd::GroupConfig;
    let endpoints = mooring::ha::etcd_endpoints(group.etcd).map_err(usage_error)?;
    let advertise = match group.advertise {
        Some(advertise) => advertise.to_string(),
        None => mooring::ha::advertised(listen).map_err(usage_error)?,
    };
    let lease_ttl = match group.leader_ttl {
        Some(text) => parse_duration(text).map_err(usage_error)?,
        None => Duration::from_secs(2),
    };
    if lease_ttl < Duration::from_secs(2) || lease_ttl.subsec_nanos() != 0 {
        return Err(usage_error(format!(
            "--leader-ttl {lease_ttl:?}: give whole seconds, at least 2 (etcd's shortest lease)"
        )));
    }
    let handler = Arc::new(mooring::ha::RoleHandler::default());
    let serving = mooring::ha::serve(listen, handler.clone(), token.clone()).await?;
    let addr = serving.addr;
    let _metrics = match group.metrics {
        Some((listen, bearer)) => {
            let pages = mooring::ha::metrics_pages(handler.clone(), serving.limits.clone());
            Some(
                mooring::http::serve(&listen, pages, bearer, mooring::metrics::PUBLIC_PATHS)
                    .await?,
            )
        }
        None => None,
    };
    let config = GroupConfig {
        endpoints,
        cluster: group.cluster.unwrap_or("default").to_string(),
        advertise,
        lease_ttl,
        lease_margin: GroupConfig::margin_for(lease_ttl),
        standby_timeout: Duration::from_secs(1),
        state_dir: group.state_dir,
        master: config,
        snapshot_after: group.snapshot_after,
        token,
        on_lead: None,
    };
    // The address stays the line's last word: scripts read it.
    out!(
        "mooring master in group {:?} listening on {addr}",
        config.cluster
    );
    let _ = std::io::stdout().flush();
    tokio::select! {
        failed = mooring::ha::etcd::run(config, handler) => failed,
        () = wait_for_shutdown() => Ok(()),
    }
}

#[cfg(not(feature = "etcd"))]
async fn run_master_group(
    _group: GroupArgs<'_>,
    _listen: &str,
    _config: mooring_core::MasterConfig,
    _token: Option<mooring_proto::auth::ClusterToken>,
) -> Result<(), Error> {
    Err(Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
        "this build of mooring has no etcd support: build it with `cargo build --release -p \
         mooring --features etcd` (needs Debian's protobuf-compiler) to run masters in a group",
    ))
}

async fn run_node(args: NodeArgs) -> Result<(), Error> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path).map_err(usage_error)?,
        None => FileConfig::default(),
    };
    let f = file.node;
    let master = args
        .master
        .or(f.master)
        .unwrap_or_else(|| DEFAULT_MASTER.into());
    let size =
        parse_size(&args.size.or(f.size).unwrap_or_else(|| "1GiB".into())).map_err(usage_error)?;
    let token_given = args.serve.auth.token()?.is_some();
    // Before anything is mapped or mounted: a bad flag fails here, with what to change.
    let served = mooring::transports::parse_served(
        args.transports
            .or(f.transports)
            .as_deref()
            .unwrap_or(mooring::transports::DEFAULT_SERVED),
    )?;
    let segment = SegmentConfig {
        node: mooring::NodeConfig {
            name: args.name.or(f.name),
            size,
            prefault: !args.no_prefault && f.prefault.unwrap_or(true),
            shared: served.contains(&mooring::transports::Transport::Shm),
            disk: match args.disk_dir.or(f.disk_dir) {
                Some(dir) => {
                    let mut disk = DiskTierConfig::new(dir);
                    if let Some(capacity) = args.disk_capacity.or(f.disk_capacity) {
                        disk.capacity = parse_size(&capacity).map_err(usage_error)?;
                    }
                    if let Some(backend) = args.disk_backend.or(f.disk_backend) {
                        disk.backend = backend;
                    }
                    if let Some(eviction) = args.disk_eviction.or(f.disk_eviction) {
                        disk.eviction = eviction;
                    }
                    if let Some(io) = args.disk_io.or(f.disk_io) {
                        disk.io = io;
                    }
                    disk.direct = args.disk_direct || f.disk_direct.unwrap_or(false);
                    Some(disk)
                }
                None => None,
            },
        },
        listen: args.listen.or(f.listen).unwrap_or_else(|| {
            match token_given {
                true => "0.0.0.0:0",
                false => "127.0.0.1:0",
            }
            .into()
        }),
        advertise: args.advertise.or(f.advertise),
        rdma_devices: served
            .contains(&mooring::transports::Transport::Rdma)
            .then(|| {
                mooring::transports::device_names(args.rdma_device.or(f.rdma_device).as_deref())
            }),
    };
    let token = args.serve.token_for(&segment.listen)?;
    mooring::preflight::check_segment_size(size)?;
    if let Some(disk) = &segment.node.disk {
        mooring::preflight::check_disk_dir(&disk.dir, disk.capacity)?;
    }
    let metrics = args.metrics.resolve()?;
    let local = Arc::new(LocalSegments::default());
    let mut node =
        StandaloneNode::start(&master, None, &segment, local.clone(), token.clone()).await?;
    // Replicas other nodes lost are copied back by the surviving nodes, in the background,
    // through a client of their own (copies to this node's segment are a memcpy).
    let repairs = match args.repair_rate {
        0 => None,
        rate => {
            let mut config = ClientConfig::new(master.clone());
            config.token = token;
            let repairer = Client::connect_with(config, local).await?;
            let task = repairer.spawn_repairs(rate);
            Some((repairer, task))
        }
    };
    if let Some((listen, bearer)) = metrics {
        node.serve_metrics(&listen, bearer).await?;
    }
    out!(
        "mooring node {} serving {size} bytes (master {master})",
        node.node().name()
    );
    let _ = std::io::stdout().flush();
    wait_for_shutdown().await;
    if let Some((repairer, task)) = repairs {
        task.abort();
        let _ = repairer.close().await;
    }
    node.shutdown().await
}

async fn wait_for_shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

async fn run_put(args: PutArgs) -> Result<(), Error> {
    let value = match (&args.value, &args.file) {
        (Some(v), _) => v.clone().into_bytes(),
        (None, Some(path)) if path.as_os_str() == "-" => read_stdin()?,
        (None, Some(path)) => std::fs::read(path).map_err(|e| {
            Error::new(
                ErrorCode::FILE_READ_FAIL,
                format!("{}: {e}", path.display()),
            )
        })?,
        (None, None) => read_stdin()?,
    };
    let mut config = ReplicateConfig::replicas(args.replicas);
    config.with_hard_pin = args.hard_pin;
    if args.soft_pin {
        config = config.soft_pinned(None);
    } else if args.soft_unpin {
        config = config.soft_unpinned();
    }
    with_client(&args.client, async |client| {
        if args.upsert {
            client.upsert(&args.key, &value, &config).await?;
        } else {
            client.put(&args.key, &value, &config).await?;
        }
        // Replicas go to distinct segments: with fewer segments than asked, fewer are stored.
        let pattern = format!("^{}$", regex::escape(&args.key));
        let stored = client.query(&pattern).await?;
        let replicas = stored.first().map_or(0, |k| k.replicas);
        if replicas < args.replicas {
            out!(
                "stored {} ({} bytes) with {replicas} of the {} replicas asked: only {replicas} \
                 segments could take a copy",
                args.key,
                value.len(),
                args.replicas
            );
        } else {
            out!(
                "stored {} ({} bytes, {replicas} replicas)",
                args.key,
                value.len()
            );
        }
        Ok(())
    })
    .await
}

fn read_stdin() -> Result<Vec<u8>, Error> {
    let mut value = Vec::new();
    std::io::stdin()
        .read_to_end(&mut value)
        .map_err(|e| Error::new(ErrorCode::FILE_READ_FAIL, format!("stdin: {e}")))?;
    Ok(value)
}

async fn run_get(args: GetArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        let value = client.get(&args.key).await?;
        match &args.out {
            Some(path) => std::fs::write(path, &value).map_err(|e| {
                Error::new(
                    ErrorCode::FILE_WRITE_FAIL,
                    format!("{}: {e}", path.display()),
                )
            })?,
            None => {
                let mut stdout = std::io::stdout();
                if let Err(e) = stdout.write_all(&value).and_then(|()| stdout.flush()) {
                    output_failed(e);
                }
            }
        }
        Ok(())
    })
    .await
}

async fn run_cp(args: CpArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        let targets: Vec<&str> = args.segments.iter().map(String::as_str).collect();
        client.copy(&args.key, &targets).await?;
        out!("copied {} to {}", args.key, args.segments.join(", "));
        Ok(())
    })
    .await
}

async fn run_mv(args: MvArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        client.move_replica(&args.key, &args.from, &args.to).await?;
        out!("moved {} from {} to {}", args.key, args.from, args.to);
        Ok(())
    })
    .await
}

async fn run_rm(args: RmArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        if let Some(key) = &args.key {
            client.remove(key).await?;
            out!("removed {key}");
        } else if let Some(regex) = &args.regex {
            out!("removed {} objects", client.remove_by_regex(regex).await?);
        } else {
            out!("removed {} objects", client.remove_all().await?);
        }
        Ok(())
    })
    .await
}

async fn run_ls(args: LsArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        let keys = client.query(&args.regex).await?;
        for k in &keys {
            let disk = if k.on_disk { " +disk" } else { "" };
            out!("{:>12}  {}x{disk}  {}", k.size, k.replicas, k.key);
        }
        out!("{} keys", keys.len());
        Ok(())
    })
    .await
}

async fn run_stat(args: StatArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        let report = client.report().await?;
        let segments = client.segments().await?;
        if args.json {
            out!("{}", mooring::metrics::stats_json(&report, &segments));
            return Ok(());
        }
        let (s, c) = (&report.stats, &report.census);
        let pct = if s.capacity == 0 {
            0.0
        } else {
            100.0 * s.used as f64 / s.capacity as f64
        };
        out!("objects        {} ({} being written)", s.objects, s.writing);
        out!(
            "memory         {} of {} bytes used ({pct:.1}%)",
            s.used,
            s.capacity
        );
        out!(
            "by state       {} complete, {} hard-pinned, {} soft-pinned, {} leased, {} held, {} only on disk",
            c.complete,
            c.hard_pinned,
            c.soft_pinned,
            c.leased,
            c.held,
            c.disk_only
        );
        out!(
            "values         {} bytes in memory (every replica), {} bytes on disk",
            c.memory_bytes,
            c.disk_bytes
        );
        out!(
            "reads          {} from memory, {} from disk, {} misses",
            s.reads.memory,
            s.reads.disk,
            s.reads.misses
        );
        out!("segments       {}", s.segments);
        out!("clients        {}", s.clients);
        out!("held reads     {}", s.holds);
        out!("copy tasks     {}", s.tasks);
        out!(
            "evicted        {} objects, {} bytes ({} live on on disk)",
            s.evicted_objects,
            s.evicted_bytes,
            s.evicted_to_disk
        );
        out!(
            "discarded      {} unfinished writes ({} blocks awaiting release)",
            s.discarded_writes,
            s.discarded_blocks
        );
        out!(
            "lost           {} objects (their last node went away)",
            s.lost_objects
        );
        out!(
            "upserts        {} new keys, {} in place, {} copied beside readers, {} resized",
            s.upserts.created,
            s.upserts.in_place,
            s.upserts.copied,
            s.upserts.resized
        );
        out!(
            "disk           {} objects with a disk copy, {} copies recorded, {} awaiting deletion",
            s.disk_replicas,
            s.disk_copies_recorded,
            s.disk_tombstones
        );
        out!(
            "prefetches     {} started, {} found no memory",
            s.prefetches,
            s.prefetch_failures
        );
        out!(
            "repairs        {} objects waiting for replicas lost with a segment",
            s.repairs_waiting
        );
        if s.events_dropped > 0 {
            out!(
                "events dropped {} (the master fell behind logging them)",
                s.events_dropped
            );
        }
        for seg in segments {
            out!(
                "  {:<24} {:>14} / {:<14} {}",
                seg.name,
                seg.used,
                seg.size,
                seg.endpoint
            );
        }
        Ok(())
    })
    .await
}

async fn run_bench(args: BenchArgs) -> Result<(), Error> {
    let sizes = args
        .sizes
        .iter()
        .map(|s| parse_size(s))
        .collect::<Result<Vec<u64>, String>>()
        .map_err(usage_error)?;
    let master = match (args.master, args.embedded.as_deref()) {
        (Some(addr), _) => MasterPlacement::Remote(addr),
        (None, None | Some("process")) => MasterPlacement::Process,
        (None, Some("writer")) => MasterPlacement::InWriter,
        (None, Some(other)) => {
            return Err(usage_error(format!(
                "--embedded takes `process` or `writer`, not {other:?}"
            )));
        }
    };
    let config = BenchConfig {
        master,
        sizes,
        count: args.count,
        batch: args.batch,
        progress: !args.json,
        transport: args.transport,
        readers: args.readers,
    };
    let report = bench::run(
        &config,
        std::env::current_exe().map_err(|e| {
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("cannot find this executable: {e}"),
            )
        })?,
    )
    .await?;
    if args.json {
        out!("{}", report.to_json());
    } else {
        out!("{}", report.to_table().trim_end());
    }
    Ok(())
}

async fn run_debug(args: DebugArgs) -> Result<(), Error> {
    match args.action {
        DebugAction::HangPut { master, key, size } => {
            let client = random_client_id();
            let control = mooring::connect::control_plane(
                &master,
                Duration::from_secs(10),
                mooring::token::resolve(None)?,
                client,
            )?;
            let control: &dyn mooring_proto::transport::ControlPlane = &*control;
            let reply = control
                .call(mooring_proto::wire::PutStart {
                    client,
                    key: key.clone(),
                    size,
                    config: ReplicateConfig::single(),
                    upsert: false,
                })
                .await?;
            out!("started put of {key}: {reply:?}");
            let _ = std::io::stdout().flush();
            std::future::pending::<()>().await;
            Ok(())
        }
    }
}

/// Ends the process after stdout failed: quietly (success) if the reader went away, with an
/// error otherwise.
fn output_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: cannot write the output: {e}");
    std::process::exit(1);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Services log their life; commands print their result and only warn; the demo prints a
    // report and keeps the log to errors.
    init_logging(match cli.command {
        Command::Master(_) | Command::Node(_) => "info",
        Command::Demo => "error",
        _ => "warn",
    });
    // Runtime threads: MOORING_WORKER_THREADS if set (0 = a single thread). Otherwise nodes
    // use one per core (parallel transfers for many clients); the master serialises on one
    // lock anyway and clients make one call at a time, so they use a single thread, which
    // also avoids cross-thread wake-ups on every request.
    let threads = std::env::var("MOORING_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(match cli.command {
            Command::Node(_) => std::thread::available_parallelism().map_or(2, |n| n.get()),
            _ => 0,
        });
    let built = match threads {
        0 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    let runtime = match built {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Master(args) => run_master(args).await,
            Command::Node(args) => run_node(args).await,
            Command::Put(args) => run_put(args).await,
            Command::Get(args) => run_get(args).await,
            Command::Rm(args) => run_rm(args).await,
            Command::Ls(args) => run_ls(args).await,
            Command::Cp(args) => run_cp(args).await,
            Command::Mv(args) => run_mv(args).await,
            Command::Stat(args) => run_stat(args).await,
            Command::Bench(args) => run_bench(args).await,
            Command::Token(TokenCommand::New { file }) => {
                mooring::token::write_new(&file)?;
                out!(
                    "wrote a new cluster token to {} (mode 0600); give it to every member: \
                     --token-file {0} or MOORING_TOKEN_FILE={0}",
                    file.display()
                );
                Ok(())
            }
            Command::BenchWriter(args) => {
                bench::run_writer(
                    &args.master,
                    &args.sizes,
                    args.count,
                    &args.run,
                    args.transport,
                )
                .await
            }
            Command::BenchReader(args) => {
                bench::run_reader(
                    &args.master,
                    &args.run,
                    args.size,
                    args.count,
                    args.first,
                    args.transport,
                )
                .await
            }
            Command::Demo => demo::run(&demo::DemoConfig::default(), &mut std::io::stdout()).await,
            Command::Debug(args) => run_debug(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
