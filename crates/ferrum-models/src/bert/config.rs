//! BERT's architecture description, validated from `config.json`.

use ferrum_formats::hf_config::HfConfig;
use ferrum_types::{FerrumError, Result};

/// What the encoder needs to know about a BERT checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub type_vocab: usize,
    /// Learned absolute positions: the longest input the model accepts.
    pub max_positions: usize,
    pub eps: f32,
}

impl BertConfig {
    pub fn from_hf(c: &HfConfig) -> Result<Self> {
        if c.model_type != "bert" {
            return Err(FerrumError::unsupported(format!(
                "model_type {:?} is not a BERT encoder",
                c.model_type
            )));
        }
        if let Some(act) = c.hidden_act.as_deref() {
            if act != "gelu" {
                return Err(FerrumError::unsupported(format!(
                    "BERT hidden_act {act:?} (only the exact erf \"gelu\" is implemented)"
                )));
            }
        }
        let cfg = Self {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            layers: c.num_hidden_layers,
            intermediate: c.intermediate_size,
            vocab: c.vocab_size,
            type_vocab: c.type_vocab_size.unwrap_or(2),
            max_positions: c.max_position_embeddings.unwrap_or(512),
            eps: c.layer_norm_eps.unwrap_or(1e-12) as f32,
        };
        if cfg.heads == 0 || !cfg.hidden.is_multiple_of(cfg.heads) {
            return Err(FerrumError::invalid(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                cfg.hidden, cfg.heads
            )));
        }
        if cfg.hidden == 0 || cfg.layers == 0 || cfg.vocab == 0 || cfg.max_positions == 0 {
            return Err(FerrumError::invalid(
                "BERT config has a zero hidden_size, layer count, vocab or max_position_embeddings",
            ));
        }
        Ok(cfg)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}
