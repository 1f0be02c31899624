//! `mooring-sim`: runs seeded whole-cluster simulations (a `--cfg madsim` build; use
//! `scripts/sim.sh`, which builds it in its own target directory).

#[cfg(not(madsim))]
fn main() {
    eprintln!(
        "mooring-sim runs only in a simulation build: use scripts/sim.sh (it builds with \
         RUSTFLAGS=\"--cfg madsim\" in its own target directory)"
    );
    std::process::exit(2);
}

#[cfg(madsim)]
fn main() {
    std::process::exit(sim::main());
}

#[cfg(madsim)]
mod sim {
    #![allow(clippy::print_stdout)] // this is the CLI's own output

    use std::time::Instant;

    use clap::{Parser, Subcommand, ValueEnum};
    use mooring_sim_tests::coverage::{FLOOR_MIN_SEEDS, Totals};
    use mooring_sim_tests::peers::{PeerPlan, PeerReport};
    use mooring_sim_tests::plan::{Plan, Shape, Transport};
    use mooring_sim_tests::runner::{check_determinism, run_isolated, run_many};

    /// Seeded simulations of a Mooring cluster under faults. Every run prints its seed and
    /// fault plan when it fails; the same seed replays the same run exactly.
    #[derive(Parser)]
    #[command(name = "mooring-sim", version)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Clone, Copy, ValueEnum)]
    enum TransportArg {
        /// transport-tcp on madsim's simulated TCP.
        Tcp,
        /// transport-sim datagrams with message faults.
        Sim,
        /// RDMA over the software HCA (with its faults), the rest as `sim`.
        Rdma,
        /// As `sim`, with clients reaching nodes on their own host through shared memory.
        Shm,
    }

    #[derive(clap::Args, Clone)]
    struct ShapeArgs {
        /// Force one transport (default: even seeds TCP, odd seeds sim).
        #[arg(long, value_enum)]
        transport: Option<TransportArg>,
        /// Operations per run, over all clients.
        #[arg(long, default_value_t = 2000)]
        ops: usize,
        /// Run without faults (the happy path).
        #[arg(long)]
        no_faults: bool,
    }

    impl ShapeArgs {
        fn plan(&self, seed: u64) -> Plan {
            let transport = self.transport.map(|t| match t {
                TransportArg::Tcp => Transport::Tcp,
                TransportArg::Sim => Transport::Sim,
                TransportArg::Rdma => Transport::Rdma,
                TransportArg::Shm => Transport::Shm,
            });
            let shape = Shape {
                ops: self.ops,
                faults: !self.no_faults,
                ..Shape::default()
            };
            Plan::generate(seed, transport, shape)
        }
    }

    /// Which seeds a command runs, and how: shared by `run` and `peer`.
    #[derive(clap::Args)]
    struct SeedArgs {
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Run the seeds listed in this file instead (one per line, `#` comments): the
        /// regression list.
        #[arg(long, value_name = "FILE")]
        list: Option<std::path::PathBuf>,
        /// Runs at a time (default: the number of CPUs).
        #[arg(long)]
        jobs: Option<usize>,
        /// Print every run's report, not just failures.
        #[arg(long)]
        verbose: bool,
    }

    impl SeedArgs {
        /// The seeds: MADSIM_TEST_SEED alone if set, else the list's, else `count` from
        /// `from`. `Err` is the exit code for a list that cannot be read (said on stderr).
        fn seeds(&self, count: u64) -> Result<Vec<u64>, i32> {
            match (env_seed(), &self.list) {
                (Some(seed), _) => Ok(vec![seed]),
                (None, Some(path)) => read_seed_list(path).map_err(|e| {
                    eprintln!("cannot read the seed list {}: {e}", path.display());
                    2
                }),
                (None, None) => Ok((self.from..self.from + count).collect()),
            }
        }

        /// Runs at a time.
        fn jobs(&self) -> usize {
            self.jobs
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        }
    }

