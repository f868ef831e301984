//! `cargo fuzz run gguf_file`: see `../targets.rs` (seeds in `seeds/gguf_file/`).
#![no_main]

// Each binary runs one of the shared targets.
#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::gguf_file(data, &targets::scratch("gguf_file"));
});
