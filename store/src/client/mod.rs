//! The client library: put, get and everything else, over any transport.
//!
//! A client talks to the master for metadata and moves bytes itself, straight to and from the
//! nodes. It is cheap to clone and safe to share across tasks and threads. A client may also
//! contribute a segment (as Mooncake's clients do), in which case it runs a node in-process and
//! transfers to its own segment are a `memcpy`.
//!
//! The rules a client follows (reads finish inside their lease, failed writes are aborted,
//! writers stop at their fence) are `mooring_core::client`'s pure values: this module reads
//! the clock, sends the requests and moves the bytes, and asks those values what to do.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use mooring_core::client::{per_key, segment_gone};
use mooring_core::tenant::{DEFAULT_TENANT, SEPARATOR, stored_key, valid_tenant};
use mooring_core::{
    Checksum, ClientId, Error, ErrorCode, HeartbeatStatus, KeyListing, Medium, PutGrant,
    ReplicaDescriptor, ReplicaList, ReplicateConfig, Result, SegmentId, SegmentInfo, Stats,
    StatsReport, WriteId,
};
use mooring_proto::trace::{TraceId, traced};
use mooring_proto::transport::{ControlPlane, DataPlane, NodeAddr, ReadOp, WriteOp};
use mooring_proto::wire::{
    AcquireHold, BatchExist, BatchGetReplicaList, BatchPutEnd, BatchPutStart, Call, ClusterInfo,
    DescribeSegments, Exist, ExistPrefetch, GetReplicaList, GetSize, GetStats, Heartbeat, ListKeys,
    ListSegments, MasterRequest, PutAbort, PutEnd, PutStart, QueryByRegex, ReleaseHold, Remove,
    RemoveAll, RemoveByRegex,
};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, warn};

use crate::buggify::{self, Site};
use crate::client::presence::{Contribution, Presence};
use crate::node::Node;

pub mod connect;
mod meta;
pub mod presence;
mod read;
mod tasks;
mod write;

pub use read::StartedReads;
pub use write::StartedWrite;

/// A handle to the store.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    presence: Presence,
    /// The tenant whose keys this client reads and writes (see `mooring_core::tenant`).
    tenant: String,
    data: Arc<dyn DataPlane>,
    segments: RwLock<BTreeMap<SegmentId, NodeAddr>>,
    next_replica: AtomicUsize,
}

impl Client {
    /// A client of the default tenant over the given transports, contributing
    /// `contribution` (kept mounted by the client's heartbeat) if given.
    pub async fn with_transport(
        id: ClientId,
        control: Arc<dyn ControlPlane>,
        data: Arc<dyn DataPlane>,
        contribution: Option<Contribution>,
    ) -> Result<Client> {
        Client::in_tenant(DEFAULT_TENANT, id, control, data, contribution).await
    }

    /// [`Client::with_transport`] reading and writing `tenant`'s keys.
    pub async fn in_tenant(
        tenant: &str,
        id: ClientId,
        control: Arc<dyn ControlPlane>,
        data: Arc<dyn DataPlane>,
        contribution: Option<Contribution>,
    ) -> Result<Client> {
        if !valid_tenant(tenant) {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{tenant:?} cannot name a tenant: 1 to 64 letters, digits, '.', '_' or '-'"
                ),
            ));
        }
        let presence = Presence::join(id, control, contribution).await?;
        Ok(Client {
            inner: Arc::new(Inner {
                presence,
                tenant: tenant.to_string(),
                data,
                segments: RwLock::new(BTreeMap::new()),
                next_replica: AtomicUsize::new(0),
            }),
        })
    }

    /// The tenant whose keys this client reads and writes.
    pub fn tenant(&self) -> &str {
        &self.inner.tenant
    }

    /// The key the master stores for this tenant's `key`; a key the master gave (a repair's)
    /// is stored already.
    fn stored_key(&self, key: &str) -> Result<String> {
        match key.contains(SEPARATOR) {
            true => Ok(key.to_string()),
            false => stored_key(&self.inner.tenant, key),
        }
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

    /// Runs one operation (`name` on `key`) under a fresh trace id: every request it sends,
    /// to the master and to the nodes, carries the id, and so do the DEBUG lines those
    /// processes log for it, so one slow operation can be followed through all three.
    async fn operation<T>(
        &self,
        name: &'static str,
        key: &str,
        operation: impl std::future::Future<Output = T>,
    ) -> T {
        let trace = TraceId::new();
        let span = tracing::debug_span!("op", %trace, op = name, key);
        let started = Instant::now();
        let outcome = traced(trace, operation).instrument(span.clone()).await;
        span.in_scope(|| debug!(elapsed_us = started.elapsed().as_micros() as u64, "done"));
        outcome
    }

    /// Sends `request` scoped to this client's tenant (its keys as the master stores them)
    /// and returns its reply, keys as the tenant named them.
    async fn call<C: Call>(&self, request: C) -> Result<C::Reply> {
        let mut request: MasterRequest = request.into();
        request.scope_to(&self.inner.tenant)?;
        let mut reply = self.inner.presence.control().send(request).await?;
        reply.unscope();
        mooring_proto::transport::reply_to::<C>(reply)
    }

    /// [`Client::call`] for a request that names this client, which the master counts as its
    /// heartbeat: an answer renews the write window as a heartbeat's acknowledgement does
    /// (so a put right after a master failover need not wait for the next heartbeat).
    async fn call_as_member<C: Call>(&self, request: C) -> Result<C::Reply> {
        let contact = &self.inner.presence.contact;
        let sent = contact.now();
        let reply = self.call(request).await?;
        contact.acknowledged(sent);
        Ok(reply)
    }

    /// The data-plane endpoints of segments, by id (segments no longer mounted are left out).
    pub async fn segment_endpoints(
        &self,
        ids: &[SegmentId],
    ) -> Result<BTreeMap<SegmentId, String>> {
        Ok(self
            .resolve(ids)
            .await?
            .into_iter()
            .map(|(id, addr)| (id, addr.endpoint.to_string()))
            .collect())
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
                    rdma_key: info.rdma_key,
                };
                cache.insert(id, addr.clone());
                found.insert(id, addr);
            }
        }
        Ok(found)
    }
}
