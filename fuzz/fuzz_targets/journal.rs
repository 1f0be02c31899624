//! A master's journal file as read back at restart (see `mooring_proto::fuzz::journal`):
//! decoding must stop cleanly at the first bad record, and every record it accepts must
//! survive encoding again. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mooring_proto::fuzz::journal(data);
});
