//! Building the cluster: a madsim node for each master, storage node and client, and the
//! buggify hooks through which the supervisor stalls readers and crashes clients mid-write.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use madsim::rand::Rng as _;
use madsim::runtime::Handle;
use mooring::buggify::Site;

use super::Nodes;
use crate::members;
use crate::plan::Member;
use crate::world::{World, ip};

pub(super) fn start_cluster(world: &Arc<World>) -> Nodes {
    let handle = Handle::current();
    let shape = &world.plan.shape;
    let w = world.clone();
    let master = if world.plan.master_group {
        handle
            .create_node()
            .name("master0")
            .ip(ip(Member::Master))
            .init(move || crate::group::group_master(w.clone(), 0))
            .build()
    } else {
        handle
            .create_node()
            .name("master")
            .ip(ip(Member::Master))
            .init(move || members::master(w.clone()))
            .build()
    };
    let group = world.plan.master_group.then(|| {
        let etcd = handle
            .create_node()
            .name("etcd")
            .ip(crate::world::etcd_addr().ip())
            .init(|| async {
                let _ = mooring_etcd::SimServer::builder()
                    .serve(crate::world::etcd_addr())
                    .await;
            })
            .build();
        let w = world.clone();
        let standby = handle
            .create_node()
            .name("master1")
            .ip(crate::world::group_master_addr(1).ip())
            .init(move || crate::group::group_master(w.clone(), 1))
            .build();
        (standby, etcd)
    });
    let storage = (0..shape.nodes)
        .map(|i| {
            let w = world.clone();
            handle
                .create_node()
                .name(format!("node{i}"))
                .ip(ip(Member::Node(i)))
                .init(move || members::storage_node(w.clone(), i))
                .build()
        })
        .collect();
    let clients = (0..shape.clients)
        .map(|j| {
            let w = world.clone();
            handle
                .create_node()
                .name(format!("client{j}"))
                .ip(ip(Member::Client(j)))
                .init(move || members::client(w.clone(), j))
                .build()
        })
        .collect();
    Nodes {
        master,
        group,
        storage,
        clients,
    }
}

