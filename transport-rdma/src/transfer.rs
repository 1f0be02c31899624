//! Running planned work requests on leased queue pairs: posting as send-queue slots free up,
//! signalling selectively, polling completions with a busy-poll that backs off, and, when
//! anything fails or the deadline passes, moving every queue pair with requests outstanding
//! to the error state and draining it before answering. So when a transfer reports failure
//! nothing of it is still in flight: no late write can land over the next writer's bytes and
//! no late read can scribble on a buffer the caller reuses.

use std::time::Duration;

use mooring_core::Result;
use tokio::time::Instant;

use crate::peer::{QueuePair, transfer_error};
use crate::verbs::{Completion, QpState, Verbs, WcStatus, WorkRequest};

/// How transfers post and poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollConfig {
    /// Signal one request in this many (and always the last of each posting).
    pub signal_every: u32,
    /// Polls that find nothing before the poller yields to other tasks.
    pub spin_polls: u32,
    /// Yields before it starts sleeping between polls.
    pub yield_polls: u32,
    /// Longest sleep between polls of an idle transfer.
    pub max_backoff: Duration,
}

impl Default for PollConfig {
    fn default() -> Self {
        PollConfig {
            signal_every: 16,
            spin_polls: 64,
            yield_polls: 64,
            max_backoff: Duration::from_millis(1),
        }
    }
}

/// One queue pair's share of a transfer.
struct Stripe {
    qpn: u32,
    requests: Vec<WorkRequest>,
    posted: usize,
    retired: usize,
    depth: usize,
}

impl Stripe {
    fn outstanding(&self) -> bool {
        self.retired < self.posted
    }
}

/// Why a transfer stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    Completion(WcStatus),
    Post,
    Deadline,
}

/// Requests posted and not yet accounted for; dropping it (a transfer future abandoned
/// mid-flight) fails and drains their queue pairs before the memory they name can be reused.
struct InFlight<'a, V: Verbs> {
    verbs: &'a V,
    stripes: Vec<Stripe>,
}

impl<V: Verbs> InFlight<'_, V> {
    /// Moves every queue pair with requests outstanding to ERR and polls until each has
    /// completed (or flushed) all of them.
    fn fail_and_drain(&mut self) {
        for s in self.stripes.iter().filter(|s| s.outstanding()) {
            if let Err(e) = self.verbs.modify_qp(s.qpn, QpState::Error, None) {
                tracing::warn!(qpn = s.qpn, error = %e, "cannot move a queue pair to ERR");
            }
        }
        let mut out = Vec::new();
        // A device flushes promptly once a queue pair is in ERR.
        let give_up = std::time::Instant::now() + Duration::from_secs(5);
        while self.stripes.iter().any(Stripe::outstanding) {
            for s in &mut self.stripes {
                out.clear();
                self.verbs.poll_cq(s.qpn, 64, &mut out);
                retire(s, &out);
            }
            if std::time::Instant::now() > give_up {
                // Only a broken device gets here. The memory its requests name is about to
                // be reused while the device may still write it: stopping is the only safe
                // answer.
                tracing::error!("an RDMA device did not flush a queue pair in ERR within 5 s");
                std::process::abort();
            }
            std::hint::spin_loop();
        }
    }
}

impl<V: Verbs> Drop for InFlight<'_, V> {
    fn drop(&mut self) {
        if self.stripes.iter().any(Stripe::outstanding) {
            self.fail_and_drain();
        }
    }
}

fn retire(stripe: &mut Stripe, completions: &[Completion]) -> Option<WcStatus> {
    let mut failure = None;
    for c in completions {
        // A completion retires its request and every unsignaled one before it.
        stripe.retired = stripe.retired.max(c.wr_id as usize + 1);
        if c.status != WcStatus::Success && failure.is_none() {
            failure = Some(c.status);
        }
    }
    failure
}

