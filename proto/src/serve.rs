//! Serving data requests: what a node's data server does with each request, shared by every
//! transport. A transport reads a request off its wire, asks [`DataService::serve`] what to do,
//! and moves the bytes it is told to move; it decides nothing itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use mooring_core::{Error, ErrorCode, Result};

use crate::transport::{
    BoxFuture, ExportTable, Exported, NodeAddr, RdmaAcceptor, SegmentMemory, ShmAcceptor, Stager,
};
use crate::wire::{DataReply, DataRequest, DataResponse, Range};

/// How a transport relates a sender's send times to its own clock, so that a write delayed in
/// the network past its validity is refused (see `DataRequest::Write::valid_for_us`).
pub trait SenderClock {
    /// A probe or write sent at `sent_at_us` (the sender's clock) arrived now.
    fn observe(&mut self, sent_at_us: u64);
    /// Whether a write sent at `sent_at_us` and valid for `valid_for_us` arrived too late.
    fn expired(&mut self, sent_at_us: u64, valid_for_us: u64) -> bool;
}

/// What the transport does with one request.
pub enum Served {
    /// Answer this at once; no bulk bytes follow.
    Answer(DataResponse),
    /// Put the request's bulk bytes into these ranges, in order, then answer `Done`.
    Write(Ranges),
    /// Refuse the write: answer this error. Its bulk bytes follow on the wire; a stream
    /// transport cannot skip them safely and closes the connection after answering.
    RefuseWrite(Error),
    /// Answer `Done`, then send the bytes of these ranges, in order.
    Read(Ranges),
    /// Answer with what this gives (a disk copy being staged).
    Later(BoxFuture<'static, DataResponse>),
}

/// Ranges of one exported segment that a request may touch, checked against the segment.
pub struct Ranges {
    memory: SegmentMemory,
    ranges: Vec<Range>,
    exported: Exported,
    unaligned: bool,
}

impl Ranges {
    /// Whether the segment is still exported under the request's key, for a transport that
    /// fills the ranges over time: it stops once the export ends (the master may have given
    /// the ranges to other writers).
    pub fn exported(&self) -> Exported {
        self.exported.clone()
    }

    /// Whether the reader asked for these bytes copied rather than lent (see
    /// [`DataRequest::Read`]'s `unaligned`).
    pub fn unaligned(&self) -> bool {
        self.unaligned
    }

    /// Total bytes.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    /// Whether there are no bytes to move.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each range's first byte and length (inside the segment: checked when resolved).
    fn spans(&self) -> impl Iterator<Item = (*mut u8, usize)> + '_ {
        self.ranges.iter().map(|r| {
            let ptr = self
                .memory
                .range(r.addr, r.len)
                .expect("checked at resolve");
            (ptr.as_ptr(), r.len as usize)
        })
    }

    /// The ranges' bytes, to send to a reader.
    pub fn read_slices(&self) -> Vec<&[u8]> {
        // SAFETY: each span lies inside the segment, which `self.memory` keeps mapped while the
        // slices (borrowing `self`) live; writers of these bytes are excluded by the master's
        // protocol (a replica is read only once complete), as for an RDMA READ.
        self.spans()
            .map(|(ptr, len)| unsafe { std::slice::from_raw_parts(ptr.cast_const(), len) })
            .collect()
    }

    /// The ranges' bytes, for a transport to fill straight from its wire.
    pub fn write_slices(&mut self) -> Vec<&mut [u8]> {
        // SAFETY: as for `read_slices`; the master's protocol gives this writer exclusive use
        // of the ranges (its grant), as for an RDMA WRITE. A writer whose ranges overlap each
        // other only races its own bytes.
        self.spans()
            .map(|(ptr, len)| unsafe { std::slice::from_raw_parts_mut(ptr, len) })
            .collect()
    }

    /// Copies `bulk`, which must be exactly [`Ranges::len`] bytes, into the ranges in order.
    pub fn copy_in(&self, bulk: &[u8]) -> Result<()> {
        if bulk.len() as u64 != self.len() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "write announces {} bytes but carries {}",
                    self.len(),
                    bulk.len()
                ),
            ));
        }
        let mut at = 0;
        for r in &self.ranges {
            let len = r.len as usize;
            self.memory.copy_in(r.addr, &bulk[at..at + len]);
            at += len;
        }
        Ok(())
    }
}

