//! The write fence, checked against every interleaving proptest can draw: whatever the
//! message delays, lost answers, clock offset between writer and node, and stalls in the
//! writer, no write lands in blocks after the master may have given them to someone else.
//!
//! The master here is the fence's counterpart, written from the protocol's side: it presumes
//! the member dead once it has heard nothing for a client TTL (and may then reuse the blocks
//! of writes it had granted), and releases a write's blocks a release timeout after it
//! received the write's start. The writer follows [`WriteWindow`]; the node judges arrival
//! with [`SenderClockView`]; bytes land at most [`FenceRule::late_landing`] after the node
//! accepted them (the transports' bound).

use mooring_core::Millis;
use mooring_core::client::{FenceRule, SenderClockView, WriteWindow};
use proptest::prelude::*;

/// One request from the member to the master: sent `gap` after the previous one, taking
/// `there` to reach the master and `back` for the answer; `fate` 0 delivered both ways,
/// 1 answer lost, 2 request lost.
#[derive(Clone, Debug)]
struct Request {
    gap: u64,
    there: u64,
    back: u64,
    fate: u8,
}

fn requests(ttl: u64) -> impl Strategy<Value = Vec<Request>> {
    prop::collection::vec(
        (
            mostly_below(ttl / 4, ttl * 2),
            mostly_below(ttl / 20, ttl),
            mostly_below(ttl / 20, ttl),
            0..3u8,
        )
            .prop_map(|(gap, there, back, fate)| Request {
                gap,
                there,
                back,
                fate,
            }),
        1..10,
    )
}

/// Mostly below `usual` (a healthy network, a heartbeating member), sometimes anything
/// below `rare`.
fn mostly_below(usual: u64, rare: u64) -> impl Strategy<Value = u64> {
    prop_oneof![6 => 0..usual.max(1), 1 => 0..rare.max(1)]
}

#[derive(Clone, Debug)]
struct Scenario {
    ttl: u64,
    release: u64,
    requests: Vec<Request>,
    /// Which request is the write's start.
    start: usize,
    /// How long after the start's answer the writer begins the transfer.
    stall: u64,
    /// The write message's delay to the node, and how long its bytes take to land after it.
    to_node: u64,
    landing: u64,
    /// The node's clock minus the writer's (µs), and the connection's first message's delay
    /// and its answer's (the writer measures their sum as the round trip).
    skew_us: i64,
    anchor_there_us: u64,
    anchor_back_us: u64,
    /// The value's size: a write may move for longer the larger it is.
    size: u64,
}

/// The transports' bound on how late sent bytes land, for a client TTL of `ttl`.
fn late_landing(ttl: u64) -> u64 {
    FenceRule::new(Millis(ttl), Millis(1))
        .late_landing()
        .as_millis()
}

fn scenarios() -> impl Strategy<Value = Scenario> {
    (3..20_000u64, 1..200u64)
        .prop_flat_map(|(ttl, release_tenths)| {
            let release = (ttl * release_tenths / 10).max(1);
            (
                Just(ttl),
                Just(release),
                requests(ttl),
                any::<prop::sample::Index>(),
                prop_oneof![0..ttl / 10 + 1, 0..ttl, 0..ttl * 3],
                mostly_below(ttl / 20, ttl),
                // The transports' bound, often reached.
                prop_oneof![Just(late_landing(ttl)), 0..=late_landing(ttl)],
                prop_oneof![Just(0), -1_000_000_000..1_000_000_000i64],
                prop_oneof![3 => Just(0), 6 => 0..ttl * 50, 1 => 0..ttl * 1_000],
                prop_oneof![3 => Just(0), 6 => 0..ttl * 50, 1 => 0..ttl * 1_000],
                prop_oneof![Just(0u64), 0..1u64 << 20, 0..4u64 << 30],
            )
        })
        .prop_map(
            |(ttl, release, requests, start, stall, to_node, landing, skew, there, back, size)| {
                Scenario {
                    start: start.index(requests.len()),
                    ttl,
                    release,
                    requests,
                    stall,
                    to_node,
                    landing,
                    skew_us: skew,
                    anchor_there_us: there,
                    anchor_back_us: back,
                    size,
                }
            },
        )
}

