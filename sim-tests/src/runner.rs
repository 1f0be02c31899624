//! Running many seeds: each run on a fresh thread (the simulator seeds per-thread state), a
//! few runs at a time, panics turned into failed reports.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use crate::plan::Plan;
use crate::run::{Report, run};

/// Runs `plan` on a fresh thread; a panic inside the simulation becomes a failed report.
pub fn run_isolated(plan: Plan) -> Report {
    let fallback = plan.clone();
    let thread = std::thread::Builder::new()
        .name(format!("sim-{}", plan.seed))
        .stack_size(16 << 20)
        .spawn(move || run(plan))
        .expect("spawn a simulation thread");
    match thread.join() {
        Ok(report) => report,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a non-text panic");
            Report::panicked(fallback, message)
        }
    }
}

/// Runs every plan, `jobs` at a time, calling `each` with every report as it arrives (in
/// completion order). Returns the reports in plan order.
pub fn run_many(plans: Vec<Plan>, jobs: usize, mut each: impl FnMut(&Report)) -> Vec<Report> {
    let count = plans.len();
    let plans = Arc::new(Mutex::new(
        plans.into_iter().enumerate().collect::<Vec<_>>(),
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    let workers: Vec<_> = (0..jobs.max(1).min(count.max(1)))
        .map(|_| {
            let (plans, next, tx) = (plans.clone(), next.clone(), tx.clone());
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    let (index, plan) = plans.lock().unwrap_or_else(|e| e.into_inner())[i].clone();
                    if tx.send((index, run_isolated(plan))).is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut reports: Vec<Option<Report>> = vec![None; count];
    for (index, report) in rx {
        each(&report);
        reports[index] = Some(report);
    }
    for worker in workers {
        let _ = worker.join();
    }
    reports.into_iter().flatten().collect()
}

/// Runs `plan` twice; an error says how the runs differed.
pub fn check_determinism(plan: &Plan) -> Result<(), String> {
    let first = run_isolated(plan.clone());
    let second = run_isolated(plan.clone());
    if first.fingerprint == second.fingerprint && first.tally == second.tally {
        Ok(())
    } else {
        Err(format!(
            "seed {} is not deterministic: fingerprints {:#x} and {:#x}, {} and {} operations, {:?} and {:?} simulated",
            plan.seed,
            first.fingerprint,
            second.fingerprint,
            first.tally.total(),
            second.tally.total(),
            first.sim_time,
            second.sim_time
        ))
    }
}