/// A node's data service: the segments it exports and its disk tier, and the answer to every
/// data request. Every transport's data server owns one.
pub struct DataService {
    exports: ExportTable,
    disk: RwLock<DiskState>,
    rdma: RwLock<Option<Arc<dyn RdmaAcceptor>>>,
    shm: RwLock<Option<Arc<dyn ShmAcceptor>>>,
    counters: Counters,
}

/// What a data server has served since it started, for its metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataCounts {
    /// Reads served from segment memory.
    pub reads: u64,
    /// Bytes those reads sent.
    pub read_bytes: u64,
    /// Writes accepted into segment memory.
    pub writes: u64,
    /// Bytes those writes carried.
    pub write_bytes: u64,
    /// Disk copies staged for a reader.
    pub stages: u64,
    /// Requests refused (unknown key or range, a write past its deadline, no disk tier).
    pub refused: u64,
    /// Connections open now (for transports that have connections).
    pub connections: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    stages: AtomicU64,
    refused: AtomicU64,
}

/// Whether a node serves disk copies.
enum DiskState {
    /// It has no disk tier.
    Absent,
    /// Its disk tier is recovering (a restarted node mounts before its disk is scanned).
    Starting,
    /// Stage requests go here.
    Serving(Arc<dyn Stager>),
}

impl DataService {
    /// A service exporting nothing yet; keys derive from `key_seed` (see [`ExportTable::new`]).
    pub fn new(key_seed: u64) -> DataService {
        DataService {
            exports: ExportTable::new(key_seed),
            disk: RwLock::new(DiskState::Absent),
            rdma: RwLock::new(None),
            shm: RwLock::new(None),
            counters: Counters::default(),
        }
    }

    /// Exports `memory` at `endpoint` under a fresh key.
    pub fn export(&self, endpoint: &Arc<str>, memory: SegmentMemory) -> NodeAddr {
        NodeAddr {
            endpoint: endpoint.clone(),
            key: self.exports.export(memory),
            rdma_key: None,
        }
    }

    /// Stops serving `key`.
    pub fn unexport(&self, key: u64) {
        self.exports.unexport(key);
    }

    /// Every exported key.
    pub fn keys(&self) -> Vec<u64> {
        self.exports.keys()
    }

    /// Serves readers' stage requests from `stager` from now on.
    pub fn serve_disk(&self, stager: Arc<dyn Stager>) {
        *self.disk.write().unwrap_or_else(|e| e.into_inner()) = DiskState::Serving(stager);
    }

    /// Connects clients' RDMA queue pairs through `acceptor` from now on.
    pub fn serve_rdma(&self, acceptor: Arc<dyn RdmaAcceptor>) {
        *self.rdma.write().unwrap_or_else(|e| e.into_inner()) = Some(acceptor);
    }

    /// Offers clients on this host shared mappings through `acceptor` from now on.
    pub fn serve_shm(&self, acceptor: Arc<dyn ShmAcceptor>) {
        *self.shm.write().unwrap_or_else(|e| e.into_inner()) = Some(acceptor);
    }

    /// Until [`DataService::serve_disk`], tells readers this node's disk tier is starting
    /// (retry shortly) rather than that it has none.
    pub fn disk_starting(&self) {
        let mut disk = self.disk.write().unwrap_or_else(|e| e.into_inner());
        if matches!(*disk, DiskState::Absent) {
            *disk = DiskState::Starting;
        }
    }

    /// What this service has served so far.
    pub fn counts(&self) -> DataCounts {
        let c = &self.counters;
        DataCounts {
            reads: c.reads.load(Ordering::Relaxed),
            read_bytes: c.read_bytes.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            write_bytes: c.write_bytes.load(Ordering::Relaxed),
            stages: c.stages.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            connections: 0,
        }
    }

