//! BERT weights from a safetensors checkpoint, with or without the `bert.`
//! prefix that `BertForMaskedLM`-style checkpoints put on every name.

use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::Backend;
use ferrum_types::{FerrumError, Result};

use super::config::BertConfig;

/// LayerNorm scale and shift.
pub struct Norm<B: Backend> {
    pub gamma: B::Buffer,
    pub beta: B::Buffer,
}

/// A biased linear layer, weight `[out, in]`.
pub struct Dense<B: Backend> {
    pub w: B::Buffer,
    pub b: B::Buffer,
}

pub struct LayerWeights<B: Backend> {
    /// Q, K and V stacked into one `[3·hidden, hidden]` projection so the
    /// three share a single GEMM.
    pub qkv: Dense<B>,
    pub attn_out: Dense<B>,
    pub attn_norm: Norm<B>,
    pub up: Dense<B>,
    pub down: Dense<B>,
    pub ffn_norm: Norm<B>,
}

pub struct Weights<B: Backend> {
    pub word: B::Buffer,
    pub position: B::Buffer,
    pub token_type: B::Buffer,
    pub emb_norm: Norm<B>,
    pub layers: Vec<LayerWeights<B>>,
    /// `tanh(W·h_CLS + b)`; absent in checkpoints saved without the pooler.
    pub pooler: Option<Dense<B>>,
}

struct Reader<'a> {
    st: &'a SafeTensors,
    prefix: &'static str,
}

impl Reader<'_> {
    fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let full = format!("{}{name}", self.prefix);
        let (v, s) = self.st.to_f32(&full)?;
        if s != shape {
            return Err(FerrumError::invalid(format!(
                "tensor {full} has shape {s:?}; the config implies {shape:?}"
            )));
        }
        Ok(v)
    }

    fn buf<B: Backend>(&self, name: &str, shape: &[usize]) -> Result<B::Buffer> {
        Ok(B::from_slice(&self.f32(name, shape)?))
    }

    fn norm<B: Backend>(&self, name: &str, dim: usize) -> Result<Norm<B>> {
        Ok(Norm {
            gamma: self.buf::<B>(&format!("{name}.weight"), &[dim])?,
            beta: self.buf::<B>(&format!("{name}.bias"), &[dim])?,
        })
    }

    fn dense<B: Backend>(&self, name: &str, out: usize, inp: usize) -> Result<Dense<B>> {
        Ok(Dense {
            w: self.buf::<B>(&format!("{name}.weight"), &[out, inp])?,
            b: self.buf::<B>(&format!("{name}.bias"), &[out])?,
        })
    }
}

impl<B: Backend> Weights<B> {
    pub fn load(st: &SafeTensors, c: &BertConfig) -> Result<Self> {
        let prefix = if st.contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let r = Reader { st, prefix };
        let h = c.hidden;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let p = format!("encoder.layer.{i}");
            let mut w = Vec::with_capacity(3 * h * h);
            let mut b = Vec::with_capacity(3 * h);
            for part in ["query", "key", "value"] {
                w.extend(r.f32(&format!("{p}.attention.self.{part}.weight"), &[h, h])?);
                b.extend(r.f32(&format!("{p}.attention.self.{part}.bias"), &[h])?);
            }
            layers.push(LayerWeights {
                qkv: Dense {
                    w: B::from_slice(&w),
                    b: B::from_slice(&b),
                },
                attn_out: r.dense(&format!("{p}.attention.output.dense"), h, h)?,
                attn_norm: r.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
                up: r.dense(&format!("{p}.intermediate.dense"), c.intermediate, h)?,
                down: r.dense(&format!("{p}.output.dense"), h, c.intermediate)?,
                ffn_norm: r.norm(&format!("{p}.output.LayerNorm"), h)?,
            });
        }
        let pooler = if st.contains(&format!("{prefix}pooler.dense.weight")) {
            Some(r.dense("pooler.dense", h, h)?)
        } else {
            None
        };
        Ok(Self {
            word: r.buf::<B>("embeddings.word_embeddings.weight", &[c.vocab, h])?,
            position: r.buf::<B>(
                "embeddings.position_embeddings.weight",
                &[c.max_positions, h],
            )?,
            token_type: r.buf::<B>(
                "embeddings.token_type_embeddings.weight",
                &[c.type_vocab, h],
            )?,
            emb_norm: r.norm("embeddings.LayerNorm", h)?,
            layers,
            pooler,
        })
    }
}
