//! What a node reads from any local process on its shared-memory socket, and what a client
//! reads back (see `mooring_proto::fuzz::shm_handoff`). Refused cleanly or decoded to a value
//! that survives encoding again; nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooring_proto::fuzz::shm_handoff(data);
});
