//! The fuzz entry points: op sequences from raw bytes ([`fuzz_one`]), and mutated snapshots
//! of a sample master that has seen a bit of everything ([`fuzz_snapshot`]).

use super::ops::{Op, Pin, ops_from_bytes};
use super::{Harness, KEYS, client_id, harness_config, key_name};
use crate::config::ReplicateConfig;
use crate::invariants;
use crate::master::Master;
use crate::time::Millis;

/// Runs a fuzz input: a seed byte, then ops. Panics on any violation (what a fuzzer wants).
pub fn fuzz_one(data: &[u8]) {
    let Some((&seed, rest)) = data.split_first() else {
        return;
    };
    let ops = ops_from_bytes(rest);
    let mut harness = Harness::new(u64::from(seed));
    if let Err(e) = harness.run(&ops) {
        panic!("seed {seed}: {e}\nops: {ops:#?}");
    }
}

/// A snapshot of a master that has seen a bit of everything, built once.
fn sample_snapshot() -> &'static [u8] {
    static SNAPSHOT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let mut harness = Harness::new(7);
        let ops = [
            Op::Put {
                client: 0,
                key: 1,
                size: 1,
                replicas: 1,
                pin: Pin::Hard,
                prefer: None,
            },
            Op::End {
                client: 0,
                grant: 0,
            },
            Op::Put {
                client: 1,
                key: 2,
                size: 2,
                replicas: 2,
                pin: Pin::Soft,
                prefer: Some(2),
            },
            Op::End {
                client: 1,
                grant: 0,
            },
            Op::Put {
                client: 2,
                key: 3,
                size: 3,
                replicas: 0,
                pin: Pin::None,
                prefer: None,
            },
            Op::Get { key: 2, keep: true },
            Op::Hold { client: 2, key: 1 },
            Op::Copy {
                client: 1,
                key: 1,
                target: 2,
            },
            Op::Upsert {
                client: 0,
                key: 2,
                size: 2,
                replicas: 1,
                pin: Pin::None,
                prefer: None,
            },
        ];
        for op in &ops {
            harness.apply(op).expect("sample ops");
        }
        harness.master.snapshot()
    })
}

/// Runs a snapshot fuzz input: the bytes are XORed into a real snapshot's payload (and also
/// tried raw), the envelope's checksum is fixed up so decoding gets past it, and the result
/// must either be refused or restore to a master that passes its invariants and survives a
/// few operations. Panics on any violation.
pub fn fuzz_snapshot(data: &[u8]) {
    let config = harness_config(7);
    let _ = Master::restore(config.clone(), data, Millis(0));
    let mut payload = crate::snapshot::payload(sample_snapshot()).to_vec();
    for (i, b) in data.iter().enumerate() {
        if payload.is_empty() {
            break;
        }
        let at = (i * 131 + usize::from(*b)) % payload.len();
        payload[at] ^= b.rotate_left(i as u32);
    }
    let bytes = crate::snapshot::envelope(&payload);
    if let Ok(mut master) = Master::restore(config, &bytes, Millis(5_000)) {
        if let Err(v) = invariants::check(&master) {
            panic!("restored a master that breaks its invariants: {v}");
        }
        let client = client_id(0);
        let now = Millis(6_000);
        master.tick(now);
        for k in 0..KEYS {
            let key = key_name(k);
            let _ = master.get_replica_list(&key, now);
            let _ = master.upsert_start(client, &key, 700, &ReplicateConfig::single(), now);
        }
        master.tick(now + Millis(100_000));
        if let Err(v) = invariants::check(&master) {
            panic!("a restored master broke its invariants: {v}");
        }
    }
}
