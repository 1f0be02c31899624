//! Replays the fuzz targets' corpora (and a fixed set of generated inputs) through the same
//! entry points `cargo fuzz` drives, so every CI run re-checks what the fuzzer has found.
//! The corpora live in `fuzz/corpus/<target>/`; crashes the fuzzer finds are fixed and then
//! added there as regression inputs.

use std::path::Path;

use mooring_core::rng::Rng;
use mooring_core::testkit::{fuzz_one, fuzz_snapshot};

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("corpus file"))
        .collect()
}

fn generated(seed: u64, count: usize, max_len: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::seeded(seed);
    (0..count)
        .map(|_| {
            let len = rng.below(max_len) + 1;
            (0..len).map(|_| rng.next_u64() as u8).collect()
        })
        .collect()
}

#[test]
fn core_ops_corpus_and_generated_inputs_pass() {
    let inputs = corpus("core_ops");
    assert!(!inputs.is_empty(), "the core_ops corpus is empty");
    for input in inputs.iter().chain(&generated(1, 300, 4096)) {
        fuzz_one(input);
    }
}

#[test]
fn snapshot_corpus_and_generated_inputs_pass() {
    let inputs = corpus("snapshot_restore");
    assert!(!inputs.is_empty(), "the snapshot_restore corpus is empty");
    for input in inputs.iter().chain(&generated(2, 300, 256)) {
        fuzz_snapshot(input);
    }
}
