//! The command line: every subcommand and flag, with the help text `--help` shows.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use mooring::node::disk_tier::{DiskBackend, DiskEviction, DiskIo};
use mooring_core::Error;
use mooring_proto::auth::Credential;

use super::{DEFAULT_MASTER, usage_error};

#[derive(Parser)]
#[command(
    name = "mooring",
    version,
    about = "Mooring: a distributed KV-cache store for LLM inference",
    long_about = "Mooring pools memory contributed by storage nodes into one store for KV-cache \
blocks and model weights. A master allocates space and grants leases; clients move bytes \
straight to and from the nodes.\n\nStart a master, start nodes pointing at it, then put and \
get from anywhere. `mooring demo` runs a whole cluster in one process.\n\nLogs go to stderr; \
set RUST_LOG (e.g. RUST_LOG=mooring=debug) to see more.\n\nDurations (flags, config file, \
environment) take a unit: us, ms, s, m or h (500ms, 5s, 10m); a bare 0 means zero.\n\nTuning \
(environment): \
MOORING_WORKER_THREADS (runtime threads; 0 = one), MOORING_CLIENT_SPIN and MOORING_SERVER_SPIN \
(how long sockets busy-poll before parking, e.g. 50us; 0 = never), MOORING_STRIPES \
(connections per large transfer)."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the master (metadata service).
    Master(MasterArgs),
    /// Run a storage node contributing memory to the pool.
    Node(NodeArgs),
    /// Run a peer of a cluster with no master (peer mode): it contributes memory, hosts a
    /// shard of the directory, and finds the other peers from a few seed addresses.
    Peer(PeerArgs),
    /// Store a value (from a file, stdin, or --value).
    Put(PutArgs),
    /// Fetch a value (to stdout or --out).
    Get(GetArgs),
    /// Remove one key, every key matching a regex, or everything unused.
    Rm(RmArgs),
    /// List keys (optionally matching a regex) with their sizes and replica counts.
    Ls(LsArgs),
    /// Copy a key's value to more segments (extra replicas), read from one it has.
    Cp(CpArgs),
    /// Move a key's replica from one segment to another.
    Mv(MvArgs),
    /// Show cluster statistics and segments.
    Stat(StatArgs),
    /// Follow the master's KV events (values stored and removed), one JSON line each.
    Events(EventsArgs),
    /// Measure put/get/exist throughput and latency (writer and reader in separate processes).
    Bench(BenchArgs),
    /// Run an embedded cluster through a prefill/decode workload and report what happened.
    Demo(DemoArgs),
    /// The writer half of `mooring bench` (started by it).
    #[command(hide = true)]
    BenchWriter(BenchWriterArgs),
    /// A helper process of `mooring bench --readers N` or `--clients N` (started by it).
    #[command(hide = true)]
    BenchReader(BenchReaderArgs),
    /// Cluster tokens and member credentials: who may join the cluster, and as what.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Fault-injection helpers for tests.
    #[command(hide = true)]
    Debug(DebugArgs),
}

#[derive(Subcommand)]
pub(crate) enum TokenCommand {
    /// Write a fresh cluster token to FILE (readable by its owner only; never replaces a
    /// file). Give it to every master, node and client: --token-file FILE, or
    /// MOORING_TOKEN_FILE=FILE in their environment.
    New {
        /// Where to write the token.
        file: PathBuf,
    },
    /// Issue a member credential from the cluster token: the member proves its name, tenant
    /// and roles to the master with it, and cannot act as anyone else. Give masters and
    /// standbys the cluster token itself, and every other member its own credential (as its
    /// --token-file). Written readable by its owner only; never replaces a file.
    Issue {
        /// The cluster token file (`mooring token new`).
        #[arg(long, env = "MOORING_TOKEN_FILE", value_name = "FILE")]
        token_file: PathBuf,
        /// The member's name, unique in its tenant (letters, digits, '.', '_', '-').
        #[arg(long)]
        name: String,
        /// What it may do, comma-separated: node (mounts segments, serves data), client (puts,
        /// gets, removes), standby (follows the leader's log), admin (remove_all). A process
        /// that contributes memory and reads and writes, like `mooring.store` with a segment,
        /// needs node,client.
        #[arg(long, value_name = "ROLES")]
        role: String,
        /// The tenant it acts in.
        #[arg(long, default_value = "default")]
        tenant: String,
        /// How long it is valid (e.g. 30d, 12h); without it, until revoked.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
        /// Where to write the credential.
        file: PathBuf,
    },
    /// Show what a token file holds: the cluster token, or a credential's claims (never a key).
    Show {
        /// The token or credential file.
        file: PathBuf,
    },
}

