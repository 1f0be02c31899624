//! Puts from and gets into device memory, through the staging pool, wave by wave.
//!
//! A batch is cut into waves that each fit one slab (`mooring_core::client::StagingWaves`).
//! For a put, wave `w`'s copy off the device is started, wave `w - 1` is sent while it runs,
//! and only then is the copy waited for; for a get, wave `w` is received while wave `w - 1`'s
//! copy onto the device runs. Values leave and arrive through the slab, so the client
//! checksums exactly the bytes it sends and delivers exactly the bytes it checked.
//!
//! A call never waits for a slab while it holds one (it finishes its previous wave first when
//! none is free), so any number of threads can share a pool without deadlock. A copy still
//! running when a call is abandoned is waited for before its slab is reused.

use std::future::Future;

use mooring_core::client::{StagingWaves, Wave};
use mooring_core::{Error, ErrorCode, Result};

use crate::memory::{CopyPart, Direction, PendingCopy};
use crate::pool::{Slab, StagingPool};

/// A piece of a value in device memory: `len` bytes at device address `addr`. A value is the
/// concatenation of its parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// The device address.
    pub addr: usize,
    /// How many bytes.
    pub len: usize,
}

/// Where staged values go: the client's batch write, begun once for the whole batch, fed wave
/// by wave, ended once.
pub trait PutFrom {
    /// A begun batch.
    type Batch: Send;

    /// Begins the batch: `(index in the batch, size)` for each value that will be sent.
    fn begin(&self, items: &[(usize, u64)]) -> impl Future<Output = Self::Batch> + Send;

    /// Sends a wave: `(index in the batch, the value's bytes)` per item; one result per item,
    /// in order.
    fn send(
        &self,
        batch: &mut Self::Batch,
        items: &[(usize, &[u8])],
    ) -> impl Future<Output = Vec<Result<()>>> + Send;

    /// Ends the batch, told how each begun value's bytes went (`(index, outcome)`); the
    /// final result per begun value, in the same order.
    fn end(
        &self,
        batch: Self::Batch,
        sent: Vec<(usize, Result<()>)>,
    ) -> impl Future<Output = Vec<Result<()>>> + Send;
}

/// Where values come from: the client's batch read, begun once for the whole batch (where the
/// values are, under one lease) and read wave by wave.
pub trait GetInto {
    /// A begun batch.
    type Batch: Send + Sync;

    /// Begins the batch for the items at these indexes.
    fn begin(&self, items: &[usize]) -> impl Future<Output = Self::Batch> + Send;

    /// Reads a wave: `(index in the batch, where to read it)` per item; one result per item,
    /// in order: the value's length.
    fn get(
        &self,
        batch: &Self::Batch,
        items: &mut [(usize, &mut [u8])],
    ) -> impl Future<Output = Vec<Result<usize>>> + Send;
}

fn too_large(size: u64, pool: &StagingPool) -> Error {
    Error::new(
        ErrorCode::INVALID_PARAMS,
        format!(
            "a {size}-byte value in device memory does not fit a {}-byte staging slab: raise device_staging_size (to at least {} bytes) or split the value",
            pool.slab_bytes(),
            size * crate::pool::SLABS as u64
        ),
    )
}

/// The byte total of each item's parts.
fn sizes(items: &[Vec<Part>]) -> Vec<u64> {
    items
        .iter()
        .map(|parts| parts.iter().map(|p| p.len as u64).sum())
        .collect()
}

/// Each item's size, the batch's waves, and a result per item: `ok` for now, or the refusal
/// of an item too large for a slab.
fn planned<T: Clone>(
    pool: &StagingPool,
    items: &[Vec<Part>],
    ok: T,
) -> (Vec<u64>, StagingWaves, Vec<Result<T>>) {
    let sizes = sizes(items);
    let plan = StagingWaves::plan(&sizes, pool.slab_bytes() as u64, pool.wave_bytes() as u64);
    let mut results = vec![Ok(ok); items.len()];
    for &i in &plan.too_large {
        results[i] = Err(too_large(sizes[i], pool));
    }
    (sizes, plan, results)
}

/// Fails every item of `wave` with `error`.
fn fail_wave<T>(results: &mut [Result<T>], wave: &Wave, error: &Error) {
    for &(i, _) in &wave.items {
        results[i] = Err(error.clone());
    }
}

