//! `cargo fuzz run chat_template`: see `../targets.rs` (seeds in `seeds/chat_template/`).
#![no_main]

// Each binary runs one of the shared targets.
#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::chat_template(data);
});
