//! Per-site timing faults that exist only in simulation builds (FoundationDB's "buggify").
//!
//! A site is a named timing decision in the services: a timeout, a retry budget, a heartbeat
//! period. In a simulation run with buggify enabled ([`enable`]; independent of madsim's own
//! buggify, which would also inject second-long delays into every network receive), each site is switched on or off once for
//! the whole run (a quarter of them on); a switched-on site then distorts its value in the
//! direction that stresses the protocol: timeouts and budgets shrink, periods stretch. In
//! production builds every function here returns its input unchanged and compiles away.
//!
//! Each simulation runs on its own thread (madsim's runner and the sim-tests harness both do),
//! so the per-run choice of sites lives in a thread-local.

use std::time::Duration;

/// A named timing decision or protocol step that a simulation may distort or hold. Sites
/// are constants, so a typo is a compile error and the simulation matches the same value the
/// services use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Site(&'static str);

impl Site {
    /// A client between PutStart and its transfers (hold).
    pub const CLIENT_AFTER_PUT_START: Site = Site("client.after_put_start");
    /// A client between a batch's transfers and its BatchPutEnd (hold).
    pub const CLIENT_BEFORE_BATCH_PUT_END: Site = Site("client.before_batch_put_end");
    /// A client between a put's transfers and its PutEnd (hold).
    pub const CLIENT_BEFORE_PUT_END: Site = Site("client.before_put_end");
    /// A copy or move between writing its targets and its TaskEnd (hold).
    pub const CLIENT_BEFORE_TASK_END: Site = Site("client.before_task_end");
    /// A reader between its replica list and the transfer (hold).
    pub const CLIENT_BEFORE_READ_TRANSFER: Site = Site("client.before_read_transfer");
    /// A reader about to ask a node to stage a disk copy (hold).
    pub const CLIENT_BEFORE_STAGE: Site = Site("client.before_stage");
    /// A reader between a node staging a disk copy and pulling it (hold).
    pub const CLIENT_BEFORE_STAGED_PULL: Site = Site("client.before_staged_pull");
    /// A prefetching client's copy of a value between reading and writing it (damage).
    pub const CLIENT_PREFETCH_BUFFER: Site = Site("client.prefetch_buffer");
    /// A held reader between its hold and the transfer (hold).
    pub const CLIENT_HELD_READ_TRANSFER: Site = Site("client.held_read_transfer");
    /// A node between choosing its disk eviction victims and telling the master (hold).
    pub const NODE_BEFORE_DISK_EVICTION_REPORT: Site = Site("node.before_disk_eviction_report");
    /// A node's data server between two pieces of a write it is receiving (hold): the writer's
    /// bytes held up, or the node's task descheduled, while its segment may be remounted.
    pub const NODE_MID_WRITE: Site = Site("node.mid_write");
    /// A same-host writer between two pieces of its copy into a node's mapped segment (hold):
    /// the writer's thread descheduled mid-copy.
    pub const SHM_WRITER_MID_COPY: Site = Site("shm.writer_mid_copy");
    /// A same-host writer that found no mapping of the node's segment, before it hands the
    /// write to the other transport (hold): its process stood still while it asked.
    pub const SHM_WRITER_FALLBACK: Site = Site("shm.writer_fallback");
    /// Every member's heartbeat period (period).
    pub const HEARTBEAT_INTERVAL: Site = Site("heartbeat.interval");
    /// The master's tick period (period).
    pub const MASTER_TICK: Site = Site("master.tick");
    /// How long a writer retries OBJECT_REPLICA_BUSY (timeout).
    pub const CLIENT_BUSY_RETRY: Site = Site("client.busy_retry");
    /// How long a reader trusts its lease (timeout).
    pub const CLIENT_READ_LEASE: Site = Site("client.read_lease");
    /// A client's RPC timeout (timeout).
    pub const CLIENT_RPC_TIMEOUT: Site = Site("client.rpc_timeout");
    /// A writer's self-fence (timeout).
    pub const CLIENT_WRITE_FENCE: Site = Site("client.write_fence");
    /// How long an unmounting node keeps serving readers (timeout).
    pub const NODE_LINGER: Site = Site("node.linger");
    /// How long a node waits for its mount (timeout).
    pub const NODE_MOUNT_PATIENCE: Site = Site("node.mount_patience");
    /// A node's RPC timeout (timeout).
    pub const NODE_RPC_TIMEOUT: Site = Site("node.rpc_timeout");

