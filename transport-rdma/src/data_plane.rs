//! RDMA behind Mooring's transport seam. On a node, [`RdmaDataServer`] wraps the node's data
//! server (TCP, or the simulation's): every export is also registered with the device and
//! its rkey advertised beside the data server's key, and the data server answers clients'
//! `RdmaConnect` requests. On a client, [`RdmaDataPlane`] wraps the data server's transport:
//! reads and writes to nodes that advertise an rkey go over RDMA, everything else (stage and
//! unstage, the queue-pair handshake, nodes without RDMA unless RDMA is required) over the
//! wrapped transport.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::{Checksum, Error, ErrorCode, Result};
use mooring_proto::serve::{DataCounts, DataService};
use mooring_proto::transport::{
    BoxFuture, DataPlane, DataServer, NodeAddr, RdmaAcceptor, ReadOp, SegmentMemory, WriteOp,
};
use mooring_proto::wire::{DataReply, DataRequest, QpAddress};

use crate::client::RdmaClient;
use crate::peer::{Handshake, Peer};
use crate::server::RdmaServer;
use crate::verbs::{QpEndpoint, Verbs};

fn to_wire(e: QpEndpoint) -> QpAddress {
    QpAddress {
        qpn: e.qpn,
        lid: e.lid,
        gid: e.gid,
        psn: e.psn,
    }
}

fn from_wire(a: QpAddress) -> QpEndpoint {
    QpEndpoint {
        qpn: a.qpn,
        lid: a.lid,
        gid: a.gid,
        psn: a.psn,
    }
}

impl<V: Verbs> RdmaAcceptor for RdmaServer<V> {
    fn accept(&self, client: QpAddress, replaces: Option<u32>) -> Result<QpAddress> {
        RdmaServer::accept(self, from_wire(client), replaces).map(to_wire)
    }
}

/// A node's data server that serves RDMA too.
pub struct RdmaDataServer<V: Verbs> {
    inner: Arc<dyn DataServer>,
    rdma: Arc<RdmaServer<V>>,
    // The rkey of each export, by the data server's key.
    rkeys: Mutex<HashMap<u64, u32>>,
}

impl<V: Verbs> RdmaDataServer<V> {
    /// Serves RDMA through `rdma` beside `inner`, which answers the handshake.
    pub fn new(inner: Arc<dyn DataServer>, rdma: Arc<RdmaServer<V>>) -> Self {
        inner.serve_rdma(rdma.clone());
        RdmaDataServer {
            inner,
            rdma,
            rkeys: Mutex::new(HashMap::new()),
        }
    }

