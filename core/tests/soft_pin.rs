//! Soft-pin actions (Mooncake's `SoftPinAction`): what a put or upsert does to a key's soft
//! pin, seen through the order eviction takes objects in.

mod common;

use common::*;
use mooring_core::{ErrorCode, Event, Millis, ReplicateConfig, SoftPinAction};

fn one() -> ReplicateConfig {
    ReplicateConfig::single()
}

fn with_action(action: SoftPinAction, ttl: Option<Millis>) -> ReplicateConfig {
    ReplicateConfig {
        soft_pin: action,
        soft_pin_ttl: ttl,
        ..one()
    }
}

/// Fills a 1 MiB segment holding "s" (64 KiB) and seven unpinned 64 KiB objects until
/// eviction has taken everything it may, and returns whether "s" was soft-pinned when taken
/// and how many objects went before it.
fn eviction_of_s(f: &mut Fixture) -> (bool, usize) {
    for i in 0..7 {
        f.put(A, &format!("u{i}"), 64 * KIB, &one());
    }
    f.advance(Millis::from_secs(6));
    f.put(A, "big", 1000 * KIB, &one());
    let evicted: Vec<(String, bool)> =
        f.m.drain_events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Evicted {
                    key, soft_pinned, ..
                } => Some((key.into(), soft_pinned)),
                _ => None,
            })
            .collect();
    let at = evicted
        .iter()
        .position(|(k, _)| k == "s")
        .expect("s was evicted");
    (evicted[at].1, at)
}

#[test]
fn a_ttl_without_enable_is_refused_with_what_to_do() {
    let mut f = Fixture::new(1, MIB);
    for action in [SoftPinAction::Preserve, SoftPinAction::Disable] {
        let config = with_action(action, Some(Millis(1000)));
        for e in [
            f.start(A, "k", 100, &config).unwrap_err(),
            f.upsert(A, "k", 100, &config).unwrap_err(),
        ] {
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
            assert!(e.to_string().contains("Enable"), "{e}");
        }
    }
    assert_eq!(f.used(), 0, "a refused request allocates nothing");
    let e = f
        .start(
            A,
            "k",
            100,
            &with_action(SoftPinAction::Enable, Some(Millis(0))),
        )
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    f.start(
        A,
        "k",
        100,
        &with_action(SoftPinAction::Enable, Some(Millis(1))),
    )
    .unwrap();
}

#[test]
fn a_put_pins_only_when_asked() {
    for (action, pinned) in [
        (SoftPinAction::Preserve, false),
        (SoftPinAction::Disable, false),
        (SoftPinAction::Enable, true),
    ] {
        let mut f = Fixture::new(1, MIB);
        f.put(A, "s", 64 * KIB, &with_action(action, None));
        let (soft, before) = eviction_of_s(&mut f);
        assert_eq!(soft, pinned, "{action:?}");
        if pinned {
            assert_eq!(before, 7, "a pinned object goes after every unpinned one");
        } else {
            assert_eq!(
                before, 0,
                "{action:?}: the oldest unpinned object goes first"
            );
        }
    }
}

#[test]
fn an_upsert_preserves_enables_or_disables_the_pin_it_finds() {
    // (pinned before, action of the upsert, pinned after)
    let cases = [
        (true, SoftPinAction::Preserve, true),
        (false, SoftPinAction::Preserve, false),
        (true, SoftPinAction::Disable, false),
        (false, SoftPinAction::Enable, true),
        (true, SoftPinAction::Enable, true),
    ];
    for (pinned, action, expected) in cases {
        for same_size in [true, false] {
            let mut f = Fixture::new(1, MIB);
            let first = if pinned {
                one().soft_pinned(None)
            } else {
                one()
            };
            f.put(A, "s", 64 * KIB, &first);
            // Same size: in place; another size: fresh memory for the same key.
            let size = if same_size { 64 * KIB } else { 60 * KIB };
            let g = f.upsert(A, "s", size, &with_action(action, None)).unwrap();
            f.end(A, "s", g.write_id).unwrap();
            let (soft, _) = eviction_of_s(&mut f);
            assert_eq!(
                soft, expected,
                "pinned {pinned}, upsert {action:?}, same size {same_size}"
            );
        }
    }
}

#[test]
fn an_upsert_that_preempts_a_write_keeps_the_pins_of_the_key() {
    let mut f = Fixture::new(1, MIB);
    let g = f
        .upsert(A, "s", 64 * KIB, &one().soft_pinned(None).hard_pinned())
        .unwrap();
    // B's upsert preempts A's unfinished write; the key keeps both pins.
    let g2 = f.upsert(B, "s", 64 * KIB, &one()).unwrap();
    assert_ne!(g.write_id, g2.write_id);
    f.end(B, "s", g2.write_id).unwrap();
    let g3 = f.upsert(B, "s", 64 * KIB, &one().soft_unpinned()).unwrap();
    f.end(B, "s", g3.write_id).unwrap();
    // Still hard-pinned (only removal clears that), no longer soft-pinned: never evicted.
    for i in 0..15 {
        f.put(A, &format!("u{i}"), 64 * KIB, &one());
    }
    f.advance(Millis::from_secs(6));
    let e = f.start(A, "big", 1000 * KIB, &one()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NO_AVAILABLE_HANDLE);
    assert!(f.get("s").is_ok());
}

#[test]
fn a_preserved_pin_keeps_its_ttl() {
    let mut f = Fixture::new(1, MIB);
    f.put(
        A,
        "s",
        64 * KIB,
        &one().soft_pinned(Some(Millis::from_secs(60))),
    );
    let g = f.upsert(A, "s", 64 * KIB, &one()).unwrap();
    f.end(A, "s", g.write_id).unwrap();
    // Sixty-one seconds without access: the preserved 60 s pin has lapsed (the default
    // TTL of 30 minutes would not have).
    f.advance(Millis::from_secs(61));
    f.tick_after(Millis(0));
    let (soft, before) = eviction_of_s(&mut f);
    assert!(!soft);
    assert_eq!(before, 0);
}
