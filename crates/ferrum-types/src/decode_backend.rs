//! The decode-phase execution interface.

use crate::{Result, TensorRef};

/// Runs single-token decode steps for one loaded model.
///
/// A decode backend owns everything the hot path needs (weights, KV caches,
/// pre-allocated scratch, device handles) so that one step allocates nothing.
/// Prefill runs through the model's ordinary forward pass; its K/V is then
/// handed over with [`DecodeBackend::init_kv_cache`]. The engine's generic
/// decode executor drives any implementation through this trait.
pub trait DecodeBackend: Send + Sync {
    /// One token in, next-token logits out (shape `[1, 1, vocab_size]`).
    /// `position` is the token's absolute position (its RoPE angle).
    fn decode_step(&mut self, token_id: u32, position: usize, cache_key: &str)
        -> Result<TensorRef>;

    /// Installs the KV cache of a freshly prefilled sequence: one `(K, V)`
    /// pair per layer, each holding `prefill_len` positions.
    fn init_kv_cache(
        &mut self,
        cache_key: &str,
        kv_data: Vec<(TensorRef, TensorRef)>,
        prefill_len: usize,
    ) -> Result<()>;

    /// Whether `cache_key` has a KV cache here.
    fn has_kv_cache(&self, cache_key: &str) -> bool;

    /// Frees the KV cache of a finished sequence (no-op when absent).
    fn release_kv_cache(&mut self, cache_key: &str);

    /// Short name for logs, e.g. `"cpu"` or `"cuda:0"`.
    fn name(&self) -> &str;
}
