//! Network bytes through one of the wire's decoders (see `mooring_proto::fuzz::master_request`): it
//! must refuse them cleanly or decode a message that survives encoding again. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooring_proto::fuzz::master_request(data);
});
