//! Configuration files and human-friendly values.
//!
//! Every service setting can come from a flag or from a TOML file (`--config`); a flag wins
//! over the file, the file over the default. Sizes read like `64MiB`, `1GiB`, `4096`;
//! durations like `5s`, `250ms`, `10m`.

use std::path::Path;
use std::time::Duration;

use mooring_core::{MasterConfig, Millis};
use std::path::PathBuf;

use serde::Deserialize;

/// How long `mooring master` waits for a silent member before taking it for dead, unless
/// `--client-ttl` says otherwise: a dead node is noticed (and its replicas queued for repair)
/// within about 3 s. Mooncake's (and the core's) default is 10 s. Measured before the change:
/// no false expiry in 20 minutes of a 3 s TTL with the machine's full test suite running
/// beside a loaded cluster. Connections bound late writes to a quarter of it (see
/// `mooring_transport_tcp::bound_late_writes`), so the write fence holds.
pub const DEFAULT_CLIENT_TTL: Millis = Millis(3_000);

/// Parses a byte size: a number with an optional unit (`B`, `KiB`/`K`, `MiB`/`M`, `GiB`/`G`,
/// `TiB`/`T` are powers of 1024; `KB`, `MB`, `GB`, `TB` powers of 1000).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .replace('_', "")
        .parse()
        .map_err(|_| format!("{text:?} is not a size (try 4096, 64MiB or 1GiB)"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    n.checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// The units [`parse_duration`] accepts, for error messages.
const DURATION_UNITS: &str = "us, ms, s, m, h or d (e.g. 50us, 500ms, 5s, 10m, 30d)";

/// Parses a duration: a whole number and a unit (`us` or `µs`, `ms`, `s`, `m` or `min`, `h`,
/// `d`).
/// The one duration parser of every flag, file and environment variable. A bare `0` is zero
/// (where the docs say zero turns something off); any other number without a unit is refused,
/// because one reader's seconds are another's microseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        format!("{text:?} is not a duration: give a number and a unit, {DURATION_UNITS}")
    })?;
    let scaled = match unit.trim() {
        "" if n == 0 => Some(Duration::ZERO),
        "" => {
            return Err(format!("{text:?} has no unit: write {DURATION_UNITS}"));
        }
        "us" | "µs" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" | "min" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        "d" => n.checked_mul(86_400).map(Duration::from_secs),
        other => {
            return Err(format!(
                "unknown duration unit {other:?} in {text:?}: use {DURATION_UNITS}"
            ));
        }
    };
    scaled.ok_or_else(|| format!("{text:?} is too long"))
}

fn millis(d: Duration) -> Millis {
    Millis(d.as_millis() as u64)
}

/// The `[master]` section of a config file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MasterSection {
    /// Address to listen on.
    pub listen: Option<String>,
    /// Read lease TTL.
    pub lease_ttl: Option<String>,
    /// Default soft-pin TTL.
    pub soft_pin_ttl: Option<String>,
    /// Whether soft-pinned objects may be evicted when nothing else is left.
    pub allow_evict_soft_pinned: Option<bool>,
    /// Usage fraction that starts eviction.
    pub eviction_high_watermark: Option<f64>,
    /// Fraction of capacity one eviction pass frees.
    pub eviction_ratio: Option<f64>,
    /// Unfinished puts may be preempted after this.
    pub put_start_discard_timeout: Option<String>,
    /// Discarded puts' space is reused after this.
    pub put_start_release_timeout: Option<String>,
    /// Silent clients are dropped after this.
    pub client_ttl: Option<String>,
    /// Seed for placement randomness.
    pub seed: Option<u64>,
    /// Directory the master keeps its state in (snapshots and journal).
    pub state_dir: Option<PathBuf>,
    /// Journal growth that starts a snapshot (a size: "64MiB").
    pub snapshot_after: Option<String>,
    /// Queue every completed write for its node's disk, not only what eviction reaches.
    pub offload_write_through: Option<bool>,
    /// Segment usage fraction past which nodes with a disk copy out their least recently
    /// used objects ahead of eviction (above 1: never).
    pub offload_ahead_watermark: Option<f64>,
    /// The most one member may hold in unfinished puts, as a fraction of the pool.
    pub unfinished_put_share: Option<f64>,
    /// Limits per tenant: `TENANT:objects=N,bytes=SIZE,unfinished=SIZE,disk=SIZE` each.
    pub tenant_quotas: Option<Vec<String>>,
    /// KV events kept for subscribers at `/kv_events` (0 or unset: off).
    pub kv_events: Option<usize>,
}

