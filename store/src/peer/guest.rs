//! A client of a peer cluster that has no pool of its own (the CLI, a short-lived tool): it
//! asks a peer to write, read and remove for it. A long-lived process that writes much runs
//! a [`super::PeerNode`] instead, so its writes are a local copy.

use std::sync::Arc;
use std::time::Duration;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::auth::Credential;
use mooring_proto::wire::{MAX_FRAME, MAX_PEER_BATCH, PeerReply, PeerRequest};
use mooring_transport_tcp::PeerLinks;

use crate::client::connect::client_id_for;

/// The largest value a guest writes or reads through a peer: what fits in one message.
pub const MAX_GUEST_VALUE: usize = MAX_FRAME - (64 << 10);

/// A client that works through the peers of a cluster, trying them in order.
#[derive(Clone)]
pub struct PeerGuest {
    peers: Vec<String>,
    links: Arc<PeerLinks>,
}

impl PeerGuest {
    /// A guest of the peers at `peers` (any of them serves), proving `token`.
    pub fn new(
        peers: Vec<String>,
        token: Option<Credential>,
        timeout: Duration,
    ) -> Result<PeerGuest> {
        if peers.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "a peer:// address names no peer: write peer://HOST:PORT[,HOST:PORT...]",
            ));
        }
        let client = client_id_for(token.as_ref()).0;
        Ok(PeerGuest {
            peers,
            links: PeerLinks::new(None, token, client, timeout),
        })
    }

    /// Stores `value` under `key`.
    pub async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        if value.len() > MAX_GUEST_VALUE {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{} bytes for {key:?}: a client without a pool writes at most \
                     {MAX_GUEST_VALUE} bytes through a peer; run the writer as a peer \
                     (mooring.store with a pool) for larger values",
                    value.len()
                ),
            ));
        }
        match self
            .call(&PeerRequest::Put {
                key: key.into(),
                value,
            })
            .await?
        {
            PeerReply::Stored => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// The latest value of `key`, or `None`.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self.call(&PeerRequest::Get { key: key.into() }).await? {
            PeerReply::Value { value } => Ok(value),
            other => Err(unexpected(&other)),
        }
    }

    /// Raises unless a peer answers (a lookup of nothing).
    pub async fn check(&self) -> Result<()> {
        match self.call(&PeerRequest::Exists { keys: Vec::new() }).await? {
            PeerReply::Exist { .. } => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Whether each key has a value (asked [`MAX_PEER_BATCH`] keys at a time).
    pub async fn exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        let mut all = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_PEER_BATCH) {
            let request = PeerRequest::Exists {
                keys: chunk.to_vec(),
            };
            match self.call(&request).await? {
                PeerReply::Exist { found } if found.len() == chunk.len() => all.extend(found),
                other => return Err(unexpected(&other)),
            }
        }
        Ok(all)
    }

    /// Removes `key`; whether it had a value.
    pub async fn remove(&self, key: &str) -> Result<bool> {
        match self.call(&PeerRequest::Remove { key: key.into() }).await? {
            PeerReply::Removed { existed } => Ok(existed),
            other => Err(unexpected(&other)),
        }
    }

    /// Sends `request` to the first peer that answers. A refusal is final; only a peer that
    /// cannot be reached is passed over.
    async fn call(&self, request: &PeerRequest) -> Result<PeerReply> {
        let mut last = None;
        for peer in &self.peers {
            match self.links.call(peer, request).await {
                Err(e) if e.code == ErrorCode::RPC_FAIL => last = Some(e),
                answer => return answer,
            }
        }
        Err(last.unwrap_or_else(|| Error::new(ErrorCode::RPC_FAIL, "no peer to ask")))
    }
}

fn unexpected(reply: &PeerReply) -> Error {
    Error::new(
        ErrorCode::RPC_FAIL,
        format!("a peer answered with {reply:?}, which does not answer the request"),
    )
}
