//! The fuzz corpora as tests replay them, shared by every crate whose decoders are fuzzed
//! (`proto/tests/fuzz_corpus.rs` includes this file by path).

use std::path::{Path, PathBuf};

use mooring_core::rng::Rng;

/// Where target `target`'s stored inputs live (`fuzz/corpus/<target>/`).
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Every stored input of `target`, in name order.
pub fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(target);
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

/// `count` random inputs of 1 to `max_len` bytes, the same for the same `seed`.
pub fn generated(seed: u64, count: usize, max_len: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::seeded(seed);
    (0..count)
        .map(|_| {
            let len = rng.below(max_len) + 1;
            (0..len).map(|_| rng.next_u64() as u8).collect()
        })
        .collect()
}