    #[derive(Subcommand)]
    enum Command {
        /// Run many seeds and report failures. MADSIM_TEST_SEED, if set, runs only that seed;
        /// MADSIM_TEST_CHECK_DETERMINISM, if set, runs each seed twice and compares the runs.
        Run {
            /// How many seeds.
            #[arg(long, default_value_t = 200)]
            seeds: u64,
            #[command(flatten)]
            which: SeedArgs,
            #[command(flatten)]
            shape: ShapeArgs,
        },
        /// Replay one seed with logs (RUST_LOG, default info) and print its report.
        Replay {
            /// The seed (default: MADSIM_TEST_SEED).
            seed: Option<u64>,
            #[command(flatten)]
            shape: ShapeArgs,
        },
        /// Peer mode's worlds: a cluster with no master, under kills, goodbyes, joins,
        /// restarts, partitions and failing disks; every read judged, every key swept at the
        /// end. MADSIM_TEST_SEED, if
        /// set, runs only that seed (with logs: RUST_LOG).
        Peer {
            /// How many seeds.
            #[arg(long, default_value_t = 40)]
            seeds: u64,
            #[command(flatten)]
            which: SeedArgs,
            /// Peers at the start [default: 3 to 6, drawn from the seed].
            #[arg(long)]
            peers: Option<usize>,
            /// Operations per client (three clients).
            #[arg(long, default_value_t = 200)]
            ops: usize,
            /// Run without faults (the happy path).
            #[arg(long)]
            no_faults: bool,
            /// Fail unless each of kills, goodbyes, joins, ring changes, stale entries,
            /// promotes from disk, failing disks and strict reads was reached by at least 20%
            /// of the seeds.
            #[arg(long)]
            floors: bool,
            /// Run each seed twice and check both runs are identical.
            #[arg(long)]
            determinism: bool,
        },
        /// Run seeds twice each and check both runs are identical.
        Determinism {
            /// How many seeds.
            #[arg(long, default_value_t = 4)]
            seeds: u64,
            /// The first seed.
            #[arg(long, default_value_t = 0)]
            from: u64,
            #[command(flatten)]
            shape: ShapeArgs,
        },
    }

    fn env_seed() -> Option<u64> {
        std::env::var("MADSIM_TEST_SEED").ok()?.parse().ok()
    }

    pub fn main() -> i32 {
        let cli = Cli::parse();
        match cli.command {
            Command::Run {
                seeds,
                which,
                shape,
            } => {
                let seeds = match which.seeds(seeds) {
                    Ok(seeds) => seeds,
                    Err(code) => return code,
                };
                if std::env::var_os("MADSIM_TEST_CHECK_DETERMINISM").is_some() {
                    return determinism(&seeds, &shape);
                }
                let (jobs, verbose) = (which.jobs(), which.verbose);
                let plans: Vec<Plan> = seeds.iter().map(|&s| shape.plan(s)).collect();
                let started = Instant::now();
                let mut failed = Vec::new();
                let mut totals = Totals::default();
                let mut done = 0;
                let total = plans.len();
                run_many(plans, jobs, |report| {
                    done += 1;
                    totals.add_with_disk(
                        &report.coverage,
                        report.plan.transport,
                        report.plan.disk.as_ref().map(|d| d.backend),
                    );
                    if !report.passed() {
                        failed.push(report.plan.seed);
                        println!("{report}");
                    } else if verbose {
                        println!("{report}");
                    }
                    if done % 50 == 0 {
                        eprintln!("{done}/{total} seeds, {} failed", failed.len());
                    }
                });
                let elapsed = started.elapsed();
                println!(
                    "{total} seeds in {:.1}s ({:.0} seeds/min with {jobs} jobs): {} failed{}",
                    elapsed.as_secs_f64(),
                    total as f64 / elapsed.as_secs_f64() * 60.0,
                    failed.len(),
                    if failed.is_empty() {
                        String::new()
                    } else {
                        format!(" {failed:?}")
                    }
                );
                let short = totals.short_of_floors();
                if total >= FLOOR_MIN_SEEDS {
                    print!("{}", totals.table());
                    for path in &short {
                        println!("coverage floor missed: {path}");
                    }
                }
                i32::from(!failed.is_empty() || !short.is_empty())
            }
            Command::Replay { seed, shape } => {
                let Some(seed) = seed.or_else(env_seed) else {
                    eprintln!("give a seed, or set MADSIM_TEST_SEED");
                    return 2;
                };
                let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
                tracing_subscriber::fmt().with_env_filter(filter).init();
                let report = run_isolated(shape.plan(seed));
                println!("{report}");
                i32::from(!report.passed())
            }
            Command::Determinism { seeds, from, shape } => {
                let seeds: Vec<u64> = (from..from + seeds).collect();
                determinism(&seeds, &shape)
            }
            Command::Peer {
                seeds,
                which,
                peers,
                ops,
                no_faults,
                floors,
                determinism,
            } => {
                if env_seed().is_some() {
                    // One seed, with logs.
                    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
                    tracing_subscriber::fmt().with_env_filter(filter).init();
                }
                let seeds = match which.seeds(seeds) {
                    Ok(seeds) => seeds,
                    Err(code) => return code,
                };
                let plans: Vec<PeerPlan> = seeds
                    .iter()
                    .map(|&seed| PeerPlan::generate(seed, peers, ops, !no_faults))
                    .collect();
                peer_worlds(plans, which.jobs(), which.verbose, floors, determinism)
            }
        }
    }

