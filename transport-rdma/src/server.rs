//! The passive side, on a node: registers segments for remote READ and WRITE, and accepts
//! queue pairs from clients that asked over the node's authenticated data-server connection.
//! The node's application code takes no part in a transfer; the device answers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::transport::SegmentMemory;

use crate::verbs::{Access, MemoryKeys, QpEndpoint, QpState, Verbs};

/// Queue pairs a node accepts in all unless told otherwise.
pub const DEFAULT_MAX_QUEUE_PAIRS: usize = 1024;

/// A node's RDMA side.
pub struct RdmaServer<V: Verbs> {
    verbs: Arc<V>,
    max_queue_pairs: usize,
    state: Mutex<ServerState>,
}

#[derive(Default)]
struct ServerState {
    // By rkey: the registration's lkey and the memory it keeps alive.
    exports: BTreeMap<u32, (u32, SegmentMemory)>,
    // Accepted queue pairs, by number: the client endpoint each is connected to, and when
    // it was accepted (a sequence number).
    accepted: BTreeMap<u32, (QpEndpoint, u64)>,
    accepted_so_far: u64,
}

impl<V: Verbs> RdmaServer<V> {
    /// A server on `verbs` accepting at most `max_queue_pairs` queue pairs.
    pub fn new(verbs: Arc<V>, max_queue_pairs: usize) -> Self {
        RdmaServer {
            verbs,
            max_queue_pairs,
            state: Mutex::new(ServerState::default()),
        }
    }

    /// The device.
    pub fn verbs(&self) -> &Arc<V> {
        &self.verbs
    }

    /// Registers `memory` for remote READ and WRITE; its rkey is what clients name it by.
    pub fn export(&self, memory: SegmentMemory) -> Result<MemoryKeys> {
        // SAFETY: `memory` keeps its bytes allocated while any clone lives, and the clone
        // kept in `exports` is dropped only after the registration ends.
        let keys = unsafe {
            self.verbs
                .register(memory.base(), memory.len() as u64, Access::REMOTE)
        }
        .map_err(|e| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "cannot register the {}-byte segment with the RDMA device: {e} (raise the \
                     memlock limit, ulimit -l, to at least the segment size)",
                    memory.len()
                ),
            )
        })?;
        self.lock().exports.insert(keys.rkey, (keys.lkey, memory));
        Ok(keys)
    }

    /// Ends the export whose rkey is `rkey`: later requests naming it fail with a remote
    /// access error.
    pub fn unexport(&self, rkey: u32) {
        let removed = self.lock().exports.remove(&rkey);
        if let Some((lkey, memory)) = removed {
            self.verbs.deregister(lkey);
            // Only now may the memory go.
            drop(memory);
        }
    }

    /// Connects a new queue pair to the client's `remote` endpoint and returns ours. If
    /// `replaces` names a queue pair this server accepted for the same client port, it is
    /// destroyed (the client reset its side). At the limit the oldest queue pair goes:
    /// clients come and go without saying so (a CLI call is a whole client), and a client
    /// still using the one dropped reconnects after one failed transfer.
    pub fn accept(&self, remote: QpEndpoint, replaces: Option<u32>) -> Result<QpEndpoint> {
        let mut state = self.lock();
        if let Some(old) = replaces {
            let same_port = state
                .accepted
                .get(&old)
                .is_some_and(|(e, _)| e.lid == remote.lid && e.gid == remote.gid);
            if same_port {
                state.accepted.remove(&old);
                self.verbs.destroy_qp(old);
            }
        }
        while state.accepted.len() >= self.max_queue_pairs.max(1) {
            let oldest = state
                .accepted
                .iter()
                .min_by_key(|(_, (_, seq))| *seq)
                .map(|(qpn, _)| *qpn)
                .expect("at the limit, so not empty");
            state.accepted.remove(&oldest);
            self.verbs.destroy_qp(oldest);
            tracing::debug!(
                qpn = oldest,
                "dropped the oldest RDMA queue pair at the limit"
            );
        }
        let fail = |e: crate::verbs::VerbsError| {
            Error::new(
                ErrorCode::TRANSFER_FAIL,
                format!("cannot set up an RDMA queue pair: {e}"),
            )
        };
        // A responder posts nothing, so a shallow queue is enough.
        let qpn = self.verbs.create_qp(1).map_err(fail)?;
        let connected = self
            .verbs
            .modify_qp(qpn, QpState::Init, None)
            .and_then(|()| {
                self.verbs
                    .modify_qp(qpn, QpState::ReadyToReceive, Some(&remote))
            })
            .and_then(|()| self.verbs.modify_qp(qpn, QpState::ReadyToSend, None))
            .and_then(|()| self.verbs.endpoint(qpn));
        match connected {
            Ok(local) => {
                state.accepted_so_far += 1;
                let seq = state.accepted_so_far;
                state.accepted.insert(qpn, (remote, seq));
                Ok(local)
            }
            Err(e) => {
                self.verbs.destroy_qp(qpn);
                Err(fail(e))
            }
        }
    }

    /// How many queue pairs are connected to clients.
    pub fn queue_pairs(&self) -> usize {
        self.lock().accepted.len()
    }

    fn lock(&self) -> MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<V: Verbs> Drop for RdmaServer<V> {
    fn drop(&mut self) {
        let state = std::mem::take(&mut *self.lock());
        for qpn in state.accepted.keys() {
            self.verbs.destroy_qp(*qpn);
        }
        for (lkey, memory) in state.exports.into_values() {
            self.verbs.deregister(lkey);
            drop(memory);
        }
    }
}