    /// What to do with `request`, which arrived now from a sender whose clock `clock` tracks.
    pub fn serve(&self, request: DataRequest, clock: &mut dyn SenderClock) -> Served {
        let served = self.decide(request, clock);
        let c = &self.counters;
        let count = |n: &AtomicU64, by: u64| {
            n.fetch_add(by, Ordering::Relaxed);
        };
        match &served {
            Served::Read(ranges) => {
                count(&c.reads, 1);
                count(&c.read_bytes, ranges.len());
            }
            Served::Write(ranges) => {
                count(&c.writes, 1);
                count(&c.write_bytes, ranges.len());
            }
            Served::Later(_) => count(&c.stages, 1),
            Served::RefuseWrite(_) | Served::Answer(Err(_)) => count(&c.refused, 1),
            Served::Answer(Ok(_)) => {}
        }
        served
    }

    fn decide(&self, request: DataRequest, clock: &mut dyn SenderClock) -> Served {
        match request {
            DataRequest::Write {
                key,
                ranges,
                sent_at_us,
                valid_for_us,
            } => {
                if clock.expired(sent_at_us, valid_for_us) {
                    return Served::RefuseWrite(Error::new(
                        ErrorCode::TRANSFER_FAIL,
                        "the write reached the node after its deadline (delayed in the \
                         network); not applied, since the master may have given its ranges to \
                         another writer",
                    ));
                }
                match self.exports.resolve_watched(key, &ranges) {
                    Ok((memory, exported)) => Served::Write(Ranges {
                        memory,
                        ranges,
                        exported,
                        unaligned: false,
                    }),
                    Err(e) => Served::RefuseWrite(e),
                }
            }
            DataRequest::Read {
                key,
                ranges,
                unaligned,
            } => match self.exports.resolve_watched(key, &ranges) {
                Ok((memory, exported)) => Served::Read(Ranges {
                    memory,
                    ranges,
                    exported,
                    unaligned,
                }),
                Err(e) => Served::Answer(Err(e)),
            },
            DataRequest::Probe { sent_at_us } => {
                clock.observe(sent_at_us);
                Served::Answer(Ok(DataReply::Done))
            }
            DataRequest::Stage {
                object,
                size,
                write,
            } => match self.stager() {
                Ok(stager) => Served::Later(Box::pin(async move {
                    stager
                        .stage(object, write, size)
                        .await
                        .map(DataReply::Staged)
                })),
                Err(e) => Served::Answer(Err(e)),
            },
            DataRequest::Unstage { slot } => Served::Answer(self.stager().map(|stager| {
                stager.unstage(slot);
                DataReply::Done
            })),
            DataRequest::RdmaConnect {
                client,
                replaces,
                key,
            } => {
                if let Err(e) = self.exports.resolve(key, &[]) {
                    return Served::Answer(Err(e));
                }
                let acceptor = self.rdma.read().unwrap_or_else(|e| e.into_inner()).clone();
                Served::Answer(match acceptor {
                    Some(acceptor) => acceptor
                        .accept(client, replaces)
                        .map(DataReply::RdmaConnected),
                    None => Err(Error::new(
                        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                        "this node does not serve RDMA (start it with --transports tcp,rdma)",
                    )),
                })
            }
            DataRequest::ShmAttach { key } => {
                let acceptor = self.shm.read().unwrap_or_else(|e| e.into_inner()).clone();
                Served::Answer(match acceptor {
                    Some(acceptor) => acceptor.offer(key).map(DataReply::ShmOffer),
                    None => Err(Error::new(
                        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                        "this node does not serve same-host shared memory (start it with \
                         --transports tcp,shm)",
                    )),
                })
            }
        }
    }

    fn stager(&self) -> Result<Arc<dyn Stager>> {
        match &*self.disk.read().unwrap_or_else(|e| e.into_inner()) {
            DiskState::Serving(stager) => Ok(stager.clone()),
            DiskState::Starting => Err(Error::new(
                ErrorCode::REPLICA_IS_NOT_READY,
                "this node's disk tier is still recovering its copies; retry shortly",
            )),
            DiskState::Absent => Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "this node has no disk tier (start it with a disk directory)",
            )),
        }
    }
}

#[cfg(all(test, not(mooring_loom)))]
mod tests {
    use std::ptr::NonNull;

    use super::*;

    /// A clock that reports every write expired or none.
    struct Fixed(bool);