/// How a process proves it belongs to the cluster.
#[derive(Args, Clone)]
pub(crate) struct AuthArgs {
    /// The cluster token file (`mooring token new FILE`), or this member's credential
    /// (`mooring token issue`). Without one, this process only meets peers without one.
    #[arg(long, env = "MOORING_TOKEN_FILE", value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,
}

impl AuthArgs {
    pub(crate) fn token(&self) -> Result<Option<Credential>, Error> {
        mooring::token::resolve(self.token_file.as_deref())
    }
}

/// Where a server listens, and whether it may go beyond loopback without a token.
#[derive(Args, Clone)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) auth: AuthArgs,
    /// Listen beyond loopback without a cluster token: anyone who reaches the port can read,
    /// change and remove everything. Only on a network you trust completely.
    #[arg(long)]
    pub(crate) insecure: bool,
}

impl ServeArgs {
    /// The token, after checking that `listen` is safe without one.
    pub(crate) fn token_for(&self, listen: &str) -> Result<Option<Credential>, Error> {
        let token = self.auth.token()?;
        if token.is_none() && !is_loopback(listen) {
            if !self.insecure {
                return Err(usage_error(format!(
                    "refusing to listen on {listen} without a cluster token: anyone who reaches \
                     it could read and change every value. Make a token (`mooring token new \
                     FILE`) and pass --token-file FILE (or MOORING_TOKEN_FILE) to every member, \
                     listen on 127.0.0.1, or pass --insecure on a network you trust"
                )));
            }
            tracing::warn!(
                %listen,
                "listening beyond loopback WITHOUT a cluster token (--insecure): anyone who \
                 reaches this port can read, change and remove everything"
            );
        }
        Ok(token)
    }
}

