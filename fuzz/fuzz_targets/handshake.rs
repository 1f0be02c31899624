//! The first bytes a server reads from a stranger: a handshake frame's payload (see
//! `mooring_proto::fuzz::handshake`). It must be refused cleanly or decode to a step that
//! survives encoding again. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooring_proto::fuzz::handshake(data);
});
