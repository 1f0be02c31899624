//! The liveness phase, once every fault has healed: every client finishes, nothing stays in
//! flight past its timeouts, every node is mounted again, and a final sweep reads every key
//! and removes everything, after which the allocators must hold no bytes.

use std::sync::Arc;
use std::time::Duration;

use madsim::runtime::Handle;
use mooring_core::ErrorCode;

use super::{Supervisor, TICK};
use crate::members;
use crate::plan::Fault;
use crate::workload::OPERATION_BOUND;
use crate::world::{World, checker_ip};

pub(super) async fn liveness(world: &Arc<World>, sup: &mut Supervisor) {
    let healed = world.now();
    while !world.all_finished() {
        tokio::time::sleep(TICK).await;
        sup.check_invariants();
        if world.now() > healed + OPERATION_BOUND * 2 {
            world.history().violation(format!(
                "clients still busy {:?} after every fault healed",
                OPERATION_BOUND * 2
            ));
            return;
        }
    }
    // Let every timeout run out: discarded writes released, dead clients expired, every
    // node remounted.
    let m = &world.plan.master;
    let quiet = Duration::from_millis(
        (m.put_start_discard_timeout
            + m.put_start_release_timeout
            + m.client_ttl
            + m.lease_ttl
            + m.lease_grace)
            .as_millis(),
    ) + Duration::from_secs(2)
        + world.disk_settle();
    tokio::time::sleep(quiet).await;
    sup.check_invariants();
    let Some(master) = world.master() else {
        world
            .history()
            .violation("no master at the end of the run".into());
        return;
    };
    // Repair copies go on after the workload (retried, with backoff, while a source stays
    // unreadable), and one that fails leaves its destination blocks waiting out the release
    // timeout (seed 142 on RDMA). Give such blocks one more discard and release timeout;
    // what is still pending after that never ends.
    let late = Duration::from_millis(
        (m.put_start_discard_timeout + m.put_start_release_timeout).as_millis(),
    );
    let give_up = world.now() + late;
    while world.now() < give_up {
        let stats = master.stats();
        if stats.writing == 0 && stats.discarded_blocks == 0 {
            break;
        }
        tokio::time::sleep(TICK).await;
    }
    let stats = master.stats();
    let shape = &world.plan.shape;
    let mut problems = Vec::new();
    if stats.writing != 0 {
        problems.push(format!(
            "{} key(s) still being written {quiet:?} after the faults healed (past the discard timeout)",
            stats.writing
        ));
    }
    if stats.discarded_blocks != 0 {
        problems.push(format!(
            "{} discarded block(s) never released",
            stats.discarded_blocks
        ));
    }
    // Repair copies are background work by live nodes, retried (with backoff) while a source
    // stays unreadable: one may be under way at any moment.
    let tasks = stats.tasks - stats.repairs_running;
    if stats.holds != 0 || tasks != 0 {
        problems.push(format!(
            "{} held read(s) and {} copy task(s) outlived their clients",
            stats.holds, tasks
        ));
    }
    if stats.segments != shape.nodes as u64 {
        problems.push(format!(
            "{} segment(s) mounted after healing, expected the {} storage nodes",
            stats.segments, shape.nodes
        ));
    }
    for p in problems {
        world.history().violation(p);
    }
    if world.history().failed() {
        return;
    }
    final_sweep(world, &master).await;
}

/// A fresh client reads every key (each read judged), then removes everything: the
/// allocators must then account for every byte.
async fn final_sweep(world: &Arc<World>, master: &Arc<mooring::MasterService>) {
    let w = world.clone();
    let m = master.clone();
    let checker = Handle::current()
        .create_node()
        .name("checker")
        .ip(checker_ip())
        .build();
    let outcome = checker
        .spawn(async move {
            let client = members::connect(&w, checker_ip(), None)
                .await
                .map_err(|e| format!("the checker cannot connect after healing: {e}"))?;
            let rotted = w
                .plan
                .faults
                .iter()
                .any(|(_, f)| {
                    matches!(
                        f,
                        Fault::RotDisk { .. } | Fault::RotRecord { .. } | Fault::RotEveryCopy { .. }
                    )
                });
            for key in &w.keys {
                let invoked = w.now();
                let mut got = client.get(key).await;
                if rotted && got.as_ref().is_err_and(|e| e.code == ErrorCode::FILE_READ_FAIL) {
                    // A copy damaged by bit rot is refused, never served; its node drops it
                    // and tells the master at its next disk sync. A record damaged for a
                    // recovery to find is read first here when the node's crash never came
                    // (shm seed 2006).
                    tokio::time::sleep(w.disk_settle()).await;
                    got = client.get(key).await;
                }
                match got {
                    Ok(bytes) => {
                        let now = w.now();
                        w.history()
                            .read_value("final get", key, invoked, now, &bytes)
                    }
                    // Not found is fine only if the master agrees: a replica it lists (a
                    // disk copy, say) must serve the value.
                    Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => {
                        if client.exist(key).await.unwrap_or(false) {
                            return Err(format!(
                                "after healing, the master lists {key:?} but reading it finds nothing: {e}"
                            ));
                        }
                    }
                    // Every copy damaged in memory: refused by its checksum, never served.
                    Err(e)
                        if e.code == ErrorCode::INVALID_REPLICA && w.history().was_rotted(key) => {}
                    Err(e) => {
                        return Err(format!("after healing, reading {key:?} still fails: {e}"));
                    }
                }
            }
            tokio::time::sleep(w.lease() * 2).await;
            let mut removed = 0;
            // Two holds outlive the workload legitimately: an offload on its way to a disk
            // keeps its object until the node reports it, and a background repair's read
            // leases its object (one whose every copy is damaged is retried, seconds apart,
            // for as long as it exists). Remove again until both have run out. A repair
            // copy under way when its object is removed leaves its target blocks waiting out
            // the release timeout (RDMA seeds 690 and 758): wait that out too.
            let release = Duration::from_millis(w.plan.master.put_start_release_timeout.as_millis());
            let settled = w.now()
                + w.disk_settle().max(w.lease())
                + release
                + Duration::from_millis(100);
            // Everything may go from here on (the master's standing is checked to the end).
            w.history().remove_invoked(".*", w.now());
            loop {
                removed += client
                    .remove_all()
                    .await
                    .map_err(|e| format!("remove_all after healing failed: {e}"))?;
                let left = m.stats();
                if (left.objects == 0 && left.used == 0) || w.now() > settled {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(removed)
        })
        .await;
    match outcome {
        Ok(Ok(_)) => {}
        Ok(Err(problem)) => world.history().violation(problem),
        Err(e) => world
            .history()
            .violation(format!("the checker panicked: {e}")),
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stats = master.stats();
    if stats.objects != 0 || stats.used != 0 {
        world.history().violation(format!(
            "after removing everything, {} object(s) and {} byte(s) are still allocated \
             ({} discarded block(s) waiting for release, {} write(s) in progress)",
            stats.objects, stats.used, stats.discarded_blocks, stats.writing
        ));
    }
}