    /// The site's name, as printed with a failing seed.
    pub fn name(self) -> &'static str {
        self.0
    }
}

/// A timeout or budget at `site`: in simulation, sometimes cut to between a tenth and a half.
#[inline]
pub fn timeout(site: Site, normal: Duration) -> Duration {
    #[cfg(madsim)]
    if let Some(roll) = sim::fire(site) {
        return normal.mul_f64(0.1 + 0.4 * roll);
    }
    let _ = site;
    normal
}

/// A period at `site`: in simulation, sometimes stretched to between 1.5 and 6 times.
#[inline]
pub fn period(site: Site, normal: Duration) -> Duration {
    #[cfg(madsim)]
    if let Some(roll) = sim::fire(site) {
        return normal.mul_f64(1.5 + 4.5 * roll);
    }
    let _ = site;
    normal
}

/// A protocol step where a simulation may hold this task (to crash or cut off the process at
/// exactly that step: a client between PutStart and PutEnd, say). A no-op in production
/// builds and in simulations without a hold hook.
pub async fn hold(site: Site) {
    #[cfg(madsim)]
    if let Some(pause) = sim::hold(site) {
        tokio::time::sleep(pause).await;
    }
    let _ = site;
}

/// A buffer a simulation may damage at `site` (one bit, as a failing DIMM in the client's
/// machine would between checking bytes and sending them on), so that the checks behind it
/// are exercised. A no-op in production builds and in simulations without a damage hook.
pub fn damage(site: Site, buf: &mut [u8]) {
    #[cfg(madsim)]
    if let Some(bit) = sim::damage(site, buf.len())
        && let Some(byte) = buf.get_mut(bit / 8)
    {
        *byte ^= 1 << (bit % 8);
    }
    let _ = (site, buf);
}

/// A request to the master with id `id` went out; its sender stops waiting for it at
/// `deadline`. A simulation checks that no master acts on it later ([`request_acted_on`]),
/// measured on the simulated clock every member shares, so a slip in how a server judges
/// lateness is caught even when nothing downstream shows it. A no-op outside simulation.
pub fn request_sent(id: u64, deadline: tokio::time::Instant) {
    #[cfg(madsim)]
    sim::request(RequestStep::Sent { id, deadline });
    let _ = (id, deadline);
}

/// A master is acting on request `id` now, having judged it in time. A no-op outside
/// simulation.
pub fn request_acted_on(id: u64) {
    #[cfg(madsim)]
    sim::request(RequestStep::ActedOn { id });
    let _ = id;
}

/// A step of a request to the master, as a simulation's request hook sees it.
#[cfg(madsim)]
#[derive(Clone, Copy, Debug)]
pub enum RequestStep {
    /// Sent; its sender stops waiting at `deadline`.
    Sent {
        /// The request's id (its operation's trace id).
        id: u64,
        /// When its sender stops waiting.
        deadline: tokio::time::Instant,
    },
    /// A master acts on it now.
    ActedOn {
        /// The request's id.
        id: u64,
    },
}

/// What a simulation does with each request step.
#[cfg(madsim)]
pub type RequestHook = std::rc::Rc<dyn Fn(RequestStep)>;

/// Installs (or with `None` removes) this run's request hook.
#[cfg(madsim)]
pub fn set_request_hook(hook: Option<RequestHook>) {
    sim::set_request_hook(hook);
}

/// What a simulation's damage hook decides for a buffer of `len` bytes at a damage point:
/// `Some(bit)` flips that bit.
#[cfg(madsim)]
pub type DamageHook = std::rc::Rc<dyn Fn(Site, usize) -> Option<usize>>;

