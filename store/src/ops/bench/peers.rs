//! `mooring bench --peer`: peer mode's rows beside master mode's, in the same run.
//!
//! A `mooring peer` process (the remote peer) and a peer in this process (the local one)
//! form a cluster. Each size is measured three ways, every value verified:
//!
//! - `peer put`: the local peer stores a value (one copy into its pool, one publish to each
//!   directory owner);
//! - `peer get`: the local peer reads a value the remote peer holds (a lookup at the
//!   owners, then one data-plane read of header and value from the other process);
//! - `peer lookup` (once): batches of directory lookups, as `exists` makes them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mooring_core::{Error, ErrorCode, Result};

use super::objects::{objects_for, value};
use super::process::Writer;
use super::report::Phase;
use super::{BenchConfig, protocol_error};
use crate::peer::{PeerConfig, PeerGuest, PeerNode};

/// Keys per lookup batch.
const LOOKUP_BATCH: usize = 1000;

/// Measures peer mode for every size of `config`.
pub(super) async fn peer_phases(
    config: &BenchConfig,
    exe: &PathBuf,
    token: Option<&Path>,
    run: &str,
) -> Result<Vec<Phase>> {
    // Room for every size's objects, twice (the local peer's and the remote one's).
    let pool: u64 = config
        .sizes
        .iter()
        .map(|&size| objects_for(size, config.count) as u64 * (size + 64))
        .sum::<u64>()
        + (64 << 20);
    let pool_arg = pool.to_string();
    let mut remote = Writer::spawn_args(
        exe,
        token,
        &["peer", "--listen", "127.0.0.1:0", "--size", &pool_arg],
    )?;
    let announced = remote.expect("mooring peer").await?;
    let address = announced
        .split_whitespace()
        .next()
        .ok_or_else(|| protocol_error(format!("a peer announced {announced:?}")))?
        .to_string();
    let token = token.map(crate::token::load).transpose()?;
    let local = PeerNode::start(
        PeerConfig::new("127.0.0.1:0", vec![address.clone()], pool),
        token.clone(),
    )
    .await?;
    let measured = measure(config, &local, &address, token, run).await;
    local.stop();
    let _ = remote.child.kill();
    measured
}

async fn measure(
    config: &BenchConfig,
    local: &PeerNode,
    remote: &str,
    token: Option<mooring_proto::auth::Credential>,
    run: &str,
) -> Result<Vec<Phase>> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(local.is_ready() && local.members().len() == 2) {
        if Instant::now() > deadline {
            return Err(Error::new(
                ErrorCode::RPC_FAIL,
                format!("the local peer never joined the remote one at {remote}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let guest = PeerGuest::new(vec![remote.to_string()], token, Duration::from_secs(30))?;
    let mut phases = Vec::new();
    let mut all_keys = Vec::new();
    for &size in &config.sizes {
        let objects = objects_for(size, config.count);
        let local_key = |i: usize| format!("bench/{run}/peer-local/{size}/{i:07}");
        let remote_key = |i: usize| format!("bench/{run}/peer-remote/{size}/{i:07}");
        let mut lat = Vec::with_capacity(config.count);
        for n in 0..config.count {
            let i = n % objects;
            let bytes = value(size, i);
            let t = Instant::now();
            local.put(&local_key(i), &bytes).await?;
            lat.push(t.elapsed());
        }
        phases.push(Phase::from_latencies("peer put", size, 1, lat));
        // The values a get crosses processes for: written through the remote peer.
        for i in 0..objects {
            guest.put(&remote_key(i), value(size, i)).await?;
            all_keys.push(remote_key(i));
        }
        let mut lat = Vec::with_capacity(config.count);
        for n in 0..config.count {
            let i = n % objects;
            let t = Instant::now();
            let got = local.get(&remote_key(i)).await?;
            lat.push(t.elapsed());
            if got.as_deref() != Some(value(size, i).as_slice()) {
                return Err(Error::new(
                    ErrorCode::INVALID_REPLICA,
                    format!("peer get of {} returned other bytes", remote_key(i)),
                ));
            }
        }
        phases.push(Phase::from_latencies("peer get", size, 1, lat));
    }
    let mut lat = Vec::new();
    for batch in all_keys.chunks(LOOKUP_BATCH) {
        let keys: Vec<&str> = batch.iter().map(String::as_str).collect();
        let t = Instant::now();
        let found = local.exists(&keys).await;
        lat.push(t.elapsed());
        if found.iter().any(|f| !f) {
            return Err(protocol_error("a peer lookup missed a key just written"));
        }
    }
    let mut lookups = Phase::from_latencies("peer lookup", 0, LOOKUP_BATCH as u64, lat);
    // The last batch may be short: count the keys looked up, not batches times the batch.
    lookups.keys = all_keys.len() as u64;
    phases.push(lookups);
    Ok(phases)
}
