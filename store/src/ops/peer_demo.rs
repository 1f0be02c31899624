//! `mooring demo --peer`: the prefill→decode workload on a peer cluster, with no master.
//!
//! Three peers in this process, talking over loopback TCP: a storage peer, the prefill
//! engine's peer and the decode engine's peer. Prefill writes each request's KV blocks into
//! its own pool (one local copy, one publish to each block's two directory owners). Decode
//! finds each block at its owners and reads it from prefill's pool over the data plane,
//! checking every byte. The stream is larger than prefill's pool, so its oldest blocks are
//! evicted there and their entries withdrawn: reading one is a miss, never other bytes, and
//! `exists` agrees. Then the storage peer, which owns a third of the directory, stops
//! without a word: with two directory replicas every block still held is found, at once and
//! after the ring changes. Last, decode's peer leaves with a goodbye, and prefill's ring
//! drops it at once.

use std::io::Write;
use std::time::{Duration, Instant};

use mooring_core::{Error, ErrorCode, Result};

use super::demo::{content, mib};
use crate::peer::{PeerConfig, PeerNode};

/// Shape of the peer demo's workload.
#[derive(Clone, Debug)]
pub struct PeerDemoConfig {
    /// Bytes of each peer's pool.
    pub pool_size: u64,
    /// Inference requests to stream through.
    pub requests: usize,
    /// KV blocks per request.
    pub blocks_per_request: usize,
    /// Bytes per KV block.
    pub block_size: usize,
}

impl Default for PeerDemoConfig {
    fn default() -> PeerDemoConfig {
        PeerDemoConfig {
            pool_size: 32 << 20,
            requests: 48,
            blocks_per_request: 8,
            block_size: 256 << 10,
        }
    }
}

fn io(e: std::io::Error) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, e.to_string())
}

fn failed(what: String) -> Error {
    Error::new(ErrorCode::INTERNAL_ERROR, what)
}

/// Waits until `peer`'s ring has `members` members; how long it took.
async fn ring_of(peer: &PeerNode, members: usize) -> Result<Duration> {
    let started = Instant::now();
    while peer.members().len() != members || !peer.is_ready() {
        if started.elapsed() > Duration::from_secs(15) {
            return Err(failed(format!(
                "peer {} sees {:?}, not {members} members",
                peer.name(),
                peer.members()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
}

/// Runs the peer demo, reporting progress to `out`. Fails if any check fails.
pub async fn run(config: &PeerDemoConfig, out: &mut dyn Write) -> Result<()> {
    let start = |seeds: Vec<String>| {
        PeerNode::start(
            PeerConfig::new("127.0.0.1:0", seeds, config.pool_size),
            None,
        )
    };
    let storage = start(Vec::new()).await?;
    let seeds = vec![storage.address().to_string()];
    let prefill = start(seeds.clone()).await?;
    let decode = start(seeds).await?;
    let result = workload(config, &storage, &prefill, &decode, out).await;
    for peer in [&storage, &prefill, &decode] {
        peer.stop();
    }
    result?;
    writeln!(out, "peer demo finished: every check passed").map_err(io)?;
    Ok(())
}

async fn workload(
    config: &PeerDemoConfig,
    storage: &PeerNode,
    prefill: &PeerNode,
    decode: &PeerNode,
    out: &mut dyn Write,
) -> Result<()> {
    for peer in [storage, prefill, decode] {
        ring_of(peer, 3).await?;
    }
    writeln!(
        out,
        "peer cluster: 3 peers x {:.0} MiB on loopback TCP (storage {}, prefill {}, decode {}), \
         no master; each directory entry on 2 peers",
        mib(config.pool_size),
        storage.address(),
        prefill.address(),
        decode.address()
    )
    .map_err(io)?;

    // The request stream: prefill writes a request's blocks, decode reads them and checks them.
    let started = Instant::now();
    let mut blocks = Vec::new();
    let mut verified = 0u64;
    for request in 0..config.requests {
        for b in 0..config.blocks_per_request {
            let key = format!("llama-8b/req-{request:04}/kv-{b:02}");
            let value = content(2_000_000 + (request * 100 + b) as u64, config.block_size);
            prefill.put(&key, &value).await?;
            match decode.get(&key).await? {
                Some(got) if got == value => verified += got.len() as u64,
                Some(_) => {
                    return Err(failed(format!(
                        "decode read {key} and got bytes prefill did not write"
                    )));
                }
                None => return Err(failed(format!("decode did not find {key}, just written"))),
            }
            blocks.push((key, value));
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    writeln!(
        out,
        "streamed {} requests: prefill wrote {} blocks ({:.0} MiB) into its own pool, decode \
         read each from there and checked {:.0} MiB byte for byte, in {:.2} s",
        config.requests,
        blocks.len(),
        mib((blocks.len() * config.block_size) as u64),
        mib(verified),
        elapsed
    )
    .map_err(io)?;

    let held = check_all(&blocks, decode).await?;
    let sizes = prefill.sizes();
    writeln!(
        out,
        "prefill's pool holds {} blocks ({:.0} of {:.0} MiB): the {} oldest were evicted there \
         and read as misses, never other bytes, and `exists` agrees for every block",
        sizes.values,
        mib(sizes.used_bytes),
        mib(sizes.pool_bytes),
        blocks.len() - held
    )
    .map_err(io)?;
    if held == 0 || held == blocks.len() {
        return Err(failed(format!(
            "{held} of {} blocks held: the stream should outgrow the pool",
            blocks.len()
        )));
    }

    // The storage peer stops without a word: the other owner of each entry answers.
    storage.stop();
    let again = check_all(&blocks, decode).await?;
    if again != held {
        return Err(failed(format!(
            "{held} blocks were found before the storage peer stopped, {again} right after"
        )));
    }
    let noticed = ring_of(prefill, 2).await?;
    ring_of(decode, 2).await?;
    let after = check_all(&blocks, decode).await?;
    if after != held {
        return Err(failed(format!(
            "{held} blocks were found before the ring changed, {after} after"
        )));
    }
    writeln!(
        out,
        "storage peer stopped without a word: all {held} held blocks found at once through \
         the other directory owner; the ring changed {:.1} s later (its silence) and all \
         {held} were found again",
        noticed.as_secs_f64()
    )
    .map_err(io)?;

    // Decode's peer leaves with a goodbye: prefill's ring drops it at once.
    let left = Instant::now();
    decode.leave().await;
    ring_of(prefill, 1).await?;
    writeln!(
        out,
        "decode's peer left with a goodbye: prefill's ring dropped it after {:.0} ms",
        left.elapsed().as_secs_f64() * 1e3
    )
    .map_err(io)?;
    Ok(())
}

/// Reads every block through `reader`, checking the bytes of each found and that `exists`
/// agrees with each read; how many were found.
async fn check_all(blocks: &[(String, Vec<u8>)], reader: &PeerNode) -> Result<usize> {
    let keys: Vec<&str> = blocks.iter().map(|(k, _)| k.as_str()).collect();
    let exists = reader.exists(&keys).await;
    let mut found = 0;
    for ((key, value), exists) in blocks.iter().zip(exists) {
        let got = reader.get(key).await?;
        match &got {
            Some(got) if got == value => found += 1,
            Some(_) => return Err(failed(format!("{key} read as bytes never written"))),
            None => {}
        }
        if exists != got.is_some() {
            return Err(failed(format!(
                "exists says {exists} for {key}, but it reads as {}",
                if got.is_some() { "found" } else { "a miss" }
            )));
        }
    }
    Ok(found)
}
