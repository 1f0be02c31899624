//! The zero-copy calls on device (GPU) memory: values staged through the device's pinned
//! slabs by `mooring_device`'s pipeline, which calls back into the client's batch put and
//! get for each wave.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use std::collections::HashMap;

use mooring::Client;
use mooring::client::{StartedReads, StartedWrite};
use mooring_core::{Checksum, Error, ErrorCode, ReplicateConfig, Result};
use mooring_device::pipeline::{copy_to_device, copy_to_host};
use mooring_device::{GetInto, Part, PutFrom, StagingPool};

use super::NativeClient;
use super::backend::Backend;
use super::mooncake::put_outcome;
use crate::errors::invalid;
use crate::values::Region;

/// Keys whose values lie in one device's memory, by their index in the caller's batch.
pub(super) struct DeviceGroup {
    pub(super) pool: Arc<StagingPool>,
    pub(super) members: Vec<(usize, Vec<Part>)>,
    /// The members' regions, kept so that they stay registered until the group is done.
    _regions: Vec<Region>,
}

/// Where a key's registered parts lie.
pub(super) enum Placement {
    /// Host memory: the CPU reads and writes it.
    Host,
    /// One device's memory, staged through its pool.
    Device,
}

/// Where `parts` lie: all in host memory, or all in one device's memory; a key split across
/// both (or across devices) is refused.
pub(super) fn placement(parts: &[Region]) -> Result<Placement> {
    let first = parts.first().and_then(Region::device);
    let same = parts.iter().all(|r| match (r.device(), first) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    });
    if !same {
        return Err(invalid(
            "a value's parts lie partly in device memory and partly elsewhere (or on two devices): give each value's parts in one device's memory, or all in host memory",
        ));
    }
    Ok(match first {
        Some(_) => Placement::Device,
        None => Placement::Host,
    })
}

/// Adds key `index` with device `parts` to its device's group.
pub(super) fn add_to_group(groups: &mut Vec<DeviceGroup>, index: usize, regions: &[Region]) {
    let Some(pool) = regions.first().and_then(Region::device) else {
        return;
    };
    let parts: Vec<Part> = regions
        .iter()
        .map(|r| Part {
            addr: r.start(),
            len: r.len(),
        })
        .collect();
    let held = regions.iter().cloned();
    match groups.iter_mut().find(|g| Arc::ptr_eq(&g.pool, pool)) {
        Some(group) => {
            group.members.push((index, parts));
            group._regions.extend(held);
        }
        None => groups.push(DeviceGroup {
            pool: Arc::clone(pool),
            members: vec![(index, parts)],
            _regions: held.collect(),
        }),
    }
}

/// The client's batch write, for the pipeline: begun once, fed wave by wave, ended once.
struct ClientPut<'a> {
    client: &'a Client,
    keys: Vec<&'a str>,
    config: &'a ReplicateConfig,
    upsert: bool,
}

/// A begun batch write, and where each batch index sits in it.
struct BegunWrite {
    write: StartedWrite,
    position: HashMap<usize, usize>,
    checksums: HashMap<usize, Result<Checksum>>,
}

impl PutFrom for ClientPut<'_> {
    type Batch = BegunWrite;

    async fn begin(&self, items: &[(usize, u64)]) -> BegunWrite {
        let sizes: Vec<(&str, u64)> = items.iter().map(|&(i, n)| (self.keys[i], n)).collect();
        BegunWrite {
            write: self
                .client
                .start_batch_write(&sizes, self.config, self.upsert)
                .await,
            position: items
                .iter()
                .enumerate()
                .map(|(p, &(i, _))| (i, p))
                .collect(),
            checksums: HashMap::new(),
        }
    }

    async fn send(&self, batch: &mut BegunWrite, items: &[(usize, &[u8])]) -> Vec<Result<()>> {
        let wave: Vec<(usize, &[u8])> = items
            .iter()
            .map(|&(i, bytes)| (batch.position[&i], bytes))
            .collect();
        let landed = self.client.write_wave(&batch.write, &wave).await;
        items
            .iter()
            .zip(landed)
            .map(|(&(i, _), outcome)| {
                let result = outcome.as_ref().map(|_| ()).map_err(Clone::clone);
                batch.checksums.insert(i, outcome);
                result
            })
            .collect()
    }

    async fn end(&self, mut batch: BegunWrite, sent: Vec<(usize, Result<()>)>) -> Vec<Result<()>> {
        let transfers: Vec<Result<Checksum>> = sent
            .into_iter()
            .map(|(i, outcome)| {
                outcome?;
                batch.checksums.remove(&i).unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        "a value was ended without being sent",
                    ))
                })
            })
            .collect();
        let ended = self.client.end_batch_write(batch.write, transfers).await;
        if self.upsert {
            ended
        } else {
            ended.into_iter().map(put_outcome).collect()
        }
    }
}

/// The client's batch read, for the pipeline: begun once, read wave by wave.
struct ClientGet<'a> {
    client: &'a Client,
    keys: Vec<&'a str>,
}

/// A begun batch read, and where each batch index sits in it.
struct BegunRead {
    reads: StartedReads,
    position: HashMap<usize, usize>,
}

impl GetInto for ClientGet<'_> {
    type Batch = BegunRead;

    async fn begin(&self, items: &[usize]) -> BegunRead {
        let keys: Vec<&str> = items.iter().map(|&i| self.keys[i]).collect();
        BegunRead {
            reads: self.client.start_batch_read(&keys).await,
            position: items.iter().enumerate().map(|(p, &i)| (i, p)).collect(),
        }
    }

    async fn get(&self, batch: &BegunRead, items: &mut [(usize, &mut [u8])]) -> Vec<Result<usize>> {
        let mut wave: Vec<(usize, &mut [u8])> = items
            .iter_mut()
            .map(|(i, b)| (batch.position[i], &mut **b))
            .collect();
        self.client.read_wave(&batch.reads, &mut wave).await
    }
}

