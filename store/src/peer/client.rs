//! A program's way into a peer cluster: with a pool of its own (a peer in this process, so a
//! write is one local copy and one publish) or without (a guest that asks a peer to do the
//! work). The Python store and the tools take either through this one type.

use std::time::{Duration, Instant};

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::auth::Credential;

use super::{PeerConfig, PeerGuest, PeerNode};

/// How long joining may take before a client gives up: ten greeting rounds (a peer that
/// answers is joined within two).
const JOIN_DEADLINE: Duration = Duration::from_secs(5);

/// A client of a peer cluster; see the module docs.
#[derive(Clone)]
pub enum PeerClient {
    /// A peer in this process, contributing a pool.
    Member(PeerNode),
    /// A guest of the cluster's peers, with no pool.
    Guest(PeerGuest),
}

impl PeerClient {
    /// Joins the cluster whose peers are `seeds`: as a peer listening on `listen` with
    /// `pool` bytes when `pool` is above zero (returning once it serves), else as a guest.
    pub async fn connect(
        seeds: Vec<String>,
        listen: &str,
        pool: u64,
        token: Option<Credential>,
        timeout: Duration,
    ) -> Result<PeerClient> {
        if pool == 0 {
            let guest = PeerGuest::new(seeds, token, timeout)?;
            guest.check().await?;
            return Ok(PeerClient::Guest(guest));
        }
        if seeds.is_empty() {
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                "a peer:// address names no peer: write peer://HOST:PORT[,HOST:PORT...]",
            ));
        }
        let mut config = PeerConfig::new(listen, seeds, pool);
        config.timeout = timeout;
        let peer = PeerNode::start(config, token).await?;
        let deadline = Instant::now() + JOIN_DEADLINE;
        while !peer.is_ready() {
            if Instant::now() > deadline {
                peer.stop();
                return Err(Error::new(
                    ErrorCode::RPC_FAIL,
                    format!(
                        "no peer of the cluster answered within {}s: check that `mooring \
                         peer` runs at the addresses given and that they share this token",
                        JOIN_DEADLINE.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(PeerClient::Member(peer))
    }

    /// The address of this process's peer, if it runs one.
    pub fn address(&self) -> Option<&str> {
        match self {
            PeerClient::Member(peer) => Some(peer.address()),
            PeerClient::Guest(_) => None,
        }
    }

    /// Raises unless the cluster answers: a peer in this process serves once it has joined;
    /// a guest asks a peer.
    pub async fn check(&self) -> Result<()> {
        match self {
            PeerClient::Member(peer) if peer.is_ready() => Ok(()),
            PeerClient::Member(peer) => Err(Error::new(
                ErrorCode::RPC_FAIL,
                format!("peer {} has not joined its cluster", peer.name()),
            )),
            PeerClient::Guest(guest) => guest.check().await,
        }
    }

    /// Stores `value` under `key` (the newest write wins: a put replaces).
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        match self {
            PeerClient::Member(peer) => peer.put(key, value).await,
            PeerClient::Guest(guest) => guest.put(key, value.to_vec()).await,
        }
    }

    /// The latest value of `key`, or `None`.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self {
            PeerClient::Member(peer) => peer.get(key).await,
            PeerClient::Guest(guest) => guest.get(key).await,
        }
    }

    /// Whether each key has a value.
    pub async fn exists(&self, keys: &[&str]) -> Result<Vec<bool>> {
        match self {
            PeerClient::Member(peer) => Ok(peer.exists(keys).await),
            PeerClient::Guest(guest) => {
                let owned: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
                guest.exists(&owned).await
            }
        }
    }

    /// Removes `key`; whether it had a value.
    pub async fn remove(&self, key: &str) -> Result<bool> {
        match self {
            PeerClient::Member(peer) => peer.remove(key).await,
            PeerClient::Guest(guest) => guest.remove(key).await,
        }
    }

    /// Leaves: this process's peer says goodbye and stops (its values go with it).
    pub async fn close(&self) {
        if let PeerClient::Member(peer) = self {
            peer.leave().await;
        }
    }
}
