//! The architecture description of a Llama-family model, read from a
//! Hugging Face `config.json` here and from GGUF metadata in
//! `gguf_config.rs`.

use ferrum_formats::hf_config::HfConfig;
use ferrum_types::{FerrumError, Result};

use super::arch::Arch;
use crate::rope::{yarn_softmax_scale, RopeSpec};

/// A mixture-of-experts MLP: a router picks `top_k` of `experts` gated
/// MLPs per token and mixes their outputs by its softmax weights.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub experts: usize,
    pub top_k: usize,
    /// Each expert's MLP width.
    pub intermediate: usize,
    /// Renormalise the chosen experts' weights to sum to 1 (Mixtral,
    /// Qwen3-MoE's `norm_topk_prob`).
    pub norm_top_k: bool,
    /// Per layer: is its MLP the mixture (else a dense MLP of the model's
    /// `intermediate` width)?
    pub sparse: Vec<bool>,
    /// The routed experts' weights are multiplied by this (DeepSeek's
    /// `routed_scaling_factor`; 1 elsewhere).
    pub routed_scale: f32,
    /// Width of an always-active shared expert added to the mixture
    /// (DeepSeek), if any.
    pub shared_intermediate: Option<usize>,
    /// Group-limited selection: experts in `(n_group, topk_group)` groups,
    /// chosen only from the best groups (DeepSeek V2 and V3).
    pub groups: Option<(usize, usize)>,
    pub scoring: Scoring,
}

/// How a router's logits become the experts' scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    /// Softmax over all experts (Mixtral, Qwen3-MoE, DeepSeek V2); groups
    /// are ranked by their best score.
    Softmax,
    /// Each logit's sigmoid, with a learned per-expert bias added for the
    /// choice only (DeepSeek V3's `noaux_tc`); groups are ranked by the sum
    /// of their two best biased scores.
    Sigmoid,
}

/// Multi-head latent attention (DeepSeek V2): queries through a low-rank
/// `q_lora_rank` bottleneck; keys and values from one `kv_lora_rank` latent
/// per token plus a `rope` key shared by all heads. The KV cache holds only
/// `kv_lora_rank + rope` values per token (see `mla.rs`).
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// `None`: queries by one full projection (DeepSeek-V2-Lite).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    /// The rope dims rotate in adjacent pairs `(2i, 2i + 1)` as DeepSeek's
    /// checkpoints (and every GGUF) store them; `false` (Hugging Face's
    /// `rope_interleave: false`): in halves `(i, i + rope/2)`.
    pub rope_interleaved: bool,
}

impl MoeConfig {
    fn check(&self) -> Result<()> {
        if self.experts == 0
            || self.top_k == 0
            || self.top_k > self.experts
            || self.intermediate == 0
        {
            return Err(bad(format!(
                "{} of {} experts of width {} is not a valid mixture",
                self.top_k, self.experts, self.intermediate
            )));
        }
        if let Some((g, k)) = self.groups {
            if g == 0 || !self.experts.is_multiple_of(g) || k == 0 || k > g {
                return Err(bad(format!(
                    "{} experts cannot be routed as the best {k} of {g} groups",
                    self.experts
                )));
            }
        }
        Ok(())
    }
}

/// Gated MLP activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
}

/// The MLP activation of an HF config: `hidden_act` (Gemma:
/// `hidden_activation`, which transformers reads there, default
/// `gelu_pytorch_tanh`). Activations without a kernel are refused, not run
/// as another.
fn hf_activation(c: &HfConfig, gemma: bool) -> Result<Activation> {
    let name = if gemma {
        c.hidden_activation
            .as_deref()
            .unwrap_or("gelu_pytorch_tanh")
    } else {
        c.hidden_act.as_deref().unwrap_or("silu")
    };
    match name {
        "silu" | "swish" => Ok(Activation::Silu),
        // transformers' three tanh approximations of GELU are one formula.
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Ok(Activation::GeluTanh),
        other => Err(bad(format!(
            "hidden_act {other:?} is not supported (silu, gelu_pytorch_tanh)"
        ))),
    }
}