impl NativeClient {
    /// Stores each group's keys (`keys[index]`) from device memory; `(index, result)` per
    /// member.
    pub(super) async fn put_from_devices(
        &self,
        keys: &[String],
        groups: &[DeviceGroup],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<(usize, Result<()>)> {
        let Backend::Master(client) = &self.client else {
            return self
                .put_whole_from_devices(keys, groups, config, upsert)
                .await;
        };
        let mut results = Vec::new();
        for group in groups {
            let sink = ClientPut {
                client,
                keys: group
                    .members
                    .iter()
                    .map(|(i, _)| keys[*i].as_str())
                    .collect(),
                config,
                upsert,
            };
            let items: Vec<Vec<Part>> = group.members.iter().map(|(_, p)| p.clone()).collect();
            let outcomes = mooring_device::put_from(&group.pool, &items, &sink).await;
            let moved = items
                .iter()
                .zip(&outcomes)
                .filter(|(_, o)| o.is_ok())
                .map(|(parts, _)| parts.iter().map(|p| p.len as u64).sum::<u64>())
                .sum();
            self.device_bytes_put.fetch_add(moved, Ordering::Relaxed);
            results.extend(group.members.iter().map(|(i, _)| *i).zip(outcomes));
        }
        results
    }

    /// Reads each group's keys (`keys[index]`) into device memory; `(index, length or
    /// error)` per member.
    pub(super) async fn get_into_devices(
        &self,
        keys: &[String],
        groups: &[DeviceGroup],
    ) -> Vec<(usize, Result<usize>)> {
        let Backend::Master(client) = &self.client else {
            return self.get_whole_into_devices(keys, groups).await;
        };
        let mut results = Vec::new();
        for group in groups {
            let source = ClientGet {
                client,
                keys: group
                    .members
                    .iter()
                    .map(|(i, _)| keys[*i].as_str())
                    .collect(),
            };
            let items: Vec<Vec<Part>> = group.members.iter().map(|(_, p)| p.clone()).collect();
            let outcomes = mooring_device::get_into(&group.pool, &items, &source).await;
            let moved = outcomes.iter().flatten().map(|&n| n as u64).sum();
            self.device_bytes_got.fetch_add(moved, Ordering::Relaxed);
            results.extend(group.members.iter().map(|(i, _)| *i).zip(outcomes));
        }
        results
    }
}

impl NativeClient {
    /// A peer cluster's path for device memory: each value is copied whole from the device
    /// into host memory, then stored (the staging pipeline's overlap is master mode's alone
    /// for now).
    async fn put_whole_from_devices(
        &self,
        keys: &[String],
        groups: &[DeviceGroup],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<(usize, Result<()>)> {
        let mut results = Vec::new();
        for group in groups {
            for (i, parts) in &group.members {
                let total: usize = parts.iter().map(|p| p.len).sum();
                let mut value = vec![0u8; total];
                let copied = copy_to_host(&group.pool, &mut pieces_of(parts, &mut value));
                let stored = match copied {
                    Ok(()) => self.client.write(&keys[*i], &value, config, upsert).await,
                    Err(e) => Err(e),
                };
                if stored.is_ok() {
                    self.device_bytes_put
                        .fetch_add(total as u64, Ordering::Relaxed);
                }
                results.push((*i, stored));
            }
        }
        results
    }

    /// A peer cluster's path for reads into device memory: each value is read whole, then
    /// copied to the device; its length.
    async fn get_whole_into_devices(
        &self,
        keys: &[String],
        groups: &[DeviceGroup],
    ) -> Vec<(usize, Result<usize>)> {
        let mut results = Vec::new();
        for group in groups {
            for (i, parts) in &group.members {
                let room: usize = parts.iter().map(|p| p.len).sum();
                let read = match self.client.get(&keys[*i]).await {
                    Ok(value) if value.len() > room => Err(Error::new(
                        ErrorCode::BUFFER_OVERFLOW,
                        format!(
                            "{:?} holds {} bytes, more than the {room} bytes given: give a \
                             larger buffer",
                            keys[*i],
                            value.len()
                        ),
                    )),
                    Ok(mut value) => {
                        let len = value.len();
                        let pieces = pieces_of(parts, &mut value);
                        let pieces: Vec<(usize, &[u8])> = pieces
                            .iter()
                            .map(|(addr, bytes)| (*addr, &**bytes))
                            .collect();
                        copy_to_device(&group.pool, &pieces).map(|()| len)
                    }
                    Err(e) => Err(e),
                };
                if let Ok(len) = read {
                    self.device_bytes_got
                        .fetch_add(len as u64, Ordering::Relaxed);
                }
                results.push((*i, read));
            }
        }
        results
    }
}

/// `value` cut along the device `parts` it fills or comes from, in order: each part's
/// address and its bytes (a value shorter than the parts leaves the last ones short).
fn pieces_of<'v>(parts: &[Part], value: &'v mut [u8]) -> Vec<(usize, &'v mut [u8])> {
    let mut rest = value;
    let mut pieces = Vec::with_capacity(parts.len());
    for part in parts {
        let n = part.len.min(rest.len());
        let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
        pieces.push((part.addr, piece));
        rest = tail;
    }
    pieces
}
