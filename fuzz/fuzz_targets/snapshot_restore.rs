//! Arbitrary bytes, wrapped in a valid snapshot envelope (so the fuzzer reaches rkyv
//! validation and the invariant checker, not just the checksum), must be refused cleanly or
//! restore to a master that passes its invariants. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooring_core::testkit::fuzz_snapshot(data);
});
