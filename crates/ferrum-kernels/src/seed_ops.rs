//! The seed's `Backend` methods that no Ferrum model calls, kept with
//! their signatures and meaning for code written against the seed, and
//! out of [`Backend`], the surface a new backend must implement.
//!
//! GPTQ checkpoints load as GGUF-style blocks (every backend runs them on
//! the kernels it has), DeepSeek's latent attention runs on the ordinary
//! ops (`ferrum-models/src/llama/mla.rs`), and K/V live in paged pools, so
//! `load_gptq`/`gemm_gptq`, `mla_attention` and the contiguous-cache
//! append have no caller. A backend implements this trait where it has
//! them (the CPU: GPTQ and the append; CUDA: the append); the defaults
//! report GPTQ and latent attention unsupported, and the append, which
//! every backend with a KV cache has, has none. `tests/seed_signatures.rs` holds the seed's
//! signatures to these.

use ferrum_types::{FerrumError, Result};

use crate::{AttnConfig, Backend};

/// The seed's uncalled `Backend` methods (see the module doc).
pub trait SeedOps: Backend {
    /// A GPTQ weight repacked once at load into this backend's favourite
    /// format (CPU: dequantized f32 rows).
    type GptqStore: Send + Sync;

    /// Repacks one GPTQ weight (host tensors straight from the checkpoint)
    /// into [`SeedOps::GptqStore`]. Called once per weight at load.
    ///
    /// `qweight` is `[k / (32 / bits), n]` with `32 / bits` values of one
    /// column packed per word along k; `qzeros` is `[k / group_size,
    /// n / (32 / bits)]` packed along n and stored minus one (the GPTQ v1
    /// on-disk convention); `scales` is `[k / group_size, n]`; `g_idx`, when
    /// present, maps each of the `k` input rows to its group.
    #[allow(clippy::too_many_arguments)]
    fn load_gptq(
        _qweight: &[i32],
        _scales: &[f32],
        _qzeros: &[i32],
        _g_idx: Option<&[i32]>,
        _bits: u32,
        _group_size: usize,
        _k: usize,
        _n: usize,
    ) -> Result<Self::GptqStore> {
        Err(FerrumError::unsupported(
            "load_gptq is not implemented for this backend",
        ))
    }

    /// `out[m, n] = a[m, k] · dequant(weight)ᵀ`.
    fn gemm_gptq(
        _ctx: &mut Self::Context,
        _a: &Self::Buffer,
        _weight: &Self::GptqStore,
        _out: &mut Self::Buffer,
        _m: usize,
    ) -> Result<()> {
        Err(FerrumError::unsupported(
            "gemm_gptq is not implemented for this backend",
        ))
    }

    /// Multi-head latent attention (DeepSeek V2/V3's compressed KV).
    ///
    /// Shapes: `q` `[batch, heads, q_len, head_dim]`, `kv_compressed`
    /// `[batch, kv_len, kv_lora_rank]`, `kv_rope` `[batch, kv_len,
    /// qk_rope_head_dim]`, `out` like `q`. An extension point: no model in
    /// Ferrum needs it yet, so every backend reports it unsupported.
    #[allow(clippy::too_many_arguments)]
    fn mla_attention(
        _ctx: &mut Self::Context,
        _q: &Self::Buffer,
        _kv_compressed: &Self::Buffer,
        _kv_rope: &Self::Buffer,
        _out: &mut Self::Buffer,
        _batch: usize,
        _q_len: usize,
        _kv_len: usize,
        _pos_offset: usize,
        _cfg: &AttnConfig,
        _kv_lora_rank: usize,
        _qk_rope_head_dim: usize,
    ) -> Result<()> {
        Err(FerrumError::unsupported(
            "mla_attention (DeepSeek V2/V3 latent attention) is not implemented for this backend",
        ))
    }

    /// Writes `new_tokens` head-major K/V rows (`[nkv, new_tokens, hd]`, as
    /// `qk_norm_rope` produces them) into caches `[nkv, cache_capacity, hd]`
    /// at positions `cache_len..cache_len + new_tokens`. The caller keeps
    /// the length and checks capacity beforehand.
    #[allow(clippy::too_many_arguments)]
    fn kv_cache_append_head_major(
        ctx: &mut Self::Context,
        cache_k: &mut Self::Buffer,
        cache_v: &mut Self::Buffer,
        cache_len: usize,
        cache_capacity: usize,
        new_k_head_major: &Self::Buffer,
        new_v_head_major: &Self::Buffer,
        new_tokens: usize,
        nkv: usize,
        hd: usize,
    );
}
