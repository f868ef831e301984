//! Shapes of well-known checkpoints, for benchmarking with random weights
//! where the real file is not at hand (`ferrum bench --random-weights`).

use crate::rope::RopeSpec;

use super::config::{Activation, Arch, LlamaConfig};

/// Names `preset` accepts.
pub const PRESETS: &[&str] = &["llama3-8b", "qwen2.5-7b", "qwen2.5-1.5b", "qwen2.5-0.5b"];

/// The architecture of a named model (its published `config.json`).
pub fn preset(name: &str) -> Option<LlamaConfig> {
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
        qk_norm: false,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        embed_scale: None,
        sandwich_norms: false,
        act: Activation::Silu,
        final_softcap: None,
        moe: None,
        attn_softcap: None,
        rotary_dims: head_dim,
    })
}
