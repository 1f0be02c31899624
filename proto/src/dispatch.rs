//! Requests in, replies out: the master service's whole request handling, as a pure function
//! over the core's [`Master`], so every adapter (TCP, simulation) serves the protocol
//! identically. The core knows nothing of the wire; this is where its calls meet messages.

use mooring_core::{Master, MasterConfig, Millis, Result};

use crate::wire::*;

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
    let m = master;
    Ok(match request {
        R::Hello(Hello { client }) => {
            m.heartbeat(client, now);
            Reply::Hello(cluster_info(m.config()))
        }
        R::Heartbeat(Heartbeat { client }) => Reply::Heartbeat(m.heartbeat(client, now)),
        R::Goodbye(Goodbye { client }) => {
            m.goodbye(client, now);
            Reply::Goodbye(())
        }
        R::MountSegment(MountSegment { client, spec }) => {
            Reply::MountSegment(m.mount_segment(client, &spec, now)?)
        }
        R::UnmountSegment(UnmountSegment { client, name }) => {
            Reply::UnmountSegment(m.unmount_segment(client, &name, now)?)
        }
        R::DescribeSegments(DescribeSegments { ids }) => {
            Reply::DescribeSegments(ids.iter().map(|&id| m.segment_info(id)).collect())
        }
        R::ListSegments(ListSegments {}) => Reply::ListSegments(m.segments()),
        R::PutStart(PutStart {
            client,
            key,
            size,
            config,
            upsert,
        }) => Reply::PutStart(if upsert {
            m.upsert_start(client, &key, size, &config, now)?
        } else {
            m.put_start(client, &key, size, &config, now)?
        }),
        R::PutEnd(PutEnd {
            client,
            key,
            write,
            checksum,
        }) => Reply::PutEnd(m.put_end(client, &key, write, checksum, now)?),
        R::PutRevoke(PutRevoke { client, key, write }) => {
            Reply::PutRevoke(m.put_revoke(client, &key, write, now)?)
        }
        R::PutAbort(PutAbort { client, key, write }) => {
            Reply::PutAbort(m.put_abort(client, &key, write, now)?)
        }
        R::BatchPutStart(BatchPutStart {
            client,
            items,
            config,
            upsert,
        }) => Reply::BatchPutStart(if upsert {
            m.batch_upsert_start(client, &items, &config, now)
        } else {
            m.batch_put_start(client, &items, &config, now)
        }),
        R::BatchPutEnd(BatchPutEnd { client, items }) => {
            Reply::BatchPutEnd(m.batch_put_end(client, &items, now))
        }
        R::BatchPutRevoke(BatchPutRevoke { client, items }) => {
            Reply::BatchPutRevoke(m.batch_put_revoke(client, &items, now))
        }
        R::GetReplicaList(GetReplicaList { key }) => {
            Reply::GetReplicaList(m.get_replica_list(&key, now)?)
        }
        R::BatchGetReplicaList(BatchGetReplicaList { keys }) => {
            Reply::BatchGetReplicaList(m.batch_get_replica_list(&keys, now))
        }
        R::Exist(Exist { key }) => Reply::Exist(m.exist(&key, now)?),
        R::BatchExist(BatchExist { keys }) => Reply::BatchExist(m.batch_exist(&keys, now)),
        R::ExistPrefetch(ExistPrefetch {
            client,
            key,
            preferred,
        }) => Reply::ExistPrefetch(m.exist_prefetch(client, &key, &preferred, now)?),
        R::BatchExistPrefetch(BatchExistPrefetch {
            client,
            keys,
            preferred,
        }) => Reply::BatchExistPrefetch(
            keys.iter()
                .map(|key| m.exist_prefetch(client, key, &preferred, now))
                .collect(),
        ),
        R::DiskSync(DiskSync {
            client,
            segment,
            report,
        }) => Reply::DiskSync(m.disk_sync(client, segment, report, now)?),
        R::GetSize(GetSize { key }) => Reply::GetSize(m.get_size(&key)?),
        R::Remove(Remove { key }) => Reply::Remove(m.remove(&key, now)?),
        R::RemoveAll(RemoveAll { tenant }) => Reply::RemoveAll(m.remove_all(&tenant, now)),
        R::RemoveByRegex(RemoveByRegex { tenant, pattern }) => {
            Reply::RemoveByRegex(m.remove_by_regex(&tenant, &pattern, now)?)
        }
        R::QueryByRegex(QueryByRegex { tenant, pattern }) => {
            Reply::QueryByRegex(m.query_by_regex(&tenant, &pattern, now)?)
        }
        R::ListKeys(ListKeys { tenant, pattern }) => {
            Reply::ListKeys(m.list_by_regex(&tenant, &pattern)?)
        }
        R::AcquireHold(AcquireHold { client, key }) => {
            Reply::AcquireHold(m.acquire_hold(client, &key, now)?)
        }
        R::ReleaseHold(ReleaseHold { client, hold }) => {
            Reply::ReleaseHold(m.release_hold(client, hold, now)?)
        }
        R::CopyStart(CopyStart {
            client,
            key,
            targets,
        }) => Reply::CopyStart(m.copy_start(client, &key, &targets, now)?),
        R::MoveStart(MoveStart {
            client,
            key,
            source,
            target,
        }) => Reply::MoveStart(m.move_start(client, &key, &source, &target, now)?),
        R::TaskEnd(TaskEnd { client, task }) => Reply::TaskEnd(m.task_end(client, task, now)?),
        R::TaskRevoke(TaskRevoke { client, task }) => {
            Reply::TaskRevoke(m.task_revoke(client, task, now)?)
        }
        R::TaskAbort(TaskAbort { client, task }) => {
            Reply::TaskAbort(m.task_abort(client, task, now)?)
        }
        R::TakeRepairs(TakeRepairs { client, max }) => {
            Reply::TakeRepairs(m.take_repairs(client, max as usize, now))
        }
        R::GetStats(GetStats {}) => Reply::GetStats(Box::new(m.report(now))),
        R::BatchQueryIp(BatchQueryIp { clients }) => Reply::BatchQueryIp(m.client_hosts(&clients)),
        R::QueryTask(QueryTask { task }) => Reply::QueryTask(m.query_task(task, now)?),
        R::BatchReplicaClear(BatchReplicaClear {
            client,
            keys,
            segment,
        }) => Reply::BatchReplicaClear(m.batch_replica_clear(
            &keys,
            client,
            segment.as_deref(),
            now,
        )?),
        R::Follow(_) => {
            return Err(mooring_core::Error::new(
                mooring_core::ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                "this master keeps no journal to follow: start the leader with --state-dir and --etcd",
            ));
        }
    })
}
