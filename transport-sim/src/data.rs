//! The data plane over the simulated network: one-sided reads and writes of a node's exported
//! segment, one datagram per request (large transfers split into several).

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use mooring_core::client::{FenceRule, SenderClockView};
use mooring_core::{Checksum, Error, ErrorCode, Result};
use mooring_proto::serve::{DataService, SenderClock, Served};
use mooring_proto::transport::{
    BoxFuture, DataPlane, DataServer, LandedPiece, NodeAddr, ReadOp, SegmentMemory, WriteOp,
    checksums_of,
};
use mooring_proto::wire::{DataReply, DataRequest, DataResponse, Range};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::datagram::{MAX_BULK, decode, encode};
use crate::mux::Mux;
use crate::net::SimNet;
use crate::server::{Handled, spawn_server};

/// A node's data server on the simulated network.
pub struct SimDataServer {
    endpoint: Arc<str>,
    service: Arc<DataService>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl SimDataServer {
    /// Serves transfers on `bind` (on the current node). Keys derive from `key_seed`.
    pub async fn start(
        net: Arc<SimNet>,
        bind: SocketAddr,
        key_seed: u64,
    ) -> io::Result<Arc<SimDataServer>> {
        let service = Arc::new(DataService::new(key_seed));
        let serving = service.clone();
        let senders: Mutex<BTreeMap<SocketAddr, SenderClockView>> = Mutex::default();
        let task = spawn_server(
            net,
            bind,
            Box::new(move |datagram, from| {
                let mut senders = senders.lock().unwrap_or_else(|e| e.into_inner());
                let mut clock = SimSenderClock(senders.entry(from).or_default());
                serve(&serving, datagram, from, &mut clock)
            }),
        )
        .await?;
        Ok(Arc::new(SimDataServer {
            endpoint: bind.to_string().into(),
            service,
            task: Mutex::new(Some(task)),
        }))
    }

    /// Where callers send transfers.
    pub fn endpoint(&self) -> &Arc<str> {
        &self.endpoint
    }

    /// Stops serving.
    pub fn shutdown(&self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

impl Drop for SimDataServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A sender's clock as the node sees it: the same rule as over TCP
/// ([`SenderClockView`]), with arrival read off the simulated clock. Simulated hosts share one
/// clock, so the offset the view estimates is the smallest delay seen from that sender.
struct SimSenderClock<'a>(&'a mut SenderClockView);

impl SenderClock for SimSenderClock<'_> {
    fn observe(&mut self, sent_at_us: u64) {
        self.0.observe(sent_at_us, sim_clock_us() as i64);
    }

    fn expired(&mut self, sent_at_us: u64, valid_for_us: u64) -> bool {
        self.0
            .expired(sent_at_us, valid_for_us, sim_clock_us() as i64)
    }
}

/// Performs one transfer request; the reply carries read data.
fn serve(
    service: &DataService,
    datagram: &[u8],
    from: SocketAddr,
    clock: &mut dyn SenderClock,
) -> Handled {
    let (id, request, bulk) = match decode::<DataRequest>(datagram) {
        Ok(decoded) => decoded,
        Err(e) => {
            warn!(%from, "refusing a transfer: {e}");
            return Handled::Now(None);
        }
    };
    let reply =
        |response: DataResponse, bulk: &[&[u8]]| Handled::Now(Some(encode(id, &response, bulk)));
    match service.serve(request, clock) {
        Served::Answer(response) => reply(response, &[]),
        Served::RefuseWrite(e) => reply(Err(e), &[]),
        Served::Write(target) => reply(target.copy_in(bulk).map(|()| DataReply::Done), &[]),
        Served::Read(source) => reply(Ok(DataReply::Done), &source.read_slices()),
        Served::Later(staging) => {
            Handled::Later(Box::pin(
                async move { Some(encode(id, &staging.await, &[])) },
            ))
        }
    }
}

/// The simulation's shared clock, in microseconds.
fn sim_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl DataServer for SimDataServer {
    fn service(&self) -> &DataService {
        &self.service
    }

    fn export(&self, memory: SegmentMemory) -> Result<NodeAddr> {
        Ok(self.service.export(&self.endpoint, memory))
    }

    fn unexport(&self, key: u64) {
        self.service.unexport(key);
    }
}

/// The caller's side of the data plane over the simulated network.
pub struct SimDataPlane {
    mux: Arc<Mux>,
    timeout: Duration,
    /// The shortest round trip seen to each node's mount (its endpoint and mount key), of the
    /// requests whose send time the node notes ([`send_stamp`]): a
    /// write's announced validity leaves it out (see `FenceRule::announced_validity`). Per
    /// mount, not per endpoint: a node that restarts learns this sender's clock afresh, from
    /// messages that may all be slow, so a round trip seen before the restart bounds nothing
    /// it now knows (seed 3045: a writer lagged by more than the release timeout since the
    /// node came back had its late writes land on reused blocks).
    round_trips: Mutex<BTreeMap<(SocketAddr, u64), Duration>>,
}

impl SimDataPlane {
    /// A data plane from the current node (address `ip`); each request fails
    /// (`TRANSFER_FAIL`) if not answered within `timeout`.
    pub async fn new(
        net: Arc<SimNet>,
        ip: IpAddr,
        timeout: Duration,
    ) -> io::Result<Arc<SimDataPlane>> {
        Ok(Arc::new(SimDataPlane {
            mux: Mux::bind(net, ip).await?,
            timeout,
            round_trips: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Sends one request and returns the reply's bulk bytes.
    async fn exchange(
        &self,
        node: &NodeAddr,
        request: DataRequest,
        bulk: &[&[u8]],
    ) -> Result<(DataReply, Vec<u8>)> {
        let fail = |what: String| {
            Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("transfer with node {}: {what}", node.endpoint),
            )
        };
        let to: SocketAddr = node
            .endpoint
            .parse()
            .map_err(|e| fail(format!("bad endpoint: {e}")))?;
        let id = self.mux.next_id();
        let stamped = send_stamp(&request);
        let reply = self
            .mux
            .call(to, id, encode(id, &request, bulk), self.timeout)
            .await
            .map_err(|_| fail(format!("no answer within {:?}", self.timeout)))?;
        if let Some(sent_at_us) = stamped {
            let rtt = Duration::from_micros(sim_clock_us().saturating_sub(sent_at_us));
            self.lock_round_trips()
                .entry((to, node.key))
                .and_modify(|seen| *seen = (*seen).min(rtt))
                .or_insert(rtt);
        }
        let (_, response, data) =
            decode::<DataResponse>(&reply).map_err(|e| fail(format!("bad reply: {e}")))?;
        Ok((response?, data.to_vec()))
    }
}

impl SimDataPlane {
    fn lock_round_trips(&self) -> std::sync::MutexGuard<'_, BTreeMap<(SocketAddr, u64), Duration>> {
        self.round_trips.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shortest round trip seen to `node`'s mount, probing it first if none was: the
    /// node learns this sender's clock from the probe.
    async fn round_trip(&self, node: &NodeAddr) -> Result<Duration> {
        let to: Option<(SocketAddr, u64)> = node.endpoint.parse().ok().map(|to| (to, node.key));
        if let Some(rtt) = to.and_then(|to| self.lock_round_trips().get(&to).copied()) {
            return Ok(rtt);
        }
        let probe = DataRequest::Probe {
            sent_at_us: sim_clock_us(),
        };
        self.exchange(node, probe, &[]).await?;
        Ok(to
            .and_then(|to| self.lock_round_trips().get(&to).copied())
            .unwrap_or(self.timeout))
    }
}

/// The send time `request` carries, if any: the node notes the arrival of only such requests,
/// so only their round trips bound how late its view of this sender's clock may be. A read's
/// round trip bounds nothing the node knows (seed 13519: a writer that had only read from a
/// restarted node took a read's round trip as its bound, its first write reached the node
/// lagged by more than the release timeout, and the node, measuring the clock from that late
/// write, applied it to blocks the master had given to another value).
fn send_stamp(request: &DataRequest) -> Option<u64> {
    match request {
        DataRequest::Probe { sent_at_us } | DataRequest::Write { sent_at_us, .. } => {
            Some(*sent_at_us)
        }
        _ => None,
    }
}

/// Splits operations into groups of at most [`MAX_BULK`] bytes (an operation larger than
/// that is a group of its own, split by the caller).
fn groups<T>(ops: Vec<(u64, T)>, size: impl Fn(&T) -> usize) -> Vec<Vec<(u64, T)>> {
    let mut out: Vec<Vec<(u64, T)>> = Vec::new();
    let mut room = 0;
    for op in ops {
        let n = size(&op.1);
        if out.is_empty() || n > room {
            out.push(Vec::new());
            room = MAX_BULK;
        }
        room = room.saturating_sub(n);
        out.last_mut().expect("a group").push(op);
    }
    out
}

/// Cuts operations larger than [`MAX_BULK`] into pieces.
fn pieces<'a>(addr: u64, len: usize) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> + 'a {
    (0..len.div_ceil(MAX_BULK).max(1)).map(move |i| {
        let start = i * MAX_BULK;
        let end = (start + MAX_BULK).min(len);
        (addr + start as u64, start..end)
    })
}

impl DataPlane for SimDataPlane {
    fn read<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<ReadOp<'a>>,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            let count = ops.len();
            let mut split: Vec<(u64, (usize, &mut [u8]))> = Vec::new();
            for (index, op) in ops.into_iter().enumerate() {
                let mut rest = op.dest;
                for (addr, range) in pieces(op.addr, rest.len()) {
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(range.len());
                    split.push((addr, (index, head)));
                    rest = tail;
                }
            }
            let requests = groups(split, |(_, d)| d.len())
                .into_iter()
                .map(|group| async move {
                    let ranges: Vec<Range> = group
                        .iter()
                        .map(|(addr, (_, d))| Range {
                            addr: *addr,
                            len: d.len() as u64,
                        })
                        .collect();
                    let (_, data) = self
                        .exchange(
                            node,
                            DataRequest::Read {
                                key: node.key,
                                ranges,
                                unaligned: false,
                            },
                            &[],
                        )
                        .await?;
                    let expected: usize = group.iter().map(|(_, (_, d))| d.len()).sum();
                    if data.len() != expected {
                        return Err(Error::new(
                            ErrorCode::TRANSFER_FAIL,
                            format!(
                                "node {} sent {} bytes for {expected}",
                                node.endpoint,
                                data.len()
                            ),
                        ));
                    }
                    let mut at = 0;
                    let mut landed = Vec::with_capacity(group.len());
                    for (addr, (op, dest)) in group {
                        let len = dest.len();
                        dest.copy_from_slice(&data[at..at + len]);
                        at += len;
                        let checksum = Checksum::of(dest);
                        let len = len as u64;
                        landed.push(LandedPiece {
                            op,
                            addr,
                            len,
                            checksum,
                        });
                    }
                    Ok(landed)
                });
            let landed: Vec<Vec<LandedPiece>> = join_all(requests)
                .await
                .into_iter()
                .collect::<Result<_>>()?;
            Ok(checksums_of(count, landed.into_iter().flatten().collect()))
        })
    }

