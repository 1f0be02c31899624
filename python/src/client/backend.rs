//! What a store talks to: a cluster with a master, or a peer cluster (`peer://...`), the
//! latter through a peer in this process (a store with a segment size) or as a guest.
//!
//! The calls SGLang's HiCache and the copying calls make are served by both, from host or
//! device memory; the rest (tasks, replica lists, pattern removals) need a master and say so.

use std::time::Duration;

use mooring::Client;
use mooring::peer::PeerClient;
use mooring_core::{Error, ErrorCode, ReplicateConfig, Result};

use super::mooncake::put_outcome;

/// How long a call to another peer may take.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// A store's cluster; see the module docs.
pub(crate) enum Backend {
    /// A cluster with a master.
    Master(Client),
    /// A peer cluster.
    Peer(PeerClient),
}

impl Backend {
    /// Joins the peer cluster of `seeds`: as a peer on `listen` with `pool` bytes, or (a pool
    /// of 0) as a guest.
    pub(super) async fn join_peers(
        seeds: Vec<String>,
        listen: &str,
        pool: u64,
        token: Option<mooring_proto::auth::Credential>,
    ) -> Result<Backend> {
        PeerClient::connect(seeds, listen, pool, token, PEER_TIMEOUT)
            .await
            .map(Backend::Peer)
    }

    /// The master's client, for `call`, which a peer cluster does not serve.
    pub(super) fn master(&self, call: &str) -> Result<&Client> {
        match self {
            Backend::Master(client) => Ok(client),
            Backend::Peer(_) => Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                format!(
                    "{call} needs a cluster with a master; a peer cluster (peer://) serves \
                     put, get, exists and remove (and their batch and zero-copy forms)"
                ),
            )),
        }
    }

    /// The name of the segment (or the address of the peer) this store contributes.
    pub(super) fn segment_name(&self) -> Option<&str> {
        match self {
            Backend::Master(client) => client.segment_name(),
            Backend::Peer(peer) => peer.address(),
        }
    }

    /// Leaves the cluster.
    pub(super) async fn close(&self) -> Result<()> {
        match self {
            Backend::Master(client) => client.close().await,
            Backend::Peer(peer) => {
                peer.close().await;
                Ok(())
            }
        }
    }

    /// Raises unless the cluster answers.
    pub(super) async fn health_check(&self) -> Result<()> {
        match self {
            Backend::Master(client) => client.health_check().await,
            Backend::Peer(peer) => peer.check().await,
        }
    }

    /// A put or an upsert of one value, with Mooncake's conventions: a put of nothing
    /// stores nothing and succeeds; a put of a key that exists keeps its value (with a
    /// master: in a peer cluster the newest write wins, so a put replaces).
    pub(super) async fn write(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
        upsert: bool,
    ) -> Result<()> {
        if value.is_empty() {
            tracing::warn!(key, "an empty value: nothing stored");
            return Ok(());
        }
        match self {
            Backend::Master(client) if upsert => client.upsert(key, value, config).await,
            Backend::Master(client) => put_outcome(client.put(key, value, config).await),
            Backend::Peer(peer) => {
                peer_config(config, peer.address())?;
                peer.put(key, value).await
            }
        }
    }

    /// Puts (or upserts) many values; `zero_copy` names the call after the caller's
    /// buffers for the master's metrics. One result per item.
    pub(super) async fn batch_write(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
        upsert: bool,
        zero_copy: bool,
    ) -> Vec<Result<()>> {
        match self {
            Backend::Master(client) if upsert => client.batch_upsert(items, config).await,
            Backend::Master(client) => {
                let results = if zero_copy {
                    client.batch_put_from(items, config).await
                } else {
                    client.batch_put(items, config).await
                };
                results.into_iter().map(put_outcome).collect()
            }
            Backend::Peer(peer) => {
                if let Err(e) = peer_config(config, peer.address()) {
                    return vec![Err(e); items.len()];
                }
                let puts = items.iter().map(|(key, value)| async move {
                    if value.is_empty() {
                        return Ok(());
                    }
                    peer.put(key, value).await
                });
                futures_util::future::join_all(puts).await
            }
        }
    }

    /// The value of `key`.
    pub(super) async fn get(&self, key: &str) -> Result<Vec<u8>> {
        match self {
            Backend::Master(client) => client.get(key).await,
            Backend::Peer(peer) => peer.get(key).await?.ok_or_else(|| not_found(key)),
        }
    }

    /// The values of `keys`, one result per key.
    pub(super) async fn batch_get(&self, keys: &[&str]) -> Vec<Result<Vec<u8>>> {
        match self {
            Backend::Master(client) => client.batch_get(keys).await,
            Backend::Peer(_) => {
                futures_util::future::join_all(keys.iter().map(|key| self.get(key))).await
            }
        }
    }

    /// Reads `key` into `buf`; its length.
    pub(super) async fn get_into(&self, key: &str, buf: &mut [u8]) -> Result<usize> {
        match self {
            Backend::Master(client) => client.get_into(key, buf).await,
            Backend::Peer(_) => {
                let value = self.get(key).await?;
                copy_into(key, &value, buf)
            }
        }
    }

    /// Reads each key into its buffer; each value's length.
    pub(super) async fn batch_get_into(
        &self,
        items: &mut [(&str, &mut [u8])],
    ) -> Vec<Result<usize>> {
        match self {
            Backend::Master(client) => client.batch_get_into(items).await,
            Backend::Peer(_) => {
                let keys: Vec<&str> = items.iter().map(|(key, _)| *key).collect();
                let values = self.batch_get(&keys).await;
                items
                    .iter_mut()
                    .zip(values)
                    .map(|((key, buf), value)| copy_into(key, &value?, buf))
                    .collect()
            }
        }
    }

    /// The size of `key`'s value.
    pub(super) async fn get_size(&self, key: &str) -> Result<u64> {
        match self {
            Backend::Master(client) => client.get_size(key).await,
            Backend::Peer(_) => self.get(key).await.map(|value| value.len() as u64),
        }
    }

    /// Whether `key` has a value; `prefetch` first brings a value found only on a node's
    /// disk back into memory (a peer cluster has no disk tier, so nothing to bring).
    pub(super) async fn exist(&self, key: &str, prefetch: bool) -> Result<bool> {
        match self {
            Backend::Master(client) if prefetch => client.exist_prefetch(key).await,
            Backend::Master(client) => client.exist(key).await,
            Backend::Peer(peer) => Ok(peer.exists(&[key]).await?.first() == Some(&true)),
        }
    }

    /// Whether each key has a value, one result per key.
    pub(super) async fn batch_exist(&self, keys: &[&str]) -> Result<Vec<Result<bool>>> {
        match self {
            Backend::Master(client) => client.batch_exist(keys).await,
            Backend::Peer(peer) => Ok(peer.exists(keys).await?.into_iter().map(Ok).collect()),
        }
    }

    /// Removes `key`.
    pub(super) async fn remove(&self, key: &str) -> Result<()> {
        match self {
            Backend::Master(client) => client.remove(key).await,
            Backend::Peer(peer) => match peer.remove(key).await? {
                true => Ok(()),
                false => Err(not_found(key)),
            },
        }
    }
}

