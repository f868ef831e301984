//! `DecoderOnlyLLM`: what the engine needs from any decoder-only language
//! model, independent of backend and weight format.

use ferrum_kernels::KvDtype;
use ferrum_types::{FerrumError, Result};

/// Told `(done, total)` as a model's weights load, so a front end can draw
/// a progress bar for large files; the parts are the model's to choose
/// (layers, for the Llama family).
pub type LoadProgress<'a> = dyn Fn(usize, usize) + 'a;

/// Environment variable that caps the per-sequence KV capacity (tokens).
pub const KV_CAPACITY_ENV: &str = "FERRUM_KV_CAPACITY";

/// The execution-facing facts about a model: enough for the engine to size
/// KV caches, bound the sampler and plan batches. Architecture details
/// (head counts per layer type, MLP width, RoPE settings) stay private to
/// each model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlmRuntimeConfig {
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// The longest context the model was trained for.
    pub max_seq_len: usize,
}

/// `FERRUM_KV_CAPACITY` as set: `None` when unset or empty, an error that
/// names the variable when it is not a whole number of at least 1 (a typo
/// there would otherwise load a model with a context nobody asked for).
pub fn kv_capacity_env() -> Result<Option<usize>> {
    let Some(raw) = std::env::var_os(KV_CAPACITY_ENV) else {
        return Ok(None);
    };
    let text = raw.to_string_lossy();
    if text.trim().is_empty() {
        return Ok(None);
    }
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(FerrumError::invalid(format!(
            "{KV_CAPACITY_ENV}={text:?} is not a number of tokens of at least 1 \
             (unset it, or give the context with --ctx)"
        ))),
    }
}

/// Environment variable for the paged KV pool size (tokens, all sequences
/// together) when `--kv-cache-tokens` is not given.
pub const KV_CACHE_TOKENS_ENV: &str = "FERRUM_KV_CACHE_TOKENS";

/// How a model sizes its shared, paged KV pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvPoolConfig {
    /// Positions in the pool over all sequences; 0 picks the default
    /// (`FERRUM_KV_CACHE_TOKENS`, else `sequences` at full capacity).
    pub tokens: usize,
    /// How many sequences at full capacity the default pool holds (4).
    /// Callers that know they run more at once (`ferrum bench --batch`)
    /// raise it: a backend that gives each sequence one block of its whole
    /// capacity fits no more sequences than this.
    pub sequences: usize,
    /// Positions per block; 0 lets the backend choose
    /// (`Backend::kv_block_size`: 16 on the CPU and CUDA).
    pub block_size: usize,
    /// Keep and share full blocks of earlier prompts.
    pub prefix_caching: bool,
    /// What the pool stores (see [`KvDtype`]); `None`: the backend's
    /// default. A type the backend's attention does not read is an error
    /// at load ([`ferrum_kernels::Capabilities::kv_dtype`]), never f32 in
    /// its place.
    pub dtype: Option<KvDtype>,
    /// Positions one sequence can hold (the command line's `--ctx`);
    /// `None`: `FERRUM_KV_CAPACITY`, else the model's default. See
    /// [`KvPoolConfig::sequence_capacity`].
    pub context: Option<usize>,
}

impl Default for KvPoolConfig {
    fn default() -> Self {
        Self {
            tokens: 0,
            sequences: 4,
            block_size: 0,
            prefix_caching: true,
            dtype: None,
            context: None,
        }
    }
}

impl KvPoolConfig {
    /// Positions one sequence holds for a model trained on `max_seq_len`:
    /// `context`, else `FERRUM_KV_CAPACITY` (a bad value is an error),
    /// else `default`; never more than `max_seq_len`. More than the model
    /// was trained on is lowered to it with a warning rather than refused,
    /// since `--ctx 32768` on a 8k model means "as much as it has".
    pub fn sequence_capacity(&self, max_seq_len: usize, default: usize) -> Result<usize> {
        let asked = match self.context {
            Some(0) => return Err(FerrumError::invalid("the context must be at least 1 token")),
            Some(n) => Some(n),
            None => kv_capacity_env()?,
        };
        if let Some(n) = asked.filter(|&n| n > max_seq_len) {
            tracing::warn!(
                "a context of {n} tokens is more than the model was trained for; using {max_seq_len}"
            );
        }
        Ok(asked.unwrap_or(default).min(max_seq_len).max(1))
    }

    /// The pool size in tokens for a model whose sequences hold
    /// `kv_capacity`: `tokens`, else `FERRUM_KV_CACHE_TOKENS`, else
    /// `sequences` at full capacity.
    pub fn resolve_tokens(&self, kv_capacity: usize) -> usize {
        let from_env = || {
            std::env::var(KV_CACHE_TOKENS_ENV)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&t| t > 0)
        };
        match self.tokens {
            0 => from_env().unwrap_or(self.sequences.max(1) * kv_capacity),
            t => t,
        }
    }
}

