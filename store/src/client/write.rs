//! Writes: put, upsert and their batches (two-phase: start, transfer, end or abort).

use mooring_core::Millis;
use mooring_core::client::write_plan::{self, BusyRetry, Finish, WritePlan};

use super::*;

impl Client {
    /// Stores `value` under `key`, read from wherever it lies (a caller's registered buffer
    /// too: there is no separate `put_from`). Objects are immutable: an existing key fails
    /// with `OBJECT_ALREADY_EXISTS` (see [`Client::upsert`]).
    pub async fn put(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.operation("put", key, self.write(key, value, config, false))
            .await
    }

    /// Stores `value` under `key` whether or not it exists (upsert; see docs/upsert.md).
    pub async fn upsert(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.operation("upsert", key, self.write(key, value, config, true))
            .await
    }

    pub(super) async fn write(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Result<()> {
        let (grant, started) = self
            .start_write(key, value.len() as u64, config, upsert)
            .await?;
        buggify::hold(Site::CLIENT_AFTER_PUT_START).await;
        let result = self
            .write_batch(&[(&grant, value)], started)
            .await
            .pop()
            .expect("one result");
        buggify::hold(Site::CLIENT_BEFORE_PUT_END).await;
        self.finish_write(key, &grant, result).await
    }

    /// Starts a put or upsert, retrying a start refused as busy as [`BusyRetry`] says; the
    /// grant, and when the granted request was sent (where its write fence starts).
    pub(super) async fn start_write(
        &self,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Result<(PutGrant, Millis)> {
        let lease = self.cluster_info().lease_ttl;
        let contact = &self.inner.presence.contact;
        let patience = buggify::timeout(
            Site::CLIENT_BUSY_RETRY,
            Duration::from_millis(BusyRetry::patience(lease).as_millis()),
        );
        let mut retry =
            BusyRetry::giving_up_after(lease, Millis(patience.as_millis() as u64), contact.now());
        loop {
            let request = PutStart {
                client: self.id(),
                key: key.to_string(),
                size,
                config: config.clone(),
                upsert,
            };
            let sent = contact.now();
            match self.call_as_member(request).await {
                Ok(grant) => return Ok((grant, sent)),
                Err(e) => match retry.after(&e, contact.now()) {
                    Some(wait) => tokio::time::sleep(Duration::from_millis(wait.as_millis())).await,
                    None => return Err(e),
                },
            }
        }
    }

    /// Ends a write after its transfers: End (with the checksum of the value written) on
    /// success, Abort on failure.
    pub(super) async fn finish_write(
        &self,
        key: &str,
        grant: &PutGrant,
        transfer: Result<Checksum>,
    ) -> Result<()> {
        let client = self.id();
        let (key, write) = (key.to_string(), grant.write_id);
        let checksum = match write_plan::finish(&transfer) {
            Finish::End(checksum) => checksum,
            Finish::Abort => {
                self.abort_write(key, write).await;
                return transfer.map(|_| ());
            }
        };
        let end = PutEnd {
            client,
            key: key.clone(),
            write,
            checksum,
        };
        let ended = self.call(end).await;
        if let Err(e) = &ended
            && write_plan::abort_after_refused_end(e)
        {
            self.abort_write(key, write).await;
        }
        ended
    }

    /// Aborts a write whose bytes did not land (or were refused); if the abort is lost, the
    /// master discards the write on its own.
    async fn abort_write(&self, key: String, write: WriteId) {
        let client = self.id();
        if let Err(abort) = self.call(PutAbort { client, key, write }).await {
            debug!("aborting a failed write also failed (the master will discard it): {abort}");
        }
    }

    /// Stores many values: one start RPC, all transfers in parallel grouped per node, one end
    /// RPC (and one abort RPC for failures).
    pub async fn batch_put(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let first = items.first().map_or("", |(key, _)| *key);
        self.operation("batch_put", first, self.batch_write(items, config, false))
            .await
    }

    /// [`Client::batch_put`] from caller buffers.
    pub async fn batch_put_from(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let first = items.first().map_or("", |(key, _)| *key);
        self.operation(
            "batch_put_from",
            first,
            self.batch_write(items, config, false),
        )
        .await
    }

    /// Upserts many values, pipelined like [`Client::batch_put`].
    pub async fn batch_upsert(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        let first = items.first().map_or("", |(key, _)| *key);
        self.operation("batch_upsert", first, self.batch_write(items, config, true))
            .await
    }

    pub(super) async fn batch_write(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<Result<()>> {
        let sizes: Vec<(&str, u64)> = items.iter().map(|(k, v)| (*k, v.len() as u64)).collect();
        let write = self.start_batch_write(&sizes, config, upsert).await;
        let wave: Vec<(usize, &[u8])> = items.iter().map(|(_, v)| *v).enumerate().collect();
        let transfers = self.write_wave(&write, &wave).await;
        self.end_batch_write(write, transfers).await
    }

    /// Starts a batch of writes with one request; their bytes then go out in one or more
    /// [`Client::write_wave`]s and [`Client::end_batch_write`] ends them. Values staged a wave
    /// at a time (from device memory) are written this way, so a batch costs one start and
    /// one end however many waves carry it.
    pub async fn start_batch_write(
        &self,
        items: &[(&str, u64)],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> StartedWrite {
        let started = self.inner.presence.contact.now();
        let grants = match self
            .call_as_member(BatchPutStart {
                client: self.id(),
                items: items.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                config: config.clone(),
                upsert,
            })
            .await
            .and_then(|grants| per_key(grants, items.len(), "BatchPutStart"))
        {
            Ok(grants) => grants,
            Err(e) => vec![Err(e); items.len()],
        };
        StartedWrite {
            keys: items.iter().map(|(k, _)| k.to_string()).collect(),
            sizes: items.iter().map(|(_, v)| *v).collect(),
            grants,
            started,
        }
    }

    /// Writes some of a started batch's values, each given as `(index in the batch, bytes)`,
    /// all in parallel, stopping at the fence that runs from the batch's start. One result per
    /// item: its checksum, or why it did not land (a key the master refused fails with the
    /// refusal).
    pub async fn write_wave(
        &self,
        write: &StartedWrite,
        wave: &[(usize, &[u8])],
    ) -> Vec<Result<Checksum>> {
        let mut results: Vec<Option<Result<Checksum>>> = Vec::with_capacity(wave.len());
        let mut jobs: Vec<(&PutGrant, &[u8])> = Vec::new();
        for &(i, bytes) in wave {
            let outcome = match (write.grants.get(i), write.sizes.get(i)) {
                (Some(Ok(grant)), Some(&size)) if size == bytes.len() as u64 => {
                    jobs.push((grant, bytes));
                    None
                }
                (Some(Ok(_)), Some(&size)) => Some(Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!(
                        "{} bytes given for a {size}-byte write of {:?}",
                        bytes.len(),
                        write.keys[i]
                    ),
                ))),
                (Some(Err(e)), _) => Some(Err(e.clone())),
                _ => Some(Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("item {i} is not in the batch"),
                ))),
            };
            results.push(outcome);
        }
        let landed = if jobs.is_empty() {
            Vec::new()
        } else {
            self.write_batch(&jobs, write.started).await
        };
        let mut transfers = landed.into_iter();
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| transfers.next().expect("one per job")))
            .collect()
    }

    /// Ends a started batch: End (in one request) for each value whose transfer landed, with
    /// its checksum; Abort for each granted value whose transfer failed or never ran. One
    /// result per key of the batch.
    pub async fn end_batch_write(
        &self,
        write: StartedWrite,
        transfers: Vec<Result<Checksum>>,
    ) -> Vec<Result<()>> {
        buggify::hold(Site::CLIENT_BEFORE_BATCH_PUT_END).await;
        let StartedWrite { keys, grants, .. } = write;
        let mut results: Vec<Result<()>> = grants
            .iter()
            .map(|g| g.as_ref().map(|_| ()).map_err(Clone::clone))
            .collect();
        let (mut ends, mut aborts) = (Vec::new(), Vec::new());
        for (i, (grant, transfer)) in grants.iter().zip(transfers).enumerate() {
            let Ok(grant) = grant else { continue };
            let (key, write) = (keys[i].clone(), grant.write_id);
            match transfer {
                Ok(checksum) => ends.push((i, (key, write, checksum))),
                Err(e) => {
                    results[i] = Err(e);
                    aborts.push((key, write));
                }
            }
        }
        for (key, write) in aborts {
            let client = self.id();
            let _ = self.call(PutAbort { client, key, write }).await;
        }
        if !ends.is_empty() {
            let request = BatchPutEnd {
                client: self.id(),
                items: ends.iter().map(|(_, e)| e.clone()).collect(),
            };
            let units = self.call(request).await;
            match units.and_then(|units| per_key(units, ends.len(), "BatchPutEnd")) {
                Ok(units) => {
                    for ((i, _), unit) in ends.iter().zip(units) {
                        results[*i] = unit;
                    }
                }
                Err(e) => {
                    for (i, _) in &ends {
                        results[*i] = Err(e.clone());
                    }
                }
            }
        }
        results
    }

    /// Writes each value to every replica of its grant, grouped per node, all in parallel,
    /// stopping at the writer's fence. One result per job: the checksum of the value, summed
    /// as it went out (every replica's copy must agree).
    pub(super) async fn write_batch(
        &self,
        jobs: &[(&PutGrant, &[u8])],
        started: Millis,
    ) -> Vec<Result<Checksum>> {
        // Each value's blocks are freed by its own bound if the master abandons it; the batch
        // moves together, so it keeps to the smallest value's.
        let smallest = jobs.iter().map(|(_, v)| v.len() as u64).min().unwrap_or(0);
        let fence = self.write_fence(started, smallest);
        if fence.is_zero() {
            crate::coverage::hit(crate::coverage::Path::WRITE_FENCED);
            return vec![Err(write_plan::fence_closed()); jobs.len()];
        }
        let ids: Vec<SegmentId> = jobs
            .iter()
            .flat_map(|(g, _)| g.replicas.iter().map(|r| r.segment))
            .collect();
        let nodes = match self.resolve(&ids).await {
            Ok(nodes) => nodes,
            Err(e) => return vec![Err(e); jobs.len()],
        };
        let grants: Vec<&PutGrant> = jobs.iter().map(|(g, _)| *g).collect();
        let mut plan = WritePlan::new(&grants, |segment| nodes.get(&segment).cloned());
        let transfers = plan.per_node.iter().map(|(node, ops)| async move {
            let writes = ops
                .iter()
                .map(|&(job, addr)| WriteOp {
                    addr,
                    src: jobs[job].1,
                })
                .collect();
            let write = self.inner.data.write(node, writes, fence);
            let outcome = match tokio::time::timeout(fence, write).await {
                Ok(outcome) => outcome,
                Err(_) => Err(write_plan::past_fence(&node.endpoint)),
            };
            (ops.clone(), outcome)
        });
        let landed = join_all(transfers).await;
        for (ops, outcome) in landed {
            plan.landed(&ops, outcome);
        }
        plan.outcomes()
    }

    /// How long a write of `size` bytes that started at `started` may still run: the writer's
    /// fence (see `mooring_core::client::fence`).
    pub(super) fn write_fence(&self, started: Millis, size: u64) -> Duration {
        let fence = self.inner.presence.contact.fence(started, size);
        buggify::timeout(Site::CLIENT_WRITE_FENCE, fence)
    }
}

/// A batch of writes the master answered: a grant or a refusal per key, and when the batch
/// started (its transfers' fence runs from then). See [`Client::start_batch_write`].
#[derive(Debug)]
pub struct StartedWrite {
    keys: Vec<String>,
    sizes: Vec<u64>,
    grants: Vec<Result<PutGrant>>,
    started: Millis,
}

impl StartedWrite {
    /// How many keys the batch has.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the batch has no keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}
