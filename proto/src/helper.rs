//! The process's helper thread: work a caller offers to share and would otherwise do alone.
//!
//! Two kinds of work use it: checksums of a transfer's pieces ([`crate::summing`]) and the
//! pieces of a large copy in memory ([`crate::striped`]). Either way the caller keeps working
//! on the same job while the helper wakes, and whatever the helper has not started by the
//! time the caller runs out, the caller does itself. So the helper only ever speeds a job up:
//! with no spare core (or no helper thread at all) a job costs what doing it alone costs.
//!
//! One thread per process: on the machines this runs on a copy is limited by memory
//! bandwidth, which two threads use most of, and summing is a fraction of a transfer's work.
//! After a job the helper spins for a moment ([`SPIN`]) before it sleeps, as the next job
//! usually follows within microseconds and waking a sleeping thread costs more than that.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// A job the helper can take part in. `help` does parts of it until none is left to start,
/// and must leave the job's memory alone once its caller has all the parts it started.
pub(crate) trait Work: Send + Sync {
    /// Does parts of the job until none is left to start.
    fn help(&self);
}

/// The process's helper thread and the jobs offered to it.
pub(crate) struct Helper {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// How many jobs are queued, readable without the lock: the helper watches it while it
    /// spins.
    queued: AtomicUsize,
}

/// The jobs waiting for the helper, and whether it sleeps (so an offer must wake it).
struct Queue {
    jobs: VecDeque<Arc<dyn Work>>,
    asleep: bool,
}

/// How long the helper keeps looking for the next job before it sleeps. Waking a sleeping
/// thread cost the waker 10–15 µs on the development VM, and the helper then often ran on
/// the waker's own core, after it, so a copy alone gained nothing; copies one after another
/// (a batch's values, a reader's gets) find it awake. A 1 MiB copy measured there, with the
/// helper spinning against sleeping: 80 against 108 µs back to back, 86 against 104 µs with
/// 20 µs between (alone: 104–110 µs).
const SPIN: Duration = Duration::from_micros(100);

impl Helper {
    /// Offers `job` to the helper, unless it is queued already (the helper works a job it
    /// takes until none of it is left, so one entry is enough).
    pub(crate) fn offer(&self, job: Arc<dyn Work>) {
        let mut queue = self.lock();
        if !queue.jobs.iter().any(|queued| Arc::ptr_eq(queued, &job)) {
            queue.jobs.push_back(job);
            self.queued.fetch_add(1, Ordering::Release);
            if queue.asleep {
                self.wake.notify_one();
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self) {
        yield_to_wakers();
        loop {
            let spin_until = Instant::now() + SPIN;
            while self.queued.load(Ordering::Acquire) == 0 && Instant::now() < spin_until {
                std::hint::spin_loop();
            }
            let job = {
                let mut queue = self.lock();
                loop {
                    if let Some(job) = queue.jobs.pop_front() {
                        self.queued.fetch_sub(1, Ordering::Release);
                        break job;
                    }
                    queue.asleep = true;
                    queue = self.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
                    queue.asleep = false;
                }
            };
            job.help();
        }
    }
}

/// Makes the calling thread (the helper) a batch thread for Linux's scheduler: one that never
/// preempts the thread that woke it. Woken onto its waker's core, the helper would otherwise
/// run first and leave the waker (whose copy it was meant to share) waiting for all of it.
fn yield_to_wakers() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` reads `param` only; pid 0 is the calling thread. Failing
        // (a sandbox that forbids it) leaves the ordinary policy, which is only slower.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    }
}

/// The process's helper, started on first use; `None` where a thread cannot be started, where
/// there is only one core, and in the simulation, which runs every node on one thread (callers
/// do all their work themselves then).
pub(crate) fn helper() -> Option<&'static Helper> {
    static HELPER: OnceLock<Option<&'static Helper>> = OnceLock::new();
    *HELPER.get_or_init(|| {
        if cfg!(madsim) {
            return None;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores < 2 {
            return None;
        }
        let helper: &'static Helper = Box::leak(Box::new(Helper {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                asleep: false,
            }),
            wake: Condvar::new(),
            queued: AtomicUsize::new(0),
        }));
        std::thread::Builder::new()
            .name("mooring-helper".into())
            .spawn(move || helper.run())
            .ok()
            .map(|_| helper)
    })
}

/// Starts the process's helper now rather than inside the first transfer that needs it
/// (finding the core count and starting a thread took milliseconds here).
pub fn start_helper() {
    let _ = helper();
}
