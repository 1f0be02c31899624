//! A peer's answers to other peers and to clients with no pool of their own.
//!
//! Directory messages and lookups are the protocol's pure handling
//! (`mooring_proto::peer_dispatch`); greetings and goodbyes go to membership; promotes (which read
//! the disk) and a client's put, get, exists and remove run as this peer's own operations.

use mooring_core::{Error, ErrorCode};
use mooring_proto::auth::Roles;
use mooring_proto::peer_dispatch::handle;
use mooring_proto::refusals;
use mooring_proto::transport::BoxFuture;
use mooring_proto::wire::{PeerReply, PeerRequest, PeerResponse};
use mooring_transport_tcp::{PeerCaller, PeerService};
use tracing::info;

use super::PeerNode;

/// The peer service of one peer.
pub(super) struct Service(pub(super) PeerNode);

impl PeerService for Service {
    fn answer<'a>(
        &'a self,
        caller: &'a mut PeerCaller,
        request: PeerRequest,
    ) -> BoxFuture<'a, PeerResponse> {
        Box::pin(async move {
            let peer = &self.0;
            let response = peer.answer(caller, request).await;
            if let Err(refused) = &response
                && refused.code == ErrorCode::ILLEGAL_CLIENT
            {
                refusals::refused(&caller.member.name, &refused.to_string());
            }
            response
        })
    }
}

impl PeerNode {
    async fn answer(&self, caller: &mut PeerCaller, request: PeerRequest) -> PeerResponse {
        request.check()?;
        match request {
            PeerRequest::Hello { me, known } => {
                caller.greet_as(&me.name)?;
                let change = self.heard_from(me, known);
                let peer = self.clone();
                // A join re-publishes; the greeter need not wait for it.
                tokio::spawn(async move { peer.apply(change).await });
                let membership = self.inner.membership.lock().expect("membership lock");
                Ok(PeerReply::Welcome {
                    me: membership.me().clone(),
                    known: membership.gossip().iter().map(|n| n.to_string()).collect(),
                })
            }
            PeerRequest::Put { key, value } => {
                may_use(caller)?;
                self.serving()?;
                self.put(&key, &value).await?;
                Ok(PeerReply::Stored)
            }
            PeerRequest::Get { key } => {
                may_use(caller)?;
                self.serving()?;
                Ok(PeerReply::Value {
                    value: self.get(&key).await?,
                })
            }
            PeerRequest::Exists { keys } => {
                may_use(caller)?;
                self.serving()?;
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                Ok(PeerReply::Exist {
                    found: self.exists(&keys).await,
                })
            }
            PeerRequest::Remove { key } => {
                may_use(caller)?;
                self.serving()?;
                Ok(PeerReply::Removed {
                    existed: self.remove(&key).await?,
                })
            }
            PeerRequest::Promote { key } => {
                if caller.name.is_none() {
                    return Err(Error::new(
                        ErrorCode::ILLEGAL_CLIENT,
                        "promotes come from peers, and a peer greets before sending one",
                    ));
                }
                Ok(PeerReply::Promoted {
                    location: self.promote(&key).await?,
                })
            }
            PeerRequest::Leave => {
                let Some(name) = caller.name.clone() else {
                    return Err(Error::new(
                        ErrorCode::ILLEGAL_CLIENT,
                        "only a peer leaves, and a peer greets before it leaves",
                    ));
                };
                let now = self.inner.clock.now();
                let change = {
                    let mut membership = self.inner.membership.lock().expect("membership lock");
                    membership.left(&name, now)
                };
                info!(peer = %self.inner.name, left = %name, "peer left");
                let peer = self.clone();
                tokio::spawn(async move { peer.apply(change).await });
                Ok(PeerReply::Left)
            }
            request => {
                let from = match (&request, &caller.name) {
                    (PeerRequest::Lookup { .. }, _) => {
                        may_use(caller)?;
                        caller.name.clone().unwrap_or_default()
                    }
                    (_, Some(name)) => name.clone(),
                    (_, None) => {
                        return Err(Error::new(
                            ErrorCode::ILLEGAL_CLIENT,
                            "directory messages come from peers, and a peer greets before \
                             sending them",
                        ));
                    }
                };
                let now = self.inner.clock.now();
                let handled = {
                    let mut state = self.inner.state.lock().expect("peer state lock");
                    let handled = handle(&mut state, &from, request, now);
                    self.owed(&mut state);
                    handled
                };
                let handled = handled.map_err(|request| {
                    Error::new(
                        ErrorCode::INTERNAL_ERROR,
                        format!(
                            "{} reached the directory's handling",
                            request_name(&request)
                        ),
                    )
                })?;
                if handled.deliver_first {
                    self.deliver(handled.onward).await;
                } else if !handled.onward.is_empty() {
                    let peer = self.clone();
                    tokio::spawn(async move { peer.deliver(handled.onward).await });
                }
                handled.response
            }
        }
    }
}

impl PeerNode {
    /// Refuses a client's operation while this peer is still joining (its view of the ring
    /// would send it to the wrong owners): the client asks another peer.
    fn serving(&self) -> Result<(), Error> {
        if self.is_ready() {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::RPC_FAIL,
            format!(
                "peer {} is still joining the cluster: ask another peer, or retry in a second",
                self.name()
            ),
        ))
    }
}

/// Whether the caller may read and write values: a client or a peer.
fn may_use(caller: &PeerCaller) -> Result<(), Error> {
    if caller
        .member
        .roles
        .intersects(Roles::CLIENT.union(Roles::NODE))
    {
        return Ok(());
    }
    Err(Error::new(
        ErrorCode::ILLEGAL_CLIENT,
        format!(
            "{} may not read or write values: its credential has neither the client nor the \
             node role",
            caller.member.name
        ),
    ))
}

/// A request's name, for messages.
fn request_name(request: &PeerRequest) -> &'static str {
    match request {
        PeerRequest::Directory { .. } => "directory messages",
        PeerRequest::Lookup { .. } => "a lookup",
        PeerRequest::Promote { .. } => "a promote",
        PeerRequest::Hello { .. } => "a greeting",
        PeerRequest::Put { .. } => "a put",
        PeerRequest::Get { .. } => "a get",
        PeerRequest::Exists { .. } => "an exists",
        PeerRequest::Remove { .. } => "a remove",
        PeerRequest::Leave => "a goodbye",
    }
}
