//! Arbitrary bytes become a seed and an operation sequence, run against the master under the
//! testkit's reference model, byte-level memory and invariant checks. Any violation panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooring_core::testkit::fuzz_one(data);
});