/// A slab for the next wave; with a previous wave still holding one and none free, `finish`
/// releases the previous wave first.
async fn next_slab<'p, P, F, Fut>(
    pool: &'p StagingPool,
    previous: &mut Option<P>,
    finish: F,
) -> Result<Slab<'p>>
where
    F: FnOnce(P) -> Fut,
    Fut: Future<Output = ()>,
{
    if previous.is_some() {
        if let Some(slab) = pool.try_acquire() {
            return slab;
        }
        if let Some(p) = previous.take() {
            finish(p).await;
        }
    }
    pool.acquire().await
}

/// A wave staged in a slab, waiting to be sent: `(index, offset, size)` per item.
struct Staged<'p> {
    slab: Slab<'p>,
    items: Vec<(usize, usize, usize)>,
}

/// Stores each item (a value in device memory, as parts) through `sink`, staging it in
/// `pool`; one result per item.
pub async fn put_from<S: PutFrom>(
    pool: &StagingPool,
    items: &[Vec<Part>],
    sink: &S,
) -> Vec<Result<()>> {
    let (sizes, plan, mut results) = planned(pool, items, ());
    let begun: Vec<(usize, u64)> = plan
        .waves
        .iter()
        .flat_map(|w| w.items.iter().map(|&(i, _)| (i, sizes[i])))
        .collect();
    if begun.is_empty() {
        return results;
    }
    let mut batch = sink.begin(&begun).await;
    let send = async |staged: Staged<'_>, batch: &mut S::Batch, results: &mut Vec<Result<()>>| {
        let buffer = staged.slab.buffer();
        let values: Vec<(usize, &[u8])> = staged
            .items
            .iter()
            .map(|&(i, at, len)| (i, buffer.bytes(at..at + len)))
            .collect();
        let outcomes = sink.send(batch, &values).await;
        for (&(i, _, _), outcome) in staged.items.iter().zip(outcomes) {
            results[i] = outcome;
        }
    };
    let mut staged: Option<Staged<'_>> = None;
    for wave in &plan.waves {
        let slab = {
            let (results, batch) = (&mut results, &mut batch);
            next_slab(pool, &mut staged, async |s| send(s, batch, results).await).await
        };
        let slab = match slab {
            Ok(slab) => slab,
            Err(e) => {
                fail_wave(&mut results, wave, &e);
                continue;
            }
        };
        let base = slab.buffer().addr();
        let mut parts = Vec::new();
        let mut placed = Vec::with_capacity(wave.items.len());
        for &(i, offset) in &wave.items {
            let mut at = offset as usize;
            for part in &items[i] {
                parts.push(CopyPart {
                    device: part.addr,
                    host: base + at,
                    len: part.len,
                });
                at += part.len;
            }
            placed.push((i, offset as usize, sizes[i] as usize));
        }
        // Started before the previous wave is sent, so the two overlap.
        let copying = pool.device().copy(Direction::ToHost, &parts);
        if let Some(previous) = staged.take() {
            send(previous, &mut batch, &mut results).await;
        }
        match copying.and_then(|mut copy| copy.wait()) {
            Ok(()) => {
                staged = Some(Staged {
                    slab,
                    items: placed,
                })
            }
            Err(e) => {
                for &(i, _, _) in &placed {
                    results[i] = Err(e.clone());
                }
            }
        }
    }
    if let Some(previous) = staged.take() {
        send(previous, &mut batch, &mut results).await;
    }
    let sent: Vec<(usize, Result<()>)> = begun
        .iter()
        .map(|&(i, _)| (i, results[i].clone()))
        .collect();
    let ended = sink.end(batch, sent).await;
    for (&(i, _), outcome) in begun.iter().zip(ended) {
        results[i] = outcome;
    }
    results
}

/// A wave received and on its way onto the device: `(index, length read)` per item read.
struct Delivering<'p> {
    _slab: Slab<'p>,
    copy: Result<Box<dyn PendingCopy>>,
    read: Vec<(usize, usize)>,
}

