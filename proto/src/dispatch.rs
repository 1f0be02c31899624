//! Requests in, replies out: the master service's whole request handling, as a pure function
//! over the core's [`Master`], so every adapter (TCP, simulation) serves the protocol
//! identically. The core knows nothing of the wire; this is where its calls meet messages.

use mooring_core::{Master, MasterConfig, Millis, Result};

use crate::wire::{ClusterInfo, MasterRequest, Reply};

/// The settings clients need to follow the protocol.
pub fn cluster_info(config: &MasterConfig) -> ClusterInfo {
    ClusterInfo {
        lease_ttl: config.lease_ttl,
        put_start_discard_timeout: config.put_start_discard_timeout,
        put_start_release_timeout: config.put_start_release_timeout,
        client_ttl: config.client_ttl,
        max_key_len: config.max_key_len as u32,
    }
}

/// Applies one request to `master` at `now` and gives the reply.
pub fn handle(master: &mut Master, request: MasterRequest, now: Millis) -> Result<Reply> {
    use MasterRequest as R;
    let this = master;
    Ok(match request {
        R::Hello { client } => {
            this.heartbeat(client, now);
            Reply::Hello(cluster_info(this.config()))
        }
        R::Heartbeat { client } => Reply::Heartbeat(this.heartbeat(client, now)),
        R::MountSegment { client, spec } => Reply::Segment(this.mount_segment(client, &spec, now)?),
        R::UnmountSegment { client, name } => {
            this.unmount_segment(client, &name, now)?;
            Reply::Unit
        }
        R::SegmentInfo { ids } => {
            Reply::Segments(ids.iter().map(|&id| this.segment_info(id)).collect())
        }
        R::ListSegments => Reply::SegmentList(this.segments()),
        R::PutStart {
            client,
            key,
            size,
            config,
            upsert,
        } => Reply::Grant(if upsert {
            this.upsert_start(client, &key, size, &config, now)?
        } else {
            this.put_start(client, &key, size, &config, now)?
        }),
        R::PutEnd { client, key, write } => {
            this.put_end(client, &key, write, now)?;
            Reply::Unit
        }
        R::PutRevoke { client, key, write } => {
            this.put_revoke(client, &key, write, now)?;
            Reply::Unit
        }
        R::PutAbort { client, key, write } => {
            this.put_abort(client, &key, write, now)?;
            Reply::Unit
        }
        R::BatchPutStart {
            client,
            items,
            config,
            upsert,
        } => Reply::Grants(if upsert {
            this.batch_upsert_start(client, &items, &config, now)
        } else {
            this.batch_put_start(client, &items, &config, now)
        }),
        R::BatchPutEnd { client, items } => Reply::Units(this.batch_put_end(client, &items, now)),
        R::BatchPutRevoke { client, items } => {
            Reply::Units(this.batch_put_revoke(client, &items, now))
        }
        R::GetReplicaList { key } => Reply::List(this.get_replica_list(&key, now)?),
        R::BatchGetReplicaList { keys } => Reply::Lists(this.batch_get_replica_list(&keys, now)),
        R::Exist { key } => Reply::Bool(this.exist(&key, now)?),
        R::BatchExist { keys } => Reply::Bools(this.batch_exist(&keys, now)),
        R::ExistPrefetch {
            client,
            key,
            preferred,
        } => {
            let (exists, grant) = this.exist_prefetch(client, &key, &preferred, now)?;
            Reply::Prefetch(exists, grant)
        }
        R::BatchExistPrefetch {
            client,
            keys,
            preferred,
        } => Reply::Prefetches(
            keys.iter()
                .map(|key| this.exist_prefetch(client, key, &preferred, now))
                .collect(),
        ),
        R::DiskSync {
            client,
            segment,
            report,
        } => Reply::DiskSync(this.disk_sync(client, segment, report, now)?),
        R::GetSize { key } => Reply::Count(this.get_size(&key)?),
        R::Remove { key } => {
            this.remove(&key, now)?;
            Reply::Unit
        }
        R::RemoveAll => Reply::Count(this.remove_all(now)),
        R::RemoveByRegex { pattern } => Reply::Count(this.remove_by_regex(&pattern, now)?),
        R::QueryByRegex { pattern } => Reply::Query(this.query_by_regex(&pattern, now)?),
        R::AcquireHold { client, key } => {
            let (hold, list) = this.acquire_hold(client, &key, now)?;
            Reply::Hold(hold, list)
        }
        R::ReleaseHold { client, hold } => {
            this.release_hold(client, hold, now)?;
            Reply::Unit
        }
        R::CopyStart {
            client,
            key,
            targets,
        } => Reply::Copy(this.copy_start(client, &key, &targets, now)?),
        R::MoveStart {
            client,
            key,
            source,
            target,
        } => Reply::Copy(this.move_start(client, &key, &source, &target, now)?),
        R::TaskEnd { client, task } => {
            this.task_end(client, task, now)?;
            Reply::Unit
        }
        R::TaskRevoke { client, task } => {
            this.task_revoke(client, task, now)?;
            Reply::Unit
        }
        R::Stats => Reply::Stats(this.stats()),
    })
}
