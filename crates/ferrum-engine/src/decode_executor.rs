//! The generic decode executor: drives any [`DecodeBackend`] through the
//! decode phase of a sequence whose prefill ran elsewhere.

use ferrum_types::{DecodeBackend, FerrumError, Result, TensorRef};

use crate::sampler::Sampler;

/// Runs decode steps on a [`DecodeBackend`], sampling each next token.
pub struct GenericDecodeExecutor<D: DecodeBackend> {
    backend: D,
}

impl<D: DecodeBackend> GenericDecodeExecutor<D> {
    pub fn new(backend: D) -> Self {
        Self { backend }
    }

    pub fn backend(&self) -> &D {
        &self.backend
    }

    /// Hands a prefilled sequence's KV cache to the backend, then samples up
    /// to `max_tokens` tokens starting from the prefill's last logits.
    /// Stops early at a token for which `is_stop` holds (not included).
    /// The backend's cache is released afterwards.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        cache_key: &str,
        kv: Vec<(TensorRef, TensorRef)>,
        prefill_len: usize,
        mut logits: Vec<f32>,
        sampler: &mut Sampler,
        max_tokens: usize,
        is_stop: impl Fn(u32) -> bool,
    ) -> Result<Vec<u32>> {
        self.backend.init_kv_cache(cache_key, kv, prefill_len)?;
        let mut out = Vec::new();
        let result = (|| {
            for step in 0..max_tokens {
                let token = sampler.sample(&mut logits).token;
                sampler.accept(token);
                if is_stop(token) {
                    break;
                }
                out.push(token);
                if step + 1 == max_tokens {
                    break;
                }
                let t = self
                    .backend
                    .decode_step(token, prefill_len + step, cache_key)?;
                if t.shape().last() != Some(&logits.len()) {
                    return Err(FerrumError::invalid(format!(
                        "{} returned logits of shape {:?}",
                        self.backend.name(),
                        t.shape()
                    )));
                }
                logits.copy_from_slice(t.data());
            }
            Ok(())
        })();
        self.backend.release_kv_cache(cache_key);
        result.map(|()| out)
    }
}