/// Whether every address `listen` names is a loopback address.
pub(crate) fn is_loopback(listen: &str) -> bool {
    use std::net::ToSocketAddrs;
    match listen.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

#[derive(Args)]
pub(crate) struct MasterArgs {
    /// TOML config file with a [master] section (flags override it).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Address to listen on [default: 0.0.0.0:50051 with a token, 127.0.0.1:50051 without].
    #[arg(long)]
    pub(crate) listen: Option<String>,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    /// How long a read protects an object from removal, eviction and overwrite [default: 5s].
    #[arg(long)]
    pub(crate) lease_ttl: Option<String>,
    /// Soft-pin TTL when a put does not give one [default: 30m].
    #[arg(long)]
    pub(crate) soft_pin_ttl: Option<String>,
    /// Never evict soft-pinned objects (by default they go when nothing else is left).
    #[arg(long)]
    pub(crate) no_evict_soft_pinned: bool,
    /// Usage fraction at which eviction starts [default: 0.95].
    #[arg(long)]
    pub(crate) high_watermark: Option<f64>,
    /// Fraction of capacity one eviction pass frees [default: 0.05].
    #[arg(long)]
    pub(crate) eviction_ratio: Option<f64>,
    /// An unfinished put may be taken over after this [default: 30s].
    #[arg(long)]
    pub(crate) discard_timeout: Option<String>,
    /// An abandoned put's space is reused after this [default: 10m].
    #[arg(long)]
    pub(crate) release_timeout: Option<String>,
    /// A silent member is taken for dead after this: its segments, and the writes it had not
    /// finished, are dropped. Heartbeats go every quarter of it [default: 3s].
    #[arg(long)]
    pub(crate) client_ttl: Option<String>,
    /// Seed for placement randomness.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Copy every completed write to its node's disk (nodes with --disk-dir), not only the
    /// objects eviction reaches: a burst of writes then cannot evict values before their
    /// copy, at the cost of disk writes for values that never leave memory.
    #[arg(long)]
    pub(crate) offload_write_through: bool,
    /// Segment usage fraction past which a node with a disk copies out its least recently
    /// used objects ahead of eviction, so eviction drops copies rather than values; above 1
    /// turns it off [default: 0.6].
    #[arg(long, value_name = "FRACTION")]
    pub(crate) offload_ahead: Option<f64>,
    /// The most one member (every process of one credential) may hold in unfinished puts, as
    /// a fraction of the pool; past it its puts are refused (-200, back off) until it finishes
    /// some, so one writer cannot keep the pool from the others [default: 0.75].
    #[arg(long, value_name = "FRACTION")]
    pub(crate) unfinished_put_share: Option<f64>,
    /// Limit one tenant: TENANT:objects=N,bytes=SIZE,unfinished=SIZE,disk=SIZE (any may be
    /// left out; bytes count each value once). Past a limit its puts are refused (-200); past
    /// `disk` its values are no longer copied to the nodes' disks (they stay in memory only).
    /// Repeat for each tenant; replaces the config file's list.
    #[arg(long, value_name = "TENANT:LIMITS")]
    pub(crate) tenant_quota: Vec<String>,
    /// Publish KV events for cache-aware routers: keep the latest N key changes (a value
    /// stored, a value removed) and serve them at /kv_events on the metrics address, behind
    /// its bearer token (so it needs --metrics-listen). Off by default: the feed names keys.
    #[arg(long, value_name = "N", requires = "metrics_listen")]
    pub(crate) kv_events: Option<usize>,
    /// Keep the master's state in DIR (created if missing): a journal of every change,
    /// synced before the change is acknowledged, and periodic snapshots. A master restarted
    /// with the same DIR knows every object it acknowledged; its nodes reconnect and their
    /// objects are readable again. Without it, a restarted master starts empty.
    #[arg(long, value_name = "DIR")]
    pub(crate) state_dir: Option<PathBuf>,
    /// Snapshot the state once the journal has grown this much (and by at least twice the last
    /// snapshot's size); each snapshot lets the older journal go. Larger values write fewer
    /// snapshots and make restarts replay more journal [default: 64MiB].
    #[arg(long, value_name = "SIZE", requires = "state_dir")]
    pub(crate) snapshot_after: Option<String>,
    /// Refuse the member credentials FILE names: lines `serial HEX` (one credential, as
    /// `mooring token show` prints it) or `name [TENANT/]NAME` (all of a member's). Re-read
    /// when it changes; a revoked member's open connections close at their next request.
    #[arg(long, value_name = "FILE")]
    pub(crate) revoked_file: Option<PathBuf>,
    /// Run as one of a group of masters elected through etcd at these client URLs (comma- or
    /// semicolon-separated; Mooncake's `etcd://host:port;host:port` works too). One leads; the
    /// others keep a synced copy of its state in their --state-dir (required) and take over
    /// within about --leader-ttl of its death. Give clients and nodes every master's address
    /// (--master A,B,C) or etcd's (--master etcd://HOST:PORT/CLUSTER; they need no etcd
    /// support of their own). Needs a build with `--features etcd`.
    #[arg(long, value_name = "URLS", requires = "state_dir")]
    pub(crate) etcd: Option<String>,
    /// The address the other masters, nodes and clients reach this one at
    /// [default: --listen, unless that is a wildcard address].
    #[arg(long, value_name = "HOST:PORT", requires = "etcd")]
    pub(crate) advertise: Option<String>,
    /// The group's name in etcd: masters of one cluster share it [default: default].
    #[arg(long, value_name = "NAME", requires = "etcd")]
    pub(crate) cluster: Option<String>,
    /// A silent leader loses its office after this; a standby then takes over
    /// (whole seconds, at least 2: etcd's shortest lease) [default: 2s].
    #[arg(long, value_name = "DURATION", requires = "etcd")]
    pub(crate) leader_ttl: Option<String>,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
}

#[derive(Args)]
pub(crate) struct MetricsArgs {
    /// Serve metrics over HTTP here: /metrics (Prometheus text); the master also serves
    /// /stats.json and a dashboard at /. A bare port listens on loopback; name another address
    /// to let other machines scrape. Read-only; shows no data-plane key (a master given
    /// --kv-events also serves /kv_events, which names keys). Off unless given.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<String>,
    /// Require `Authorization: Bearer <token>` of scrapers, the token read from FILE.
    #[arg(long, value_name = "FILE", requires = "metrics_listen")]
    pub(crate) metrics_token_file: Option<PathBuf>,
}

impl MetricsArgs {
    /// The address to serve metrics on, and the scrapers' token, if metrics are on.
    pub(crate) fn resolve(&self) -> Result<Option<(String, Option<String>)>, mooring_core::Error> {
        let Some(given) = &self.metrics_listen else {
            return Ok(None);
        };
        // A bare port means loopback: metrics leave the machine only when the operator says so.
        let listen = if given.parse::<u16>().is_ok() {
            format!("127.0.0.1:{given}")
        } else {
            given.clone()
        };
        let bearer = match &self.metrics_token_file {
            Some(path) => Some(read_bearer(path)?),
            None => None,
        };
        Ok(Some((listen, bearer)))
    }
}

/// The scrapers' bearer token: the file's first line.
fn read_bearer(path: &std::path::Path) -> Result<String, mooring_core::Error> {
    use mooring_core::{Error, ErrorCode};
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            ErrorCode::FILE_READ_FAIL,
            format!("metrics token file {}: {e}", path.display()),
        )
    })?;
    let token = text.lines().next().unwrap_or_default().trim().to_string();
    if token.is_empty() {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("metrics token file {} is empty", path.display()),
        ));
    }
    Ok(token)
}

