//! `mooring master`: a master alone, or (`--etcd`) one of a group of masters.

use std::io::Write;
#[cfg(feature = "etcd")]
use std::sync::Arc;
#[cfg(feature = "etcd")]
use std::time::Duration;

use mooring::RunningMaster;
use mooring::config::{FileConfig, MasterSection, parse_size};
use mooring::master::MasterService;
use mooring_core::Error;
#[cfg(not(feature = "etcd"))]
use mooring_core::ErrorCode;

use super::args::MasterArgs;
use super::{usage_error, wait_for_shutdown};

pub(crate) async fn run_master(args: MasterArgs) -> Result<(), Error> {
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
        unfinished_put_share: args.unfinished_put_share,
        tenant_quotas: (!args.tenant_quota.is_empty()).then_some(args.tenant_quota),
        kv_events: args.kv_events,
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
            None => mooring::master::journal::SNAPSHOT_AFTER,
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
            revoked_file: args.revoked_file.clone(),
            kv_events: settings.kv_events.unwrap_or(0),
        };
        return run_master_group(group, &listen, config, token).await;
    }
    let service = match &settings.state_dir {
        Some(dir) => {
            let snapshot_after = match &settings.snapshot_after {
                Some(size) => parse_size(size).map_err(usage_error)?,
                None => mooring::master::journal::SNAPSHOT_AFTER,
            };
            MasterService::persistent(dir, config, snapshot_after)?
        }
        None => MasterService::new(config)?,
    };
    if let Some(kept) = settings.kv_events.filter(|&n| n > 0) {
        service.publish_kv_events(kept);
    }
    let mut master = RunningMaster::serve(&listen, service, token).await?;
    let _revocations = watch_revocations(&args.revoked_file, &master.gate)?;
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
    /// The revocation list (`--revoked-file`).
    revoked_file: Option<std::path::PathBuf>,
    /// KV events kept for subscribers (`--kv-events`; 0: off).
    kv_events: usize,
}

/// Keeps `gate`'s revocation list in step with `file`, if one is given.
fn watch_revocations(
    file: &Option<std::path::PathBuf>,
    gate: &std::sync::Arc<mooring_proto::auth::Gate>,
) -> Result<Option<tokio::task::JoinHandle<()>>, Error> {
    file.as_ref()
        .map(|path| {
            mooring::token::watch_revocations(
                gate.clone(),
                path.clone(),
                std::time::Duration::from_secs(2),
            )
        })
        .transpose()
}

/// `mooring master --etcd`: serves as one of a group of masters (see `mooring::ha`).
#[cfg(feature = "etcd")]
async fn run_master_group(
    group: GroupArgs<'_>,
    listen: &str,
    config: mooring_core::MasterConfig,
    token: Option<mooring_proto::auth::Credential>,
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
    let _revocations = watch_revocations(&group.revoked_file, &serving.gate)?;
    let addr = serving.addr;
    let _metrics = match group.metrics {
        Some((listen, bearer)) => {
            let pages = mooring::ha::metrics_pages(handler.clone(), serving.limits.clone());
            Some(
                mooring::ops::http::serve(
                    &listen,
                    pages,
                    bearer,
                    mooring::ops::metrics::PUBLIC_PATHS,
                )
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
        state_dir: Arc::new(mooring_disk::PosixStateDir::new(&group.state_dir)),
        master: config,
        snapshot_after: group.snapshot_after,
        token,
        // Each term's master keeps its own feed (a new epoch: subscribers list the keys again).
        on_lead: (group.kv_events > 0).then(|| {
            let kept = group.kv_events;
            Arc::new(move |service: &Arc<MasterService>| service.publish_kv_events(kept))
                as mooring::ha::etcd::OnLead
        }),
        dial: None,
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
    _token: Option<mooring_proto::auth::Credential>,
) -> Result<(), Error> {
    Err(Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
        "this build of mooring has no etcd support: build it with `cargo build --release -p \
         mooring --features etcd` (needs Debian's protobuf-compiler) to run masters in a group",
    ))
}
