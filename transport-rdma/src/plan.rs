//! Turning a batch of transfers into work requests: pieces no larger than a message may be,
//! remotely contiguous pieces gathered into one request's scatter list, and the requests
//! shared out across queue pairs so a large transfer moves over all of them at once.

use smallvec::SmallVec;

use crate::verbs::{Opcode, Sge, WorkRequest};

/// One transfer of a batch: `len` bytes between local `local_addr` (registered under `lkey`)
/// and remote `remote_addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Local address.
    pub local_addr: u64,
    /// Local key covering it.
    pub lkey: u32,
    /// Remote address.
    pub remote_addr: u64,
    /// Bytes.
    pub len: u64,
}

/// Limits a plan respects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanLimits {
    /// Most bytes per work request (the device's max message size, or a smaller striping
    /// unit).
    pub max_request: u64,
    /// Most scatter-gather entries per work request.
    pub max_sge: u32,
    /// Most queue pairs to stripe over.
    pub stripes: usize,
    /// Bytes a queue pair should have before another is worth adding.
    pub stripe_min: u64,
}

/// The work requests of one batch, one list per queue pair used, each in posting order.
/// Ids and signalling are set when posted.
pub fn plan(
    opcode: Opcode,
    spans: &[Span],
    rkey: u32,
    limits: PlanLimits,
) -> Vec<Vec<WorkRequest>> {
    let max_request = limits.max_request.clamp(1, u64::from(u32::MAX));
    let max_sge = limits.max_sge.max(1) as usize;
    let mut requests: Vec<WorkRequest> = Vec::new();
    for span in spans {
        let mut done = 0;
        while done < span.len {
            let remote = span.remote_addr + done;
            let room = match requests.last() {
                Some(last)
                    if last.remote_addr + last.len() == remote
                        && last.sges.len() < max_sge
                        && last.len() < max_request =>
                {
                    max_request - last.len()
                }
                _ => 0,
            };
            let take = if room > 0 {
                room.min(span.len - done)
            } else {
                max_request.min(span.len - done)
            };
            let sge = Sge {
                addr: span.local_addr + done,
                // Bounded by max_request, itself at most u32::MAX.
                len: take as u32,
                lkey: span.lkey,
            };
            if room > 0 {
                requests.last_mut().expect("checked above").sges.push(sge);
            } else {
                requests.push(WorkRequest {
                    wr_id: 0,
                    opcode,
                    sges: SmallVec::from_slice(&[sge]),
                    remote_addr: remote,
                    rkey,
                    signaled: false,
                });
            }
            done += take;
        }
    }
    stripe(requests, limits)
}

/// Shares `requests` out over queue pairs, each to the one with the fewest bytes so far;
/// as many queue pairs as the bytes justify.
fn stripe(requests: Vec<WorkRequest>, limits: PlanLimits) -> Vec<Vec<WorkRequest>> {
    let total: u64 = requests.iter().map(WorkRequest::len).sum();
    let wanted = (total / limits.stripe_min.max(1)).max(1) as usize;
    let count = wanted.min(limits.stripes.max(1)).min(requests.len().max(1));
    let mut stripes: Vec<(u64, Vec<WorkRequest>)> = vec![(0, Vec::new()); count];
    for wr in requests {
        let lightest = stripes
            .iter_mut()
            .min_by_key(|(bytes, _)| *bytes)
            .expect("at least one stripe");
        lightest.0 += wr.len();
        lightest.1.push(wr);
    }
    stripes
        .into_iter()
        .map(|(_, list)| list)
        .filter(|list| !list.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_request: u64, max_sge: u32, stripes: usize) -> PlanLimits {
        PlanLimits {
            max_request,
            max_sge,
            stripes,
            stripe_min: 1024,
        }
    }

    #[test]
    fn large_spans_split_at_the_request_limit_and_stripe() {
        let span = Span {
            local_addr: 0x1000,
            lkey: 7,
            remote_addr: 0x9000,
            len: 10_000,
        };
        let stripes = plan(Opcode::Write, &[span], 3, limits(4096, 4, 2));
        assert_eq!(stripes.len(), 2);
        let mut all: Vec<&WorkRequest> = stripes.iter().flatten().collect();
        all.sort_by_key(|wr| wr.remote_addr);
        let lens: Vec<u64> = all.iter().map(|wr| wr.len()).collect();
        assert_eq!(lens, vec![4096, 4096, 1808]);
        for wr in &all {
            assert_eq!(wr.sges.len(), 1);
            assert_eq!(wr.sges[0].addr - 0x1000, wr.remote_addr - 0x9000);
        }
    }

    #[test]
    fn remotely_contiguous_spans_share_a_scatter_list() {
        let spans = [
            Span {
                local_addr: 0x100,
                lkey: 1,
                remote_addr: 0x5000,
                len: 100,
            },
            Span {
                local_addr: 0x900,
                lkey: 2,
                remote_addr: 0x5064,
                len: 100,
            },
            Span {
                local_addr: 0x300,
                lkey: 1,
                remote_addr: 0x50c8,
                len: 100,
            },
            Span {
                local_addr: 0x300,
                lkey: 1,
                remote_addr: 0x7000,
                len: 100,
            },
        ];
        let stripes = plan(Opcode::Read, &spans, 3, limits(1 << 20, 2, 1));
        assert_eq!(stripes.len(), 1);
        let sges: Vec<usize> = stripes[0].iter().map(|wr| wr.sges.len()).collect();
        // Two entries at most per request; the fourth span is not contiguous.
        assert_eq!(sges, vec![2, 1, 1]);
        assert_eq!(stripes[0][1].remote_addr, 0x50c8);
    }
}
