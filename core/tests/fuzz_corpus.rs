//! Replays the fuzz targets' corpora (and a fixed set of generated inputs) through the same
//! entry points `cargo fuzz` drives, so every CI run re-checks what the fuzzer has found.
//! The corpora live in `fuzz/corpus/<target>/`; crashes the fuzzer finds are fixed and then
//! added there as regression inputs.

#[path = "common/corpus.rs"]
mod corpus;

use corpus::{corpus, generated};
use mooring_core::testkit::{fuzz_one, fuzz_snapshot};

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
