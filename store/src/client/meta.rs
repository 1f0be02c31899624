//! Metadata calls: exist (with prefetch), sizes, removal, queries, stats.

use super::*;
use crate::coverage::{self, Path};

impl Client {
    /// Whether `key` has a complete replica (grants a lease if so).
    pub async fn exist(&self, key: &str) -> Result<bool> {
        self.call(Exist {
            key: key.to_string(),
        })
        .await
    }

    /// `exist(key, prefetch=true)` (docs/prefetch.md): whether `key` exists and, if its only
    /// copy is on a node's disk, promotes it into memory (this client's own segment first)
    /// before answering, so a later get is a memory hit. Best effort: if the promotion fails
    /// the answer is still `true` and the failure is logged.
    pub async fn exist_prefetch(&self, key: &str) -> Result<bool> {
        let request = ExistPrefetch {
            client: self.id(),
            key: key.to_string(),
            preferred: self
                .segment_name()
                .map(str::to_string)
                .into_iter()
                .collect(),
        };
        // The write fence runs from the request that granted the promotion's write.
        let started = self.now();
        let (exists, grant) = self.call(request).await?;
        if let Some(prefetch) = grant {
            let mut value = crate::node::memory::value_buffer(prefetch.source.len)?;
            let source = std::slice::from_ref(&prefetch.source);
            let read = self
                .read_replica(key, source, prefetch.checksum, &mut value)
                .await;
            buggify::damage(Site::CLIENT_PREFETCH_BUFFER, &mut value);
            let transfer = match read {
                Ok(()) => self
                    .write_batch(&[(&prefetch.grant, &value)], started)
                    .await
                    .pop()
                    .expect("one result"),
                Err(e) => Err(e),
            };

            if let Err(e) = self.finish_write(key, &prefetch.grant, transfer).await {
                if e.code == ErrorCode::INVALID_WRITE {
                    coverage::hit(Path::PREFETCH_REFUSED);
                }
                warn!(key, "prefetch from disk failed; reads stay on disk: {e}");
            }
        }
        Ok(exists)
    }

    /// [`Client::exist`] for many keys, in one RPC.
    pub async fn batch_exist(&self, keys: &[&str]) -> Result<Vec<Result<bool>>> {
        self.call(BatchExist {
            keys: keys.iter().map(|k| k.to_string()).collect(),
        })
        .await
    }

    /// The size of `key`'s value.
    pub async fn get_size(&self, key: &str) -> Result<u64> {
        self.call(GetSize {
            key: key.to_string(),
        })
        .await
    }

    /// Removes `key` (`OBJECT_HAS_LEASE` while a reader holds it).
    pub async fn remove(&self, key: &str) -> Result<()> {
        self.call(Remove {
            key: key.to_string(),
        })
        .await
    }

    /// Removes every object of this client's tenant nobody is using; returns how many.
    pub async fn remove_all(&self) -> Result<u64> {
        self.call(RemoveAll {
            tenant: String::new(),
        })
        .await
    }

    /// Removes every unused object whose key matches `pattern`; returns how many.
    pub async fn remove_by_regex(&self, pattern: &str) -> Result<u64> {
        self.call(RemoveByRegex {
            tenant: String::new(),
            pattern: pattern.to_string(),
        })
        .await
    }

    /// The readable objects whose keys match `pattern`, with their replicas.
    pub async fn query_by_regex(&self, pattern: &str) -> Result<Vec<(String, ReplicaList)>> {
        self.call(QueryByRegex {
            tenant: String::new(),
            pattern: pattern.to_string(),
        })
        .await
    }

    /// Keys matching `pattern`, with sizes and replica counts. Grants no lease: a listing
    /// never keeps objects from eviction or removal.
    pub async fn query(&self, pattern: &str) -> Result<Vec<KeyListing>> {
        self.call(ListKeys {
            tenant: String::new(),
            pattern: pattern.to_string(),
        })
        .await
    }

    /// The master's gauges and counters.
    pub async fn stats(&self) -> Result<Stats> {
        self.report().await.map(|report| report.stats)
    }

    /// The master's counters and gauges with its census of objects by state (one pass over
    /// the master's table: for operators, not for a hot loop).
    pub async fn report(&self) -> Result<StatsReport> {
        self.call(GetStats {}).await.map(|report| *report)
    }

    /// Every mounted segment.
    pub async fn segments(&self) -> Result<Vec<SegmentInfo>> {
        self.call(ListSegments {}).await
    }

    /// The hosts of each of `clients`' mounted segments, without repeats (Mooncake's
    /// `BatchQueryIp`); a client with no segment mounted is left out.
    pub async fn client_hosts(&self, clients: &[ClientId]) -> Result<Vec<(ClientId, Vec<String>)>> {
        self.call(mooring_proto::wire::BatchQueryIp {
            clients: clients.to_vec(),
        })
        .await
    }

    /// Clears this client's own objects among `keys` (Mooncake's `BatchReplicaClear`): each
    /// whole, or with `segment` only its replica there (an object whose only replica that was
    /// goes whole). Objects another client wrote, or that are leased, held, being written or
    /// copied, are skipped. Returns the keys cleared.
    pub async fn clear_replicas(
        &self,
        keys: &[String],
        segment: Option<&str>,
    ) -> Result<Vec<String>> {
        self.call(mooring_proto::wire::BatchReplicaClear {
            client: self.id(),
            keys: keys.to_vec(),
            segment: segment.map(str::to_string),
        })
        .await
    }

    /// The complete replicas of `key` with the lease they come with (what a get reads from):
    /// for callers that show where a value lives.
    pub async fn replicas(&self, key: &str) -> Result<ReplicaList> {
        self.call(GetReplicaList {
            key: key.to_string(),
        })
        .await
    }

    /// [`Client::replicas`] for many keys: one RPC, one result per key.
    pub async fn batch_replicas(&self, keys: &[&str]) -> Result<Vec<Result<ReplicaList>>> {
        let lists = self
            .call(BatchGetReplicaList {
                keys: keys.iter().map(|k| k.to_string()).collect(),
            })
            .await?;
        per_key(lists, keys.len(), "BatchGetReplicaList")
    }

    /// Whether the master answers and still knows this client: one heartbeat, the same one
    /// the client's background heartbeat sends.
    pub async fn health_check(&self) -> Result<()> {
        let ack = self.call(Heartbeat { client: self.id() }).await?;
        if ack.status == HeartbeatStatus::Registered {
            debug!("the master had forgotten this client and registered it again");
        }
        Ok(())
    }
}
