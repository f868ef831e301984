//! Any byte string must parse or fail cleanly: no panic, no huge allocation.
//! `cargo fuzz run gguf_header` (see README).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferrum_formats::gguf::parse_header(data);
});
