//! A Llama-family configuration from GGUF metadata: the `{arch}.*` keys,
//! named and defaulted as llama.cpp writes and reads them, and the few
//! settings llama.cpp's converters store as tensors (RoPE factors) or
//! leave to the tensors present (biases, QK norms, a tied head).

use ferrum_formats::gguf::GgufFile;
use ferrum_types::Result;

use super::arch::{Arch, Traits};
use super::config::{Activation, LlamaConfig, MlaConfig, MoeConfig, Scoring};
use crate::rope::{long_rope_attn_factor, yarn_mscale, RopeScaling, RopeSpec};

/// One file's `{arch}.*` keys.
struct Meta<'a> {
    g: &'a GgufFile,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn u(&self, k: &str) -> Result<usize> {
        self.g.get_u64(&self.key(k)).map(|v| v as usize)
    }

    fn f(&self, k: &str) -> Result<f64> {
        self.g.get_f64(&self.key(k))
    }
}

impl LlamaConfig {
    /// From GGUF metadata (`{arch}.*` keys, named as llama.cpp writes them).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let name = g.architecture()?.to_string();
        let arch = Arch::from_name(&name).map_err(|e| g.error(e.to_string()))?;
        let m = Meta { g, arch: &name };
        let hidden = m.u("embedding_length")?;
        let heads = m.u("attention.head_count")?;
        let head_dim = m.u("attention.key_length").unwrap_or(hidden / heads.max(1));
        let layers = m.u("block_count")?;
        let vocab = match g.get(&m.key("vocab_size")).and_then(|v| v.as_u64()) {
            Some(v) => v as usize,
            None => g
                .get("tokenizer.ggml.tokens")
                .and_then(|t| t.as_array())
                .map(|a| a.len())
                .ok_or_else(|| {
                    g.error("neither vocab_size nor tokenizer.ggml.tokens is present")
                })?,
        };
        check_sizes(&m, layers, hidden, heads, head_dim, vocab)?;
        let t = arch.traits();
        let gemma = t.gemma;
        let mla = mla(&m, &t)?;
        let sliding_window = m.u("attention.sliding_window").unwrap_or(0);
        let sliding = (0..layers)
            .map(|i| sliding_window > 0 && t.gguf_windows.slides(i))
            .collect();
        Self {
            arch,
            hidden,
            // MoE files may give only the experts' width.
            intermediate: m
                .u("feed_forward_length")
                .or_else(|_| m.u("expert_feed_forward_length"))?,
            layers,
            heads,
            kv_heads: m.u("attention.head_count_kv").unwrap_or(heads),
            head_dim,
            rotary_dims: m.u("rope.dimension_count").unwrap_or(head_dim),
            vocab,
            max_seq_len: m.u("context_length").unwrap_or(4096),
            rms_eps: m.f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6) as f32,
            rope: RopeSpec {
                theta: m.f("rope.freq_base").unwrap_or(10_000.0) as f32,
                scaling: rope_scaling(&m, arch, head_dim)?,
            },
            // llama.cpp hard-codes Gemma 3's local base.
            rope_local: t.local_rope.then(|| RopeSpec::plain(10_000.0)),
            sliding_window,
            sliding,
            qkv_bias: g.tensor("blk.0.attn_q.bias").is_some(),
            o_bias: g.tensor("blk.0.attn_output.bias").is_some(),
            mlp_bias: g.tensor("blk.0.ffn_down.bias").is_some(),
            tied_head: g.tensor("output.weight").is_none(),
            qk_norm: g.tensor("blk.0.attn_q_norm.weight").is_some(),
            attn_scale: match &mla {
                Some(a) => softmax_scale(&m) / ((a.nope + a.rope) as f32).sqrt(),
                None => 1.0 / (head_dim as f32).sqrt(),
            },
            embed_scale: gemma.then(|| (hidden as f32).sqrt()),
            sandwich_norms: gemma,
            act: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            final_softcap: m.f("final_logit_softcapping").ok().map(|v| v as f32),
            attn_softcap: m.f("attn_logit_softcapping").ok().map(|v| v as f32),
            moe: moe(&m, &t, layers)?,
            mla,
        }
        .check()
        .map_err(|e| g.error(e.to_string()))
    }
}

