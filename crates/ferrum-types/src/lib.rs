//! Types shared by every Ferrum crate: the one error type, the ggml tensor
//! types, the host tensor handle and the decode-execution interface (and
//! pieces of process hygiene, [`release_freed_memory`] and [`bound_retained_memory`]).
//!
//! This crate sits at the bottom of the dependency graph
//! (types -> kernels -> models -> engine -> server/cli) and depends on no
//! other Ferrum crate.

mod decode_backend;
mod error;
mod ggml;
mod memory;
mod tensor;

pub use decode_backend::DecodeBackend;
pub use error::{FerrumError, Result};
pub use ggml::GgmlType;
pub use memory::{bound_retained_memory, release_freed_memory};
pub use tensor::TensorRef;
