//! `mooring peer`: one peer of a cluster with no master.

use std::io::Write;

use mooring::config::{FileConfig, parse_size};
use mooring::peer::{PeerConfig, PeerDiskConfig, PeerNode};
use mooring_core::Error;

use super::args::PeerArgs;
use super::{usage_error, wait_for_shutdown};

/// Where a peer listens unless told.
const DEFAULT_PEER_LISTEN: &str = "127.0.0.1:7100";

pub(crate) async fn run_peer(args: PeerArgs) -> Result<(), Error> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path).map_err(usage_error)?,
        None => FileConfig::default(),
    };
    let f = file.peer;
    let listen = args
        .listen
        .or(f.listen)
        .unwrap_or_else(|| DEFAULT_PEER_LISTEN.into());
    let size =
        parse_size(&args.size.or(f.size).unwrap_or_else(|| "1GiB".into())).map_err(usage_error)?;
    mooring::node::preflight::check_segment_size(size)?;
    let seeds = match args.seeds.is_empty() {
        true => f.seeds.unwrap_or_default(),
        false => args.seeds,
    };
    let mut config = PeerConfig::new(listen.clone(), seeds, size);
    config.name = args.name.or(f.name);
    config.advertise = args.advertise.or(f.advertise);
    if let Some(replicas) = args.directory_replicas.or(f.directory_replicas) {
        if replicas == 0 {
            return Err(usage_error(
                "--directory-replicas must be at least 1".into(),
            ));
        }
        config.directory_replicas = replicas;
    }
    if let Some(weight) = args.weight.or(f.weight) {
        config.weight = weight.max(1);
    }
    let served = mooring::transports::served(args.transports.or(f.transports).as_deref())?;
    if served.contains(&mooring::transports::Transport::Rdma) {
        return Err(usage_error(
            "a peer does not serve RDMA yet: use --transports tcp,shm (peers on other hosts \
             read over TCP)"
                .into(),
        ));
    }
    config.shared_memory = served.contains(&mooring::transports::Transport::Shm);
    let disk_dir = args.disk_dir.or(f.disk_dir);
    if let Some(dir) = &disk_dir {
        let capacity = match args.disk_size.or(f.disk_size) {
            Some(given) => parse_size(&given).map_err(usage_error)?,
            None => size.saturating_mul(4),
        };
        if capacity == 0 {
            return Err(usage_error("--disk-size must be more than 0".into()));
        }
        config.disk = Some(PeerDiskConfig {
            dir: dir.clone(),
            capacity,
            device: None,
        });
    }
    let token = args.serve.token_for(&listen)?;
    let metrics = args.metrics.resolve()?;
    let peer = PeerNode::start(config, token).await?;
    if let Some((listen, bearer)) = metrics {
        peer.serve_metrics(&listen, bearer).await?;
    }
    let at = match peer.name() == peer.address() {
        true => String::new(),
        false => format!(" at {}", peer.address()),
    };
    let disk = match (&disk_dir, peer.disk_capacity()) {
        (None, _) => String::new(),
        (Some(dir), 0) => format!(
            ", without a disk tier ({} could not be used: see the warning)",
            dir.display()
        ),
        (Some(dir), bytes) => format!(", disk tier {bytes} bytes in {}", dir.display()),
    };
    out!(
        "mooring peer {}{at} serving {size} bytes{disk}",
        peer.name()
    );
    let _ = std::io::stdout().flush();
    wait_for_shutdown().await;
    peer.leave().await;
    Ok(())
}