    fn write<'a>(
        &'a self,
        node: &'a NodeAddr,
        ops: Vec<WriteOp<'a>>,
        valid_for: Duration,
    ) -> BoxFuture<'a, Result<Vec<Checksum>>> {
        Box::pin(async move {
            let sums: Vec<Checksum> = ops.iter().map(|op| Checksum::of(op.src)).collect();
            let rtt = self.round_trip(node).await?;
            let remaining = valid_for.as_micros().min(u128::from(u64::MAX)) as u64;
            let Some(valid_for_us) =
                FenceRule::announced_validity(remaining, rtt.as_micros() as u64)
            else {
                return Err(Error::new(
                    ErrorCode::TRANSFER_FAIL,
                    format!(
                        "not writing to {}: the writer's fence leaves less than a round trip",
                        node.endpoint
                    ),
                ));
            };
            let sent_at_us = sim_clock_us();
            let split: Vec<(u64, &[u8])> = ops
                .into_iter()
                .flat_map(|op| {
                    pieces(op.addr, op.src.len()).map(move |(addr, range)| (addr, &op.src[range]))
                })
                .collect();
            let requests = groups(split, |s| s.len())
                .into_iter()
                .map(|group| async move {
                    let ranges: Vec<Range> = group
                        .iter()
                        .map(|(addr, s)| Range {
                            addr: *addr,
                            len: s.len() as u64,
                        })
                        .collect();
                    let bulk: Vec<&[u8]> = group.iter().map(|(_, s)| *s).collect();
                    self.exchange(
                        node,
                        DataRequest::Write {
                            key: node.key,
                            ranges,
                            sent_at_us,
                            valid_for_us,
                        },
                        &bulk,
                    )
                    .await
                    .map(|_| ())
                });
            join_all(requests)
                .await
                .into_iter()
                .collect::<Result<()>>()
                .map(|()| sums)
        })
    }

    fn request<'a>(
        &'a self,
        node: &'a NodeAddr,
        request: DataRequest,
    ) -> BoxFuture<'a, Result<DataReply>> {
        Box::pin(async move { Ok(self.exchange(node, request, &[]).await?.0) })
    }
}
