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

/// A timeout or budget at `site`: in simulation, sometimes cut to between a tenth and a half.
#[inline]
pub fn timeout(site: &'static str, normal: Duration) -> Duration {
    #[cfg(madsim)]
    if let Some(roll) = sim::fire(site) {
        return normal.mul_f64(0.1 + 0.4 * roll);
    }
    let _ = site;
    normal
}

/// A period at `site`: in simulation, sometimes stretched to between 1.5 and 6 times.
#[inline]
pub fn period(site: &'static str, normal: Duration) -> Duration {
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
pub async fn hold(site: &'static str) {
    #[cfg(madsim)]
    if let Some(pause) = sim::hold(site) {
        tokio::time::sleep(pause).await;
    }
    let _ = site;
}

/// What a simulation's hold hook decides for a hold point: `Some(pause)` holds the task that
/// long.
#[cfg(madsim)]
pub type HoldHook = std::rc::Rc<dyn Fn(&'static str) -> Option<Duration>>;

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
pub fn active_sites() -> Vec<&'static str> {
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
        static ENABLED: Cell<bool> = const { Cell::new(false) };
        static SITES: RefCell<BTreeMap<&'static str, bool>> = const { RefCell::new(BTreeMap::new()) };
    }

    /// If `site` is switched on in this run, a uniform roll in [0, 1) for this use of it.
    pub(super) fn fire(site: &'static str) -> Option<f64> {
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

    pub(super) fn hold(site: &'static str) -> Option<std::time::Duration> {
        let hook = HOLD.with(|h| h.borrow().clone())?;
        hook(site)
    }

    pub(super) fn set_hold_hook(hook: Option<super::HoldHook>) {
        HOLD.with(|h| *h.borrow_mut() = hook);
    }

    pub(super) fn reset(enabled: bool) {
        HOLD.with(|h| *h.borrow_mut() = None);
        ENABLED.with(|e| e.set(enabled));
        SITES.with(|sites| sites.borrow_mut().clear());
    }

    pub(super) fn calm() {
        ENABLED.with(|e| e.set(false));
    }

    pub(super) fn active() -> Vec<&'static str> {
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