    /// Runs peer worlds, `jobs` at a time, each on a fresh thread; prints failures and a
    /// coverage line. With `floors`, fails when a path was reached by under 20% of seeds;
    /// with `determinism`, runs each twice and fails on any difference.
    fn peer_worlds(
        plans: Vec<PeerPlan>,
        jobs: usize,
        verbose: bool,
        floors: bool,
        determinism: bool,
    ) -> i32 {
        let started = Instant::now();
        let total = plans.len();
        let queue = std::sync::Mutex::new(plans);
        let reports = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..jobs.max(1).min(total.max(1)) {
                scope.spawn(|| {
                    loop {
                        let Some(plan) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop()
                        else {
                            return;
                        };
                        let runs = if determinism { 2 } else { 1 };
                        let mut results: Vec<PeerReport> = (0..runs)
                            .map(|_| isolated_peer_world(plan.clone()))
                            .collect();
                        let mut report = results.remove(0);
                        if let Some(again) = results.first()
                            && (again.fingerprint != report.fingerprint || again.ops != report.ops)
                        {
                            report.violations.push(format!(
                                "not deterministic: fingerprints {:#x} and {:#x}",
                                report.fingerprint, again.fingerprint
                            ));
                        }
                        reports
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(report);
                    }
                });
            }
        });
        let mut reports = reports.into_inner().unwrap_or_else(|e| e.into_inner());
        reports.sort_by_key(|r| r.seed);
        let mut failed = Vec::new();
        for report in &reports {
            if !report.passed() || verbose {
                println!(
                    "peer seed {}: {} peers, {} ops, {} strict reads, {} keys swept, kills {}, \
                     goodbyes {}, joins {}, restarts {}, partitions {}, failing disks {}, \
                     ring changes {}, stale entries {}, re-publish rounds {}, promotes {}",
                    report.seed,
                    report.peers,
                    report.ops,
                    report.strict_reads,
                    report.swept,
                    report.kills,
                    report.leaves,
                    report.joins,
                    report.restarts,
                    report.partitions,
                    report.disk_errors,
                    report.ring_changes,
                    report.stale,
                    report.republishes,
                    report.promotes
                );
            }
            if !report.passed() {
                failed.push(report.seed);
                for violation in report.violations.iter().take(10) {
                    println!("  violation: {violation}");
                }
            }
        }
        let share = |reached: &dyn Fn(&PeerReport) -> bool| {
            reports.iter().filter(|r| reached(r)).count() as f64 / total.max(1) as f64
        };
        let reached: [(&str, f64); 8] = [
            ("a kill or restart", share(&|r| r.kills + r.restarts > 0)),
            ("a goodbye", share(&|r| r.leaves > 0)),
            ("a join", share(&|r| r.joins > 0)),
            (
                "a ring change after forming",
                share(&|r| r.ring_changes > 0),
            ),
            ("a stale entry skipped", share(&|r| r.stale > 0)),
            ("a promote from disk", share(&|r| r.promotes > 0)),
            ("a failing disk", share(&|r| r.disk_errors > 0)),
            ("strict reads", share(&|r| r.strict_reads > 0)),
        ];
        let elapsed = started.elapsed();
        println!(
            "{total} peer worlds in {:.1}s: {} failed{}",
            elapsed.as_secs_f64(),
            failed.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(" {failed:?}")
            }
        );
        let mut short = Vec::new();
        for (path, share) in reached {
            println!("  {path}: {:.0}% of seeds", share * 100.0);
            if floors && share < 0.2 {
                short.push(path);
            }
        }
        for path in &short {
            println!("coverage floor missed: {path} (under 20% of seeds)");
        }
        i32::from(!failed.is_empty() || !short.is_empty())
    }

    /// One peer world on a fresh thread (the simulator seeds per-thread state); a panic is a
    /// failed report.
    fn isolated_peer_world(plan: PeerPlan) -> PeerReport {
        let (seed, peers) = (plan.seed, plan.peers);
        let thread = std::thread::Builder::new()
            .name(format!("peer-sim-{seed}"))
            .stack_size(16 << 20)
            .spawn(move || mooring_sim_tests::peers::run(plan))
            .expect("spawn a simulation thread");
        thread.join().unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a non-text panic");
            PeerReport {
                seed,
                peers,
                violations: vec![format!("panicked: {message}")],
                ..PeerReport::default()
            }
        })
    }

    /// Runs each seed twice; fails if any pair of runs differs.
    fn determinism(seeds: &[u64], shape: &ShapeArgs) -> i32 {
        if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
            tracing_subscriber::fmt().with_env_filter(filter).init();
        }
        let mut bad = 0;
        for &seed in seeds {
            let plan = shape.plan(seed);
            match check_determinism(&plan) {
                Ok(()) => println!("seed {seed}: deterministic"),
                Err(e) => {
                    bad += 1;
                    println!("{e}");
                }
            }
        }
        i32::from(bad > 0)
    }

    /// Seeds from a list file: the first word of each line, `#` starts a comment.
    fn read_seed_list(path: &std::path::Path) -> std::io::Result<Vec<u64>> {
        let text = std::fs::read_to_string(path)?;
        let mut seeds = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let Some(word) = line
                .split('#')
                .next()
                .and_then(|l| l.split_whitespace().next())
            else {
                continue;
            };
            let seed = word.parse().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("line {}: {word:?} is not a seed: {e}", n + 1),
                )
            })?;
            seeds.push(seed);
        }
        Ok(seeds)
    }
}
