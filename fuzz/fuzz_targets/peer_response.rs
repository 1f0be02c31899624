//! Network bytes through one of the wire's decoders (see `mooring_proto::fuzz::peer_response`):
//! a peer's replies in peer mode. They must be refused cleanly or decode to a message that survives encoding again.
//! Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooring_proto::fuzz::peer_response(data);
});
