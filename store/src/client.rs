//! The client library: put, get and everything else, over any transport.
//!
//! A client talks to the master for metadata and moves bytes itself, straight to and from the
//! nodes. It is cheap to clone and safe to share across tasks and threads. A client may also
//! contribute a segment (as Mooncake's clients do), in which case it runs a node in-process and
//! transfers to its own segment are a `memcpy`.
//!
//! Two rules from the protocol are enforced here, on the client side:
//!
//! - **Reads finish inside their lease.** A get measures from just before asking for the
//!   replica list; if the transfer ends later than the lease (minus a margin), the bytes are
//!   discarded and the get retried (`LEASE_EXPIRED` if it keeps happening). Inside the lease the
//!   master guarantees the bytes are not overwritten, evicted or removed.
//! - **A failed write is aborted, not revoked.** A transfer that timed out or lost its
//!   connection may still land on the node; `PutAbort` frees the key at once but keeps the
//!   blocks out of reuse for the release timeout. Writes also stop shortly before the release
//!   timeout after their start, and once the master may have presumed this client dead (the
//!   writer's self-fence; see [`crate::presence`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use mooring_core::{
    ClientId, Error, ErrorCode, Medium, PutGrant, ReplicaDescriptor, ReplicaList, ReplicateConfig,
    Result, SegmentId, SegmentInfo, Stats,
};
use mooring_proto::transport::{ControlPlane, DataPlane, NodeAddr, ReadOp, WriteOp};
use mooring_proto::wire::{
    BatchExist, BatchGetReplicaList, BatchPutEnd, BatchPutStart, Call, ClusterInfo,
    DescribeSegments, Exist, ExistPrefetch, GetReplicaList, GetSize, GetStats, ListSegments,
    PutAbort, PutEnd, PutStart, QueryByRegex, Remove, RemoveAll, RemoveByRegex,
};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::buggify::{self, Site};
use crate::node::Node;
use crate::presence::{Contribution, Presence};

/// A write planned for one node: (job index, remote address, bytes).
type PlannedWrite<'a> = (usize, u64, &'a [u8]);

/// How many times a get is retried when its lease ran out mid-transfer.
const LEASE_RETRIES: usize = 3;

/// A key's size and replica count, as listed by [`Client::query`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    /// The key.
    pub key: String,
    /// Value size in bytes.
    pub size: u64,
    /// Complete replicas.
    pub replicas: usize,
}

/// A handle to the store.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    presence: Presence,
    data: Arc<dyn DataPlane>,
    segments: RwLock<BTreeMap<SegmentId, NodeAddr>>,
    next_replica: AtomicUsize,
}

impl Client {
    /// A client over the given transports, contributing `contribution` (kept mounted by the
    /// client's heartbeat) if given.
    pub async fn with_transport(
        id: ClientId,
        control: Arc<dyn ControlPlane>,
        data: Arc<dyn DataPlane>,
        contribution: Option<Contribution>,
    ) -> Result<Client> {
        let presence = Presence::join(id, control, contribution).await?;
        Ok(Client {
            inner: Arc::new(Inner {
                presence,
                data,
                segments: RwLock::new(BTreeMap::new()),
                next_replica: AtomicUsize::new(0),
            }),
        })
    }

    /// This client's id.
    pub fn id(&self) -> ClientId {
        self.inner.presence.id
    }

    /// The master's protocol settings.
    pub fn cluster_info(&self) -> &ClusterInfo {
        &self.inner.presence.info
    }

    /// The name of the segment this client contributes, if any (pass it as a preferred
    /// segment to keep values local).
    pub fn segment_name(&self) -> Option<&str> {
        self.node().map(Node::name)
    }

    fn node(&self) -> Option<&Node> {
        self.inner.presence.node.as_ref()
    }

    /// Stops heartbeating and, if this client contributes a segment, unmounts it (after
    /// letting readers finish within a lease).
    pub async fn close(&self) -> Result<()> {
        self.inner.presence.leave().await
    }