/// A decoder-only language model with its own per-sequence KV caches: the
/// seed's interface, for callers that run one or a few sequences by name
/// (`ferrum run`, `ferrum bench`, draft models). Paged models get it from
/// [`crate::KvManaged`]; the engine drives [`crate::PagedLlm`] directly
/// with its own block manager.
///
/// Sequences are named by a `cache_id` chosen by the caller. `prefill`
/// consumes a prompt and creates or extends that sequence's cache; `decode`
/// appends one token; both return next-token logits (`vocab_size` floats).
/// `release` frees a sequence.
///
/// Callers check [`DecoderOnlyLLM::kv_capacity`] against
/// [`DecoderOnlyLLM::kv_len`] before extending a sequence: the infallible
/// signatures below leave a model no way to report an overflow other than
/// panicking.
pub trait DecoderOnlyLLM: Send + Sync {
    /// The runtime-facing configuration.
    fn config(&self) -> &LlmRuntimeConfig;

    /// Runs `tokens` through the model at the end of `cache_id`'s cache
    /// (creating it if needed) and returns the logits after the last one.
    fn prefill(&mut self, cache_id: &str, tokens: &[u32]) -> Vec<f32>;

    /// Runs one token at position `pos` (the number of tokens already in the
    /// sequence) and returns the next-token logits.
    fn decode(&mut self, cache_id: &str, token: u32, pos: u32) -> Vec<f32>;

    /// Frees `cache_id`'s KV cache (no-op if unknown).
    fn release(&mut self, cache_id: &str);

    /// Number of positions currently cached for `cache_id` (0 if unknown).
    ///
    /// Not in the original seed interface; added because the default
    /// [`DecoderOnlyLLM::forward_verify`] must know where the sequence ends
    /// to give each token its true position, and because callers need it to
    /// check capacity before a write.
    fn kv_len(&self, cache_id: &str) -> usize;

    /// Hint that calls on `cache_id` will carry at most `max_tokens` tokens,
    /// so the model can allocate scratch and the KV cache now instead of
    /// on the first timed call. Default: nothing to do.
    fn prepare(&mut self, _cache_id: &str, _max_tokens: usize) {}

    /// The most positions one sequence can hold: `FERRUM_KV_CAPACITY` when
    /// set, clamped to `max_seq_len`. Models that reserve less override it
    /// (the loaded ones, sized by [`KvPoolConfig::sequence_capacity`], which
    /// refuses a bad value; this signature cannot fail, so here it is
    /// ignored).
    fn kv_capacity(&self) -> usize {
        let max = self.config().max_seq_len;
        kv_capacity_env().ok().flatten().unwrap_or(max).min(max)
    }

    /// Decodes one token for each `(cache_id, token, pos)` and returns the
    /// logits in the same order. Default: one `decode` per entry; models
    /// with a batched path run a single GEMM with `m = batch.len()`.
    fn decode_batch(&mut self, batch: &[(String, u32, u32)]) -> Vec<Vec<f32>> {
        batch
            .iter()
            .map(|(id, tok, pos)| self.decode(id, *tok, *pos))
            .collect()
    }

    /// Appends `tokens` at the end of `cache_id` and returns the logits after
    /// each of them, position-major (`tokens.len() × vocab_size`). Speculative
    /// decoding verifies a draft with it in one pass. Default: a `decode`
    /// loop starting at [`DecoderOnlyLLM::kv_len`].
    fn forward_verify(&mut self, cache_id: &str, tokens: &[u32]) -> Vec<f32> {
        let start = self.kv_len(cache_id);
        let mut out = Vec::with_capacity(tokens.len() * self.config().vocab_size);
        for (i, &tok) in tokens.iter().enumerate() {
            out.extend(self.decode(cache_id, tok, (start + i) as u32));
        }
        out
    }

    /// Mixed batch of prefill chunks and decodes in one forward pass (the
    /// chunked-prefill path). Each item is `(cache_id, tokens, pos_offset,
    /// is_final_chunk)`; the result holds `Some(logits of the last token)`
    /// for final chunks and `None` for intermediate ones. Default:
    /// `Unsupported`, and the engine falls back to `prefill` +
    /// `decode_batch`.
    fn unified_forward(
        &mut self,
        _items: &[(String, Vec<u32>, usize, bool)],
    ) -> Result<Vec<Option<Vec<f32>>>> {
        Err(FerrumError::unsupported(
            "unified_forward is not implemented by this model",
        ))
    }

    /// Rolls `cache_id` back to its first `new_len` positions (speculative
    /// decoding's rejection path). The default panics: a model that cannot
    /// roll back must not pretend it did, and the signature has no error.
    fn truncate_kv(&mut self, cache_id: &str, new_len: usize) {
        panic!("truncate_kv({cache_id}, {new_len}) is not supported by this model");
    }

    /// Drops every sequence's cached state.
    fn reset(&mut self) {}
}