    impl SenderClock for Fixed {
        fn observe(&mut self, _: u64) {}
        fn expired(&mut self, _: u64, _: u64) -> bool {
            self.0
        }
    }

    fn segment() -> SegmentMemory {
        let owner = Arc::new(std::sync::Mutex::new(vec![0u8; 4096]));
        let ptr = NonNull::new(owner.lock().unwrap().as_mut_ptr()).unwrap();
        // SAFETY: the vector lives as long as `owner`, which the memory keeps.
        unsafe { SegmentMemory::new(ptr, 4096, owner) }
    }

    #[test]
    fn writes_land_and_read_back_and_late_or_foreign_writes_are_refused() {
        let service = DataService::new(1);
        let memory = segment();
        let base = memory.base();
        let addr = service.export(&Arc::from("node:1"), memory);
        let ranges = vec![
            Range { addr: base, len: 3 },
            Range {
                addr: base + 100,
                len: 2,
            },
        ];
        let write = |key| DataRequest::Write {
            key,
            ranges: ranges.clone(),
            sent_at_us: 0,
            valid_for_us: 1,
        };
        let Served::Write(target) = service.serve(write(addr.key), &mut Fixed(false)) else {
            panic!("a valid write is accepted");
        };
        assert!(target.copy_in(b"abcd").is_err(), "short bulk refused");
        target.copy_in(b"abcde").unwrap();
        let read = DataRequest::Read {
            key: addr.key,
            ranges: ranges.clone(),
            unaligned: true,
        };
        let Served::Read(source) = service.serve(read, &mut Fixed(false)) else {
            panic!("a valid read is served");
        };
        assert_eq!(source.read_slices(), [&b"abc"[..], &b"de"[..]]);
        assert!(
            source.unaligned(),
            "the reader's wish reaches the transport"
        );
        assert!(matches!(
            service.serve(write(addr.key), &mut Fixed(true)),
            Served::RefuseWrite(e) if e.code == ErrorCode::TRANSFER_FAIL
        ));
        assert!(matches!(
            service.serve(write(addr.key ^ 2), &mut Fixed(false)),
            Served::RefuseWrite(e) if e.code == ErrorCode::REPLICA_IS_GONE
        ));
        let stage = DataRequest::Stage {
            object: "k".into(),
            size: 1,
            write: 1,
        };
        assert!(matches!(
            service.serve(stage.clone(), &mut Fixed(false)),
            Served::Answer(Err(e)) if e.code == ErrorCode::INVALID_PARAMS
        ));
        service.disk_starting();
        assert!(matches!(
            service.serve(stage, &mut Fixed(false)),
            Served::Answer(Err(e)) if e.code == ErrorCode::REPLICA_IS_NOT_READY
        ));
        service.unexport(addr.key);
        let read = DataRequest::Read {
            key: addr.key,
            ranges,
            unaligned: false,
        };
        assert!(matches!(
            service.serve(read, &mut Fixed(false)),
            Served::Answer(Err(e)) if e.code == ErrorCode::REPLICA_IS_GONE
        ));
    }

    /// A queue pair is connected only for a segment the node serves: descriptors from an
    /// earlier incarnation of the node (simulation seed 199 over RDMA: a restarted client
    /// process registered fresh memory under the memory key its predecessor had) are
    /// refused as gone instead of reading the new process's memory.
    #[test]
    fn rdma_connect_names_a_served_segment() {
        let service = DataService::new(1);
        let addr = service.export(&Arc::from("node:1"), segment());
        let connect = |key| DataRequest::RdmaConnect {
            client: crate::wire::QpAddress {
                qpn: 1,
                lid: 1,
                gid: [0; 16],
                psn: 1,
            },
            replaces: None,
            key,
        };
        assert!(matches!(
            service.serve(connect(addr.key ^ 2), &mut Fixed(false)),
            Served::Answer(Err(e)) if e.code == ErrorCode::REPLICA_IS_GONE
        ));
        // A served segment gets as far as the RDMA acceptor (none on this node).
        assert!(matches!(
            service.serve(connect(addr.key), &mut Fixed(false)),
            Served::Answer(Err(e)) if e.code == ErrorCode::UNAVAILABLE_IN_CURRENT_MODE
        ));
    }
}
