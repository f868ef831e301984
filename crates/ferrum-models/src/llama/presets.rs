//! Shapes of well-known checkpoints, for benchmarking with random weights
//! where the real file is not at hand (`ferrum bench --random-weights`).

use crate::rope::RopeSpec;

use super::arch::Arch;
use super::config::{Activation, LlamaConfig, MoeConfig, Scoring};

/// Names `preset` accepts.
pub const PRESETS: &[&str] = &[
    "llama3-8b",
    "qwen2.5-7b",
    "qwen2.5-1.5b",
    "qwen2.5-0.5b",
    "qwen3-30b-a3b",
];

/// The architecture of a named model (its published `config.json`).
pub fn preset(name: &str) -> Option<LlamaConfig> {
    if name == "qwen3-30b-a3b" {
        return Some(qwen3_30b_a3b());
    }
    // (arch, hidden, intermediate, layers, heads, kv heads, vocab, theta, max positions)
    let (arch, hidden, intermediate, layers, heads, kv_heads, vocab, theta, max) = match name {
        "llama3-8b" => (
            Arch::Llama,
            4096,
            14336,
            32,
            32,
            8,
            128_256,
            500_000.0,
            8192,
        ),
        "qwen2.5-7b" => (Arch::Qwen2, 3584, 18944, 28, 28, 4, 152_064, 1e6, 32768),
        "qwen2.5-1.5b" => (Arch::Qwen2, 1536, 8960, 28, 12, 2, 151_936, 1e6, 32768),
        "qwen2.5-0.5b" => (Arch::Qwen2, 896, 4864, 24, 14, 2, 151_936, 1e6, 32768),
        _ => return None,
    };
    let head_dim = hidden / heads;
    Some(LlamaConfig {
        arch,
        hidden,
        intermediate,
        layers,
        heads,
        kv_heads,
        head_dim,
        vocab,
        max_seq_len: max,
        rms_eps: 1e-6,
        rope: RopeSpec::plain(theta),
        rope_local: None,
        sliding_window: 0,
        sliding: vec![false; layers],
        qkv_bias: arch == Arch::Qwen2,
        o_bias: false,
        mlp_bias: false,
        tied_head: false,
        qk_norm: false,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        embed_scale: None,
        sandwich_norms: false,
        act: Activation::Silu,
        final_softcap: None,
        moe: None,
        mla: None,
        attn_softcap: None,
        rotary_dims: head_dim,
    })
}

/// Qwen3-30B-A3B: 48 layers, 128 experts of width 768 with 8 active per
/// token, head_dim 128 over a 2048-wide stream (32 query heads, 4 KV).
fn qwen3_30b_a3b() -> LlamaConfig {
    let (layers, head_dim) = (48, 128);
    LlamaConfig {
        arch: Arch::Qwen3Moe,
        hidden: 2048,
        intermediate: 6144,
        layers,
        heads: 32,
        kv_heads: 4,
        head_dim,
        rotary_dims: head_dim,
        vocab: 151_936,
        max_seq_len: 40_960,
        rms_eps: 1e-6,
        rope: RopeSpec::plain(1e6),
        rope_local: None,
        sliding_window: 0,
        sliding: vec![false; layers],
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        tied_head: false,
        qk_norm: true,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        embed_scale: None,
        sandwich_norms: false,
        act: Activation::Silu,
        final_softcap: None,
        attn_softcap: None,
        moe: Some(MoeConfig {
            experts: 128,
            top_k: 8,
            intermediate: 768,
            norm_top_k: true,
            sparse: vec![true; layers],
            routed_scale: 1.0,
            shared_intermediate: None,
            groups: None,
            scoring: Scoring::Softmax,
        }),
        mla: None,
    }
}