#[derive(Args)]
pub(crate) struct NodeArgs {
    /// TOML config file with a [node] section (flags override it).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// The master's address [default: 127.0.0.1:50051]; a group's: every master's (A,B,C),
    /// or where etcd finds them (etcd://HOST:PORT[/CLUSTER]).
    #[arg(long, env = "MOORING_MASTER")]
    pub(crate) master: Option<String>,
    /// Memory to contribute, e.g. 4GiB [default: 1GiB].
    #[arg(long)]
    pub(crate) size: Option<String>,
    /// Segment name, unique in the cluster [default: the advertised address].
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Data server bind address [default: 0.0.0.0:0 with a token, 127.0.0.1:0 without].
    #[arg(long)]
    pub(crate) listen: Option<String>,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    /// Address clients connect to, if not the bound one (e.g. behind NAT).
    #[arg(long)]
    pub(crate) advertise: Option<String>,
    /// Do not touch every page at startup.
    #[arg(long)]
    pub(crate) no_prefault: bool,
    /// Directory for the SSD tier: objects evicted from memory are kept here and read back
    /// on demand; an existing directory is recovered. Without it the node is memory only.
    #[arg(long)]
    pub(crate) disk_dir: Option<PathBuf>,
    /// Most bytes of values kept on disk, e.g. 100GiB; beyond it the oldest (or least
    /// recently read) go [default: no limit].
    #[arg(long)]
    pub(crate) disk_capacity: Option<String>,
    /// How copies are laid out on disk [default: bucket].
    #[arg(long, value_enum)]
    pub(crate) disk_backend: Option<DiskBackend>,
    /// Which copies leave the disk first once it is full [default: fifo].
    #[arg(long, value_enum)]
    pub(crate) disk_eviction: Option<DiskEviction>,
    /// How the disk is driven [default: uring, falling back to posix].
    #[arg(long, value_enum)]
    pub(crate) disk_io: Option<DiskIo>,
    /// Bypass the page cache (O_DIRECT), with the alignment the filesystem reports.
    #[arg(long)]
    pub(crate) disk_direct: bool,
    /// When another node dies or leaves, copy back the replicas its objects lost, at most this
    /// many objects a second from this node (each surviving node takes a share); 0 turns
    /// it off.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub(crate) repair_rate: u32,
    /// Data-plane transports to serve, comma-separated, always including tcp: tcp, rdma,
    /// shm [default: tcp,shm]. The TCP data server always runs (clients on other hosts, the
    /// RDMA and shared-memory handshakes, disk staging). shm puts the segment in shared
    /// memory (a sealed memfd) that clients on this host holding the cluster token map and
    /// copy to and from directly. RDMA needs a device, kernel support, a memlock limit above
    /// --size and a build with `--features rdma`.
    #[arg(long, value_name = "LIST")]
    pub(crate) transports: Option<String>,
    /// With shm: also serve the shared memory to processes of this group's members (a name
    /// or a gid). By default only processes running as this node's own user may map it;
    /// other local users are refused at its socket by the credentials the kernel reports.
    #[arg(long, value_name = "GROUP")]
    pub(crate) shm_group: Option<String>,
    /// RDMA devices to use, comma-separated (the first that exists) [default: the first
    /// device found].
    #[arg(long, value_name = "NAME[,NAME]")]
    pub(crate) rdma_device: Option<String>,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
}

