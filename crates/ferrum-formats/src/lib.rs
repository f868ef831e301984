//! Readers for the files people already have: llama.cpp's GGUF and Hugging
//! Face folders (safetensors weights + `config.json`).
//!
//! Every reader validates sizes and offsets against the file before it
//! allocates or reads, and reports problems as
//! [`ferrum_types::FerrumError::BadFile`] naming the file.

pub mod file_bytes;
pub mod gguf;
pub mod hf_config;
pub mod hf_quant;
pub mod safetensors;
pub mod sampling;
pub mod sizes;

/// Ferrum's model cache: `$FERRUM_MODELS`, else `~/.cache/ferrum/models`
/// (where `ferrum pull` and `fetch.sh` put models).
pub fn model_cache_dir() -> std::path::PathBuf {
    match std::env::var_os("FERRUM_MODELS") {
        Some(p) => p.into(),
        None => std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/ferrum/models"),
    }
}

/// `file` in the model cache, or `None` with a note on stderr: how tests
/// that need a fetched model skip where `fetch.sh` has not run.
pub fn cached_model(file: &str) -> Option<std::path::PathBuf> {
    let path = model_cache_dir().join(file);
    if path.exists() {
        return Some(path);
    }
    eprintln!(
        "skipping: {} not found (run scripts/fetch-models.sh)",
        path.display()
    );
    None
}
