//! Writes: put, upsert and their batches (two-phase: start, transfer, end or abort).

use super::*;

/// A write planned for one node: (job index, remote address, bytes).
type PlannedWrite<'a> = (usize, u64, &'a [u8]);

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
        let started = Instant::now();
        let grant = self
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

    /// Starts a put or upsert. An upsert refused with `OBJECT_REPLICA_BUSY` (readers hold the
    /// value and there is no room for a fresh copy yet) is retried with backoff for up to two
    /// lease TTLs: by then the readers' leases have ended or their blocks can be evicted.
    pub(super) async fn start_write(
        &self,
        key: &str,
        size: u64,
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Result<PutGrant> {
        let lease = Duration::from_millis(self.cluster_info().lease_ttl.as_millis());
        let give_up = Instant::now() + buggify::timeout(Site::CLIENT_BUSY_RETRY, lease * 2);
        let mut backoff = Duration::from_millis(5);
        loop {
            let request = PutStart {
                client: self.id(),
                key: key.to_string(),
                size,
                config: config.clone(),
                upsert,
            };
            match self.call_as_member(request).await {
                Ok(grant) => return Ok(grant),
                Err(e) if e.code == ErrorCode::OBJECT_REPLICA_BUSY && Instant::now() < give_up => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(lease / 4).max(Duration::from_millis(1));
                }
                Err(e) => return Err(e),
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
        let checksum = match transfer {
            Ok(checksum) => checksum,
            Err(e) => {
                self.abort_write(key, write).await;
                return Err(e);
            }
        };
        let end = PutEnd {
            client,
            key: key.clone(),
            write,
            checksum,
        };
        let ended = self.call(end).await;
        // The master refuses bytes it knows to be wrong (a prefetch that does not match the
        // value's checksum): take the write back rather than leave it to the discard timeout.
        if let Err(e) = &ended
            && e.code == ErrorCode::INVALID_WRITE
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
        let started = Instant::now();
        let grants = match self
            .call_as_member(BatchPutStart {
                client: self.id(),
                items: items
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.len() as u64))
                    .collect(),
                config: config.clone(),
                upsert,
            })
            .await
            .and_then(|grants| per_key(grants, items.len(), "BatchPutStart"))
        {
            Ok(grants) => grants,
            Err(e) => return vec![Err(e); items.len()],
        };
        let started_ok: Vec<(usize, &PutGrant)> = grants
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.as_ref().ok().map(|g| (i, g)))
            .collect();
        let jobs: Vec<(&PutGrant, &[u8])> =
            started_ok.iter().map(|&(i, g)| (g, items[i].1)).collect();
        let transfers = self.write_batch(&jobs, started).await;
        buggify::hold(Site::CLIENT_BEFORE_BATCH_PUT_END).await;
        let mut results: Vec<Result<()>> = grants
            .iter()
            .map(|g| g.as_ref().map(|_| ()).map_err(Clone::clone))
            .collect();
        let (mut ends, mut aborts) = (Vec::new(), Vec::new());
        for (&(i, grant), transfer) in started_ok.iter().zip(transfers) {
            let (key, write) = (items[i].0.to_string(), grant.write_id);
            match transfer {
                Ok(checksum) => ends.push((i, (key, write, checksum))),
                Err(e) => {
                    results[i] = Err(e);
                    aborts.push((key, write));
                }
            }
        }
        if !aborts.is_empty() {
            for (key, write) in aborts {
                let client = self.id();
                let _ = self.call(PutAbort { client, key, write }).await;
            }
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
    /// stopping at the writer's self-fence. One result per job: the checksum of the value,
    /// summed as it went out (every replica's copy must agree).
    pub(super) async fn write_batch(
        &self,
        jobs: &[(&PutGrant, &[u8])],
        started: Instant,
    ) -> Vec<Result<Checksum>> {
        let fence = self.write_fence(started);
        if fence.is_zero() {
            let e = Error::new(
                ErrorCode::TRANSFER_FAIL,
                "not writing: the master has not acknowledged this client recently enough to be \
                 sure it still considers it alive (check the network path to the master)",
            );
            return vec![Err(e); jobs.len()];
        }
        let mut per_node: BTreeMap<NodeAddr, Vec<PlannedWrite<'_>>> = BTreeMap::new();
        let mut results: Vec<Result<Option<Checksum>>> = vec![Ok(None); jobs.len()];
        let ids: Vec<SegmentId> = jobs
            .iter()
            .flat_map(|(g, _)| g.replicas.iter().map(|r| r.segment))
            .collect();
        let nodes = match self.resolve(&ids).await {
            Ok(nodes) => nodes,
            Err(e) => return vec![Err(e); jobs.len()],
        };
        for (job, (grant, value)) in jobs.iter().enumerate() {
            for replica in &grant.replicas {
                match nodes.get(&replica.segment) {
                    Some(node) => {
                        per_node
                            .entry(node.clone())
                            .or_default()
                            .push((job, replica.addr, value))
                    }
                    None => results[job] = Err(segment_gone(replica.segment)),
                }
            }
        }
        let transfers = per_node.iter().map(|(node, ops)| async move {
            let write = self.inner.data.write(
                node,
                ops.iter()
                    .map(|&(_, addr, src)| WriteOp { addr, src })
                    .collect(),
                fence,
            );
            let outcome = match tokio::time::timeout(fence, write).await {
                Ok(outcome) => outcome,
                Err(_) => Err(Error::new(
                    ErrorCode::TRANSFER_FAIL,
                    format!("write to {} passed the writer's fence", node.endpoint),
                )),
            };
            (ops, outcome)
        });
        for (ops, outcome) in join_all(transfers).await {
            let sums = outcome.and_then(|sums| {
                if sums.len() == ops.len() {
                    Ok(sums)
                } else {
                    Err(Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!("{} checksums for {} writes", sums.len(), ops.len()),
                    ))
                }
            });
            match sums {
                Ok(sums) => {
                    for (&(job, _, _), sum) in ops.iter().zip(sums) {
                        results[job] = match &results[job] {
                            Ok(Some(seen)) if *seen != sum => Err(Error::new(
                                ErrorCode::WRITE_FAIL,
                                "the value changed while it was being written; put it again",
                            )),
                            Ok(_) => Ok(Some(sum)),
                            Err(e) => Err(e.clone()),
                        };
                    }
                }
                Err(e) => {
                    for &(job, _, _) in ops {
                        results[job] = Err(e.clone());
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.map(|sum| sum.unwrap_or(Checksum::EMPTY)))
            .collect()
    }

    /// How long a write that started at `started` may still run (the self-fence): until
    /// shortly before the master may release its blocks after a timeout, and only while the
    /// master cannot have presumed this client dead (see [`crate::presence::MasterContact`]).
    pub(super) fn write_fence(&self, started: Instant) -> Duration {
        let release =
            Duration::from_millis(self.cluster_info().put_start_release_timeout.as_millis());
        let release = buggify::timeout(Site::CLIENT_WRITE_FENCE, release);
        release
            .saturating_sub(release / 10)
            .saturating_sub(started.elapsed())
            .min(self.inner.presence.contact.write_window())
    }
}