#[derive(Args)]
pub(crate) struct PeerArgs {
    /// TOML config file with a [peer] section (flags override it).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Where the peer service listens; its address is the peer's name on the ring, so keep
    /// it the same across restarts [default: 127.0.0.1:7100].
    #[arg(long)]
    pub(crate) listen: Option<String>,
    /// The address other peers reach this one at, if not --listen (needed with 0.0.0.0).
    #[arg(long)]
    pub(crate) advertise: Option<String>,
    /// The peer's name on the ring [default: its member credential's name, else its
    /// address]. A member credential may only run a peer of its own name.
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Peers to greet first, comma-separated (any live member will do; the rest are found
    /// from them). The first peer of a cluster has none.
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT]", value_delimiter = ',')]
    pub(crate) seeds: Vec<String>,
    /// Memory for values written through this peer, e.g. 8GiB [default: 1GiB].
    #[arg(long)]
    pub(crate) size: Option<String>,
    /// Peers holding each directory entry: with 2, any one peer can die without an entry
    /// of the survivors' data being lost [default: 2].
    #[arg(long)]
    pub(crate) directory_replicas: Option<usize>,
    /// This peer's share of the directory, relative to a peer of weight 1 [default: 1].
    #[arg(long)]
    pub(crate) weight: Option<u32>,
    /// A directory for the disk tier: every value is copied there too, and a value evicted
    /// from memory stays readable from disk. Emptied at start (a restarted peer starts
    /// anew); one that cannot be created leaves the peer without a disk tier, with a warning.
    #[arg(long)]
    pub(crate) disk_dir: Option<PathBuf>,
    /// Most bytes kept in --disk-dir, e.g. 100GiB; the oldest copies go first to make room
    /// [default: four times --size].
    #[arg(long)]
    pub(crate) disk_size: Option<String>,
    /// Data-plane transports to serve, comma-separated: tcp, shm [default: tcp,shm]. With
    /// shm the pool lives in shared memory (a sealed memfd) that peers on this host running
    /// as this user map, so their reads of it are a memcpy; other peers read it over TCP.
    #[arg(long, value_name = "LIST")]
    pub(crate) transports: Option<String>,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
}

#[derive(Args, Clone)]
pub(crate) struct ClientArgs {
    /// TOML config file with a [client] section: `master` and `rpc_timeout` (flags and
    /// MOORING_MASTER override it).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// The master's address; a group's: every master's (A,B,C), or where etcd finds them
    /// (etcd://HOST:PORT[/CLUSTER]); or a peer cluster's peers
    /// (peer://HOST:PORT[,HOST:PORT]) [default: the config file's, else 127.0.0.1:50051].
    #[arg(long, env = "MOORING_MASTER")]
    pub(crate) master: Option<String>,
    /// Time allowed for one request [default: the config file's rpc_timeout, else 10s].
    #[arg(long)]
    pub(crate) timeout: Option<String>,
    /// How to reach nodes: auto (the best each node offers that this client can use: shared
    /// memory on this host, then RDMA, then TCP), tcp, rdma (needs a device) or shm (only
    /// nodes on this host that serve it).
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) transport: mooring::transports::TransportChoice,
    /// RDMA devices to use, comma-separated (the first that exists) [default: the first
    /// device found].
    #[arg(long, value_name = "NAME[,NAME]")]
    pub(crate) rdma_device: Option<String>,
    /// The tenant whose keys to read and write [default: the credential's, else the default
    /// tenant]. A member credential acts only in its own tenant.
    #[arg(long, env = "MOORING_TENANT")]
    pub(crate) tenant: Option<String>,
    #[command(flatten)]
    pub(crate) auth: AuthArgs,
}

impl ClientArgs {
    /// The master's address and the time allowed for one request: flags (and
    /// MOORING_MASTER) first, then the config file's `[client]` section, then the defaults.
    pub(crate) fn master_and_timeout(&self) -> Result<(String, std::time::Duration), Error> {
        let file = match &self.config {
            Some(path) => mooring::config::FileConfig::load(path).map_err(usage_error)?,
            None => mooring::config::FileConfig::default(),
        };
        let master = self
            .master
            .clone()
            .or(file.client.master)
            .unwrap_or_else(|| DEFAULT_MASTER.into());
        let timeout = self
            .timeout
            .clone()
            .or(file.client.rpc_timeout)
            .unwrap_or_else(|| "10s".into());
        let timeout = mooring::config::parse_duration(&timeout).map_err(usage_error)?;
        Ok((master, timeout))
    }
}