/// Where the write landed (ms) and the earliest the master may reuse its blocks, or `None` if
/// the writer or the node refused it.
fn run(s: &Scenario) -> Option<(u64, u64)> {
    let rule = FenceRule::new(Millis(s.ttl), Millis(s.release));
    // The hello: sent at 0, heard at 0, answered at once.
    let mut sent = 0;
    let mut heard = vec![0u64];
    let mut answers = Vec::new();
    let mut start = None;
    for (i, r) in s.requests.iter().enumerate() {
        sent += r.gap.max(1);
        if r.fate < 2 {
            heard.push(sent + r.there);
        }
        if r.fate == 0 {
            answers.push((sent + r.there + r.back, sent));
        }
        if i == s.start {
            // The writer starts only once its start is answered.
            if r.fate != 0 {
                return None;
            }
            start = Some((sent, sent + r.there, sent + r.there + r.back));
        }
    }
    let (started, master_start, answered) = start?;
    let transfer_at = answered + s.stall;
    // The writer's window, fed the answers that arrived by then, in arrival order.
    answers.sort_unstable();
    let mut window = WriteWindow::new(rule, Millis::ZERO);
    for &(at, sent) in answers.iter().filter(|(at, _)| *at <= transfer_at) {
        window.acknowledged(Millis(sent), Millis(at));
    }
    let fence = window.fence(Millis(started), s.size, Millis(transfer_at));
    // The connection's clock: send time zero is when the writer's first message went out, at
    // real time 0; the node noted its arrival; the writer saw the round trip.
    let rtt_us = s.anchor_there_us + s.anchor_back_us;
    let valid_us = FenceRule::announced_validity(fence.as_millis() * 1_000, rtt_us)?;
    let node_us = |real_ms: u64| (real_ms * 1_000) as i64 + s.skew_us;
    let mut view = SenderClockView::anchored(node_us(0) + s.anchor_there_us as i64);
    let arrived = transfer_at + s.to_node;
    if view.expired(transfer_at * 1_000, valid_us, node_us(arrived)) {
        return None;
    }
    let landed = arrived + s.landing;
    // The master: the first time after the start was heard that it had heard nothing for a
    // TTL, and the release timeout.
    heard.sort_unstable();
    let expiry = heard
        .iter()
        .zip(heard.iter().skip(1).map(Some).chain([None]))
        .filter(|(at, _)| **at >= master_start)
        .find_map(|(at, next)| match next {
            Some(next) if next - at < s.ttl => None,
            _ => Some(at + s.ttl),
        })
        .expect("the last hearing expires");
    // A write the master abandoned while its writer lives: its blocks are reused once the
    // fence says the last byte has landed.
    let abandoned = FenceRule::new(Millis(s.ttl), Millis(s.release))
        .writes_land_by(Millis(master_start), s.size)
        .as_millis();
    Some((landed, expiry.min(master_start + s.release).min(abandoned)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn no_write_lands_after_its_blocks_may_be_reused(s in scenarios()) {
        prop_assume!(FenceRule::new(Millis(s.ttl), Millis(s.release)).check().is_ok());
        if let Some((landed, reuse)) = run(&s) {
            prop_assert!(landed < reuse, "landed at {landed} ms, blocks reusable from {reuse} ms");
        }
    }
}

/// The fence is not vacuous: honest writers with prompt answers do write.
#[test]
fn prompt_writers_write() {
    let s = Scenario {
        ttl: 10_000,
        release: 600_000,
        requests: vec![
            Request {
                gap: 1_000,
                there: 1,
                back: 1,
                fate: 0,
            },
            Request {
                gap: 2_000,
                there: 1,
                back: 1,
                fate: 0,
            },
        ],
        start: 1,
        stall: 10,
        to_node: 1,
        landing: 5,
        skew_us: 123_456,
        anchor_there_us: 100,
        anchor_back_us: 100,
        size: 0,
    };
    let (landed, reuse) = run(&s).expect("written");
    assert_eq!(landed, 3_002 + 10 + 1 + 5);
    // If the master abandons the write, its blocks are reused once the fence has passed: a
    // 5 s window, the 2 s late-landing bound and a millisecond after the master heard the start.
    assert_eq!(reuse, 3_001 + 7_001);
}
