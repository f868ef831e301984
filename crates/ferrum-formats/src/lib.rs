//! Readers for the files people already have: llama.cpp's GGUF and Hugging
//! Face folders (safetensors weights + `config.json`).
//!
//! Every reader validates sizes and offsets against the file before it
//! allocates or reads, and reports problems as
//! [`ferrum_types::FerrumError::BadFile`] naming the file.

pub mod gguf;
pub mod hf_config;
pub mod safetensors;
