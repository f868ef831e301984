//! The Llama-shaped architectures, each declared once: its names in GGUF
//! files and `config.json`, and the traits that set it apart from plain
//! Llama over the shared blocks (attention with RoPE, gated MLP or mixture
//! of experts, RMSNorms). `config.rs` and `weights.rs` read these traits;
//! they never match on an architecture themselves.
//!
//! A new family of this shape is a variant here, its row in [`Arch::traits`]
//! and its names in [`NAMES`], plus a fixture test. A trait that no row has
//! yet (a new attention or norm variant) is a field here and the code that
//! honours it.

use ferrum_types::{FerrumError, Result};

/// The decoder-only architectures of the Llama shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Phi3,
    Qwen3Moe,
    Mixtral,
    Gemma2,
    Gemma3,
    /// Multi-head latent attention and a mixture with a shared expert.
    DeepseekV2,
    /// DeepSeek V2's blocks with the sigmoid `noaux_tc` router. GGUF files
    /// of both say `deepseek2` (and their router in `expert_gating_func`).
    DeepseekV3,
}

/// Architecture names as GGUF (`general.architecture`) and Hugging Face
/// (`model_type`) spell them.
pub const NAMES: &[(&str, Arch)] = &[
    ("llama", Arch::Llama),
    ("mistral", Arch::Mistral),
    ("qwen2", Arch::Qwen2),
    ("qwen3", Arch::Qwen3),
    ("phi3", Arch::Phi3),
    ("qwen3_moe", Arch::Qwen3Moe),
    ("qwen3moe", Arch::Qwen3Moe),
    ("mixtral", Arch::Mixtral),
    ("gemma2", Arch::Gemma2),
    ("gemma3", Arch::Gemma3),
    ("gemma3_text", Arch::Gemma3),
    ("deepseek_v2", Arch::DeepseekV2),
    ("deepseek2", Arch::DeepseekV2),
    ("deepseek_v3", Arch::DeepseekV3),
];

/// Which layers use the sliding window in a GGUF file (which records only
/// the window's size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufWindows {
    /// None (a window is ignored).
    None,
    /// Every layer.
    All,
    /// All but every `n`-th layer, which attends globally (llama.cpp's
    /// patterns: Gemma 3 `n = 6`, Gemma 2 `n = 2`).
    AllButEvery(usize),
}

/// Hugging Face tensor names of a mixture-of-experts layer:
/// `model.layers.{i}.{block}.gate.weight` for the router and
/// `model.layers.{i}.{block}.experts.{e}.{proj}.weight` for the experts'
/// gate, up and down projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeNames {
    pub block: &'static str,
    pub gate_up_down: [&'static str; 3],
    /// The chosen experts' weights are always renormalised (else per
    /// `norm_topk_prob`).
    pub always_renormalise: bool,
}

/// What sets an architecture apart from plain Llama.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Traits {
    /// `config.json`'s `sliding_window` applies (elsewhere only with
    /// `use_sliding_window`).
    pub hf_window: bool,
    pub gguf_windows: GgufWindows,
    /// Biases on Q, K and V (elsewhere per `attention_bias`).
    pub qkv_bias: bool,
    /// RMSNorm of each head of Q and K before RoPE.
    pub qk_norm: bool,
    /// Gemma's traits: `√hidden` embedding scale, sandwich norms around
    /// attention and MLP, GeGLU, `query_pre_attn_scalar`, and norms stored
    /// as `w` meaning `1 + w` in Hugging Face files.
    pub gemma: bool,
    /// Sliding layers have their own RoPE (`rope_parameters`'
    /// `sliding_attention`; in GGUF llama.cpp's fixed base 10 000).
    pub local_rope: bool,
    /// `qkv_proj` and `gate_up_proj` come fused in one tensor each.
    pub fused_projections: bool,
    /// GGUF Q/K rows are permuted for ggml's interleaved RoPE.
    pub gguf_permuted_qk: bool,
    pub moe: Option<MoeNames>,
    /// Attention through a compressed latent KV (DeepSeek V2); see `mla.rs`.
    pub latent_attention: bool,
    /// `config.json`'s router is DeepSeek V3's (sigmoid scores with a
    /// selection bias, `noaux_tc`); see `config::Scoring`.
    pub sigmoid_router: bool,
}

const LLAMA: Traits = Traits {
    hf_window: false,
    gguf_windows: GgufWindows::None,
    qkv_bias: false,
    qk_norm: false,
    gemma: false,
    local_rope: false,
    fused_projections: false,
    gguf_permuted_qk: false,
    moe: None,
    latent_attention: false,
    sigmoid_router: false,
};

const DEEPSEEK: Traits = Traits {
    moe: Some(MoeNames {
        block: "mlp",
        gate_up_down: ["gate_proj", "up_proj", "down_proj"],
        always_renormalise: false,
    }),
    latent_attention: true,
    ..LLAMA
};

impl Arch {
    /// The variant named `name` (GGUF's or Hugging Face's spelling). The
    /// registry names what another family's name is instead; a name that
    /// reaches here unchecked gets this plainer error.
    pub fn from_name(name: &str) -> Result<Arch> {
        NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, a)| a)
            .ok_or_else(|| {
                FerrumError::unsupported(format!(
                    "architecture '{name}' is not supported by the Llama-family loader"
                ))
            })
    }

    pub fn traits(self) -> Traits {
        match self {
            Arch::Llama => Traits { gguf_permuted_qk: true, ..LLAMA },
            Arch::Mistral => Traits {
                hf_window: true,
                gguf_windows: GgufWindows::All,
                ..LLAMA
            },
            Arch::Qwen2 => Traits { qkv_bias: true, ..LLAMA },
            Arch::Qwen3 => Traits { qk_norm: true, ..LLAMA },
            Arch::Phi3 => Traits {
                hf_window: true,
                gguf_windows: GgufWindows::All,
                fused_projections: true,
                ..LLAMA
            },
            Arch::Qwen3Moe => Traits {
                qk_norm: true,
                moe: Some(MoeNames {
                    block: "mlp",
                    gate_up_down: ["gate_proj", "up_proj", "down_proj"],
                    always_renormalise: false,
                }),
                ..LLAMA
            },
            Arch::Mixtral => Traits {
                hf_window: true,
                moe: Some(MoeNames {
                    block: "block_sparse_moe",
                    gate_up_down: ["w1", "w3", "w2"],
                    always_renormalise: true,
                }),
                ..LLAMA
            },
            Arch::Gemma2 => Traits {
                hf_window: true,
                gguf_windows: GgufWindows::AllButEvery(2),
                gemma: true,
                ..LLAMA
            },
            Arch::DeepseekV2 => DEEPSEEK,
            Arch::DeepseekV3 => Traits { sigmoid_router: true, ..DEEPSEEK },
            Arch::Gemma3 => Traits {
                hf_window: true,
                gguf_windows: GgufWindows::AllButEvery(6),
                qk_norm: true,
                gemma: true,
                local_rope: true,
                ..LLAMA
            },
        }
    }
}

impl GgufWindows {
    /// Whether layer `i` slides.
    pub fn slides(self, i: usize) -> bool {
        match self {
            GgufWindows::None => false,
            GgufWindows::All => true,
            GgufWindows::AllButEvery(n) => !(i + 1).is_multiple_of(n),
        }
    }
}