/// Installs (or with `None` removes) this run's damage hook.
#[cfg(madsim)]
pub fn set_damage_hook(hook: Option<DamageHook>) {
    sim::set_damage_hook(hook);
}

/// What a simulation's hold hook decides for a hold point: `Some(pause)` holds the task that
/// long.
#[cfg(madsim)]
pub type HoldHook = std::rc::Rc<dyn Fn(Site) -> Option<Duration>>;

/// Installs (or with `None` removes) this run's hold hook.
#[cfg(madsim)]
pub fn set_hold_hook(hook: Option<HoldHook>) {
    sim::set_hold_hook(hook);
}

/// Starts a simulation run: forgets which sites were switched on, and enables or disables
/// buggify for the run.
pub fn reset(enabled: bool) {
    #[cfg(madsim)]
    sim::reset(enabled);
    let _ = enabled;
}

/// Stops distorting for the rest of the run (sites already switched on stay listed): a
/// simulation calls this when it heals every fault, before it checks liveness.
pub fn calm() {
    #[cfg(madsim)]
    sim::calm();
}

/// The sites switched on in this run so far, in order (the harness prints them with a
/// failing seed).
pub fn active_sites() -> Vec<Site> {
    #[cfg(madsim)]
    return sim::active();
    #[cfg(not(madsim))]
    Vec::new()
}

#[cfg(madsim)]
mod sim {
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeMap;

    use madsim::rand::Rng;

    thread_local! {
        static HOLD: RefCell<Option<super::HoldHook>> = const { RefCell::new(None) };
        static DAMAGE: RefCell<Option<super::DamageHook>> = const { RefCell::new(None) };
        static REQUEST: RefCell<Option<super::RequestHook>> = const { RefCell::new(None) };
        static ENABLED: Cell<bool> = const { Cell::new(false) };
        static SITES: RefCell<BTreeMap<super::Site, bool>> = const { RefCell::new(BTreeMap::new()) };
    }

    /// If `site` is switched on in this run, a uniform roll in [0, 1) for this use of it.
    pub(super) fn fire(site: super::Site) -> Option<f64> {
        if !ENABLED.with(Cell::get) {
            return None;
        }
        let mut rng = madsim::rand::thread_rng();
        let on = SITES.with(|sites| {
            *sites
                .borrow_mut()
                .entry(site)
                .or_insert_with(|| rng.gen_bool(0.25))
        });
        on.then(|| rng.r#gen::<f64>())
    }

    pub(super) fn hold(site: super::Site) -> Option<std::time::Duration> {
        let hook = HOLD.with(|h| h.borrow().clone())?;
        hook(site)
    }

    pub(super) fn set_hold_hook(hook: Option<super::HoldHook>) {
        HOLD.with(|h| *h.borrow_mut() = hook);
    }

    pub(super) fn damage(site: super::Site, len: usize) -> Option<usize> {
        let hook = DAMAGE.with(|h| h.borrow().clone())?;
        hook(site, len)
    }

    pub(super) fn set_damage_hook(hook: Option<super::DamageHook>) {
        DAMAGE.with(|h| *h.borrow_mut() = hook);
    }

    pub(super) fn request(step: super::RequestStep) {
        if let Some(hook) = REQUEST.with(|h| h.borrow().clone()) {
            hook(step);
        }
    }

    pub(super) fn set_request_hook(hook: Option<super::RequestHook>) {
        REQUEST.with(|h| *h.borrow_mut() = hook);
    }

    pub(super) fn reset(enabled: bool) {
        HOLD.with(|h| *h.borrow_mut() = None);
        DAMAGE.with(|h| *h.borrow_mut() = None);
        REQUEST.with(|h| *h.borrow_mut() = None);
        ENABLED.with(|e| e.set(enabled));
        SITES.with(|sites| sites.borrow_mut().clear());
    }

    pub(super) fn calm() {
        ENABLED.with(|e| e.set(false));
    }

    pub(super) fn active() -> Vec<super::Site> {
        SITES.with(|sites| {
            sites
                .borrow()
                .iter()
                .filter(|&(_, &on)| on)
                .map(|(&site, _)| site)
                .collect()
        })
    }
}