    async fn call<C: Call>(&self, request: C) -> Result<C::Reply> {
        self.inner.presence.control().call(request).await
    }

    // ---- writes ----------------------------------------------------------------------------

    /// Stores `value` under `key`. Objects are immutable: an existing key fails with
    /// `OBJECT_ALREADY_EXISTS` (see [`Client::upsert`]).
    pub async fn put(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.write(key, value, config, false).await
    }

    /// [`Client::put`] from a caller buffer (over TCP the same as `put`; RDMA transports use
    /// registered buffers directly).
    pub async fn put_from(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.write(key, value, config, false).await
    }

    /// Stores `value` under `key` whether or not it exists (RFC 000 upsert).
    pub async fn upsert(&self, key: &str, value: &[u8], config: &ReplicateConfig) -> Result<()> {
        self.write(key, value, config, true).await
    }

    async fn write(
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
    async fn start_write(
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
            match self.call(request).await {
                Ok(grant) => return Ok(grant),
                Err(e) if e.code == ErrorCode::OBJECT_REPLICA_BUSY && Instant::now() < give_up => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(lease / 4).max(Duration::from_millis(1));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Ends a write after its transfers: End on success, Abort on failure.
    async fn finish_write(&self, key: &str, grant: &PutGrant, transfer: Result<()>) -> Result<()> {
        let client = self.id();
        let (key, write) = (key.to_string(), grant.write_id);
        match transfer {
            Ok(()) => self.call(PutEnd { client, key, write }).await,
            Err(e) => {
                if let Err(abort) = self.call(PutAbort { client, key, write }).await {
                    debug!(
                        "abort after a failed transfer also failed (the master will discard the write): {abort}"
                    );
                }
                Err(e)
            }
        }
    }

    /// Stores many values: one start RPC, all transfers in parallel grouped per node, one end
    /// RPC (and one abort RPC for failures).
    pub async fn batch_put(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        self.batch_write(items, config, false).await
    }

    /// [`Client::batch_put`] from caller buffers.
    pub async fn batch_put_from(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        self.batch_write(items, config, false).await
    }

    /// Upserts many values, pipelined like [`Client::batch_put`].
    pub async fn batch_upsert(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<()>> {
        self.batch_write(items, config, true).await
    }

    async fn batch_write(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<Result<()>> {
        let started = Instant::now();
        let grants = match self
            .call(BatchPutStart {
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
            let entry = (items[i].0.to_string(), grant.write_id);
            match transfer {
                Ok(()) => ends.push((i, entry)),
                Err(e) => {
                    results[i] = Err(e);
                    aborts.push(entry);
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
    /// stopping at the writer's self-fence. One result per job.
    async fn write_batch(&self, jobs: &[(&PutGrant, &[u8])], started: Instant) -> Vec<Result<()>> {
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
        let mut results: Vec<Result<()>> = vec![Ok(()); jobs.len()];
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
            if let Err(e) = outcome {
                for &(job, _, _) in ops {
                    results[job] = Err(e.clone());
                }
            }
        }
        results
    }

    /// How long a write that started at `started` may still run (the self-fence): until
    /// shortly before the master may release its blocks after a timeout, and only while the
    /// master cannot have presumed this client dead (see [`crate::presence::MasterContact`]).
    fn write_fence(&self, started: Instant) -> Duration {
        let release =
            Duration::from_millis(self.cluster_info().put_start_release_timeout.as_millis());
        let release = buggify::timeout(Site::CLIENT_WRITE_FENCE, release);
        release
            .saturating_sub(release / 10)
            .saturating_sub(started.elapsed())
            .min(self.inner.presence.contact.write_window())
    }

    // ---- reads -----------------------------------------------------------------------------

    /// The value of `key`.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.read(key, None)
            .await
            .map(|(v, _)| v.expect("owned read"))
    }

    /// Reads the value of `key` into `buf`; returns its length. `BUFFER_OVERFLOW` if `buf` is
    /// smaller than the value.
    pub async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize> {
        self.read(key, Some(buf)).await.map(|(_, n)| n)
    }

    async fn read(
        &self,
        key: &str,
        mut into: Option<&mut [u8]>,
    ) -> Result<(Option<Vec<u8>>, usize)> {
        for _ in 0..LEASE_RETRIES {
            let asked = Instant::now();
            let list = self
                .call(GetReplicaList {
                    key: key.to_string(),
                })
                .await?;
            let size = list.replicas.first().map_or(0, |r| r.len) as usize;
            let mut owned = Vec::new();
            let caller_buffer = into.is_some();
            {
                let buf: &mut [u8] = match into.as_deref_mut() {
                    Some(buf) if buf.len() < size => {
                        return Err(Error::new(
                            ErrorCode::BUFFER_OVERFLOW,
                            format!("{key:?} is {size} bytes, the buffer {}", buf.len()),
                        ));
                    }
                    Some(buf) => &mut buf[..size],
                    None => {
                        owned = vec![0u8; size];
                        &mut owned[..]
                    }
                };
                // A simulation may stall the reader here, inside its lease, so the race between
                // a reader holding descriptors and eviction or upsert of the same bytes is hit.
                buggify::hold(Site::CLIENT_BEFORE_READ_TRANSFER).await;
                self.read_replica(key, &list.replicas, buf).await?;
            }
            if self.inside_lease(asked, &list) {
                return Ok(if caller_buffer {
                    (None, size)
                } else {
                    (Some(owned), size)
                });
            }
            debug!(key, "read outlived its lease; retrying");
        }
        Err(Error::new(
            ErrorCode::LEASE_EXPIRED,
            format!("reading {key:?} kept outliving its lease"),
        ))
    }

    fn inside_lease(&self, asked: Instant, list: &ReplicaList) -> bool {
        let lease = Duration::from_millis(list.lease_ttl.as_millis());
        let usable = buggify::timeout(Site::CLIENT_READ_LEASE, lease.saturating_sub(lease / 10));
        asked.elapsed() < usable
    }

    /// Reads one of `key`'s `replicas` into `buf`, trying the next on failure (memory
    /// replicas before the disk one).
    async fn read_replica(
        &self,
        key: &str,
        replicas: &[ReplicaDescriptor],
        buf: &mut [u8],
    ) -> Result<()> {
        let ids: Vec<SegmentId> = replicas.iter().map(|r| r.segment).collect();
        let nodes = self.resolve(&ids).await?;
        let mut last = Error::new(ErrorCode::REPLICA_IS_NOT_READY, "no readable replica");
        for replica in self.read_order(replicas) {
            let Some(node) = nodes.get(&replica.segment) else {
                last = segment_gone(replica.segment);
                continue;
            };
            let read = match replica.medium {
                Medium::Memory => {
                    let op = ReadOp {
                        addr: replica.addr,
                        dest: &mut *buf,
                    };
                    self.inner.data.read(node, vec![op]).await
                }
                Medium::Disk => self.read_disk(node, key, replica.addr, buf).await,
            };
            match read {
                Ok(()) => return Ok(()),
                Err(e) => {
                    debug!(endpoint = %node.endpoint, "replica read failed, trying another: {e}");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Reads `key`'s disk copy from `node`: the node stages it, this client pulls it from the
    /// staging buffer with a one-sided read, then frees the slot (the node reclaims it after
    /// its TTL if the unstage is lost).
    async fn read_disk(
        &self,
        node: &NodeAddr,
        key: &str,
        write: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let asked = Instant::now();
        let staged = self
            .inner
            .data
            .stage(node, key, write, buf.len() as u64)
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
        };
        let op = ReadOp {
            addr: staged.addr,
            dest: buf,
        };
        let read = self.inner.data.read(&staging, vec![op]).await;
        // The node may reuse a slot once its TTL (counted from after the load, so after
        // `asked`) is up: bytes read later than that may be another value's.
        let in_time = asked.elapsed() < Duration::from_millis(staged.ttl_ms);
        if let Err(e) = self.inner.data.unstage(node, staged.slot).await {
            debug!(endpoint = %node.endpoint, "unstage failed (the node reclaims the slot): {e}");
        }
        read?;
        if !in_time {
            return Err(Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("the read of {key:?}'s staged disk copy outlived its slot's TTL; retry"),
            ));
        }
        Ok(())
    }

    /// Replicas in the order to try them: memory before disk, this node's own segment first,
    /// otherwise rotating so load spreads over replicas.
    fn read_order<'a>(&self, replicas: &'a [ReplicaDescriptor]) -> Vec<&'a ReplicaDescriptor> {
        if replicas.is_empty() {
            return Vec::new();
        }
        let local = self.node().and_then(Node::segment);
        let start = self.inner.next_replica.fetch_add(1, Ordering::Relaxed) % replicas.len();
        let mut order: Vec<&ReplicaDescriptor> =
            replicas[start..].iter().chain(&replicas[..start]).collect();
        order.sort_by_key(|r| (r.medium == Medium::Disk, Some(r.segment) != local));
        order
    }

    /// The values of many keys: one RPC for the replica lists, transfers in parallel grouped
    /// per node.
    pub async fn batch_get(&self, keys: &[&str]) -> Vec<Result<Vec<u8>>> {
        let mut results: Vec<Result<Vec<u8>>> = vec![Ok(Vec::new()); keys.len()];
        let asked = Instant::now();
        let lists = match self.batch_lists(keys).await {
            Ok(lists) => lists,
            Err(e) => return vec![Err(e); keys.len()],
        };
        let mut buffers: Vec<Vec<u8>> = lists
            .iter()
            .map(|l| match l {
                Ok(list) => vec![0u8; list.replicas.first().map_or(0, |r| r.len) as usize],
                Err(_) => Vec::new(),
            })
            .collect();
        let mut dests: Vec<Option<&mut [u8]>> =
            buffers.iter_mut().map(|b| Some(&mut b[..])).collect();
        let outcomes = self.batch_read(keys, &lists, &mut dests, asked).await;
        drop(dests);
        for (i, outcome) in outcomes.into_iter().enumerate() {
            results[i] = match outcome {
                Ok(_) => Ok(std::mem::take(&mut buffers[i])),
                Err(e) if e.code == ErrorCode::LEASE_EXPIRED => Box::pin(self.get(keys[i])).await,
                Err(e) => Err(e),
            };
        }
        results
    }

    /// Reads many keys into caller buffers; one result (the length) per key.
    pub async fn batch_get_into(&self, items: &mut [(&str, &mut [u8])]) -> Vec<Result<usize>> {
        let keys: Vec<&str> = items.iter().map(|(k, _)| *k).collect();
        let asked = Instant::now();
        let lists = match self.batch_lists(&keys).await {
            Ok(lists) => lists,
            Err(e) => return vec![Err(e); items.len()],
        };
        let mut dests: Vec<Option<&mut [u8]>> = Vec::with_capacity(items.len());
        let mut early: Vec<Option<Error>> = vec![None; items.len()];
        for (i, (key, buf)) in items.iter_mut().enumerate() {
            let size = match &lists[i] {
                Ok(list) => list.replicas.first().map_or(0, |r| r.len) as usize,
                Err(_) => 0,
            };
            if buf.len() < size {
                early[i] = Some(Error::new(
                    ErrorCode::BUFFER_OVERFLOW,
                    format!("{key:?} is {size} bytes, the buffer {}", buf.len()),
                ));
                dests.push(None);
            } else {
                dests.push(Some(&mut buf[..size]));
            }
        }
        let outcomes = self.batch_read(&keys, &lists, &mut dests, asked).await;
        drop(dests);
        let mut results = Vec::with_capacity(items.len());
        for (i, outcome) in outcomes.into_iter().enumerate() {
            results.push(match (early[i].take(), outcome) {
                (Some(e), _) => Err(e),
                (None, Err(e)) if e.code == ErrorCode::LEASE_EXPIRED => {
                    let (key, buf) = &mut items[i];
                    Box::pin(self.get_into(key, buf)).await
                }
                (None, outcome) => outcome,
            });
        }
        results
    }

    async fn batch_lists(&self, keys: &[&str]) -> Result<Vec<Result<ReplicaList>>> {
        let lists = self
            .call(BatchGetReplicaList {
                keys: keys.iter().map(|k| k.to_string()).collect(),
            })
            .await?;
        per_key(lists, keys.len(), "BatchGetReplicaList")
    }

    /// Reads every listed object into its destination: first choice of replica per key,
    /// grouped per node, all nodes in parallel; keys whose node failed retry their other
    /// replicas one by one. Returns each key's length or error (`LEASE_EXPIRED` if the batch
    /// outlived the lease).
    async fn batch_read(
        &self,
        keys: &[&str],
        lists: &[Result<ReplicaList>],
        dests: &mut [Option<&mut [u8]>],
        asked: Instant,
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
                    let size = list.replicas.first().map_or(0, |r| r.len) as usize;
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
        for (keys, outcome) in join_all(reads).await {
            if let Err(e) = outcome {
                debug!("batch read from a node failed, retrying its keys one by one: {e}");
                failed.extend(keys);
            }
        }
        // The rest concurrently (a disk read each, typically: the nodes' disks see them
        // all at once).
        drop(slots);
        failed.sort_unstable();
        let singles = dests
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| failed.binary_search(i).is_ok())
            .map(|(i, dest)| {
                let list = lists[i].as_ref().expect("read only listed keys");
                let dest = dest.as_deref_mut().expect("read only keys with buffers");
                async move { (i, self.read_replica(keys[i], &list.replicas, dest).await) }
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
            for r in results.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(Error::new(
                    ErrorCode::LEASE_EXPIRED,
                    "the batch outlived its lease",
                ));
            }
        }
        results
    }

    /// Resolves segment ids to data-plane addresses, asking the master for unknown ones.
    async fn resolve(&self, ids: &[SegmentId]) -> Result<BTreeMap<SegmentId, NodeAddr>> {
        let mut found = BTreeMap::new();
        let mut missing = Vec::new();
        {
            let cache = self.inner.segments.read().expect("segment cache lock");
            for id in ids {
                match cache.get(id) {
                    Some(addr) => {
                        found.insert(*id, addr.clone());
                    }
                    None if !missing.contains(id) => missing.push(*id),
                    None => {}
                }
            }
        }
        if missing.is_empty() {
            return Ok(found);
        }
        let infos = self
            .call(DescribeSegments {
                ids: missing.clone(),
            })
            .await?;
        let infos = per_key(infos, missing.len(), "DescribeSegments")?;
        let mut cache = self.inner.segments.write().expect("segment cache lock");
        for (id, info) in missing.into_iter().zip(infos) {
            if let Some(info) = info {
                let addr = NodeAddr {
                    endpoint: info.endpoint.into(),
                    key: info.key,
                };
                cache.insert(id, addr.clone());
                found.insert(id, addr);
            }
        }
        Ok(found)
    }

    // ---- metadata ----------------------------------------------------------------------

    /// Whether `key` has a complete replica (grants a lease if so).
    pub async fn exist(&self, key: &str) -> Result<bool> {
        self.call(Exist {
            key: key.to_string(),
        })
        .await
    }

    /// RFC 003's `exist(key, prefetch=true)`: whether `key` exists and, if its only copy is on
    /// a node's disk, promotes it into memory (this client's own segment first) before
    /// answering, so a later get is a memory hit. Best effort: if the promotion fails the
    /// answer is still `true` and the failure is logged.
    pub async fn exist_prefetch(&self, key: &str) -> Result<bool> {
        let request = ExistPrefetch {
            client: self.id(),
            key: key.to_string(),
            preferred: self
                .segment_name()
                .map(str::to_string)
                .into_iter()
                .collect(),
        };
        let (exists, grant) = self.call(request).await?;
        if let Some(prefetch) = grant {
            let started = Instant::now();
            let mut value = vec![0u8; prefetch.source.len as usize];
            let mut transfer = self
                .read_replica(key, std::slice::from_ref(&prefetch.source), &mut value)
                .await;
            if transfer.is_ok() {
                transfer = self
                    .write_batch(&[(&prefetch.grant, &value)], started)
                    .await
                    .pop()
                    .expect("one result");
            }
            if let Err(e) = self.finish_write(key, &prefetch.grant, transfer).await {
                warn!(key, "prefetch from disk failed; reads stay on disk: {e}");
            }
        }
        Ok(exists)
    }

    /// [`Client::exist`] for many keys, in one RPC.
    pub async fn batch_exist(&self, keys: &[&str]) -> Result<Vec<Result<bool>>> {
        self.call(BatchExist {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        })
        .await
    }

    /// The size of `key`'s value.
    pub async fn get_size(&self, key: &str) -> Result<u64> {
        self.call(GetSize {
            key: key.to_string(),
        })
        .await
    }

    /// Removes `key` (`OBJECT_HAS_LEASE` while a reader holds it).
    pub async fn remove(&self, key: &str) -> Result<()> {
        self.call(Remove {
            key: key.to_string(),
        })
        .await
    }

    /// Removes every object nobody is using; returns how many.
    pub async fn remove_all(&self) -> Result<u64> {
        self.call(RemoveAll {}).await
    }

    /// Removes every unused object whose key matches `pattern`; returns how many.
    pub async fn remove_by_regex(&self, pattern: &str) -> Result<u64> {
        self.call(RemoveByRegex {
            pattern: pattern.to_string(),
        })
        .await
    }

    /// The readable objects whose keys match `pattern`, with their replicas.
    pub async fn query_by_regex(&self, pattern: &str) -> Result<Vec<(String, ReplicaList)>> {
        self.call(QueryByRegex {
            pattern: pattern.to_string(),
        })
        .await
    }

    /// Keys matching `pattern`, with sizes and replica counts.
    pub async fn query(&self, pattern: &str) -> Result<Vec<KeyInfo>> {
        Ok(self
            .query_by_regex(pattern)
            .await?
            .into_iter()
            .map(|(key, list)| KeyInfo {
                key,
                size: list.replicas.first().map_or(0, |r| r.len),
                replicas: list.replicas.len(),
            })
            .collect())
    }

    /// The master's gauges and counters.
    pub async fn stats(&self) -> Result<Stats> {
        self.call(GetStats {}).await
    }

    /// Every mounted segment.
    pub async fn segments(&self) -> Result<Vec<SegmentInfo>> {
        self.call(ListSegments {}).await
    }
}

fn segment_gone(id: SegmentId) -> Error {
    Error::new(
        ErrorCode::REPLICA_IS_GONE,
        format!("{id} is no longer mounted"),
    )
}

/// A batch reply's per-key results, checked to be one per key asked: a master that answers
/// another count is confused or lying, and no result can be matched to its key.
fn per_key<T>(results: Vec<T>, asked: usize, request: &str) -> Result<Vec<T>> {
    if results.len() == asked {
        Ok(results)
    } else {
        Err(Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!(
                "the master answered {request} for {asked} keys with {} results",
                results.len()
            ),
        ))
    }
}