/// The `[node]` section of a config file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// The master's address.
    pub master: Option<String>,
    /// Segment name.
    pub name: Option<String>,
    /// Bytes contributed.
    pub size: Option<String>,
    /// Data server bind address.
    pub listen: Option<String>,
    /// Address advertised to clients.
    pub advertise: Option<String>,
    /// Touch every page at startup.
    pub prefault: Option<bool>,
    /// SSD tier directory (none: memory only).
    pub disk_dir: Option<std::path::PathBuf>,
    /// Most bytes kept on disk, e.g. "100GiB".
    pub disk_capacity: Option<String>,
    /// Disk layout: "bucket", "file-per-key" or "offset-file".
    pub disk_backend: Option<crate::node::disk_tier::DiskBackend>,
    /// Disk eviction order: "fifo" or "lru".
    pub disk_eviction: Option<crate::node::disk_tier::DiskEviction>,
    /// Disk I/O: "uring" or "posix".
    pub disk_io: Option<crate::node::disk_tier::DiskIo>,
    /// O_DIRECT.
    pub disk_direct: Option<bool>,
    /// Transports served: "tcp", "rdma" or "tcp,rdma".
    pub transports: Option<String>,
    /// A group whose members' processes may also map the shared memory (name or gid).
    pub shm_group: Option<String>,
    /// RDMA devices, comma-separated.
    pub rdma_device: Option<String>,
}

/// The `[peer]` section of a config file (peer mode: `mooring peer`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    /// Where the peer service listens (host:port).
    pub listen: Option<String>,
    /// The address other peers reach it at, if not `listen`.
    pub advertise: Option<String>,
    /// Its name on the ring (default: a member credential's name, else its address).
    pub name: Option<String>,
    /// Peers to greet first.
    pub seeds: Option<Vec<String>>,
    /// Bytes of the published pool, e.g. "8GiB".
    pub size: Option<String>,
    /// Owners of each directory entry.
    pub directory_replicas: Option<usize>,
    /// Share of the directory relative to a peer of weight 1.
    pub weight: Option<u32>,
    /// A directory for the disk tier.
    pub disk_dir: Option<std::path::PathBuf>,
    /// Most bytes kept in `disk_dir`, e.g. "100GiB" (default: four times `size`).
    pub disk_size: Option<String>,
    /// Data-plane transports to serve, e.g. "tcp,shm" (the default).
    pub transports: Option<String>,
}

/// The `[client]` section of a config file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSection {
    /// The master's address.
    pub master: Option<String>,
    /// Time allowed for one RPC.
    pub rpc_timeout: Option<String>,
}

/// A config file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Master settings.
    #[serde(default)]
    pub master: MasterSection,
    /// Node settings.
    #[serde(default)]
    pub node: NodeSection,
    /// Client settings.
    #[serde(default)]
    pub client: ClientSection,
    /// Peer settings.
    #[serde(default)]
    pub peer: PeerSection,
}

impl FileConfig {
    /// Reads a TOML config file.
    pub fn load(path: &Path) -> Result<FileConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("bad config {}: {e}", path.display()))
    }
}

impl MasterSection {
    /// Overlays `flags` (which win) on this section.
    pub fn overlay(self, flags: MasterSection) -> MasterSection {
        MasterSection {
            listen: flags.listen.or(self.listen),
            lease_ttl: flags.lease_ttl.or(self.lease_ttl),
            soft_pin_ttl: flags.soft_pin_ttl.or(self.soft_pin_ttl),
            allow_evict_soft_pinned: flags
                .allow_evict_soft_pinned
                .or(self.allow_evict_soft_pinned),
            eviction_high_watermark: flags
                .eviction_high_watermark
                .or(self.eviction_high_watermark),
            eviction_ratio: flags.eviction_ratio.or(self.eviction_ratio),
            put_start_discard_timeout: flags
                .put_start_discard_timeout
                .or(self.put_start_discard_timeout),
            put_start_release_timeout: flags
                .put_start_release_timeout
                .or(self.put_start_release_timeout),
            client_ttl: flags.client_ttl.or(self.client_ttl),
            seed: flags.seed.or(self.seed),
            state_dir: flags.state_dir.or(self.state_dir),
            snapshot_after: flags.snapshot_after.or(self.snapshot_after),
            offload_write_through: flags.offload_write_through.or(self.offload_write_through),
            offload_ahead_watermark: flags
                .offload_ahead_watermark
                .or(self.offload_ahead_watermark),
            unfinished_put_share: flags.unfinished_put_share.or(self.unfinished_put_share),
            tenant_quotas: flags.tenant_quotas.or(self.tenant_quotas),
            kv_events: flags.kv_events.or(self.kv_events),
        }
    }

