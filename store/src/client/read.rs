//! Reads: get and its batches, inside the lease, from memory replicas or a node's disk.

use mooring_core::client::read_plan::{
    self, READ_ATTEMPTS, ReadPlan, ReadVerdict, ReplicaFailures, read_order, value_len,
};
use mooring_core::{HoldId, Millis};

use super::*;
use crate::coverage::{self, Path};
use crate::node::memory::value_buffer;

impl Client {
    /// The value of `key`.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.operation("get", key, self.read(key, None))
            .await
            .map(|(v, _)| v.expect("owned read"))
    }

    /// Reads the value of `key` into `buf`; returns its length. `BUFFER_OVERFLOW` if `buf` is
    /// smaller than the value.
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize> {
        self.operation("get_into", key, self.read(key, Some(buf)))
            .await
            .map(|(_, n)| n)
    }

    /// The value of `key`, read under a hold instead of a lease: until the read ends, the
    /// object is not evicted, removed or upserted, however long the transfer takes (a large
    /// value over a slow link, a reader that may stall). The hold is released when the read
    /// ends, and by the master if this client dies (or is taken for dead) first.
    pub async fn get_held(&self, key: &str) -> Result<Vec<u8>> {
        self.operation("get_held", key, async {
            let mut gone = None;
            for _ in 0..READ_ATTEMPTS {
                let (read, kept) = self.read_held(key).await?;
                let (outcome, value) = match read {
                    Ok(value) => (Ok(()), Some(value)),
                    Err(e) => (Err(e), None),
                };
                match ReadPlan::judge_held(outcome, kept) {
                    ReadVerdict::Done => return Ok(value.expect("read")),
                    ReadVerdict::Outlived => {
                        debug!(key, "held read lost its hold; reading again");
                        coverage::hit(Path::HOLD_LAPSED);
                    }
                    ReadVerdict::AskAgain(e) => {
                        debug!(key, "the held copies were gone; asking again: {e}");
                        coverage::hit(Path::LISTED_COPY_GONE);
                        gone = Some(e);
                    }
                    ReadVerdict::Fail(e) => return Err(e),
                }
            }
            Err(ReadPlan::exhausted(key, gone))
        })
        .await
    }

    /// Holds `key`: until [`Client::release_hold`], the master neither evicts, removes nor
    /// replaces it (and drops the hold if this client leaves or dies). Returns the hold and
    /// the replicas it covers; `OBJECT_NOT_FOUND` if there is no such object.
    pub async fn acquire_hold(&self, key: &str) -> Result<(HoldId, ReplicaList)> {
        self.call(AcquireHold {
            client: self.id(),
            key: key.to_string(),
        })
        .await
    }

    /// Releases a hold [`Client::acquire_hold`] gave. `INVALID_PARAMS` if the master no longer
    /// has it (it dropped it, or it was released already).
    pub async fn release_hold(&self, hold: HoldId) -> Result<()> {
        self.call(ReleaseHold {
            client: self.id(),
            hold,
        })
        .await
    }

    /// One held read: its outcome, and whether the hold was still the master's to release
    /// when it ended.
    async fn read_held(&self, key: &str) -> Result<(Result<Vec<u8>>, bool)> {
        let asked = self.now();
        let (hold, list) = self.acquire_hold(key).await?;
        let read = async {
            let mut value = value_buffer(value_len(key, &list)? as u64)?;
            buggify::hold(Site::CLIENT_HELD_READ_TRANSFER).await;
            self.read_replica(key, &list.replicas, list.checksum, &mut value)
                .await
                .map(|()| value)
        }
        .await;
        if !self.inside_lease(asked, &list) {
            coverage::hit(Path::HELD_PAST_LEASE);
        }
        let released = self.release_hold(hold).await;
        if let Err(e) = &released {
            // Either the master dropped the hold already, or it keeps it until this client
            // closes or expires: worth a warning, not a failed read.
            warn!(key, "could not release the hold on {key:?}: {e}");
        }
        Ok((read, released.is_ok()))
    }

    pub(super) async fn read(
        &self,
        key: &str,
        mut into: Option<&mut [u8]>,
    ) -> Result<(Option<Vec<u8>>, usize)> {
        let mut gone: Option<Error> = None;
        for _ in 0..READ_ATTEMPTS {
            let asked = self.now();
            let list = self
                .call(GetReplicaList {
                    key: key.to_string(),
                })
                .await?;
            let size = value_len(key, &list)?;
            let mut owned = Vec::new();
            let caller_buffer = into.is_some();
            let read = {
                let buf: &mut [u8] = match into.as_deref_mut() {
                    Some(buf) if buf.len() < size => {
                        return Err(Error::new(
                            ErrorCode::BUFFER_OVERFLOW,
                            format!("{key:?} is {size} bytes, the buffer {}", buf.len()),
                        ));
                    }
                    Some(buf) => &mut buf[..size],
                    None => {
                        owned = value_buffer(size as u64)?;
                        &mut owned[..]
                    }
                };
                // A simulation may stall the reader here, inside its lease, so the race between
                // a reader holding descriptors and eviction or upsert of the same bytes is hit.
                buggify::hold(Site::CLIENT_BEFORE_READ_TRANSFER).await;
                self.read_replica(key, &list.replicas, list.checksum, buf)
                    .await
            };
            // Past its lease a read's blocks may have been reused under it: bytes that fail
            // their checksum then say nothing about the replicas, and the read starts over.
            match ReadPlan::judge(read, self.inside_lease(asked, &list)) {
                ReadVerdict::Done if caller_buffer => return Ok((None, size)),
                ReadVerdict::Done => return Ok((Some(owned), size)),
                ReadVerdict::AskAgain(e) => {
                    debug!(key, "the listed copies were gone; asking again: {e}");
                    coverage::hit(Path::LISTED_COPY_GONE);
                    gone = Some(e);
                }
                ReadVerdict::Outlived => {
                    debug!(key, "read outlived its lease; retrying");
                    coverage::hit(Path::READ_OUTLIVED_LEASE);
                }
                ReadVerdict::Fail(e) => return Err(e),
            }
        }
        Err(ReadPlan::exhausted(key, gone))
    }

    /// Whether a read asked for at `asked` under `list`'s lease is still inside it (a
    /// simulation may shorten the lease the reader trusts).
    pub(super) fn inside_lease(&self, asked: Millis, list: &ReplicaList) -> bool {
        let lease = buggify::timeout(
            Site::CLIENT_READ_LEASE,
            Duration::from_millis(list.lease_ttl.as_millis()),
        );
        ReadPlan {
            lease_ttl: Millis(lease.as_millis() as u64),
        }
        .inside_lease(asked, self.now())
    }

    /// The client's clock (the one its write fence runs on).
    pub(super) fn now(&self) -> Millis {
        self.inner.presence.contact.now()
    }

    /// Reads one of `key`'s `replicas` into `buf`, trying the next on failure or when the
    /// bytes do not match the value's `checksum` (memory replicas before the disk one).
    pub(super) async fn read_replica(
        &self,
        key: &str,
        replicas: &[ReplicaDescriptor],
        checksum: Checksum,
        buf: &mut [u8],
    ) -> Result<()> {
        let ids: Vec<SegmentId> = replicas.iter().map(|r| r.segment).collect();
        let nodes = self.resolve(&ids).await?;
        let mut failures = ReplicaFailures::default();
        for replica in self.read_order(replicas) {
            let Some(node) = nodes.get(&replica.segment) else {
                failures.record(segment_gone(replica.segment));
                continue;
            };
            let read = match replica.medium {
                Medium::Memory => {
                    let op = ReadOp {
                        addr: replica.addr,
                        dest: &mut *buf,
                    };
                    let sums = self.inner.data.read(node, vec![op]).await;
                    sums.and_then(|sums| one_sum(&sums))
                }
                Medium::Disk => self.read_disk(node, key, replica.addr, buf).await,
            };
            let read = read.and_then(|got| read_plan::verify(key, replica, checksum, got));
            match read {
                Ok(()) => {
                    if replica.medium == Medium::Disk {
                        coverage::hit(Path::READ_FROM_DISK);
                    }
                    if failures.any {
                        coverage::hit(Path::READ_FELL_BACK);
                    }
                    return Ok(());
                }
                Err(e) => {
                    if e.code == ErrorCode::INVALID_REPLICA {
                        warn!(key, segment = %replica.segment, medium = ?replica.medium, "a replica failed its checksum; reading another");
                    }
                    debug!(endpoint = %node.endpoint, "replica read failed, trying another: {e}");
                    if failures.record(e) {
                        coverage::hit(Path::STALE_COPY_AFTER_FAILURE);
                    }
                }
            }
        }
        Err(failures.into_error())
    }

    /// Reads `key`'s disk copy from `node`: the node stages it, this client pulls it from the
    /// staging buffer with a one-sided read, then frees the slot (the node reclaims it after
    /// its TTL if the unstage is lost). Returns the checksum of the bytes read.
    pub(super) async fn read_disk(
        &self,
        node: &NodeAddr,
        key: &str,
        write: u64,
        buf: &mut [u8],
    ) -> Result<Checksum> {
        buggify::hold(Site::CLIENT_BEFORE_STAGE).await;
        let asked = self.now();
        let stored = self.stored_key(key)?;
        let staged = self
            .inner
            .data
            .stage(node, &stored, write, buf.len() as u64)
            .await?;
        if staged.len != buf.len() as u64 {
            return Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!(
                    "node staged {} bytes of a {}-byte value",
                    staged.len,
                    buf.len()
                ),
            ));
        }
        let staging = NodeAddr {
            endpoint: node.endpoint.clone(),
            key: staged.key,
            rdma_key: staged.rdma_key,
        };
        let op = ReadOp {
            addr: staged.addr,
            dest: buf,
        };
        buggify::hold(Site::CLIENT_BEFORE_STAGED_PULL).await;
        let read = self.inner.data.read(&staging, vec![op]).await;
        // The slot's TTL is counted from after the load, so after `asked`.
        let in_time = read_plan::staged_in_time(asked, self.now(), Millis(staged.ttl_ms));
        if let Err(e) = self.inner.data.unstage(node, staged.slot).await {
            debug!(endpoint = %node.endpoint, "unstage failed (the node reclaims the slot): {e}");
        }
        let sum = one_sum(&read?)?;
        if !in_time {
            return Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("the read of {key:?}'s staged disk copy outlived its slot's TTL; retry"),
            ));
        }
        Ok(sum)
    }

    /// Replicas in the order to try them (see [`read_order`]), rotating per read.
    pub(super) fn read_order<'a>(
        &self,
        replicas: &'a [ReplicaDescriptor],
    ) -> Vec<&'a ReplicaDescriptor> {
        let local = self.node().and_then(Node::segment);
        read_order(
            replicas,
            local,
            self.inner.next_replica.fetch_add(1, Ordering::Relaxed),
        )
    }

    /// The values of many keys: one RPC for the replica lists, transfers in parallel grouped
    /// per node.
    pub async fn batch_get(&self, keys: &[&str]) -> Vec<Result<Vec<u8>>> {
        self.operation(
            "batch_get",
            keys.first().copied().unwrap_or_default(),
            async {
                let mut results: Vec<Result<Vec<u8>>> = vec![Ok(Vec::new()); keys.len()];
                let asked = self.now();
                let mut lists = match self.batch_lists(keys).await {
                    Ok(lists) => lists,
                    Err(e) => return vec![Err(e); keys.len()],
                };
                let mut buffers: Vec<Vec<u8>> = Vec::with_capacity(lists.len());
                for list in &mut lists {
                    let buffer = match list {
                        Ok(list) => value_buffer(list.replicas[0].len),
                        Err(_) => Ok(Vec::new()),
                    };
                    buffers.push(buffer.unwrap_or_else(|e| {
                        *list = Err(e);
                        Vec::new()
                    }));
                }
                let mut dests: Vec<Option<&mut [u8]>> =
                    buffers.iter_mut().map(|b| Some(&mut b[..])).collect();
                let outcomes = self.batch_read(keys, &lists, &mut dests, asked).await;
                drop(dests);
                for (i, outcome) in outcomes.into_iter().enumerate() {
                    results[i] = match outcome {
                        Ok(_) => Ok(std::mem::take(&mut buffers[i])),
                        Err(e) if ReadPlan::read_again(&e, lists[i].is_ok()) => {
                            Box::pin(self.get(keys[i])).await
                        }
                        Err(e) => Err(e),
                    };
                }
                results
            },
        )
        .await
    }

    /// Reads many keys into caller buffers; one result (the length) per key.
    pub async fn batch_get_into(&self, items: &mut [(&str, &mut [u8])]) -> Vec<Result<usize>> {
        self.operation(
            "batch_get_into",
            items.first().map_or("", |(key, _)| *key),
            async {
                let keys: Vec<&str> = items.iter().map(|(k, _)| *k).collect();
                let reads = self.start_batch_read(&keys).await;
                let mut wave: Vec<(usize, &mut [u8])> = items
                    .iter_mut()
                    .enumerate()
                    .map(|(i, (_, buf))| (i, &mut **buf))
                    .collect();
                self.read_wave(&reads, &mut wave).await
            },
        )
        .await
    }

    /// Starts reading many keys with one request (where their replicas are, under one read
    /// lease); the bytes then come in one or more [`Client::read_wave`]s. Values delivered a
    /// wave at a time (into device memory) are read this way, so a batch costs one request
    /// however many waves carry it.
    pub async fn start_batch_read(&self, keys: &[&str]) -> StartedReads {
        let asked = self.now();
        StartedReads {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            lists: self.batch_lists(keys).await,
            asked,
        }
    }

    /// Reads some of a started batch's keys, each given as `(index in the batch, buffer)`;
    /// one result per item: the value's length. A read that outlived the batch's lease, or
    /// whose replica went away, is read again on its own.
    pub async fn read_wave(
        &self,
        reads: &StartedReads,
        wave: &mut [(usize, &mut [u8])],
    ) -> Vec<Result<usize>> {
        let all = match &reads.lists {
            Ok(lists) => lists,
            Err(e) => return vec![Err(e.clone()); wave.len()],
        };
        let keys: Vec<&str> = wave
            .iter()
            .map(|(i, _)| reads.keys.get(*i).map_or("", String::as_str))
            .collect();
        let lists: Vec<Result<ReplicaList>> = wave
            .iter()
            .map(|(i, _)| {
                all.get(*i).cloned().unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!("item {i} is not in the batch"),
                    ))
                })
            })
            .collect();
        let mut dests: Vec<Option<&mut [u8]>> = Vec::with_capacity(wave.len());
        let mut early: Vec<Option<Error>> = vec![None; wave.len()];
        for (w, (_, buf)) in wave.iter_mut().enumerate() {
            let size = match &lists[w] {
                Ok(list) => list.replicas[0].len as usize,
                Err(_) => 0,
            };
            if buf.len() < size {
                early[w] = Some(Error::new(
                    ErrorCode::BUFFER_OVERFLOW,
                    format!("{:?} is {size} bytes, the buffer {}", keys[w], buf.len()),
                ));
                dests.push(None);
            } else {
                dests.push(Some(&mut buf[..size]));
            }
        }
        let outcomes = self
            .batch_read(&keys, &lists, &mut dests, reads.asked)
            .await;
        drop(dests);
        let mut results = Vec::with_capacity(wave.len());
        for (w, outcome) in outcomes.into_iter().enumerate() {
            results.push(match (early[w].take(), outcome) {
                (Some(e), _) => Err(e),
                (None, Err(e)) if ReadPlan::read_again(&e, lists[w].is_ok()) => {
                    Box::pin(self.get_into(keys[w], wave[w].1)).await
                }
                (None, outcome) => outcome,
            });
        }
        results
    }

    pub(super) async fn batch_lists(&self, keys: &[&str]) -> Result<Vec<Result<ReplicaList>>> {
        let lists = self
            .call(BatchGetReplicaList {
                keys: keys.iter().map(|k| k.to_string()).collect(),
            })
            .await?;
        let lists = per_key(lists, keys.len(), "BatchGetReplicaList")?;
        Ok(keys
            .iter()
            .zip(lists)
            .map(|(key, list)| list.and_then(|l| value_len(key, &l).map(|_| l)))
            .collect())
    }

    /// Reads every listed object into its destination: first choice of replica per key,
    /// grouped per node, all nodes in parallel; keys whose node failed retry their other
    /// replicas one by one. Returns each key's length or error (`LEASE_EXPIRED` if the batch
    /// outlived the lease).
    pub(super) async fn batch_read(
        &self,
        keys: &[&str],
        lists: &[Result<ReplicaList>],
        dests: &mut [Option<&mut [u8]>],
        asked: Millis,
    ) -> Vec<Result<usize>> {
        let ids: Vec<SegmentId> = lists
            .iter()
            .filter_map(|l| l.as_ref().ok())
            .flat_map(|l| l.replicas.iter().map(|r| r.segment))
            .collect();
        let nodes = match self.resolve(&ids).await {
            Ok(nodes) => nodes,
            Err(e) => return vec![Err(e); lists.len()],
        };
        buggify::hold(Site::CLIENT_BEFORE_READ_TRANSFER).await;
        let mut results: Vec<Result<usize>> = Vec::with_capacity(lists.len());
        let mut per_node: BTreeMap<NodeAddr, Vec<(usize, u64)>> = BTreeMap::new();
        // Keys read one by one: only on disk, or their node's batch failed.
        let mut failed = Vec::new();
        for (i, list) in lists.iter().enumerate() {
            match list {
                Err(e) => results.push(Err(e.clone())),
                Ok(list) => {
                    let size = list.replicas[0].len as usize;
                    results.push(Ok(size));
                    if dests[i].is_none() {
                        continue;
                    }
                    let order = self.read_order(&list.replicas);
                    let first = order.iter().find(|r| nodes.contains_key(&r.segment));
                    match first {
                        Some(r) if r.medium == Medium::Memory => per_node
                            .entry(nodes[&r.segment].clone())
                            .or_default()
                            .push((i, r.addr)),
                        Some(_) => failed.push(i),
                        None => results[i] = Err(segment_gone(list.replicas[0].segment)),
                    }
                }
            }
        }
        // Hand each key's destination to its node's batch.
        let mut slots: Vec<Option<&mut [u8]>> =
            dests.iter_mut().map(|d| d.as_deref_mut()).collect();
        let mut batches = Vec::new();
        for (node, keys) in &per_node {
            let ops: Vec<(usize, ReadOp<'_>)> = keys
                .iter()
                .map(|&(i, addr)| {
                    let dest = slots[i].take().expect("one destination per key");
                    (i, ReadOp { addr, dest })
                })
                .collect();
            batches.push((node, ops));
        }
        let reads = batches.into_iter().map(|(node, ops)| async move {
            let (keys, ops): (Vec<usize>, Vec<ReadOp<'_>>) = ops.into_iter().unzip();
            (keys, self.inner.data.read(node, ops).await)
        });
        for (indices, outcome) in join_all(reads).await {
            match outcome {
                Ok(sums) if sums.len() == indices.len() => {
                    // Keys whose bytes are damaged are retried one by one too (from another
                    // replica).
                    for (i, sum) in indices.into_iter().zip(sums) {
                        let expected = lists[i].as_ref().map(|l| l.checksum);
                        if expected.is_ok_and(|expected| expected != sum) {
                            warn!(
                                key = keys[i],
                                "a replica failed its checksum; reading another"
                            );
                            failed.push(i);
                        }
                    }
                }
                Ok(_) => {
                    debug!("a data plane answered a batch read with the wrong number of checksums");
                    failed.extend(indices);
                }
                Err(e) => {
                    debug!("batch read from a node failed, retrying its keys one by one: {e}");
                    failed.extend(indices);
                }
            }
        }
        drop(slots);
        // The rest concurrently (a disk read each, typically: the nodes' disks see them
        // all at once).
        failed.sort_unstable();
        let singles = dests
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| failed.binary_search(i).is_ok())
            .map(|(i, dest)| {
                let list = lists[i].as_ref().expect("read only listed keys");
                let dest = dest.as_deref_mut().expect("read only keys with buffers");
                let checksum = list.checksum;
                async move {
                    let read = self.read_replica(keys[i], &list.replicas, checksum, dest);
                    (i, read.await)
                }
            });
        for (i, outcome) in join_all(singles).await {
            if let Err(e) = outcome {
                results[i] = Err(e);
            }
        }
        let lease_ok = lists
            .iter()
            .filter_map(|l| l.as_ref().ok())
            .all(|l| self.inside_lease(asked, l));
        if !lease_ok {
            // As for a single read: past the lease, damage may be reuse.
            return results.into_iter().map(ReadPlan::outlived_batch).collect();
        }
        results
    }
}

/// The checksum of a one-operation read.
fn one_sum(sums: &[Checksum]) -> Result<Checksum> {
    match sums {
        [sum] => Ok(*sum),
        _ => Err(Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("a one-operation read reported {} checksums", sums.len()),
        )),
    }
}

/// Reads of many keys begun with one request: where each key's replicas are (or why not),
/// and when that was asked, from which the read lease runs. See
/// [`Client::start_batch_read`].
#[derive(Debug)]
pub struct StartedReads {
    keys: Vec<String>,
    lists: Result<Vec<Result<ReplicaList>>>,
    asked: Millis,
}
