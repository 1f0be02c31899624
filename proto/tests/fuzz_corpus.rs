//! Replays the wire fuzz targets' corpora (`fuzz/corpus/<target>/`) and a set of generated
//! inputs through the same entry points `cargo fuzz` drives, so every test run re-checks every
//! decoder of network bytes. Inputs the fuzzer once failed on are kept in the corpora.

#[path = "../../core/tests/common/corpus.rs"]
mod corpus;

use corpus::{corpus, corpus_dir, generated};
use mooring_proto::fuzz;
use mooring_proto::wire::{FrameKind, HEADER_LEN};

/// A fuzz entry point: arbitrary bytes in, a panic on a defect.
type Entry = fn(&[u8]);

/// Each wire target with its entry point.
const TARGETS: [(&str, Entry); 11] = [
    ("wire_frame", fuzz::frame),
    ("master_request", fuzz::master_request),
    ("master_response", fuzz::master_response),
    ("data_request", fuzz::data_request),
    ("data_response", fuzz::data_response),
    ("handshake", fuzz::handshake),
    ("journal", fuzz::journal),
    ("shm_handoff", fuzz::shm_handoff),
    ("credential", fuzz::credential),
    ("peer_request", fuzz::peer_request),
    ("peer_response", fuzz::peer_response),
];

/// Every corpus input and its single-bit flips, plus random bytes, through every target.
#[test]
fn wire_corpora_and_generated_inputs_pass() {
    for (i, (target, entry)) in TARGETS.iter().enumerate() {
        let inputs = corpus(target);
        assert!(!inputs.is_empty(), "the {target} corpus is empty");
        for input in &inputs {
            entry(input);
            for bit in (0..input.len() * 8).step_by(7) {
                let mut flipped = input.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                entry(&flipped);
            }
        }
        for input in generated(10 + i as u64, 300, 512) {
            entry(&input);
        }
    }
}

/// The seeds decode: a corpus that no longer means anything would fuzz only garbage.
#[test]
fn the_seed_frames_decode() {
    let frames = fuzz::sample_frames();
    assert!(frames.len() >= 10);
    for (kind, frame) in &frames {
        fuzz::frame(frame);
        let payload = &frame[HEADER_LEN..];
        match kind {
            FrameKind::MasterRequest => fuzz::master_request(payload),
            FrameKind::MasterResponse => fuzz::master_response(payload),
            FrameKind::DataRequest => fuzz::data_request(payload),
            FrameKind::DataResponse => fuzz::data_response(payload),
            FrameKind::Handshake => fuzz::handshake(payload),
            FrameKind::PeerRequest => fuzz::peer_request(payload),
            FrameKind::PeerResponse => fuzz::peer_response(payload),
        }
    }
}

/// Writes the seed corpora (run once by hand after a wire change:
/// `cargo test -p mooring-proto --test fuzz_corpus -- --ignored`).
#[test]
#[ignore = "writes fuzz/corpus; run by hand after a wire change"]
fn write_seed_corpora() {
    let dir = corpus_dir("journal");
    std::fs::create_dir_all(&dir).expect("corpus dir");
    for journal in [fuzz::sample_journal(), fuzz::sample_damaged_journal()] {
        let name = format!("seed-{:08x}", crc32c::crc32c(&journal));
        std::fs::write(dir.join(name), &journal).expect("corpus file");
    }
    let dir = corpus_dir("shm_handoff");
    std::fs::create_dir_all(&dir).expect("corpus dir");
    for input in fuzz::sample_handoffs() {
        let name = format!("seed-{:08x}", crc32c::crc32c(&input));
        std::fs::write(dir.join(name), &input).expect("corpus file");
    }
    let dir = corpus_dir("credential");
    std::fs::create_dir_all(&dir).expect("corpus dir");
    for input in fuzz::sample_credentials() {
        let name = format!("seed-{:08x}", crc32c::crc32c(&input));
        std::fs::write(dir.join(name), &input).expect("corpus file");
    }
    for (kind, frame) in fuzz::sample_frames() {
        let (target, input) = match kind {
            FrameKind::MasterRequest => ("master_request", &frame[HEADER_LEN..]),
            FrameKind::MasterResponse => ("master_response", &frame[HEADER_LEN..]),
            FrameKind::DataRequest => ("data_request", &frame[HEADER_LEN..]),
            FrameKind::DataResponse => ("data_response", &frame[HEADER_LEN..]),
            FrameKind::Handshake => ("handshake", &frame[HEADER_LEN..]),
            FrameKind::PeerRequest => ("peer_request", &frame[HEADER_LEN..]),
            FrameKind::PeerResponse => ("peer_response", &frame[HEADER_LEN..]),
        };
        for (target, input) in [(target, input), ("wire_frame", &frame[..])] {
            let dir = corpus_dir(target);
            std::fs::create_dir_all(&dir).expect("corpus dir");
            let name = format!("seed-{:08x}", crc32c::crc32c(input));
            std::fs::write(dir.join(name), input).expect("corpus file");
        }
    }
}

#[test]
fn the_journal_seeds_reach_both_the_replay_and_the_refusal() {
    use mooring_proto::journal::decode;
    let whole = decode(4, &fuzz::sample_journal());
    assert!(whole.ended && whole.damaged.is_none(), "{whole:?}");
    let damaged = decode(4, &fuzz::sample_damaged_journal());
    assert!(damaged.damaged.is_some(), "{damaged:?}");
}
