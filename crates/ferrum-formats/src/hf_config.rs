//! Hugging Face `config.json` for the architectures Ferrum runs.
//!
//! Accepts both the transformers-5 layout (`rope_parameters`, per layer type
//! for Gemma 3) and the older top-level `rope_theta` / `rope_scaling` used by
//! most published checkpoints.

use std::path::Path;

use ferrum_types::{FerrumError, Result};
use serde::Deserialize;
use serde_json::Value;

use crate::hf_quant::HfQuant;

/// RoPE settings of one attention type.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    /// `default`, `linear`, `llama3`, `longrope` or `yarn`.
    pub rope_type: String,
    /// The scaling factor; absent means 1 (YaRN then derives it from the
    /// context lengths, as transformers does).
    pub factor: Option<f64>,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: Option<usize>,
    /// The fraction of each head's dimensions that rotate (Phi-3: 0.5...).
    pub partial_rotary_factor: f64,
    /// LongRoPE's per-pair frequency divisors (Phi-3 128K, Phi-3.5).
    pub short_factor: Vec<f64>,
    pub long_factor: Vec<f64>,
    /// YaRN: cos/sin multiplier when given (else derived from `factor`,
    /// `mscale` and `mscale_all_dim`).
    pub attention_factor: Option<f64>,
    /// YaRN's ramp bounds in rotations (transformers' defaults 32 and 1).
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// YaRN (DeepSeek): the magnitude terms of the cos/sin scale and, for
    /// `mscale_all_dim`, of the softmax scale.
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    /// YaRN: round the ramp's ends outward to whole dimensions (default).
    pub truncate: bool,
}

/// The fields of `config.json` Ferrum reads. Model code turns these into its
/// own validated architecture description.
#[derive(Clone, Debug, Deserialize)]
pub struct HfConfig {
    pub model_type: String,
    #[serde(default)]
    pub architectures: Vec<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    pub max_position_embeddings: Option<usize>,
    /// The pretraining context at the top level, where Phi-3's configs keep
    /// it (see [`Self::rope`]).
    pub original_max_position_embeddings: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub layer_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<Value>,
    pub rope_parameters: Option<Value>,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    /// Qwen2: with `use_sliding_window`, the layers from this one on slide.
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3 configs without `layer_types`: every this-many-th layer is
    /// global, the others slide.
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 3 configs without `rope_parameters`: the sliding layers' θ.
    pub rope_local_base_freq: Option<f64>,
    pub tie_word_embeddings: Option<bool>,
    pub query_pre_attn_scalar: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub hidden_act: Option<String>,
    pub hidden_activation: Option<String>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub partial_rotary_factor: Option<f64>,
    #[serde(alias = "num_local_experts", alias = "n_routed_experts")]
    pub num_experts: Option<usize>,
    /// DeepSeek: shared experts beside the routed ones, dense first layers,
    /// the routed weights' scale, and multi-head latent attention's ranks
    /// and head split.
    pub n_shared_experts: Option<usize>,
    pub first_k_dense_replace: Option<usize>,
    pub routed_scaling_factor: Option<f64>,
    pub topk_method: Option<String>,
    pub n_group: Option<usize>,
    pub topk_group: Option<usize>,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: Option<usize>,
    pub qk_nope_head_dim: Option<usize>,
    pub qk_rope_head_dim: Option<usize>,
    pub v_head_dim: Option<usize>,
    /// DeepSeek V3: whether the rope dims of q and k rotate in adjacent
    /// pairs (`true`, the default, as DeepSeek's checkpoints store them) or
    /// in halves.
    pub rope_interleave: Option<bool>,
    pub num_experts_per_tok: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    pub decoder_sparse_step: Option<usize>,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    pub type_vocab_size: Option<usize>,
    pub bos_token_id: Option<Value>,
    pub eos_token_id: Option<Value>,
    /// GPTQ / AWQ / FP8 / compressed-tensors checkpoints: see [`Self::quant`].
    pub quantization_config: Option<Value>,
}

