//! `mooring demo`: an embedded cluster running a prefill→decode workload.
//!
//! Three storage nodes, a prefill engine and a decode engine in one process, talking over
//! loopback TCP. The prefill engine loads hard-pinned model weights, then writes the KV-cache
//! blocks of a stream of requests; the decode engine reads every block back and checks it byte
//! for byte. The stream is larger than the pool, so the master evicts old blocks while the
//! weights stay; every node has an SSD tier (in a temporary directory), so evicted blocks are
//! offloaded first and the oldest requests' blocks are read back from disk and checked, and
//! one is promoted back into memory with `exist_prefetch`. Then a weight shard is upserted
//! while a reader is reading it; the reader sees the old or the new shard, never a mix.

use std::io::Write;
use std::time::{Duration, Instant};

use mooring_core::{ErrorCode, MasterConfig, Medium, Millis, ReplicateConfig, Result};

use crate::cluster::{EmbeddedCluster, EmbeddedConfig};
use crate::node::disk_tier::DiskTierConfig;

/// Shape of the demo workload.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// Storage nodes.
    pub nodes: usize,
    /// Bytes per node.
    pub node_size: u64,
    /// Inference requests to stream through.
    pub requests: usize,
    /// KV blocks per request.
    pub blocks_per_request: usize,
    /// Bytes per KV block.
    pub block_size: usize,
    /// Weight shards.
    pub weight_shards: usize,
    /// Bytes per weight shard.
    pub shard_size: usize,
    /// Give every node an SSD tier in a temporary directory.
    pub disk: bool,
}

impl Default for DemoConfig {
    fn default() -> DemoConfig {
        DemoConfig {
            nodes: 3,
            node_size: 64 << 20,
            requests: 96,
            blocks_per_request: 8,
            block_size: 512 << 10,
            weight_shards: 4,
            shard_size: 8 << 20,
            disk: true,
        }
    }
}

