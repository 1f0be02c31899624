//! The zero-copy calls on device (GPU) memory: values staged through the device's pinned
//! slabs by `mooring_device`'s pipeline, which calls back into the client's batch put and
//! get for each wave.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use std::collections::HashMap;

use mooring::Client;
use mooring::client::{StartedReads, StartedWrite};
use mooring_core::{Checksum, Error, ErrorCode, ReplicateConfig, Result};
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

/// A peer cluster's writes, for the pipeline: a peer cluster has no batch to begin or end,
/// so each wave's values are stored as the wave is sent.
struct PeerPut<'a> {
    backend: &'a Backend,
    keys: Vec<&'a str>,
    config: &'a ReplicateConfig,
    upsert: bool,
}

impl PutFrom for PeerPut<'_> {
    type Batch = ();

    async fn begin(&self, _items: &[(usize, u64)]) {}

    async fn send(&self, _batch: &mut (), items: &[(usize, &[u8])]) -> Vec<Result<()>> {
        let wave: Vec<(&str, &[u8])> = items.iter().map(|&(i, b)| (self.keys[i], b)).collect();
        self.backend
            .batch_write(&wave, self.config, self.upsert, true)
            .await
    }

    async fn end(&self, _batch: (), sent: Vec<(usize, Result<()>)>) -> Vec<Result<()>> {
        sent.into_iter().map(|(_, outcome)| outcome).collect()
    }
}

/// A peer cluster's reads, for the pipeline: each wave's values are read as the wave is.
struct PeerGet<'a> {
    backend: &'a Backend,
    keys: Vec<&'a str>,
}

impl GetInto for PeerGet<'_> {
    type Batch = ();

    async fn begin(&self, _items: &[usize]) {}

    async fn get(&self, _batch: &(), items: &mut [(usize, &mut [u8])]) -> Vec<Result<usize>> {
        let mut results = Vec::with_capacity(items.len());
        for (i, room) in items.iter_mut() {
            let key = self.keys[*i];
            results.push(match self.backend.get(key).await {
                Ok(value) if value.len() > room.len() => Err(Error::new(
                    ErrorCode::BUFFER_OVERFLOW,
                    format!(
                        "{key:?} holds {} bytes, more than the {} bytes given: give a larger \
                         buffer",
                        value.len(),
                        room.len()
                    ),
                )),
                Ok(value) => {
                    room[..value.len()].copy_from_slice(&value);
                    Ok(value.len())
                }
                Err(e) => Err(e),
            });
        }
        results
    }
}

impl NativeClient {
    /// Stores each group's keys (`keys[index]`) from device memory, staged through the
    /// group's pool wave by wave; `(index, result)` per member.
    pub(super) async fn put_from_devices(
        &self,
        keys: &[String],
        groups: &[DeviceGroup],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<(usize, Result<()>)> {
        let mut results = Vec::new();
        for group in groups {
            let members: Vec<&str> = group
                .members
                .iter()
                .map(|(i, _)| keys[*i].as_str())
                .collect();
            let items: Vec<Vec<Part>> = group.members.iter().map(|(_, p)| p.clone()).collect();
            let outcomes = match &self.client {
                Backend::Master(client) => {
                    let sink = ClientPut {
                        client,
                        keys: members,
                        config,
                        upsert,
                    };
                    mooring_device::put_from(&group.pool, &items, &sink).await
                }
                backend @ Backend::Peer(_) => {
                    let sink = PeerPut {
                        backend,
                        keys: members,
                        config,
                        upsert,
                    };
                    mooring_device::put_from(&group.pool, &items, &sink).await
                }
            };
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

    /// Reads each group's keys (`keys[index]`) into device memory, staged through the
    /// group's pool wave by wave; `(index, length or error)` per member.
    pub(super) async fn get_into_devices(
        &self,
        keys: &[String],
        groups: &[DeviceGroup],
    ) -> Vec<(usize, Result<usize>)> {
        let mut results = Vec::new();
        for group in groups {
            let members: Vec<&str> = group
                .members
                .iter()
                .map(|(i, _)| keys[*i].as_str())
                .collect();
            let items: Vec<Vec<Part>> = group.members.iter().map(|(_, p)| p.clone()).collect();
            let outcomes = match &self.client {
                Backend::Master(client) => {
                    let source = ClientGet {
                        client,
                        keys: members,
                    };
                    mooring_device::get_into(&group.pool, &items, &source).await
                }
                backend @ Backend::Peer(_) => {
                    let source = PeerGet {
                        backend,
                        keys: members,
                    };
                    mooring_device::get_into(&group.pool, &items, &source).await
                }
            };
            let moved = outcomes.iter().flatten().map(|&n| n as u64).sum();
            self.device_bytes_got.fetch_add(moved, Ordering::Relaxed);
            results.extend(group.members.iter().map(|(i, _)| *i).zip(outcomes));
        }
        results
    }
}
