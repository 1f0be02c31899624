//! Requests in, replies out: the master service's whole request handling, as a pure function
//! over the master, so every adapter (TCP, simulation) serves the protocol identically.

use crate::error::Result;
use crate::master::Master;
use crate::time::Millis;
use crate::wire::{ClusterInfo, MasterRequest, Reply};

impl Master {
    /// The settings clients need to follow the protocol.
    pub fn cluster_info(&self) -> ClusterInfo {
        ClusterInfo {
            lease_ttl: self.config.lease_ttl,
            put_start_discard_timeout: self.config.put_start_discard_timeout,
            put_start_release_timeout: self.config.put_start_release_timeout,
            client_ttl: self.config.client_ttl,
            max_key_len: self.config.max_key_len as u32,
        }
    }

    /// Handles one request at `now`.
    pub fn handle(&mut self, request: MasterRequest, now: Millis) -> Result<Reply> {
        use MasterRequest as R;
        Ok(match request {
            R::Hello { client } => {
                self.heartbeat(client, now);
                Reply::Hello(self.cluster_info())
            }
            R::Heartbeat { client } => Reply::Heartbeat(self.heartbeat(client, now)),
            R::MountSegment { client, spec } => {
                Reply::Segment(self.mount_segment(client, &spec, now)?)
            }
            R::UnmountSegment { client, name } => {
                self.unmount_segment(client, &name, now)?;
                Reply::Unit
            }
            R::SegmentInfo { ids } => {
                Reply::Segments(ids.iter().map(|&id| self.segment_info(id)).collect())
            }
            R::ListSegments => Reply::SegmentList(self.segments()),
            R::PutStart {
                client,
                key,
                size,
                config,
                upsert,
            } => Reply::Grant(if upsert {
                self.upsert_start(client, &key, size, &config, now)?
            } else {
                self.put_start(client, &key, size, &config, now)?
            }),
            R::PutEnd { client, key, write } => {
                self.put_end(client, &key, write, now)?;
                Reply::Unit
            }
            R::PutRevoke { client, key, write } => {
                self.put_revoke(client, &key, write, now)?;
                Reply::Unit
            }
            R::PutAbort { client, key, write } => {
                self.put_abort(client, &key, write, now)?;
                Reply::Unit
            }
            R::BatchPutStart {
                client,
                items,
                config,
                upsert,
            } => Reply::Grants(if upsert {
                self.batch_upsert_start(client, &items, &config, now)
            } else {
                self.batch_put_start(client, &items, &config, now)
            }),
            R::BatchPutEnd { client, items } => {
                Reply::Units(self.batch_put_end(client, &items, now))
            }
            R::BatchPutRevoke { client, items } => {
                Reply::Units(self.batch_put_revoke(client, &items, now))
            }
            R::GetReplicaList { key } => Reply::List(self.get_replica_list(&key, now)?),
            R::BatchGetReplicaList { keys } => {
                Reply::Lists(self.batch_get_replica_list(&keys, now))
            }
            R::Exist { key } => Reply::Bool(self.exist(&key, now)?),
            R::BatchExist { keys } => Reply::Bools(self.batch_exist(&keys, now)),
            R::ExistPrefetch {
                client,
                key,
                preferred,
            } => {
                let (exists, grant) = self.exist_prefetch(client, &key, &preferred, now)?;
                Reply::Prefetch(exists, grant)
            }
            R::BatchExistPrefetch {
                client,
                keys,
                preferred,
            } => Reply::Prefetches(
                keys.iter()
                    .map(|key| self.exist_prefetch(client, key, &preferred, now))
                    .collect(),
            ),
            R::DiskSync {
                client,
                segment,
                report,
            } => Reply::DiskSync(self.disk_sync(client, segment, report, now)?),
            R::GetSize { key } => Reply::Count(self.get_size(&key)?),
            R::Remove { key } => {
                self.remove(&key, now)?;
                Reply::Unit
            }
            R::RemoveAll => Reply::Count(self.remove_all(now)),
            R::RemoveByRegex { pattern } => Reply::Count(self.remove_by_regex(&pattern, now)?),
            R::QueryByRegex { pattern } => Reply::Query(self.query_by_regex(&pattern, now)?),
            R::AcquireHold { client, key } => {
                let (hold, list) = self.acquire_hold(client, &key, now)?;
                Reply::Hold(hold, list)
            }
            R::ReleaseHold { client, hold } => {
                self.release_hold(client, hold, now)?;
                Reply::Unit
            }
            R::CopyStart {
                client,
                key,
                targets,
            } => Reply::Copy(self.copy_start(client, &key, &targets, now)?),
            R::MoveStart {
                client,
                key,
                source,
                target,
            } => Reply::Copy(self.move_start(client, &key, &source, &target, now)?),
            R::TaskEnd { client, task } => {
                self.task_end(client, task, now)?;
                Reply::Unit
            }
            R::TaskRevoke { client, task } => {
                self.task_revoke(client, task, now)?;
                Reply::Unit
            }
            R::Stats => Reply::Stats(self.stats()),
        })
    }
}
