//! The phases this process measures as the reader: gets and batch gets of each size (beside
//! a memcpy of the same values, the yardstick), then exists and batch exists.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use mooring_core::Result;

use super::objects::{key, objects_for, value};
use super::report::{Phase, human_size};
use super::{BenchConfig, protocol_error};
use crate::client::Client;

/// Keys per exist batch.
const EXIST_BATCH: usize = 1000;

fn progress(enabled: bool, len: u64, label: String) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>22} [{bar:30}] {pos}/{len} {per_sec}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label);
    bar
}

pub(super) async fn read_phases(
    reader: &Client,
    config: &BenchConfig,
    run: &str,
    size: u64,
) -> Result<Vec<Phase>> {
    let objects = objects_for(size, config.count);
    let expected: Vec<Vec<u8>> = (0..objects).map(|i| value(size, i)).collect();
    let mut buf = vec![0u8; size as usize];
    // The yardstick: one thread copying the same values (as many, as large, in the same
    // order) from memory into the same buffer.
    let mut lat = Vec::with_capacity(config.count);
    for n in 0..config.count {
        let source = &expected[n % objects];
        let t = Instant::now();
        buf.copy_from_slice(std::hint::black_box(source));
        std::hint::black_box(&mut buf);
        lat.push(t.elapsed());
    }
    let memcpy = Phase::from_latencies("memcpy", size, 1, lat);
    let bar = progress(
        config.progress,
        config.count as u64,
        format!("get {}", human_size(size)),
    );
    let mut lat = Vec::with_capacity(config.count);
    for n in 0..config.count {
        let i = n % objects;
        let k = key(run, size, i);
        let t = Instant::now();
        let len = reader.get_into(&k, &mut buf).await?;
        lat.push(t.elapsed());
        if len != size as usize || buf != expected[i] {
            return Err(protocol_error(format!("{k} read back wrong")));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut phases = vec![memcpy, Phase::from_latencies("get", size, 1, lat)];

    let batch = config.batch.min(objects);
    let rounds = config.count.div_ceil(batch);
    let bar = progress(
        config.progress,
        rounds as u64,
        format!("batch-{batch} get {}", human_size(size)),
    );
    let mut bufs = vec![vec![0u8; size as usize]; batch];
    let mut lat = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let first = (round * batch) % objects;
        let ids: Vec<usize> = (0..batch).map(|j| (first + j) % objects).collect();
        let keys: Vec<String> = ids.iter().map(|&i| key(run, size, i)).collect();
        let mut items: Vec<(&str, &mut [u8])> = keys
            .iter()
            .map(String::as_str)
            .zip(bufs.iter_mut().map(Vec::as_mut_slice))
            .collect();
        let t = Instant::now();
        let results = reader.batch_get_into(&mut items).await;
        lat.push(t.elapsed());
        for (j, r) in results.into_iter().enumerate() {
            r?;
            if bufs[j] != expected[ids[j]] {
                return Err(protocol_error(format!("{} read back wrong", keys[j])));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    phases.push(Phase::from_latencies(
        &format!("batch{batch}-get"),
        size,
        batch as u64,
        lat,
    ));
    Ok(phases)
}

pub(super) async fn exist_phases(
    reader: &Client,
    config: &BenchConfig,
    run: &str,
) -> Result<Vec<Phase>> {
    let size = config.sizes[0];
    let objects = objects_for(size, config.count);
    let bar = progress(config.progress, config.count as u64, "exist".into());
    let mut lat = Vec::with_capacity(config.count);
    for n in 0..config.count {
        let k = key(run, size, n % objects);
        let t = Instant::now();
        let found = reader.exist(&k).await?;
        lat.push(t.elapsed());
        if !found {
            return Err(protocol_error(format!("{k} should exist")));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut phases = vec![Phase::from_latencies("exist", 0, 1, lat)];
    let keys: Vec<String> = (0..EXIST_BATCH)
        .map(|i| key(run, size, i % objects))
        .collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let rounds = config.count.div_ceil(10).max(10);
    let mut lat = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let found = reader.batch_exist(&refs).await?;
        lat.push(t.elapsed());
        if !found.iter().all(|r| matches!(r, Ok(true))) {
            return Err(protocol_error("a batch exist missed a key"));
        }
    }
    phases.push(Phase::from_latencies(
        &format!("batch{EXIST_BATCH}-exist"),
        0,
        EXIST_BATCH as u64,
        lat,
    ));
    Ok(phases)
}
