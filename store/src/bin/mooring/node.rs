//! `mooring node`: a storage node contributing a segment (and, with `--disk-dir`, a disk
//! tier), repairing replicas other nodes lost.

use std::io::Write;
use std::sync::Arc;

use mooring::config::{FileConfig, parse_size};
use mooring::node::disk_tier::DiskTierConfig;
use mooring::{Client, ClientConfig, SegmentConfig, StandaloneNode};
use mooring_core::Error;
use mooring_transport_tcp::LocalSegments;

use super::args::NodeArgs;
use super::{DEFAULT_MASTER, usage_error, wait_for_shutdown};

pub(crate) async fn run_node(args: NodeArgs) -> Result<(), Error> {
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
    let served = mooring::transports::served(args.transports.or(f.transports).as_deref())?;
    let shm_group = args
        .shm_group
        .or(f.shm_group)
        .map(|group| mooring::transports::group_id(&group))
        .transpose()?;
    let segment = SegmentConfig {
        node: mooring::NodeConfig {
            name: args.name.or(f.name),
            size,
            prefault: !args.no_prefault && f.prefault.unwrap_or(true),
            shared: served.contains(&mooring::transports::Transport::Shm),
            shm_group,
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
    mooring::node::preflight::check_segment_size(size)?;
    if let Some(disk) = &segment.node.disk {
        mooring::node::preflight::check_disk_dir(&disk.dir, disk.capacity)?;
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