/// Sizes before anything is sized from them (a corrupt count must be an
/// error, not an allocation that aborts), the layer count against the
/// layers the file holds, and the hyperparameters that must be positive.
fn check_sizes(
    m: &Meta<'_>,
    layers: usize,
    hidden: usize,
    heads: usize,
    head_dim: usize,
    vocab: usize,
) -> Result<()> {
    use ferrum_formats::sizes::{self, *};
    let g = m.g;
    let opt = |k: &str| m.u(k).unwrap_or(0);
    sizes::check(&[
        ("block_count", layers, MAX_LAYERS),
        ("embedding_length", hidden, MAX_HIDDEN),
        ("attention.head_count", heads, MAX_HEADS),
        (
            "attention.head_count_kv",
            opt("attention.head_count_kv"),
            MAX_HEADS,
        ),
        ("attention.key_length", head_dim, MAX_HEAD_DIM),
        ("vocab_size", vocab, MAX_VOCAB),
        (
            "feed_forward_length",
            opt("feed_forward_length"),
            MAX_INTERMEDIATE,
        ),
        ("context_length", opt("context_length"), MAX_POSITIONS),
        ("expert_count", opt("expert_count"), MAX_EXPERTS),
        ("expert_used_count", opt("expert_used_count"), MAX_EXPERTS),
        (
            "attention.sliding_window",
            opt("attention.sliding_window"),
            MAX_POSITIONS,
        ),
    ])
    .map_err(|e| g.error(e))?;
    let last = format!("blk.{}.", layers.saturating_sub(1));
    if layers == 0 || !g.tensors().iter().any(|t| t.name.starts_with(&last)) {
        return Err(g.error(format!(
            "block_count {layers} is more layers than the file holds"
        )));
    }
    for (k, default) in [
        ("rope.freq_base", 10_000.0),
        ("attention.layer_norm_rms_epsilon", 1e-6),
    ] {
        let v = m.f(k).unwrap_or(default);
        sizes::positive(&m.key(k), v).map_err(|e| g.error(e))?;
    }
    Ok(())
}

/// The RoPE scaling a file states: `rope.scaling.type` (linear, YaRN),
/// Phi-3's short and long factor tensors (LongRoPE), or Llama 3's
/// `rope_freqs.weight` factors.
fn rope_scaling(m: &Meta<'_>, arch: Arch, head_dim: usize) -> Result<RopeScaling> {
    let g = m.g;
    let rotary = m.u("rope.dimension_count").unwrap_or(head_dim);
    let long_rope = (
        rope_factors(g, "rope_factors_short.weight", rotary)?,
        rope_factors(g, "rope_factors_long.weight", rotary)?,
    );
    let kind = g.get(&m.key("rope.scaling.type")).and_then(|v| v.as_str());
    Ok(match (kind, long_rope) {
        (Some("linear"), _) => RopeScaling::Linear {
            factor: m.f("rope.scaling.factor").unwrap_or(1.0) as f32,
        },
        (Some("yarn"), _) => yarn(m, arch)?,
        (_, (Some(short), Some(long))) => {
            let ctx = m.u("context_length").unwrap_or(4096);
            let orig = m.u("rope.scaling.original_context_length").unwrap_or(ctx);
            RopeScaling::LongRope {
                short,
                long,
                original_max_position: orig,
                attn_factor: m
                    .f("rope.scaling.attn_factor")
                    .map(|f| f as f32)
                    .unwrap_or_else(|_| long_rope_attn_factor(ctx as f64 / orig as f64, orig)),
            }
        }
        _ => match rope_factors(g, "rope_freqs.weight", head_dim)? {
            Some(f) => RopeScaling::Factors(f),
            None => RopeScaling::None,
        },
    })
}

/// Mixture-of-experts settings where the file has experts.
fn moe(m: &Meta<'_>, t: &Traits, layers: usize) -> Result<Option<MoeConfig>> {
    let g = m.g;
    let experts = m.u("expert_count").unwrap_or(0);
    if experts == 0 {
        return Ok(None);
    }
    let eim = m
        .u("expert_feed_forward_length")
        .or_else(|_| m.u("feed_forward_length"))?;
    Ok(Some(MoeConfig {
        experts,
        top_k: m.u("expert_used_count")?,
        intermediate: eim,
        // llama.cpp renormalises for Mixtral and Qwen3-MoE; its DeepSeek
        // files say so when they do.
        norm_top_k: g
            .get(&m.key("expert_weights_norm"))
            .and_then(|v| v.as_bool())
            .unwrap_or(!t.latent_attention),
        sparse: (0..layers)
            .map(|i| g.tensor(&format!("blk.{i}.ffn_gate_inp.weight")).is_some())
            .collect(),
        routed_scale: m.f("expert_weights_scale").unwrap_or(1.0) as f32,
        shared_intermediate: m
            .u("expert_shared_count")
            .ok()
            .filter(|&n| n > 0)
            .map(|n| n * eim),
        groups: match (m.u("expert_group_count"), m.u("expert_group_used_count")) {
            (Ok(g), Ok(k)) if g > 1 => Some((g, k)),
            _ => None,
        },
        // llama.cpp's `expert_gating_func`: 1 softmax, 2 sigmoid.
        scoring: match m.u("expert_gating_func").unwrap_or(1) {
            1 => Scoring::Softmax,
            2 => Scoring::Sigmoid,
            other => {
                return Err(g.error(format!(
                    "expert_gating_func {other} is not supported (1 softmax, 2 sigmoid)"
                )))
            }
        },
    }))
}