/// Whether the attention projections (Q, K, V and the output) carry biases:
/// `attention_bias` where transformers' model reads it (Llama, Qwen3,
/// Qwen3-MoE, Gemma 2/3); Mistral, Mixtral and Phi-3 ignore it, as
/// transformers does; DeepSeek's biases (on its latent projections) are
/// refused.
fn attention_bias(c: &HfConfig, arch: Arch) -> Result<bool> {
    let on = c.attention_bias == Some(true);
    match arch {
        Arch::Llama | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma2 | Arch::Gemma3 => Ok(on),
        Arch::DeepseekV2 | Arch::DeepseekV3 if on => Err(bad(
            "attention_bias on DeepSeek's latent projections is not supported",
        )),
        _ => Ok(false),
    }
}

/// Whether gate, up and down carry biases: Llama's `mlp_bias`; DeepSeek
/// V2's (on every expert too) is refused; other families have none.
fn mlp_bias(c: &HfConfig, arch: Arch) -> Result<bool> {
    let on = c.mlp_bias == Some(true);
    match arch {
        Arch::Llama => Ok(on),
        Arch::DeepseekV2 if on => Err(bad("mlp_bias on DeepSeek V2 is not supported")),
        _ => Ok(false),
    }
}

/// `architectures` must name a class of the `model_type` family (a Falcon
/// config with `model_type: llama` is not a Llama).
fn check_architectures(c: &HfConfig, arch: Arch) -> Result<()> {
    let known: &[&str] = match arch {
        Arch::Llama => &["LlamaForCausalLM", "LlamaModel"],
        Arch::Mistral => &["MistralForCausalLM", "MistralModel"],
        Arch::Qwen2 => &["Qwen2ForCausalLM", "Qwen2Model"],
        Arch::Qwen3 => &["Qwen3ForCausalLM", "Qwen3Model"],
        Arch::Phi3 => &["Phi3ForCausalLM", "Phi3Model"],
        Arch::Qwen3Moe => &["Qwen3MoeForCausalLM", "Qwen3MoeModel"],
        Arch::Mixtral => &["MixtralForCausalLM", "MixtralModel"],
        Arch::Gemma2 => &["Gemma2ForCausalLM", "Gemma2Model"],
        Arch::Gemma3 => &["Gemma3ForCausalLM", "Gemma3TextModel", "Gemma3Model"],
        Arch::DeepseekV2 => &["DeepseekV2ForCausalLM", "DeepseekV2Model"],
        Arch::DeepseekV3 => &["DeepseekV3ForCausalLM", "DeepseekV3Model"],
    };
    match c
        .architectures
        .iter()
        .find(|a| !known.contains(&a.as_str()))
    {
        Some(other) => Err(bad(format!(
            "architectures names {other}, not a {} model (model_type {:?}); Ferrum runs {}",
            known[0].trim_end_matches("ForCausalLM"),
            c.model_type,
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

#[derive(Clone, Debug)]
pub struct LlamaConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that rotate (`head_dim` unless partial).
    pub rotary_dims: usize,
    pub vocab: usize,
    pub max_seq_len: usize,
    pub rms_eps: f32,
    /// RoPE of full-attention layers.
    pub rope: RopeSpec,
    /// RoPE of sliding-window layers, when it differs (Gemma 3).
    pub rope_local: Option<RopeSpec>,
    pub sliding_window: usize,
    /// Per layer: does it use the sliding window?
    pub sliding: Vec<bool>,
    pub qkv_bias: bool,
    /// A bias on the attention output projection (Llama, Qwen3 and Gemma
    /// with `attention_bias`).
    pub o_bias: bool,
    /// Biases on gate, up and down (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// The output head is the embedding table (`tie_word_embeddings`; a
    /// GGUF without `output.weight`). An untied HF checkpoint without
    /// `lm_head.weight` is an error, and a tied one's `lm_head.weight`, if
    /// any, is not read (transformers ties it to the embeddings).
    pub tied_head: bool,
    pub qk_norm: bool,
    /// Multiplier of `q·k` (usually `head_dim^-½`).
    pub attn_scale: f32,
    /// Embeddings are multiplied by this (Gemma: `√hidden`).
    pub embed_scale: Option<f32>,
    /// Extra norms after attention and after the MLP (Gemma 3).
    pub sandwich_norms: bool,
    pub act: Activation,
    pub final_softcap: Option<f32>,
    /// Attention logits soft-capped at this value (Gemma 2).
    pub attn_softcap: Option<f32>,
    pub moe: Option<MoeConfig>,
    /// Latent attention; `heads`/`head_dim`/`kv_heads` then describe its KV
    /// cache rows (1 "head" of `kv_lora_rank + rope`).
    pub mla: Option<MlaConfig>,
}

fn bad(what: impl Into<String>) -> FerrumError {
    FerrumError::invalid(what.into())
}

impl LlamaConfig {
    pub(super) fn check(self) -> Result<Self> {
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(bad(format!(
                "{} heads cannot be grouped over {} KV heads",
                self.heads, self.kv_heads
            )));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > 512 {
            return Err(bad(format!(
                "head_dim {} is not supported (even, at most 512)",
                self.head_dim
            )));
        }
        if self.rotary_dims == 0
            || self.rotary_dims > self.head_dim
            || !self.rotary_dims.is_multiple_of(2)
        {
            return Err(bad(format!(
                "{} rotary dimensions do not fit a head of {}",
                self.rotary_dims, self.head_dim
            )));
        }
        if self.hidden == 0 || self.vocab == 0 || self.layers == 0 || self.intermediate == 0 {
            return Err(bad(
                "hidden size, vocabulary, layer count and MLP width must be positive",
            ));
        }
        if let Some(m) = &self.moe {
            m.check()?;
        }
        Ok(self)
    }

    /// From a Hugging Face config; `model_type` selects the variant.
    pub fn from_hf(c: &HfConfig) -> Result<Self> {
        let arch = Arch::from_name(&c.model_type)?;
        check_architectures(c, arch)?;
        let head_dim = c.head_dim();
        let max_seq_len = c.max_position_embeddings.unwrap_or(4096);
        let rope_of = |t: Option<&str>| RopeSpec::from_hf(&c.rope(t), max_seq_len).map_err(bad);
        let t = arch.traits();
        let gemma = t.gemma;
        let sliding_window = if t.hf_window || c.use_sliding_window == Some(true) {
            c.sliding_window.unwrap_or(0)
        } else {
            0
        };
        let sliding = (0..c.num_hidden_layers)
            .map(|i| sliding_window > 0 && c.is_sliding_layer(i))
            .collect();
        let mut cfg = Self {
            arch,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            layers: c.num_hidden_layers,
            heads: c.num_attention_heads,
            kv_heads: c.num_kv_heads(),
            head_dim,
            rotary_dims: ((head_dim as f64 * c.rope(None).partial_rotary_factor) as usize)
                .min(head_dim),
            vocab: c.vocab_size,
            max_seq_len,
            rms_eps: c.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope: rope_of(t.local_rope.then_some("full_attention"))?,
            rope_local: if t.local_rope {
                Some(rope_of(Some("sliding_attention"))?)
            } else {
                None
            },
            sliding_window,
            sliding,
            qkv_bias: t.qkv_bias || attention_bias(c, arch)?,
            o_bias: attention_bias(c, arch)?,
            mlp_bias: mlp_bias(c, arch)?,
            // transformers' defaults: Gemma ties, the other families do not.
            tied_head: c.tie_word_embeddings.unwrap_or(gemma),
            qk_norm: t.qk_norm,
            attn_scale: match c.query_pre_attn_scalar {
                Some(s) if gemma => 1.0 / (s as f32).sqrt(),
                _ => 1.0 / (head_dim as f32).sqrt(),
            },
            embed_scale: gemma.then(|| (c.hidden_size as f32).sqrt()),
            sandwich_norms: gemma,
            act: hf_activation(c, gemma)?,
            final_softcap: c.final_logit_softcapping.map(|v| v as f32),
            attn_softcap: c.attn_logit_softcapping.map(|v| v as f32),
            moe: t.moe.map(|names| {
                let step = c.decoder_sparse_step.unwrap_or(1).max(1);
                let dense = c.first_k_dense_replace.unwrap_or(0);
                let eim = c.moe_intermediate_size.unwrap_or(c.intermediate_size);
                MoeConfig {
                    experts: c.num_experts.unwrap_or(0),
                    top_k: c.num_experts_per_tok.unwrap_or(0),
                    // Mixtral's experts have the model's MLP width.
                    intermediate: eim,
                    norm_top_k: names.always_renormalise || c.norm_topk_prob.unwrap_or(false),
                    sparse: (0..c.num_hidden_layers)
                        .map(|i| {
                            i >= dense && !c.mlp_only_layers.contains(&i) && (i + 1) % step == 0
                        })
                        .collect(),
                    routed_scale: c.routed_scaling_factor.unwrap_or(1.0) as f32,
                    shared_intermediate: c.n_shared_experts.filter(|&n| n > 0).map(|n| n * eim),
                    groups: match (c.topk_method.as_deref(), c.n_group, c.topk_group) {
                        (Some("group_limited_greedy" | "noaux_tc"), Some(g), Some(k)) => {
                            Some((g, k))
                        }
                        (None, Some(g), Some(k)) if t.sigmoid_router => Some((g, k)),
                        _ => None,
                    },
                    scoring: if t.sigmoid_router {
                        Scoring::Sigmoid
                    } else {
                        Scoring::Softmax
                    },
                }
            }),
            mla: None,
        };
        if t.latent_attention {
            cfg = cfg.with_latent_attention(c)?;
        }
        cfg.check()
    }

    /// DeepSeek V2's attention: the KV cache holds one row of
    /// `kv_lora_rank + rope` per token, which `heads`/`kv_heads`/`head_dim`
    /// then describe (one shared "head", as multi-query attention).
    fn with_latent_attention(mut self, c: &HfConfig) -> Result<Self> {
        let need = |v: Option<usize>, name: &str| {
            v.filter(|&x| x > 0)
                .ok_or_else(|| bad(format!("config.json needs a positive {name}")))
        };
        let sigmoid = self.arch.traits().sigmoid_router;
        let method = c.topk_method.as_deref();
        let known = match method {
            None => true,
            Some("greedy" | "group_limited_greedy") => !sigmoid,
            Some("noaux_tc") => sigmoid,
            Some(_) => false,
        };
        if !known {
            return Err(bad(format!(
                "expert selection {method:?} is not supported for {:?} (DeepSeek V2: greedy, \
                 group_limited_greedy; V3: noaux_tc)",
                self.arch
            )));
        }
        let mla = MlaConfig {
            q_lora_rank: c.q_lora_rank.filter(|&r| r > 0),
            kv_lora_rank: need(c.kv_lora_rank, "kv_lora_rank")?,
            nope: need(c.qk_nope_head_dim, "qk_nope_head_dim")?,
            rope: need(c.qk_rope_head_dim, "qk_rope_head_dim")?,
            v: need(c.v_head_dim, "v_head_dim")?,
            rope_interleaved: c.rope_interleave.unwrap_or(true),
        };
        if !mla.rope.is_multiple_of(2) {
            return Err(bad(format!("qk_rope_head_dim {} is odd", mla.rope)));
        }
        let max_pos = c.max_position_embeddings.unwrap_or(4096);
        self.attn_scale =
            yarn_softmax_scale(&c.rope(None), max_pos) / ((mla.nope + mla.rope) as f32).sqrt();
        self.kv_heads = 1;
        self.head_dim = mla.kv_lora_rank + mla.rope;
        self.rotary_dims = mla.rope;
        self.mla = Some(mla);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::rope::RopeScaling;

    /// The Hub's DeepSeek-V2-Lite and V3 `config.json` keys (older
    /// `rope_scaling` spelling, `q_lora_rank: null`, `noaux_tc`).
    #[test]
    fn deepseek_hub_configs_are_read() {
        const LITE: &str = r#"{"model_type": "deepseek_v2", "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 32,
                "max_position_embeddings": 163840, "rope_theta": 10000,
                "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                 "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
                "q_lora_rank": null, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                "v_head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 32, "n_shared_experts": 2, "first_k_dense_replace": 1,
                "topk_method": "greedy", "scoring_func": "softmax"}"#;
        // LITE with `over`'s keys replaced.
        let with = |over: &str| {
            let mut v: serde_json::Value = serde_json::from_str(LITE).unwrap();
            let o: serde_json::Value = serde_json::from_str(over).unwrap();
            for (k, x) in o.as_object().unwrap() {
                v[k] = x.clone();
            }
            HfConfig::parse(&v.to_string()).unwrap()
        };
        let cfg = LlamaConfig::from_hf(&with("{}")).unwrap();
        assert_eq!(cfg.mla.as_ref().unwrap().q_lora_rank, None);
        let RopeScaling::Yarn {
            factor,
            original_max_position,
            attn_factor,
            ..
        } = cfg.rope.scaling
        else {
            panic!("{:?}", cfg.rope.scaling);
        };
        // mscale == mscale_all_dim: cos/sin unscaled; the softmax scale
        // takes (0.0707 ln 40 + 1)^2 over sqrt(16 + 8).
        assert_eq!(
            (factor, original_max_position, attn_factor),
            (40.0, 4096, 1.0)
        );
        let m = 0.1 * 0.707 * 40f64.ln() + 1.0;
        assert!((cfg.attn_scale as f64 - m * m / 24f64.sqrt()).abs() < 1e-6);
        assert_eq!(cfg.moe.as_ref().unwrap().scoring, Scoring::Softmax);

        let v3 = with(
            r#"{"model_type": "deepseek_v3", "q_lora_rank": 32, "topk_method": "noaux_tc",
                "scoring_func": "sigmoid", "n_group": 4, "topk_group": 2, "norm_topk_prob": true,
                "routed_scaling_factor": 2.5}"#,
        );
        let moe = LlamaConfig::from_hf(&v3).unwrap().moe.unwrap();
        assert_eq!(
            (moe.scoring, moe.groups, moe.norm_top_k, moe.routed_scale),
            (Scoring::Sigmoid, Some((4, 2)), true, 2.5)
        );
        // V3's router under V2's name is refused, not run as V2's.
        let wrong = with(r#"{"topk_method": "noaux_tc"}"#);
        let e = LlamaConfig::from_hf(&wrong).unwrap_err().to_string();
        assert!(e.contains("noaux_tc"), "{e}");
    }

    #[test]
    fn phi3_long_rope_config_is_read() {
        let c = HfConfig::parse(
            r#"{"model_type": "phi3", "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 32,
                "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                "rope_scaling": {"type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1],
                                 "long_factor": [1, 2, 3, 4, 5, 6, 7, 8],
                                 "original_max_position_embeddings": 4096}}"#,
        )
        .unwrap();
        let cfg = LlamaConfig::from_hf(&c).unwrap();
        let RopeScaling::LongRope {
            long, original_max_position, attn_factor, ..
        } = &cfg.rope.scaling
        else {
            panic!("{:?}", cfg.rope.scaling);
        };
        assert_eq!((long[7], *original_max_position), (8.0, 4096));
        // sqrt(1 + ln(32) / ln(4096)) = sqrt(1 + 5/12).
        assert!((attn_factor - (17.0f32 / 12.0).sqrt()).abs() < 1e-6);
        let bad = HfConfig::parse(
            r#"{"model_type": "phi3", "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 32,
                "rope_scaling": {"type": "longrope", "short_factor": [1], "long_factor": []}}"#,
        )
        .unwrap();
        assert!(LlamaConfig::from_hf(&bad).is_err());
    }
}
