//! The single error type used across the workspace.

use std::path::PathBuf;

/// Result alias used by every Ferrum crate.
pub type Result<T, E = FerrumError> = std::result::Result<T, E>;

/// Everything that can go wrong in Ferrum, grouped by who has to act on it.
///
/// Variants carry human-readable context (which file, which parameter) so the
/// CLI and the HTTP server can print them verbatim and the user knows what to
/// do next.
#[derive(Debug, thiserror::Error)]
pub enum FerrumError {
    /// The requested operation exists in the interface but this backend,
    /// model or build does not implement it.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A caller passed a value outside the accepted range (a request
    /// parameter, a shape, a token id).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A model file (GGUF, safetensors, config.json, tokenizer) is malformed.
    #[error("{path}: {message}")]
    BadFile { path: PathBuf, message: String },

    /// A sequence would grow past the KV cache reserved for it.
    #[error("context overflow: {needed} tokens needed but the KV capacity is {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },

    /// The shared KV block pool has too few free blocks for a step. The
    /// scheduler avoids it by admitting and preempting on free blocks; a
    /// caller that sees it can release a sequence and retry.
    #[error("KV cache full: {needed} blocks needed, {free} free; lower the load or raise --kv-cache-tokens")]
    KvExhausted { needed: usize, free: usize },

    /// An I/O failure, with the path it concerned. The OS error is part of
    /// the message (not a separate cause) so it is printed once.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },

    /// A device (GPU driver, runtime compiler) failure.
    #[error("device error: {0}")]
    Device(String),
}

impl FerrumError {
    /// Shorthand for [`FerrumError::Unsupported`].
    pub fn unsupported(msg: impl Into<String>) -> Self {
        Self::Unsupported(msg.into())
    }

    /// Shorthand for [`FerrumError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }

    /// Shorthand for [`FerrumError::BadFile`].
    pub fn bad_file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Self::BadFile { path: path.into(), message: msg.into() }
    }

    /// Shorthand for [`FerrumError::Io`].
    pub fn io(path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        Self::Io { path: path.into(), err }
    }

    /// True for [`FerrumError::Unsupported`]; callers use it to pick a
    /// fallback path (e.g. the engine falls back from `unified_forward`).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Self::Unsupported(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_problem() {
        let e = FerrumError::bad_file("/m/x.gguf", "tensor data past end of file");
        assert_eq!(e.to_string(), "/m/x.gguf: tensor data past end of file");
        assert!(FerrumError::unsupported("mla").is_unsupported());
        assert!(!FerrumError::invalid("top_p > 1").is_unsupported());
        let o = FerrumError::ContextOverflow { needed: 5000, capacity: 4096 };
        assert!(o.to_string().contains("5000") && o.to_string().contains("4096"));
    }
}