/// Waits for a wave's copy onto the device and records each item's result.
fn delivered(wave: Delivering<'_>, results: &mut [Result<usize>]) {
    let Delivering { _slab, copy, read } = wave;
    let outcome = copy.and_then(|mut copy| copy.wait());
    for (i, len) in read {
        results[i] = outcome.clone().map(|()| len);
    }
}

/// Reads each item (a destination in device memory, as parts) from `source`, receiving it
/// into `pool`'s slabs and copying it onto the device; one result per item: the value's
/// length.
pub async fn get_into<G: GetInto>(
    pool: &StagingPool,
    items: &[Vec<Part>],
    source: &G,
) -> Vec<Result<usize>> {
    let (sizes, plan, mut results) = planned(pool, items, 0);
    let begun: Vec<usize> = plan
        .waves
        .iter()
        .flat_map(|w| w.items.iter().map(|&(i, _)| i))
        .collect();
    if begun.is_empty() {
        return results;
    }
    let batch = source.begin(&begun).await;
    let mut delivering: Option<Delivering<'_>> = None;
    for wave in &plan.waves {
        let slab = {
            let results = &mut results;
            next_slab(pool, &mut delivering, async |d| delivered(d, results)).await
        };
        let mut slab = match slab {
            Ok(slab) => slab,
            Err(e) => {
                fail_wave(&mut results, wave, &e);
                continue;
            }
        };
        let base = slab.buffer().addr();
        let got = {
            let mut rest = slab.buffer_mut().bytes_mut(0..wave.bytes as usize);
            let mut consumed = 0;
            let mut slices = Vec::with_capacity(wave.items.len());
            for &(i, offset) in &wave.items {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(offset as usize - consumed);
                let (mine, after) = tail.split_at_mut(sizes[i] as usize);
                slices.push((i, mine));
                rest = after;
                consumed = offset as usize + sizes[i] as usize;
            }
            source.get(&batch, &mut slices).await
        };
        // The previous wave's copy onto the device ran while this one was received.
        if let Some(previous) = delivering.take() {
            delivered(previous, &mut results);
        }
        let mut parts = Vec::new();
        let mut read = Vec::new();
        for (&(i, offset), outcome) in wave.items.iter().zip(got) {
            match outcome {
                Ok(len) => {
                    let mut left = len;
                    let mut at = base + offset as usize;
                    for part in &items[i] {
                        let n = left.min(part.len);
                        if n == 0 {
                            break;
                        }
                        parts.push(CopyPart {
                            device: part.addr,
                            host: at,
                            len: n,
                        });
                        at += n;
                        left -= n;
                    }
                    read.push((i, len));
                }
                Err(e) => results[i] = Err(e),
            }
        }
        let copy = pool.device().copy(Direction::ToDevice, &parts);
        delivering = Some(Delivering {
            _slab: slab,
            copy,
            read,
        });
    }
    if let Some(previous) = delivering.take() {
        delivered(previous, &mut results);
    }
    results
}

/// Copies host bytes onto the device and waits: `(device address, bytes)` per piece. For
/// values already in host memory (Mooncake's `get_into_ranges` reads whole values first).
pub fn copy_to_device(pool: &StagingPool, pieces: &[(usize, &[u8])]) -> Result<()> {
    let parts: Vec<CopyPart> = pieces
        .iter()
        .filter(|(_, bytes)| !bytes.is_empty())
        .map(|&(device, bytes)| CopyPart {
            device,
            host: bytes.as_ptr() as usize,
            len: bytes.len(),
        })
        .collect();
    if parts.is_empty() {
        return Ok(());
    }
    pool.device().copy(Direction::ToDevice, &parts)?.wait()
}

/// Copies device bytes into host memory and waits: `(device address, destination)` per
/// piece. For small reads the CPU must inspect (a tensor's header).
pub fn copy_to_host(pool: &StagingPool, pieces: &mut [(usize, &mut [u8])]) -> Result<()> {
    let parts: Vec<CopyPart> = pieces
        .iter_mut()
        .filter(|(_, bytes)| !bytes.is_empty())
        .map(|(device, bytes)| CopyPart {
            device: *device,
            host: bytes.as_mut_ptr() as usize,
            len: bytes.len(),
        })
        .collect();
    if parts.is_empty() {
        return Ok(());
    }
    pool.device().copy(Direction::ToHost, &parts)?.wait()
}
