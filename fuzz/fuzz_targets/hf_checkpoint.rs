//! `cargo fuzz run hf_checkpoint`: see `../targets.rs` (seeds in `seeds/hf_checkpoint/`).
#![no_main]

// Each binary runs one of the shared targets.
#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::hf_checkpoint(data, &targets::scratch("hf_checkpoint"));
});
