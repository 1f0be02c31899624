//! A serving endpoint: receives requests, drops corrupt and duplicate ones, answers the rest.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use madsim::net::Endpoint;
use mooring_proto::transport::BoxFuture;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::datagram::{TAG_REPLY, TAG_REQUEST, check};
use crate::net::SimNet;

/// Request ids remembered per caller incarnation to recognise duplicates.
const DEDUP_WINDOW: usize = 4096;

/// The ids one caller incarnation has sent recently (as an RDMA reliable connection's
/// sequence numbers let the receiver drop retransmitted duplicates).
#[derive(Default)]
struct SeenIds {
    /// Every id at or below this is forgotten and treated as seen.
    floor: u32,
    recent: BTreeSet<u32>,
}

impl SeenIds {
    /// Records `seq`; false if it was seen before (a duplicate).
    fn first_time(&mut self, seq: u32) -> bool {
        if seq <= self.floor || !self.recent.insert(seq) {
            return false;
        }
        while self.recent.len() > DEDUP_WINDOW {
            if let Some(oldest) = self.recent.pop_first() {
                self.floor = oldest;
            }
        }
        true
    }
}

/// A handler's answer to one request.
pub(crate) enum Handled {
    /// Answered at once (in arrival order); `None` sends no reply.
    Now(Option<Vec<u8>>),
    /// Answered when the future completes (a disk read), while later requests are served.
    Later(BoxFuture<'static, Option<Vec<u8>>>),
}

/// Answers one intact, first-time request datagram.
pub(crate) type Handler = Box<dyn Fn(&[u8], SocketAddr) -> Handled + Send + Sync>;

/// Binds `bind` and serves requests with `handler` until the returned task is aborted.
pub(crate) async fn spawn_server(
    net: Arc<SimNet>,
    bind: SocketAddr,
    handler: Handler,
) -> io::Result<JoinHandle<()>> {
    let endpoint = Endpoint::bind(bind).await?;
    let addr = endpoint.local_addr()?;
    Ok(tokio::spawn(async move {
        let mut seen: BTreeMap<(SocketAddr, u32), SeenIds> = BTreeMap::new();
        loop {
            let Ok((payload, from)) = endpoint.recv_from_raw(TAG_REQUEST).await else {
                return;
            };
            let Ok(datagram) = payload.downcast::<Vec<u8>>() else {
                continue;
            };
            let id = match check(&datagram) {
                Ok((header, _)) => header.request_id,
                Err(e) => {
                    warn!(%from, "refusing a request: {e}");
                    net.count_refused();
                    continue;
                }
            };
            let (session, seq) = ((id >> 32) as u32, id as u32);
            if !seen.entry((from, session)).or_default().first_time(seq) {
                debug!(%from, id, "dropping a duplicate request");
                net.count_deduplicated();
                continue;
            }
            match handler(&datagram, from) {
                Handled::Now(Some(reply)) => net.send(&endpoint, addr, from, TAG_REPLY, reply),
                Handled::Now(None) => {}
                Handled::Later(answer) => {
                    let (net, endpoint) = (net.clone(), endpoint.clone());
                    tokio::spawn(async move {
                        if let Some(reply) = answer.await {
                            net.send(&endpoint, addr, from, TAG_REPLY, reply);
                        }
                    });
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_recognised_inside_and_below_the_window() {
        let mut seen = SeenIds::default();
        assert!(seen.first_time(5));
        assert!(seen.first_time(3), "reordered ids are fine");
        assert!(!seen.first_time(5));
        for seq in 10..10 + DEDUP_WINDOW as u32 + 10 {
            assert!(seen.first_time(seq));
        }
        assert!(!seen.first_time(3), "ids below the window count as seen");
        assert!(!seen.first_time(11));
    }
}
