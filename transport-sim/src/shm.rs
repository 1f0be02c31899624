//! Same-host shared memory in the simulation: segments handed over by a call instead of on a
//! Unix socket.
//!
//! Every node and client of a simulated cluster lives in one process, so none can reach
//! another's abstract socket as a separate process would, and the socket's thread would make
//! a run depend on the operating system's scheduling. Everything else is the production code:
//! nodes back their segments with sealed memfds and issue one-time tickets
//! ([`ShmServer`]), clients ask for them over the simulated data-server connection and map
//! the descriptor they receive a second time ([`mooring_transport_shm::ShmDataPlane`]), so a
//! client reads and writes the node's pages through its own mapping, outliving the node's
//! if the node crashes, as a mapping in another process would.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};

use mooring_proto::handoff::{Reply, encode_request};
use mooring_proto::wire::ShmOffer;
use mooring_transport_shm::{Handoff, ShmServer};

/// The shared-memory servers of a simulated cluster, by socket id: what a client's handoff
/// reaches instead of a socket.
#[derive(Default)]
pub struct SimSockets {
    servers: Mutex<HashMap<[u8; 16], Weak<ShmServer>>>,
}

impl SimSockets {
    /// A shared-memory server for a node on `host`, reachable by this cluster's clients
    /// while the node keeps it.
    pub fn serve(&self, host: [u8; 16]) -> Arc<ShmServer> {
        let server = ShmServer::unlistened(host);
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        servers.retain(|_, s| s.strong_count() > 0);
        servers.insert(server.socket(), Arc::downgrade(&server));
        server
    }

    /// The handoff for this cluster's clients.
    pub fn handoff(self: &Arc<Self>) -> Arc<dyn Handoff> {
        Arc::new(SimHandoff(self.clone()))
    }
}

/// A client's handoff: the node's server answers the same request bytes it reads from its
/// socket in production.
struct SimHandoff(Arc<SimSockets>);

impl Handoff for SimHandoff {
    fn in_this_process(&self, _socket: &[u8; 16]) -> bool {
        // Each simulated member stands for a process of its own.
        false
    }

    fn exchange(&self, offer: &ShmOffer) -> Result<(Reply, Option<OwnedFd>), String> {
        let server = {
            let servers = self.0.servers.lock().unwrap_or_else(|e| e.into_inner());
            servers.get(&offer.socket).and_then(Weak::upgrade)
        };
        // A node that crashed or left: its socket is gone with it.
        let server = server.ok_or("cannot reach the node's socket: no one listens on it")?;
        Ok(server.hand_over(&encode_request(&offer.ticket)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooring_proto::transport::ShmAcceptor;
    use mooring_transport_shm::SharedMemory;

    #[test]
    fn a_ticket_buys_the_segment_once_and_only_while_its_node_lives() {
        let sockets = Arc::new(SimSockets::default());
        let handoff = sockets.handoff();
        let server = sockets.serve([7; 16]);
        let memory = SharedMemory::new(1 << 16, false).unwrap().into_segment();
        server.add(5, memory.clone());
        let offer = server.offer(5).unwrap();
        assert_eq!(offer.host, [7; 16]);

        let (reply, fd) = handoff.exchange(&offer).unwrap();
        assert_eq!(
            reply,
            Reply::Granted {
                base: memory.base(),
                len: 1 << 16,
                proof: offer.proof,
            }
        );
        assert!(fd.is_some(), "the descriptor comes with the grant");
        let (again, fd) = handoff.exchange(&offer).unwrap();
        assert!(matches!(again, Reply::Refused(_)), "{again:?}");
        assert!(fd.is_none());

        let later = server.offer(5).unwrap();
        drop(server);
        let gone = handoff.exchange(&later).unwrap_err();
        assert!(gone.contains("no one listens"), "{gone}");
    }
}