    /// The core configuration these settings describe (defaults for anything unset).
    pub fn master_config(&self) -> Result<MasterConfig, String> {
        let mut c = MasterConfig {
            client_ttl: DEFAULT_CLIENT_TTL,
            ..MasterConfig::default()
        };
        let duration = |v: &Option<String>| v.as_deref().map(parse_duration).transpose();
        if let Some(d) = duration(&self.lease_ttl)? {
            c.lease_ttl = millis(d);
        }
        if let Some(d) = duration(&self.soft_pin_ttl)? {
            c.default_soft_pin_ttl = millis(d);
        }
        if let Some(d) = duration(&self.put_start_discard_timeout)? {
            c.put_start_discard_timeout = millis(d);
        }
        if let Some(d) = duration(&self.put_start_release_timeout)? {
            c.put_start_release_timeout = millis(d);
        }
        if let Some(d) = duration(&self.client_ttl)? {
            c.client_ttl = millis(d);
        }
        if let Some(v) = self.allow_evict_soft_pinned {
            c.allow_evict_soft_pinned = v;
        }
        if let Some(v) = self.eviction_high_watermark {
            c.eviction_high_watermark = v;
        }
        if let Some(v) = self.eviction_ratio {
            c.eviction_ratio = v;
        }
        if let Some(v) = self.seed {
            c.seed = v;
        }
        if let Some(v) = self.offload_write_through {
            c.offload_write_through = v;
        }
        if let Some(v) = self.offload_ahead_watermark {
            c.offload_ahead_watermark = v;
        }
        if let Some(v) = self.unfinished_put_share {
            c.unfinished_put_share = v;
        }
        for quota in self.tenant_quotas.iter().flatten() {
            let quota = mooring_core::tenant::TenantQuota::parse(quota, parse_size)
                .map_err(|e| format!("tenant quota: {e}"))?;
            c.tenant_quotas.retain(|q| q.tenant != quota.tenant);
            c.tenant_quotas.push(quota);
        }
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2 GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1_024"), Ok(1024));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("20us"), Ok(Duration::from_micros(20)));
        assert_eq!(parse_duration(" 20 µs "), Ok(Duration::from_micros(20)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        // A bare number meant seconds to the config file and microseconds to the spin
        // variables; now it means nothing, and the message says what to write.
        let bare = parse_duration("20").unwrap_err();
        assert!(bare.contains("no unit") && bare.contains("ms"), "{bare}");
        assert!(parse_duration(&format!("{}h", u64::MAX)).is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 fortnights").is_err());
    }

    #[test]
    fn flags_win_over_the_file_and_bad_values_are_explained() {
        let file: FileConfig = toml::from_str(
            "[master]\nlease_ttl = \"2s\"\nclient_ttl = \"20s\"\n[node]\nsize = \"1GiB\"\n",
        )
        .unwrap();
        let merged = file.master.overlay(MasterSection {
            lease_ttl: Some("300ms".into()),
            ..MasterSection::default()
        });
        let config = merged.master_config().unwrap();
        assert_eq!(config.lease_ttl, Millis(300));
        assert_eq!(config.client_ttl, Millis(20_000));
        let unset = MasterSection::default().master_config().unwrap();
        assert_eq!(
            unset.client_ttl, DEFAULT_CLIENT_TTL,
            "3 s unless told otherwise"
        );
        assert_eq!(unset.lease_ttl, MasterConfig::default().lease_ttl);
        let bad = MasterSection {
            eviction_high_watermark: Some(3.0),
            ..MasterSection::default()
        };
        assert!(
            bad.master_config()
                .unwrap_err()
                .contains("eviction_high_watermark")
        );
        assert!(toml::from_str::<FileConfig>("[master]\nleese_ttl = \"1s\"").is_err());
    }

    #[test]
    fn offload_settings_reach_the_core_config() {
        let file: FileConfig = toml::from_str(
            "[master]\noffload_write_through = true\noffload_ahead_watermark = 0.8\n",
        )
        .unwrap();
        let config = file.master.clone().master_config().unwrap();
        assert!(config.offload_write_through);
        assert_eq!(config.offload_ahead_watermark, 0.8);
        let flags = MasterSection {
            offload_ahead_watermark: Some(2.0),
            ..MasterSection::default()
        };
        let config = file.master.overlay(flags).master_config().unwrap();
        assert_eq!(
            config.offload_ahead_watermark, 2.0,
            "the flag wins; above 1: off"
        );
        let unset = MasterSection::default().master_config().unwrap();
        assert!(!unset.offload_write_through);
        assert_eq!(unset.offload_ahead_watermark, 0.6);
        let bad = MasterSection {
            offload_ahead_watermark: Some(0.0),
            ..MasterSection::default()
        };
        assert!(
            bad.master_config()
                .unwrap_err()
                .contains("offload_ahead_watermark")
        );
    }
}