fn rope_from(v: &Value, fallback_theta: f64) -> RopeParams {
    let f = |k: &str| v.get(k).and_then(Value::as_f64);
    let floats = |k: &str| -> Vec<f64> {
        v.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    RopeParams {
        theta: f("rope_theta").unwrap_or(fallback_theta),
        rope_type: v
            .get("rope_type")
            .or_else(|| v.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string(),
        factor: f("factor"),
        low_freq_factor: f("low_freq_factor").unwrap_or(1.0),
        high_freq_factor: f("high_freq_factor").unwrap_or(4.0),
        original_max_position_embeddings: v
            .get("original_max_position_embeddings")
            .and_then(Value::as_u64)
            .map(|x| x as usize),
        partial_rotary_factor: f("partial_rotary_factor").unwrap_or(1.0),
        short_factor: floats("short_factor"),
        long_factor: floats("long_factor"),
        attention_factor: f("attention_factor"),
        beta_fast: f("beta_fast").unwrap_or(32.0),
        beta_slow: f("beta_slow").unwrap_or(1.0),
        mscale: f("mscale"),
        mscale_all_dim: f("mscale_all_dim"),
        truncate: v.get("truncate").and_then(Value::as_bool).unwrap_or(true),
    }
}

/// Only the `model_type` of the `config.json` at `path`: enough to pick a
/// model family before that family reads the fields it needs.
pub fn read_model_type(path: impl AsRef<Path>) -> Result<String> {
    #[derive(Deserialize)]
    struct Kind {
        model_type: String,
    }
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| FerrumError::io(path, e))?;
    serde_json::from_str::<Kind>(&text)
        .map(|k| k.model_type)
        .map_err(|e| FerrumError::bad_file(path, format!("invalid config.json: {e}")))
}

impl HfConfig {
    /// Reads and parses `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| FerrumError::io(path, e))?;
        Self::parse(&text).map_err(|e| FerrumError::bad_file(path, e))
    }

    /// Parses config text; the error says which field is wrong.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let cfg: Self =
            serde_json::from_str(text).map_err(|e| format!("invalid config.json: {e}"))?;
        use crate::sizes::{self, *};
        sizes::check(&[
            ("num_hidden_layers", cfg.num_hidden_layers, MAX_LAYERS),
            ("hidden_size", cfg.hidden_size, MAX_HIDDEN),
            ("intermediate_size", cfg.intermediate_size, MAX_INTERMEDIATE),
            ("num_attention_heads", cfg.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", cfg.num_kv_heads(), MAX_HEADS),
            ("head_dim", cfg.head_dim.unwrap_or(0), MAX_HEAD_DIM),
            ("vocab_size", cfg.vocab_size, MAX_VOCAB),
            (
                "max_position_embeddings",
                cfg.max_position_embeddings.unwrap_or(0),
                MAX_POSITIONS,
            ),
            ("num_experts", cfg.num_experts.unwrap_or(0), MAX_EXPERTS),
            (
                "num_experts_per_tok",
                cfg.num_experts_per_tok.unwrap_or(0),
                MAX_EXPERTS,
            ),
            (
                "moe_intermediate_size",
                cfg.moe_intermediate_size.unwrap_or(0),
                MAX_INTERMEDIATE,
            ),
            ("kv_lora_rank", cfg.kv_lora_rank.unwrap_or(0), MAX_HIDDEN),
            ("q_lora_rank", cfg.q_lora_rank.unwrap_or(0), MAX_HIDDEN),
            (
                "sliding_window",
                cfg.sliding_window.unwrap_or(0),
                MAX_POSITIONS,
            ),
        ])?;
        for (name, v) in [
            ("rope_theta", cfg.rope_theta),
            ("rms_norm_eps", cfg.rms_norm_eps),
            ("layer_norm_eps", cfg.layer_norm_eps),
            ("rope_local_base_freq", cfg.rope_local_base_freq),
            ("partial_rotary_factor", cfg.partial_rotary_factor),
        ] {
            if let Some(v) = v {
                sizes::positive(name, v)?;
            }
        }
        if cfg.num_attention_heads == 0 || cfg.hidden_size == 0 || cfg.num_hidden_layers == 0 {
            return Err(
                "hidden_size, num_hidden_layers and num_attention_heads must be positive".into(),
            );
        }
        if cfg.head_dim.is_none() && !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not divisible by num_attention_heads {} and no head_dim is given",
                cfg.hidden_size, cfg.num_attention_heads
            ));
        }
        let kv = cfg.num_kv_heads();
        if kv == 0 || !cfg.num_attention_heads.is_multiple_of(kv) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {kv}",
                cfg.num_attention_heads
            ));
        }
        cfg.quant()?;
        if let Some(lt) = &cfg.layer_types {
            if lt.len() != cfg.num_hidden_layers {
                return Err(format!(
                    "layer_types has {} entries for {} layers",
                    lt.len(),
                    cfg.num_hidden_layers
                ));
            }
        }
        Ok(cfg)
    }

    /// The weights' quantization scheme, `None` for a plain checkpoint.
    pub fn quant(&self) -> std::result::Result<Option<HfQuant>, String> {
        match &self.quantization_config {
            None | Some(Value::Null) => Ok(None),
            Some(q) => HfQuant::from_section(q).map(Some),
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn is_phi3(&self) -> bool {
        self.model_type == "phi3"
    }

    fn is_gemma3(&self) -> bool {
        matches!(self.model_type.as_str(), "gemma3" | "gemma3_text")
    }

    /// RoPE parameters for layers of `layer_type` (e.g. `sliding_attention`);
    /// `None` for models with one setting. Follows transformers' reading of
    /// the older layouts: Gemma 3's sliding layers take `rope_local_base_freq`
    /// (default 1e4) and no scaling; Phi-3's top-level
    /// `original_max_position_embeddings` (default 4096) wins over the one
    /// in `rope_scaling`, and its `su` / `yarn` mean LongRoPE; elsewhere a
    /// top-level one fills in a missing one.
    pub fn rope(&self, layer_type: Option<&str>) -> RopeParams {
        let theta = self.rope_theta.unwrap_or(10_000.0);
        if let Some(p) = &self.rope_parameters {
            // Per-layer-type map (Gemma 3) or a single parameter object.
            if let Some(per_type) = layer_type.and_then(|t| p.get(t)) {
                return rope_from(per_type, theta);
            }
            if p.get("rope_theta").is_some() || p.get("rope_type").is_some() {
                return rope_from(p, theta);
            }
        }
        if layer_type == Some("sliding_attention") && self.is_gemma3() {
            let local = self.rope_local_base_freq.unwrap_or(10_000.0);
            return rope_from(&Value::Null, local);
        }
        let mut r = match &self.rope_scaling {
            Some(s) if s.is_object() => rope_from(s, theta),
            _ => rope_from(&Value::Null, theta),
        };
        // Older configs give the factor at the top level.
        if let Some(f) = self.partial_rotary_factor {
            r.partial_rotary_factor = f;
        }
        if self.is_phi3() {
            if matches!(r.rope_type.as_str(), "su" | "yarn") {
                r.rope_type = "longrope".into();
            }
            if r.rope_type == "longrope" {
                r.original_max_position_embeddings =
                    Some(self.original_max_position_embeddings.unwrap_or(4096));
            }
        } else if r.original_max_position_embeddings.is_none() {
            r.original_max_position_embeddings = self.original_max_position_embeddings;
        }
        r
    }

    /// Whether layer `i` uses sliding-window attention: `layer_types` when
    /// present (the authority), else transformers' default for the model
    /// type: Gemma 2 alternates (sliding first), Gemma 3 makes every
    /// `sliding_window_pattern`-th (default 6th) layer global, Qwen2 slides
    /// from `max_window_layers` (default 28) on, and the others slide on
    /// every layer when a window is set.
    pub fn is_sliding_layer(&self, i: usize) -> bool {
        if let Some(t) = &self.layer_types {
            return t.get(i).is_some_and(|s| s == "sliding_attention");
        }
        if self.sliding_window.is_none() || self.use_sliding_window == Some(false) {
            return false;
        }
        match self.model_type.as_str() {
            "gemma2" => i.is_multiple_of(2),
            "gemma3" | "gemma3_text" => {
                !(i + 1).is_multiple_of(self.sliding_window_pattern.unwrap_or(6).max(1))
            }
            "qwen2" | "qwen2_moe" => i >= self.max_window_layers.unwrap_or(28),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_and_new_rope_layouts() {
        let old = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
            "num_attention_heads":4,"vocab_size":10,"rope_theta":500000.0,
            "rope_scaling":{"rope_type":"llama3","factor":8.0,"original_max_position_embeddings":8192}}"#;
        let c = HfConfig::parse(old).unwrap();
        let r = c.rope(None);
        assert_eq!(
            (r.theta, r.rope_type.as_str(), r.factor),
            (500000.0, "llama3", Some(8.0))
        );
        assert_eq!(r.original_max_position_embeddings, Some(8192));
        assert_eq!((c.head_dim(), c.num_kv_heads()), (16, 4));

        let new = r#"{"model_type":"gemma3_text","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,"vocab_size":10,
            "layer_types":["sliding_attention","full_attention"],"sliding_window":8,
            "rope_parameters":{"full_attention":{"rope_theta":1e6},"sliding_attention":{"rope_theta":1e4}}}"#;
        let c = HfConfig::parse(new).unwrap();
        assert_eq!(c.rope(Some("full_attention")).theta, 1e6);
        assert_eq!(c.rope(Some("sliding_attention")).theta, 1e4);
        assert!(c.is_sliding_layer(0) && !c.is_sliding_layer(1));
    }

    /// transformers' readings of configs without `layer_types` or
    /// `rope_parameters`, as the Hub's checkpoints write them.
    #[test]
    fn older_layouts_read_as_transformers_reads_them() {
        let base = r#""hidden_size":64,"intermediate_size":128,"num_hidden_layers":12,
            "num_attention_heads":4,"vocab_size":10,"sliding_window":8"#;
        let c = |extra: &str| HfConfig::parse(&format!("{{{base},{extra}}}")).unwrap();
        let slides = |c: &HfConfig| (0..12).map(|i| c.is_sliding_layer(i)).collect::<Vec<_>>();
        // Gemma 2 alternates, sliding first.
        let g2 = c(r#""model_type":"gemma2""#);
        assert_eq!(slides(&g2), (0..12).map(|i| i % 2 == 0).collect::<Vec<_>>());
        // Gemma 3: every 6th layer (by default) is global.
        let g3 = c(
            r#""model_type":"gemma3_text","rope_theta":1e6,"rope_local_base_freq":1e4,
            "rope_scaling":{"rope_type":"linear","factor":8.0}"#,
        );
        assert_eq!(
            slides(&g3),
            (0..12).map(|i| (i + 1) % 6 != 0).collect::<Vec<_>>()
        );
        let g3p = c(r#""model_type":"gemma3_text","sliding_window_pattern":3"#);
        assert!(!g3p.is_sliding_layer(2) && g3p.is_sliding_layer(3));
        // ... and its sliding layers take the local base, unscaled.
        let local = g3.rope(Some("sliding_attention"));
        assert_eq!((local.theta, local.rope_type.as_str()), (1e4, "default"));
        let global = g3.rope(Some("full_attention"));
        assert_eq!((global.theta, global.rope_type.as_str()), (1e6, "linear"));
        // Qwen2 slides from max_window_layers on, and only when told to.
        let q2 = c(r#""model_type":"qwen2","use_sliding_window":true,"max_window_layers":4"#);
        assert_eq!(slides(&q2), (0..12).map(|i| i >= 4).collect::<Vec<_>>());
        assert!(!c(r#""model_type":"qwen2","use_sliding_window":false"#).is_sliding_layer(5));
        // Phi-3's pretraining length at the top level wins, and "su" is
        // LongRoPE; elsewhere a top-level one fills a gap.
        let phi = c(
            r#""model_type":"phi3","original_max_position_embeddings":32,
            "rope_scaling":{"type":"su","short_factor":[1.0],"long_factor":[2.0],
            "original_max_position_embeddings":256}"#,
        );
        let r = phi.rope(None);
        assert_eq!(
            (r.rope_type.as_str(), r.original_max_position_embeddings),
            ("longrope", Some(32))
        );
        let llama = c(
            r#""model_type":"llama","original_max_position_embeddings":64,
            "rope_scaling":{"rope_type":"llama3","factor":8.0}"#,
        );
        assert_eq!(llama.rope(None).original_max_position_embeddings, Some(64));
    }

    /// Sizes and hyperparameters from the file are checked before anything
    /// is sized from them: four billion layers used to abort the process
    /// ("memory allocation of 6012954213000 bytes failed").
    #[test]
    fn impossible_sizes_and_hyperparameters_are_named() {
        let base = r#""model_type":"llama","hidden_size":64,"intermediate_size":128,
            "num_attention_heads":4"#;
        let err = |extra: &str| HfConfig::parse(&format!("{{{base},{extra}}}")).unwrap_err();
        let e = err(r#""num_hidden_layers":4294967295,"vocab_size":10"#);
        assert!(e.contains("num_hidden_layers 4294967295"), "{e}");
        let e = err(r#""num_hidden_layers":2,"vocab_size":999999999"#);
        assert!(e.contains("vocab_size 999999999"), "{e}");
        let e = err(r#""num_hidden_layers":2,"vocab_size":10,"rope_theta":-1.0"#);
        assert!(e.contains("rope_theta -1"), "{e}");
        let e = err(r#""num_hidden_layers":2,"vocab_size":10,"rms_norm_eps":0.0"#);
        assert!(e.contains("rms_norm_eps 0"), "{e}");
    }

    #[test]
    fn inconsistent_configs_are_rejected() {
        let bad = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":3,"vocab_size":10}"#;
        assert!(HfConfig::parse(bad)
            .unwrap_err()
            .contains("num_key_value_heads"));
        assert!(HfConfig::parse("{").is_err());
        assert!(HfConfig::parse(r#"{"model_type":"llama"}"#)
            .unwrap_err()
            .contains("hidden_size"));
    }
}
