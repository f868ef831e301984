//! `ferrum inspect`'s account of a Llama-family configuration: every
//! setting that changes the maths, one `label: text` line each, so that a
//! setting read wrongly from a config shows.

use super::config::{Activation, LlamaConfig, MlaConfig, MoeConfig, Scoring};
use crate::rope::{RopeScaling, RopeSpec};

impl LlamaConfig {
    /// What sets this model apart: attention kind, RoPE scaling, sliding
    /// window, biases, norms, scales, softcaps, experts and routing.
    pub fn describe(&self) -> Vec<String> {
        let mut out = vec![self.attention_line()];
        let partial = if self.rotary_dims < self.head_dim {
            format!(", {} of {} dims rotate", self.rotary_dims, self.head_dim)
        } else {
            String::new()
        };
        out.push(format!(
            "rope:           {}{partial}",
            rope_text(&self.rope)
        ));
        if let Some(local) = &self.rope_local {
            out.push(format!("rope (sliding): {}", rope_text(local)));
        }
        out.extend(self.sliding_line());
        out.push(format!("maths:          {}", self.maths().join(", ")));
        out.extend(self.moe.as_ref().map(experts_line));
        out
    }

    fn attention_line(&self) -> String {
        match &self.mla {
            Some(m) => mla_line(m),
            None => format!(
                "attention:      {} heads / {} kv, head_dim {}",
                self.heads, self.kv_heads, self.head_dim
            ),
        }
    }

    /// Which layers slide, if any do.
    fn sliding_line(&self) -> Option<String> {
        let sliding: Vec<String> = (0..self.layers)
            .filter(|&i| self.sliding.get(i).copied().unwrap_or(false))
            .map(|i| i.to_string())
            .collect();
        if self.sliding_window == 0 || sliding.is_empty() {
            return None;
        }
        let which = if sliding.len() == self.layers {
            "every layer".to_string()
        } else {
            format!("layers {}", sliding.join(","))
        };
        Some(format!(
            "sliding window: {} on {which}",
            self.sliding_window
        ))
    }

    /// The MLP, biases, norms, scales and softcaps.
    fn maths(&self) -> Vec<String> {
        let act = match self.act {
            Activation::Silu => "SiLU-gated",
            Activation::GeluTanh => "GELU(tanh)-gated",
        };
        let mut maths = vec![format!("{act} MLP")];
        let biases: Vec<&str> = [
            (self.qkv_bias, "q/k/v"),
            (self.o_bias, "o"),
            (self.mlp_bias, "gate/up/down"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        if !biases.is_empty() {
            maths.push(format!("biases on {}", biases.join(", ")));
        }
        if self.qk_norm {
            maths.push("QK-norm".into());
        }
        if self.sandwich_norms {
            maths.push("sandwich norms".into());
        }
        maths.push(format!("attention scale {:.4}", self.attn_scale));
        maths.extend(self.attn_softcap.map(|c| format!("attention softcap {c}")));
        maths.extend(self.final_softcap.map(|c| format!("final softcap {c}")));
        maths.extend(self.embed_scale.map(|e| format!("embeddings x{e:.3}")));
        maths.push(if self.tied_head {
            "head tied to the embeddings".into()
        } else {
            "own head".into()
        });
        maths
    }
}

fn mla_line(m: &MlaConfig) -> String {
    format!(
        "attention:      latent (kv rank {} + {} rope dims cached per token{}{})",
        m.kv_lora_rank,
        m.rope,
        m.q_lora_rank
            .map_or(String::new(), |r| format!(", q rank {r}")),
        if m.rope_interleaved {
            ""
        } else {
            ", rope in halves"
        }
    )
}

fn rope_text(r: &RopeSpec) -> String {
    let how = match &r.scaling {
        RopeScaling::None => "plain".to_string(),
        RopeScaling::Linear { factor } => format!("linear x{factor}"),
        RopeScaling::Factors(_) => "per-pair factors (rope_freqs)".to_string(),
        RopeScaling::LongRope { original_max_position, attn_factor, .. } => format!(
            "LongRoPE (original {original_max_position}: long factors for caches past it; \
             cos/sin x{attn_factor:.4})"
        ),
        RopeScaling::Llama3 { factor, .. } => format!("llama3 x{factor}"),
        RopeScaling::Yarn {
            factor,
            original_max_position,
            attn_factor,
            ..
        } => {
            format!("YaRN x{factor} (original {original_max_position}, cos/sin x{attn_factor:.4})")
        }
    };
    format!("θ {}, {how}", r.theta)
}

fn experts_line(m: &MoeConfig) -> String {
    let router = match m.scoring {
        Scoring::Softmax => "softmax",
        Scoring::Sigmoid => "sigmoid + bias",
    };
    let groups = m
        .groups
        .map_or(String::new(), |(g, k)| format!(", best {k} of {g} groups"));
    let shared = m
        .shared_intermediate
        .map_or(String::new(), |w| format!(", shared expert width {w}"));
    format!(
        "experts:        {} of {} per token (width {}), {router} router{groups}{shared}",
        m.top_k, m.experts, m.intermediate
    )
}