/// The deterministic contents of a block or shard, so every read can be checked.
pub(super) fn content(tag: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub(super) fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Runs the demo, reporting progress to `out`. Fails if any check fails.
pub async fn run(config: &DemoConfig, out: &mut dyn Write) -> Result<()> {
    let io = |e: std::io::Error| mooring_core::Error::new(ErrorCode::INTERNAL_ERROR, e.to_string());
    let master = MasterConfig {
        // Engines read a block right after it is written; a short lease lets the pool recycle
        // blocks as fast as the stream produces them.
        lease_ttl: Millis(200),
        ..MasterConfig::default()
    };
    let disk_dir = std::env::temp_dir().join(format!("mooring-demo-{}", std::process::id()));
    let cluster = EmbeddedCluster::start(EmbeddedConfig {
        master,
        nodes: config.nodes,
        node_size: config.node_size,
        prefault: true,
        local_memcpy: false,
        disk: config.disk.then(|| DiskTierConfig::new(&disk_dir)),
        ..EmbeddedConfig::default()
    })
    .await?;
    let result = stream(config, &cluster, out).await;
    cluster.shutdown().await?;
    if config.disk {
        let _ = std::fs::remove_dir_all(&disk_dir);
    }
    result?;
    writeln!(out, "demo finished: every check passed").map_err(io)?;
    Ok(())
}

/// Puts `items`, retrying those refused for want of room (blocks still being read hold it)
/// for up to a second; returns how many retries it took.
async fn put_with_room(client: &crate::Client, items: &[(&str, &[u8])]) -> Result<u64> {
    let mut pending = items.to_vec();
    let mut retries = 0;
    for attempt in 0.. {
        let results = client.batch_put(&pending, &ReplicateConfig::single()).await;
        let mut failed = Vec::new();
        for (item, result) in pending.iter().zip(results) {
            match result {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::NO_AVAILABLE_HANDLE && attempt < 20 => {
                    failed.push(*item)
                }
                Err(e) => return Err(e),
            }
        }
        if failed.is_empty() {
            break;
        }
        retries += 1;
        pending = failed;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(retries)
}

/// The workload, on a running cluster.
async fn stream(config: &DemoConfig, cluster: &EmbeddedCluster, out: &mut dyn Write) -> Result<()> {
    let io = |e: std::io::Error| mooring_core::Error::new(ErrorCode::INTERNAL_ERROR, e.to_string());
    writeln!(
        out,
        "embedded cluster: master {} + {} nodes x {:.0} MiB, transfers over loopback TCP",
        cluster.master_addr(),
        config.nodes,
        mib(config.node_size)
    )
    .map_err(io)?;
    let prefill = cluster.client().await?;
    let decode = cluster.client().await?;

    // Weights: hard-pinned, two replicas each.
    let started = Instant::now();
    let weights = ReplicateConfig::replicas(2).hard_pinned();
    for shard in 0..config.weight_shards {
        let key = format!("llama-8b/weights/shard-{shard}");
        prefill
            .put(&key, &content(shard as u64, config.shard_size), &weights)
            .await?;
    }
    writeln!(
        out,
        "loaded {} weight shards of {:.0} MiB (hard-pinned, 2 replicas) in {:.0} ms",
        config.weight_shards,
        mib(config.shard_size as u64),
        started.elapsed().as_secs_f64() * 1e3
    )
    .map_err(io)?;

    // The request stream: prefill writes each request's blocks in one batch; decode reads them
    // back in one batch and checks them.
    let started = Instant::now();
    let (mut written, mut verified, mut retries, mut rewritten) = (0u64, 0u64, 0u64, 0u64);
    for request in 0..config.requests {
        let keys: Vec<String> = (0..config.blocks_per_request)
            .map(|b| format!("llama-8b/req-{request:04}/kv-{b:02}"))
            .collect();
        let blocks: Vec<Vec<u8>> = (0..config.blocks_per_request)
            .map(|b| content(1_000_000 + (request * 100 + b) as u64, config.block_size))
            .collect();
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        for round in 0.. {
            let items: Vec<(&str, &[u8])> = pending
                .iter()
                .map(|&i| (keys[i].as_str(), blocks[i].as_slice()))
                .collect();
            retries += put_with_room(&prefill, &items).await?;
            // Decode reads what it was handed. A block the master evicted before decode got to
            // it (the pool is half the stream) is a cache miss: prefill computes it again.
            let wanted: Vec<&str> = pending.iter().map(|&i| keys[i].as_str()).collect();
            let mut missed = Vec::new();
            for (&i, got) in pending.iter().zip(decode.batch_get(&wanted).await) {
                match got {
                    Ok(got) if got == blocks[i] => verified += got.len() as u64,
                    Ok(_) => {
                        return Err(mooring_core::Error::new(
                            ErrorCode::INTERNAL_ERROR,
                            "decode read a block that differs from what prefill wrote",
                        ));
                    }
                    Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND && round < 5 => missed.push(i),
                    Err(e) => return Err(e),
                }
            }
            written += (pending.len() * config.block_size) as u64;
            if missed.is_empty() {
                break;
            }
            rewritten += missed.len() as u64;
            pending = missed;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = decode.stats().await?;
    writeln!(
        out,
        "streamed {} requests: prefill wrote {:.0} MiB, decode read and verified {:.0} MiB in {:.2} s ({:.0} MiB/s each way)",
        config.requests,
        mib(written),
        mib(verified),
        elapsed,
        mib(written) / elapsed
    )
    .map_err(io)?;
    writeln!(
        out,
        "the stream is {:.1}x the pool: the master evicted {} objects ({:.0} MiB); {} objects resident, {:.0}% full{}",
        mib(written) / mib(stats.capacity),
        stats.evicted_objects,
        mib(stats.evicted_bytes),
        stats.objects,
        100.0 * stats.used as f64 / stats.capacity as f64,
        match (retries, rewritten) {
            (0, 0) => String::new(),
            (r, 0) => format!("; {r} batches waited for room"),
            (r, w) => format!(
                "; {r} batches waited for room, {w} blocks evicted before decode read them were prefilled again"
            ),
        }
    )
    .map_err(io)?;

    // The weights survived, byte for byte.
    for shard in 0..config.weight_shards {
        let key = format!("llama-8b/weights/shard-{shard}");
        if decode.get(&key).await? != content(shard as u64, config.shard_size) {
            return Err(mooring_core::Error::new(
                ErrorCode::INTERNAL_ERROR,
                "a hard-pinned weight shard changed",
            ));
        }
    }
    writeln!(
        out,
        "all {} hard-pinned weight shards intact",
        config.weight_shards
    )
    .map_err(io)?;
    if config.disk {
        ssd_tier(config, &decode, out).await?;
    }

    // Upsert a shard while decode keeps reading it: every read is the old or the new shard.
    let key = "llama-8b/weights/shard-0";
    let (old, new) = (
        content(0, config.shard_size),
        content(99, config.shard_size),
    );
    let reader = {
        let decode = decode.clone();
        let (old, new) = (old.clone(), new.clone());
        tokio::spawn(async move {
            let (mut saw_old, mut saw_new) = (0, 0);
            for _ in 0..40 {
                let got = decode.get(key).await;
                match got {
                    Ok(v) if v == old => saw_old += 1,
                    Ok(v) if v == new => saw_new += 1,
                    Ok(_) => return Err("torn read"),
                    Err(e) if e.code == ErrorCode::REPLICA_IS_NOT_READY => {}
                    Err(_) => return Err("read failed"),
                }
            }
            Ok((saw_old, saw_new))
        })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    prefill.upsert(key, &new, &weights).await?;
    let (saw_old, saw_new) = reader
        .await
        .map_err(|e| mooring_core::Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?
        .map_err(|e| mooring_core::Error::new(ErrorCode::INTERNAL_ERROR, e))?;
    writeln!(
        out,
        "upserted shard-0 under a concurrent reader: {saw_old} reads saw the old shard, {saw_new} the new, none torn"
    )
    .map_err(io)?;

    prefill.close().await?;
    decode.close().await?;
    Ok(())
}

/// The oldest requests' blocks left memory long ago: those offloaded before eviction read
/// back from the nodes' disks, byte for byte; one is promoted back into memory.
async fn ssd_tier(config: &DemoConfig, decode: &crate::Client, out: &mut dyn Write) -> Result<()> {
    let io = |e: std::io::Error| mooring_core::Error::new(ErrorCode::INTERNAL_ERROR, e.to_string());
    let requests = config.requests.min(16);
    let (mut from_disk, mut dropped, mut in_memory) = (0, 0, 0);
    let mut promotable = None;
    for request in 0..requests {
        for b in 0..config.blocks_per_request {
            let key = format!("llama-8b/req-{request:04}/kv-{b:02}");
            let on_disk_only = match decode.query_by_regex(&format!("^{key}$")).await?.first() {
                Some((_, list)) => list.replicas.iter().all(|r| r.medium == Medium::Disk),
                None => {
                    dropped += 1;
                    continue;
                }
            };
            let expected = content(1_000_000 + (request * 100 + b) as u64, config.block_size);
            match decode.get(&key).await {
                Ok(got) if got == expected => {}
                Ok(_) => {
                    return Err(mooring_core::Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!("{key} read back from the SSD tier differs from what was written"),
                    ));
                }
                // Dropped from disk (disk eviction) since the query: fine, never wrong bytes.
                Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => {
                    dropped += 1;
                    continue;
                }
                Err(e) => return Err(e),
            }
            if on_disk_only {
                from_disk += 1;
                promotable.get_or_insert(key);
            } else {
                in_memory += 1;
            }
        }
    }
    let stats = decode.stats().await?;
    writeln!(
        out,
        "SSD tier: {} copies offloaded; of the first {requests} requests' blocks, {from_disk} read back from disk and {in_memory} from memory, byte-exact ({dropped} evicted before their offload)",
        stats.disk_copies_recorded
    )
    .map_err(io)?;
    if let Some(key) = promotable {
        if !decode.exist_prefetch(&key).await? {
            return Err(mooring_core::Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("exist_prefetch lost {key}"),
            ));
        }
        let media: Vec<Medium> = match decode.query_by_regex(&format!("^{key}$")).await?.first() {
            Some((_, list)) => list.replicas.iter().map(|r| r.medium).collect(),
            None => Vec::new(),
        };
        writeln!(
            out,
            "exist_prefetch({key}) promoted it back into memory: replicas now {media:?}"
        )
        .map_err(io)?;
    }
    Ok(())
}