/// Latent-attention settings for the families that have it.
fn mla(m: &Meta<'_>, t: &Traits) -> Result<Option<MlaConfig>> {
    if !t.latent_attention {
        return Ok(None);
    }
    let rope = m.u("rope.dimension_count")?;
    let qk = m.u("attention.key_length_mla")?;
    if qk <= rope {
        return Err(m.g.error(format!(
            "key_length_mla {qk} leaves no room beside {rope} rope dims"
        )));
    }
    Ok(Some(MlaConfig {
        // Absent in DeepSeek-V2-Lite files (a plain `attn_q`).
        q_lora_rank: m.u("attention.q_lora_rank").ok().filter(|&r| r > 0),
        kv_lora_rank: m.u("attention.kv_lora_rank")?,
        nope: qk - rope,
        rope,
        v: m.u("attention.value_length_mla")?,
        rope_interleaved: true,
    }))
}

/// Per-pair RoPE frequency factors stored as a GGUF tensor, if the file
/// has `name`: `rotary / 2` positive f32 values (Llama 3.1+'s
/// `rope_freqs.weight`, Phi-3's `rope_factors_long/short.weight`).
fn rope_factors(g: &GgufFile, name: &str, rotary: usize) -> Result<Option<Vec<f32>>> {
    let Some(t) = g.tensor(name) else {
        return Ok(None);
    };
    if t.numel() != (rotary / 2) as u64 {
        return Err(g.error(format!(
            "{name} has {} values; {rotary} rotary dims need {}",
            t.numel(),
            rotary / 2
        )));
    }
    let mut f = vec![0f32; rotary / 2];
    ferrum_kernels::quant::dequantize(t.ty, g.tensor_data(t), &mut f)
        .map_err(|e| g.error(format!("{name}: {e}")))?;
    if let Some(v) = f.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
        return Err(g.error(format!("{name} holds {v}; its factors must be positive")));
    }
    Ok(Some(f))
}

/// YaRN from llama.cpp's `rope.scaling.*` keys, read as llama.cpp reads
/// them: cos/sin scaled by `0.1 ln factor + 1`, except in DeepSeek files
/// (`yarn_log_multiplier`, written as `0.1 · mscale_all_dim`), whose
/// converter assumes `mscale = mscale_all_dim`, so the two magnitude terms
/// cancel (the softmax scale takes them instead: [`softmax_scale`]).
/// An explicit `yarn_attn_factor` wins, as transformers' `attention_factor`
/// does; `attn_factor` multiplies the result, as in llama.cpp.
fn yarn(m: &Meta<'_>, arch: Arch) -> Result<RopeScaling> {
    let (g, name) = (m.g, m.arch);
    let key = |k: &str| format!("{name}.rope.scaling.{k}");
    let f = |k: &str| g.get_f64(&key(k)).ok();
    let factor = f("factor").unwrap_or(1.0);
    let ctx = g.get_u64(&format!("{name}.context_length")).unwrap_or(4096) as usize;
    let orig = g
        .get_u64(&key("original_context_length"))
        .map_or(ctx, |v| v as usize);
    if !(factor.is_finite() && factor > 0.0 && orig > 0) {
        return Err(g.error(format!(
            "yarn factor {factor} over {orig} positions is not valid"
        )));
    }
    let deepseek_log_mul = arch.traits().latent_attention && f("yarn_log_multiplier").is_some();
    let attn_factor = match f("yarn_attn_factor") {
        Some(a) => a,
        None if deepseek_log_mul => 1.0,
        None => yarn_mscale(factor, 1.0),
    } * f("attn_factor").unwrap_or(1.0);
    Ok(RopeScaling::Yarn {
        factor: factor as f32,
        original_max_position: orig,
        beta_fast: f("yarn_beta_fast").unwrap_or(32.0) as f32,
        beta_slow: f("yarn_beta_slow").unwrap_or(1.0) as f32,
        truncate: true,
        attn_factor: attn_factor as f32,
    })
}

/// DeepSeek's YaRN softmax multiplier `mscale(factor, mscale_all_dim)²`
/// from a GGUF file (`yarn_log_multiplier` holds `0.1 · mscale_all_dim`),
/// 1 without YaRN.
fn softmax_scale(m: &Meta<'_>) -> f32 {
    let (g, name) = (m.g, m.arch);
    let key = |k: &str| format!("{name}.rope.scaling.{k}");
    let yarn = g.get(&key("type")).and_then(|v| v.as_str()) == Some("yarn");
    match (yarn, g.get_f64(&key("yarn_log_multiplier"))) {
        (true, Ok(m)) => {
            let factor = g.get_f64(&key("factor")).unwrap_or(1.0);
            yarn_mscale(factor, m / 0.1).powi(2) as f32
        }
        _ => 1.0,
    }
}
