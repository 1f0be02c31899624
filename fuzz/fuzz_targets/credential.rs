//! The claims a stranger's handshake carries to the master, token files and revocation lists
//! (see `mooring_proto::fuzz::credential`): refused with a reason or accepted with one
//! spelling. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooring_proto::fuzz::credential(data);
});