#[derive(Args)]
pub(crate) struct PutArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// The key.
    pub(crate) key: String,
    /// File to read the value from ("-" for stdin).
    pub(crate) file: Option<PathBuf>,
    /// The value, given inline instead of a file.
    #[arg(long, conflicts_with = "file")]
    pub(crate) value: Option<String>,
    /// Replicas, each on a different node (best effort).
    #[arg(long, default_value_t = 1)]
    pub(crate) replicas: u32,
    /// Never evict this object (until it is removed).
    #[arg(long)]
    pub(crate) hard_pin: bool,
    /// Evict this object only after every unpinned one (the pin lapses after the master's
    /// soft-pin TTL without access).
    #[arg(long)]
    pub(crate) soft_pin: bool,
    /// Drop the soft pin the key had (an upsert otherwise keeps it).
    #[arg(long, conflicts_with = "soft_pin")]
    pub(crate) soft_unpin: bool,
    /// Replace the value if the key exists.
    #[arg(long)]
    pub(crate) upsert: bool,
}

#[derive(Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// The key.
    pub(crate) key: String,
    /// Write the value to this file instead of stdout.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct RmArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// The key to remove.
    #[arg(required_unless_present_any = ["regex", "all"])]
    pub(crate) key: Option<String>,
    /// Remove every unused key matching this regex.
    #[arg(long, conflicts_with_all = ["key", "all"])]
    pub(crate) regex: Option<String>,
    /// Remove every unused key.
    #[arg(long, conflicts_with = "key")]
    pub(crate) all: bool,
}

#[derive(Args)]
pub(crate) struct CpArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// The key to copy.
    pub(crate) key: String,
    /// Segments (node names, as `mooring stat` lists them) to add a replica on.
    #[arg(required = true)]
    pub(crate) segments: Vec<String>,
}

#[derive(Args)]
pub(crate) struct MvArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// The key whose replica moves.
    pub(crate) key: String,
    /// The segment it leaves.
    pub(crate) from: String,
    /// The segment it goes to.
    pub(crate) to: String,
}

#[derive(Args)]
pub(crate) struct LsArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// Only keys matching this regex.
    #[arg(default_value = ".*")]
    pub(crate) regex: String,
}

/// `mooring demo`.
#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// Run the workload on a peer cluster (no master): three peers in this process, a
    /// storage peer's silent stop and a goodbye.
    #[arg(long)]
    pub peer: bool,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Benchmark a running cluster at this master address.
    #[arg(long, env = "MOORING_MASTER", conflicts_with = "embedded")]
    pub(crate) master: Option<String>,
    /// Start the cluster for the run instead: `process` (the default) runs the master as its
    /// own process, `writer` inside the writer's process (an engine embedding the master).
    #[arg(long, value_name = "MASTER", num_args = 0..=1, default_missing_value = "process")]
    pub(crate) embedded: Option<String>,
    /// Value sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,4MiB")]
    pub(crate) sizes: Vec<String>,
    /// Objects per size.
    #[arg(long, default_value_t = 1000)]
    pub(crate) count: usize,
    /// Keys per batch in the batched phases.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch: usize,
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// How the reader reaches the writer's segment: auto (shared memory, as the reader and
    /// writer share this host), tcp, rdma or shm.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) transport: mooring::transports::TransportChoice,
    /// Also run N reader processes at once per size (each making --count gets, every value
    /// verified) and report their aggregate throughput beside the TCP loopback limit of N
    /// streams on this machine.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(crate) readers: usize,
    /// Also run N client processes at once, each asking the master whether keys exist, one
    /// request at a time, and report the requests per second the master answered and the
    /// CPU it used (when this host runs it), so its ceiling per core is known.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) clients: usize,
    /// Also measure peer mode beside master mode: a `mooring peer` process and a peer in
    /// this process; puts into the local peer, gets of values the other process holds, and
    /// directory lookups.
    #[arg(long)]
    pub(crate) peer: bool,
}