/// Refuses what a peer cluster cannot honour: it keeps one copy of each value, unpinned, in
/// the writer's own pool (`own`, if this process runs a peer: preferring it is no change).
fn peer_config(config: &ReplicateConfig, own: Option<&str>) -> Result<()> {
    let elsewhere = config
        .preferred_segments
        .iter()
        .any(|s| Some(s.as_str()) != own);
    if config.replica_num > 1 || config.with_hard_pin || elsewhere {
        return Err(Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
            "a peer cluster keeps one copy of each value, unpinned, in the writer's own pool: \
             leave replica_num at 1, with_hard_pin off and preferred_segment empty",
        ));
    }
    Ok(())
}

fn not_found(key: &str) -> Error {
    Error::new(
        ErrorCode::OBJECT_NOT_FOUND,
        format!("{key:?} has no value in the peer cluster"),
    )
}

/// Copies `value` into `buf`; its length, or `BUFFER_OVERFLOW` if it does not fit.
fn copy_into(key: &str, value: &[u8], buf: &mut [u8]) -> Result<usize> {
    let Some(dest) = buf.get_mut(..value.len()) else {
        return Err(Error::new(
            ErrorCode::BUFFER_OVERFLOW,
            format!(
                "{key:?} holds {} bytes, more than the {} bytes given: give a larger buffer",
                value.len(),
                buf.len()
            ),
        ));
    };
    dest.copy_from_slice(value);
    Ok(value.len())
}