    fn rkeys(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u32>> {
        self.rkeys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<V: Verbs> DataServer for RdmaDataServer<V> {
    fn service(&self) -> &DataService {
        self.inner.service()
    }

    fn export(&self, memory: SegmentMemory) -> Result<NodeAddr> {
        let keys = self.rdma.export(memory.clone())?;
        let mut addr = match self.inner.export(memory) {
            Ok(addr) => addr,
            Err(e) => {
                self.rdma.unexport(keys.rkey);
                return Err(e);
            }
        };
        self.rkeys().insert(addr.key, keys.rkey);
        addr.rdma_key = Some(keys.rkey);
        Ok(addr)
    }

    fn unexport(&self, key: u64) {
        self.inner.unexport(key);
        let rkey = self.rkeys().remove(&key);
        if let Some(rkey) = rkey {
            self.rdma.unexport(rkey);
        }
    }

    // The wrapped server's counts (a TCP server's include its connections).
    fn counts(&self) -> DataCounts {
        self.inner.counts()
    }
}

/// Connects queue pairs to one node by asking its data server.
struct DataServerHandshake {
    via: Arc<dyn DataPlane>,
    node: NodeAddr,
}

impl Handshake for DataServerHandshake {
    fn connect(
        &self,
        local: QpEndpoint,
        replaces: Option<u32>,
    ) -> BoxFuture<'_, Result<QpEndpoint>> {
        Box::pin(async move {
            let request = DataRequest::RdmaConnect {
                client: to_wire(local),
                replaces,
                key: self.node.key,
            };
            let reply: DataReply = self.via.request(&self.node, request).await?;
            reply
                .into_rdma_connected(&self.node.endpoint)
                .map(from_wire)
        })
    }
}

/// Nodes a client keeps queue pairs to; beyond it the least recently used node's go (nodes
/// that left, or restarted on another port, are never used again).
const MAX_PEERS: usize = 256;

/// A client's data plane that moves bytes over RDMA to nodes that serve it.
pub struct RdmaDataPlane<V: Verbs> {
    client: RdmaClient<V>,
    via: Arc<dyn DataPlane>,
    required: bool,
    peers: Mutex<Peers<V>>,
}

/// By node endpoint: the queue pairs and when they were last used; and the use counter.
type Peers<V> = (HashMap<Arc<str>, (Arc<Peer<V>>, u64)>, u64);

impl<V: Verbs> RdmaDataPlane<V> {
    /// RDMA through `client`, everything else through `via`. With `required`, a node that
    /// does not serve RDMA is an error rather than reached through `via`.
    pub fn new(client: RdmaClient<V>, via: Arc<dyn DataPlane>, required: bool) -> Self {
        RdmaDataPlane {
            client,
            via,
            required,
            peers: Mutex::new((HashMap::new(), 0)),
        }
    }

    /// The RDMA client (to register long-lived buffers).
    pub fn client(&self) -> &RdmaClient<V> {
        &self.client
    }

    /// The queue pairs to `node`, made on first use.
    fn peer(&self, node: &NodeAddr) -> Arc<Peer<V>> {
        let mut guard = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let (peers, clock) = &mut *guard;
        *clock += 1;
        let now = *clock;
        if let Some((peer, used)) = peers.get_mut(&node.endpoint) {
            *used = now;
            return peer.clone();
        }
        if peers.len() >= MAX_PEERS {
            let stalest = peers
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(endpoint, _)| endpoint.clone())
                .expect("at the limit, so not empty");
            peers.remove(&stalest);
        }
        let peer = Arc::new(self.client.peer(Arc::new(DataServerHandshake {
            via: self.via.clone(),
            node: node.clone(),
        })));
        peers.insert(node.endpoint.clone(), (peer.clone(), now));
        peer
    }

    /// The rkey to use for `node`, or `None` to go through the wrapped transport.
    fn rkey(&self, node: &NodeAddr) -> Result<Option<u32>> {
        match (node.rdma_key, self.required) {
            (Some(rkey), _) => Ok(Some(rkey)),
            (None, false) => Ok(None),
            (None, true) => Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                format!(
                    "node {} does not serve RDMA, and this client requires it (use --transport \
                     auto to reach it over TCP)",
                    node.endpoint
                ),
            )),
        }
    }
}

impl<V: Verbs> DataPlane for RdmaDataPlane<V> {
    fn read<'a>(
        &'a self,
        node: &'a NodeAddr,
        mut ops: Vec<ReadOp<'a>>,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            let Some(rkey) = self.rkey(node)? else {
                return self.via.read(node, ops).await;
            };
            let peer = self.peer(node);
            self.client.read(&peer, rkey, &mut ops).await?;
            Ok(ops.iter().map(|op| Checksum::of(op.dest)).collect())
        })
    }

    fn write<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<WriteOp<'a>>,
        valid_for: Duration,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            let Some(rkey) = self.rkey(node)? else {
                return self.via.write(node, ops, valid_for).await;
            };
            let peer = self.peer(node);
            // The checksums of what is sent: the source is borrowed unchanged throughout.
            let sums = ops.iter().map(|op| Checksum::of(op.src)).collect();
            self.client.write(&peer, rkey, &ops, valid_for).await?;
            Ok(sums)
        })
    }

    fn request<'a>(
        &'a self,
        node: &'a NodeAddr,
        request: DataRequest,
    ) -> BoxFuture<'a, Result<DataReply>> {
        self.via.request(node, request)
    }
}