#[derive(Args)]
pub(crate) struct BenchReaderArgs {
    #[arg(long)]
    pub(crate) master: String,
    #[arg(long)]
    pub(crate) run: String,
    #[arg(long)]
    pub(crate) size: u64,
    #[arg(long)]
    pub(crate) count: usize,
    #[arg(long)]
    pub(crate) objects: usize,
    #[arg(long)]
    pub(crate) first: usize,
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) transport: mooring::transports::TransportChoice,
    #[arg(long, value_enum, default_value = "get")]
    pub(crate) op: mooring::ops::bench::HelperOp,
}

#[derive(Args)]
pub(crate) struct BenchWriterArgs {
    #[arg(long)]
    pub(crate) master: String,
    #[arg(long, value_delimiter = ',')]
    pub(crate) sizes: Vec<u64>,
    #[arg(long)]
    pub(crate) count: usize,
    #[arg(long)]
    pub(crate) run: String,
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) transport: mooring::transports::TransportChoice,
}

#[derive(Args)]
pub(crate) struct StatArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// Print every counter and the segments as JSON (the same document as the master's
    /// /stats.json).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct EventsArgs {
    /// The master's metrics address (its --metrics-listen; the master must run with
    /// --kv-events).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) metrics: String,
    /// The bearer token the metrics address requires, read from FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) metrics_token_file: Option<PathBuf>,
    /// Follow this tenant's keys.
    #[arg(long, default_value = "default")]
    pub(crate) tenant: String,
    /// Only keys starting with this.
    #[arg(long)]
    pub(crate) prefix: Option<String>,
    /// Print every event the master still keeps first, not only those from now on.
    #[arg(long)]
    pub(crate) from_start: bool,
    /// How long to wait between polls when nothing is waiting [default: 100ms].
    #[arg(long, value_name = "DURATION")]
    pub(crate) interval: Option<String>,
    /// Events looked at per poll (1 to 10000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) page: u32,
}

impl EventsArgs {
    /// The metrics token, if a file was given.
    pub(crate) fn metrics_token(&self) -> Result<Option<String>, mooring_core::Error> {
        self.metrics_token_file
            .as_deref()
            .map(read_bearer)
            .transpose()
    }
}

#[derive(Args)]
pub(crate) struct DebugArgs {
    #[command(subcommand)]
    pub(crate) action: DebugAction,
}

#[derive(Subcommand)]
pub(crate) enum DebugAction {
    /// Start a put and never finish it (for crash tests).
    HangPut {
        #[arg(long, default_value = DEFAULT_MASTER)]
        master: String,
        key: String,
        #[arg(long, default_value_t = 4096)]
        size: u64,
    },
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command};

    fn get_args(args: &[&str]) -> super::ClientArgs {
        let mut argv = vec!["mooring", "get"];
        argv.extend_from_slice(args);
        argv.push("key");
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Get(get) => get.client,
            _ => unreachable!("a get"),
        }
    }

    #[test]
    fn a_client_takes_the_config_files_master_and_timeout_unless_flags_say_otherwise() {
        // MOORING_MASTER, when set, rightly takes precedence over the file.
        if std::env::var_os("MOORING_MASTER").is_some() {
            return;
        }
        let path = std::env::temp_dir().join(format!("mooring-client-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "[client]\nmaster = \"10.0.0.9:7000\"\nrpc_timeout = \"3s\"\n",
        )
        .unwrap();
        let config = path.to_str().unwrap();
        let (master, timeout) = get_args(&["--config", config])
            .master_and_timeout()
            .unwrap();
        assert_eq!((master.as_str(), timeout.as_secs()), ("10.0.0.9:7000", 3));
        let (master, timeout) =
            get_args(&["--config", config, "--master", "m:1", "--timeout", "1s"])
                .master_and_timeout()
                .unwrap();
        assert_eq!((master.as_str(), timeout.as_secs()), ("m:1", 1));
        let (master, timeout) = get_args(&[]).master_and_timeout().unwrap();
        assert_eq!(
            (master.as_str(), timeout.as_secs()),
            ("127.0.0.1:50051", 10)
        );
        std::fs::write(&path, "[client]\nrpc_timeout = \"soon\"\n").unwrap();
        let bad = get_args(&["--config", config])
            .master_and_timeout()
            .unwrap_err();
        assert!(bad.to_string().contains("soon"), "{bad}");
        std::fs::remove_file(&path).unwrap();
    }
}