/// Runs `plan` (one list of requests per queue pair in `qps`, in order) to completion or
/// failure by `deadline`. Queue pairs that failed are marked broken for reconnection.
pub(crate) async fn run<V: Verbs>(
    verbs: &V,
    qps: &mut [QueuePair],
    plan: Vec<Vec<WorkRequest>>,
    depth: u32,
    config: PollConfig,
    deadline: Instant,
) -> Result<()> {
    debug_assert!(plan.len() <= qps.len());
    // Broken until the transfer ends well: if this future is dropped part way, its queue
    // pairs were failed and drained and must be reconnected before reuse.
    for qp in qps.iter_mut().take(plan.len()) {
        qp.broken = true;
    }
    let mut flight = InFlight {
        verbs,
        stripes: plan
            .into_iter()
            .zip(qps.iter())
            .map(|(requests, qp)| Stripe {
                qpn: qp.qpn,
                requests,
                posted: 0,
                retired: 0,
                depth: depth as usize,
            })
            .collect(),
    };
    let mut failure: Option<Failure> = None;
    let mut completions = Vec::new();
    let mut idle_polls: u32 = 0;
    let mut backoff = Duration::from_micros(20);
    loop {
        let mut progressed = false;
        for s in &mut flight.stripes {
            if failure.is_none() && s.posted < s.requests.len() {
                match post_window(verbs, s, config.signal_every) {
                    Ok(n) => progressed |= n > 0,
                    Err(()) => failure = Some(Failure::Post),
                }
            }
            if s.outstanding() {
                completions.clear();
                verbs.poll_cq(s.qpn, 64, &mut completions);
                progressed |= !completions.is_empty();
                if let Some(status) = retire(s, &completions) {
                    failure.get_or_insert(Failure::Completion(status));
                }
            }
        }
        let all_done = flight
            .stripes
            .iter()
            .all(|s| !s.outstanding() && (failure.is_some() || s.posted == s.requests.len()));
        if all_done {
            break;
        }
        if failure.is_some() || Instant::now() >= deadline {
            failure.get_or_insert(Failure::Deadline);
            flight.fail_and_drain();
            break;
        }
        if progressed {
            idle_polls = 0;
            backoff = Duration::from_micros(20);
        } else {
            idle_polls += 1;
            if idle_polls <= config.spin_polls {
                std::hint::spin_loop();
            } else if idle_polls <= config.spin_polls + config.yield_polls {
                tokio::task::yield_now().await;
            } else {
                let sleep = backoff.min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(sleep).await;
                backoff = (backoff * 2).min(config.max_backoff);
            }
        }
    }
    // A queue pair still in RTS is fine to reuse; any other needs reconnecting.
    for qp in qps.iter_mut() {
        if flight.stripes.iter().any(|s| s.qpn == qp.qpn) {
            qp.broken = !matches!(verbs.qp_state(qp.qpn), Ok(QpState::ReadyToSend));
        }
    }
    let Some(failure) = failure else {
        return Ok(());
    };
    Err(transfer_error(match failure {
        Failure::Completion(WcStatus::RemoteAccess) => {
            "the node refused the transfer (RDMA remote access error): the segment was unmounted \
             or remounted, or the range lies outside it"
                .to_string()
        }
        Failure::Completion(WcStatus::RetryExceeded) => {
            "the node did not answer (RDMA retry exceeded): it may be down or unreachable"
                .to_string()
        }
        Failure::Completion(WcStatus::LocalProtection) => {
            "local memory was not registered for the transfer (RDMA local protection error)"
                .to_string()
        }
        Failure::Completion(other) => format!("an RDMA transfer completed with {other:?}"),
        Failure::Post => "the device refused to post the transfer's requests".to_string(),
        Failure::Deadline => "the transfer did not complete in time; it was cancelled and \
                              nothing of it is still in flight"
            .to_string(),
    }))
}

/// Posts as many of `stripe`'s requests as its free send-queue slots allow; returns how many.
fn post_window<V: Verbs>(verbs: &V, stripe: &mut Stripe, signal_every: u32) -> Result<usize, ()> {
    let free = stripe.depth - (stripe.posted - stripe.retired);
    let end = (stripe.posted + free).min(stripe.requests.len());
    if end == stripe.posted {
        return Ok(0);
    }
    let every = signal_every.max(1) as usize;
    for (id, wr) in stripe.requests[stripe.posted..end].iter_mut().enumerate() {
        let id = stripe.posted + id;
        wr.wr_id = id as u64;
        // The last of a posting is signalled so its slots come back (and the queue pair
        // can be drained knowing which completion comes last).
        wr.signaled = (id + 1).is_multiple_of(every) || id + 1 == end;
    }
    // SAFETY: the caller's memory named by these requests is borrowed for the whole transfer,
    // and `InFlight` drains every posted request before the borrow can end.
    let posted = unsafe { verbs.post_send(stripe.qpn, &stripe.requests[stripe.posted..end]) };
    match posted {
        Ok(()) => {
            let n = end - stripe.posted;
            stripe.posted = end;
            Ok(n)
        }
        Err(e) => {
            tracing::warn!(qpn = stripe.qpn, error = %e, "posting RDMA requests failed");
            Err(())
        }
    }
}