/// Crash orders are served at the client's write steps: the client parks itself and the
/// supervisor kills it at its next tick. Slow readers stall at the read-transfer step, and
/// the plan's held writes at the transports' copy and receive steps.
pub(super) fn install_crash_hook(world: &Arc<World>) {
    let w = world.clone();
    let slow_readers = world.plan.slow_readers;
    let lease = Duration::from_millis(world.plan.master.lease_ttl.as_millis());
    let slot_ttl = world
        .plan
        .disk
        .as_ref()
        .map_or(Duration::ZERO, |d| d.slot_ttl);
    let release = Duration::from_millis(world.plan.master.put_start_release_timeout.as_millis());
    let write_window = Duration::from_millis(world.plan.master.client_ttl.as_millis() / 2);
    let hook: mooring::buggify::HoldHook = Rc::new(move |site| {
        let stall = !w.healed.load(Ordering::Relaxed);
        if site == Site::CLIENT_BEFORE_READ_TRANSFER {
            // One read in five stalls for up to 80% of its lease (the client still checks
            // its lease after the transfer and retries a read that outlived it).
            let mut rng = madsim::rand::thread_rng();
            return (stall && slow_readers && rng.gen_bool(0.2))
                .then(|| lease.mul_f64(0.8 * rng.r#gen::<f64>()));
        }
        if site == Site::CLIENT_BEFORE_STAGE {
            // Disk reads with an old replica list: the key may be rewritten (and its new
            // value written to the same disk) before the node is asked for the old one.
            let mut rng = madsim::rand::thread_rng();
            return (stall && slow_readers && rng.gen_bool(0.5))
                .then(|| lease.mul_f64(0.6 * rng.r#gen::<f64>()));
        }
        if site == Site::CLIENT_BEFORE_STAGED_PULL {
            // Staged slots wait for their readers (inside the slot's TTL: a reader past it
            // gives up), so a tight staging buffer fills with slots a node must not take back
            // early.
            let mut rng = madsim::rand::thread_rng();
            return (stall && slow_readers && rng.gen_bool(0.8))
                .then(|| slot_ttl.min(lease).mul_f64(0.7 * rng.r#gen::<f64>()));
        }
        if site == Site::NODE_BEFORE_DISK_EVICTION_REPORT {
            // A node slow to report its disk eviction: the master keeps sending readers to
            // the victims, which must still be there (every report until the faults heal, up
            // to a lease late).
            let mut rng = madsim::rand::thread_rng();
            return stall.then(|| lease.mul_f64(rng.r#gen::<f64>()));
        }
        if site == Site::CLIENT_HELD_READ_TRANSFER {
            // A held read is not bounded by its lease: half of them outlast it, so removes,
            // upserts and eviction meet objects whose only protection is the hold.
            let mut rng = madsim::rand::thread_rng();
            return (stall && slow_readers && rng.gen_bool(0.5))
                .then(|| lease.mul_f64(0.5 + 2.0 * rng.r#gen::<f64>()));
        }
        if site == Site::SHM_WRITER_MID_COPY
            || site == Site::SHM_WRITER_FALLBACK
            || site == Site::NODE_MID_WRITE
        {
            // A write held up partway, now and then until the plan's are used up (runs
            // without them draw nothing here, so their seeds play out as before).
            if !stall || !w.held_writes_remain() {
                return None;
            }
            let mut rng = madsim::rand::thread_rng();
            let node =
                (site == Site::NODE_MID_WRITE).then(|| w.storage_here().and_then(|i| w.node(i)));
            if !rng.gen_bool(0.002)
                || node.as_ref().is_some_and(Option::is_none)
                || !w.take_held_write()
            {
                return None;
            }
            let Some(Some(storage)) = node else {
                // The writer's process stops mid-copy (or, having found no mapping, before
                // its write goes over TCP) past the release timeout: the master frees the
                // blocks and hands them out again meanwhile. A memcpy cannot be
                // cancelled, so the whole process is paused (holding the task alone would let
                // the write's own timeout drop the copy); its fence must keep the rest out
                // when it runs again.
                mooring::coverage::hit(if site == Site::SHM_WRITER_FALLBACK {
                    mooring::coverage::Path::SHM_FALLBACK_HELD
                } else {
                    mooring::coverage::Path::SHM_WRITE_HELD
                });
                w.pause_here(release + Duration::from_millis(rng.gen_range(200..3000)));
                return Some(Duration::from_micros(1));
            };
            // The node remounts while the rest of the write is held, within the write's
            // window (so its deadline still lets it in): the rest must be refused, as the
            // master hands the new mount's ranges to other writers.
            madsim::task::spawn(async move {
                if let Err(e) = storage.remount().await {
                    tracing::info!("remount failed: {e}");
                }
            });
            mooring::coverage::hit(mooring::coverage::Path::NODE_WRITE_HELD_REMOUNTED);
            return Some(write_window.mul_f64(rng.gen_range(0.1..0.5)));
        }
        if site == Site::CLIENT_BEFORE_TASK_END {
            // The supervisor takes the target away while the client waits, well within the
            // task's discard timeout (a second at least), so the task ends, not times out.
            let node = madsim::plugin::node();
            let mut orders = w.task_orders();
            let order = orders.get_mut(&node).filter(|o| !o.triggered)?;
            order.triggered = true;
            return Some(Duration::from_millis(300));
        }
        if !matches!(
            site,
            Site::CLIENT_BEFORE_PUT_END
                | Site::CLIENT_BEFORE_BATCH_PUT_END
                | Site::CLIENT_AFTER_PUT_START
        ) {
            return None;
        }
        let node = madsim::plugin::node();
        let mut orders = w.orders();
        let order = orders.get_mut(&node)?;
        if order.triggered {
            return None;
        }
        order.triggered = true;
        Some(Duration::from_secs(3600))
    });
    mooring::buggify::set_hold_hook(Some(hook));
    let client_rot = world.plan.client_rot;
    let damage: mooring::buggify::DamageHook = Rc::new(move |site, len| {
        // A failing client's memory damages one prefetch in three.
        let mut rng = madsim::rand::thread_rng();
        (client_rot && site == Site::CLIENT_PREFETCH_BUFFER && len > 0 && rng.gen_bool(1.0 / 3.0))
            .then(|| rng.gen_range(0..len * 8))
    });
    mooring::buggify::set_damage_hook(Some(damage));
}

/// Checks a contract of every master where it is made: no request is acted on after its
/// sender stopped waiting for it (on the simulated clock all members share), whatever a
/// server's view of the sender's clock says. The latest deadline of each request id counts
/// (an operation's retries share its trace id), so a retry never makes an earlier try late.
pub(super) fn install_request_deadlines(world: &Arc<World>) {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use mooring::buggify::RequestStep;
    use tokio::time::Instant;

    let w = world.clone();
    let deadlines: RefCell<HashMap<u64, Instant>> = RefCell::default();
    let hook: mooring::buggify::RequestHook = Rc::new(move |step| {
        let now = Instant::now();
        let mut deadlines = deadlines.borrow_mut();
        match step {
            RequestStep::Sent { id, deadline } => {
                if deadlines.len() > 100_000 {
                    // Requests never acted on: long past any retry.
                    deadlines
                        .retain(|_, d| now.saturating_duration_since(*d) < Duration::from_secs(60));
                }
                let latest = deadlines.entry(id).or_insert(deadline);
                *latest = (*latest).max(deadline);
            }
            RequestStep::ActedOn { id } => {
                if let Some(&deadline) = deadlines.get(&id)
                    && now > deadline
                {
                    w.history().violation(format!(
                        "a master acted on request {id:#x} at {:?}, {:?} after its sender stopped waiting",
                        w.now(),
                        now - deadline
                    ));
                }
            }
        }
    });
    mooring::buggify::set_request_hook(Some(hook));
}
