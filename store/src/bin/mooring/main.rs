//! The `mooring` command: run a master or a storage node, use the store from the shell,
//! benchmark it, or watch a demo.

#![allow(clippy::print_stdout)] // this is the CLI; stdout is its output

use std::process::ExitCode;

use clap::Parser;
use mooring::ops::{bench, demo, peer_demo};
use mooring_core::{Error, ErrorCode};

/// Prints a line of the CLI's output. A closed stdout (`mooring stat | head -1`) ends the
/// process quietly, as for any Unix filter, instead of a panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::output_failed(e);
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
mod benchmark;
mod debug;
mod events;
mod master;
mod node;
mod peer;
mod shell;
mod stat;

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
        Command::Master(_) | Command::Node(_) | Command::Peer(_) => "info",
        Command::Demo(_) => "error",
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
            Command::Node(_) | Command::Peer(_) => {
                std::thread::available_parallelism().map_or(2, |n| n.get())
            }
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
            Command::Master(args) => master::run_master(args).await,
            Command::Node(args) => node::run_node(args).await,
            Command::Peer(args) => peer::run_peer(args).await,
            Command::Put(args) => shell::run_put(args).await,
            Command::Get(args) => shell::run_get(args).await,
            Command::Rm(args) => shell::run_rm(args).await,
            Command::Ls(args) => shell::run_ls(args).await,
            Command::Cp(args) => shell::run_cp(args).await,
            Command::Mv(args) => shell::run_mv(args).await,
            Command::Stat(args) => stat::run_stat(args).await,
            Command::Events(args) => events::run_events(args).await,
            Command::Bench(args) => benchmark::run_bench(args).await,
            Command::Token(TokenCommand::New { file }) => {
                mooring::token::write_new(&file)?;
                out!(
                    "wrote a new cluster token to {} (mode 0600); give it to every member: \
                     --token-file {0} or MOORING_TOKEN_FILE={0}",
                    file.display()
                );
                Ok(())
            }
            Command::Token(TokenCommand::Issue {
                token_file,
                name,
                role,
                tenant,
                expires,
                file,
            }) => {
                let roles = mooring_proto::auth::Roles::parse(&role).map_err(usage_error)?;
                let valid_for = expires
                    .as_deref()
                    .map(mooring::config::parse_duration)
                    .transpose()
                    .map_err(usage_error)?
                    .map(|d| d.as_secs());
                let claims =
                    mooring::token::issue(&token_file, &name, &tenant, roles, valid_for, &file)?;
                out!(
                    "wrote a credential for {}/{} (roles {}, serial {:016x}{}) to {} (mode 0600); \
                     give it to that member only, as its --token-file",
                    claims.tenant,
                    claims.name,
                    claims.roles,
                    claims.serial,
                    match claims.expires {
                        0 => String::new(),
                        at => format!(", expires at unix time {at}"),
                    },
                    file.display()
                );
                Ok(())
            }
            Command::Token(TokenCommand::Show { file }) => {
                let held = mooring::token::load(&file)?;
                match held.claims() {
                    None => out!(
                        "{}: the cluster token (every role; for masters and standbys)",
                        file.display()
                    ),
                    Some(claims) => out!(
                        "{}: member {}/{}, roles {}, serial {:016x}, {}",
                        file.display(),
                        claims.tenant,
                        claims.name,
                        claims.roles,
                        claims.serial,
                        match claims.expires {
                            0 => "never expires".to_string(),
                            at => format!("expires at unix time {at}"),
                        }
                    ),
                }
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
                let job = bench::HelperJob {
                    master: args.master,
                    run: args.run,
                    size: args.size,
                    count: args.count,
                    objects: args.objects,
                    first: args.first,
                    op: args.op,
                };
                bench::run_reader(job, args.transport).await
            }
            Command::Demo(args) if args.peer => {
                peer_demo::run(
                    &peer_demo::PeerDemoConfig::default(),
                    &mut std::io::stdout(),
                )
                .await
            }
            Command::Demo(_) => {
                demo::run(&demo::DemoConfig::default(), &mut std::io::stdout()).await
            }
            Command::Debug(args) => debug::run_debug(args).await,
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
