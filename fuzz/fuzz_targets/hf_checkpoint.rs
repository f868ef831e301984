//! `cargo fuzz run hf_checkpoint`: see `../targets.rs` (seeds in `seeds/hf_checkpoint/`).
#![no_main]

// Each binary runs one of the shared targets.
#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

use std::path::PathBuf;
use std::sync::OnceLock;

/// This process's folder for the files an input is written to.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ferrum-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch folder");
        dir
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::hf_checkpoint(data, scratch());
});
