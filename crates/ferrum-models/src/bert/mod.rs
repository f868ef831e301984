//! BERT encoder (embedding models such as all-MiniLM-L6-v2).
//!
//! A batch is packed without padding: every sequence's tokens sit back to
//! back, the projections run as one GEMM over all of them, and attention
//! runs per sequence over its own tokens. That is exactly what an attention
//! mask over a padded batch computes, without spending work on pad rows.

mod config;
mod pooling;
mod weights;

use std::path::Path;

use ferrum_formats::hf_config::HfConfig;
use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::{AttnConfig, Backend, Gemm, Heads, Mat, QkOp, Span};
use ferrum_types::{FerrumError, Result};

pub use config::BertConfig;
pub use pooling::{l2_normalize, Pooling};
use weights::{Dense, Norm, Weights};

pub use crate::encoder::EncoderInput;

pub struct BertModel<B: Backend> {
    cfg: BertConfig,
    w: Weights<B>,
}

impl<B: Backend> crate::encoder::Encoder for BertModel<B> {
    fn hidden(&self) -> usize {
        self.cfg.hidden
    }

    fn max_positions(&self) -> usize {
        self.cfg.max_positions
    }

    fn encode(&self, inputs: &[EncoderInput]) -> Result<Vec<Vec<f32>>> {
        self.forward(inputs)
    }
}

impl<B: Backend> BertModel<B> {
    /// Loads a Hugging Face folder (`config.json` + safetensors).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let hf = HfConfig::load(dir.join("config.json"))?;
        let cfg = BertConfig::from_hf(&hf)?;
        let st = SafeTensors::open_dir(dir)?;
        let w = Weights::load(&st, &cfg).map_err(|e| FerrumError::bad_file(dir, e.to_string()))?;
        Ok(Self { cfg, w })
    }

    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    pub fn has_pooler(&self) -> bool {
        self.w.pooler.is_some()
    }

    fn validate(&self, inputs: &[EncoderInput]) -> Result<()> {
        let c = &self.cfg;
        for (i, s) in inputs.iter().enumerate() {
            if s.ids.is_empty() {
                return Err(FerrumError::invalid(format!("input {i} has no tokens")));
            }
            if s.ids.len() > c.max_positions {
                return Err(FerrumError::ContextOverflow {
                    needed: s.ids.len(),
                    capacity: c.max_positions,
                });
            }
            if let Some(&bad) = s.ids.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(FerrumError::invalid(format!(
                    "token id {bad} in input {i} is outside the vocabulary of {}",
                    c.vocab
                )));
            }
            if let Some(t) = s.type_ids {
                if t.len() != s.ids.len() {
                    return Err(FerrumError::invalid(format!(
                        "input {i} has {} token type ids for {} tokens",
                        t.len(),
                        s.ids.len()
                    )));
                }
                if let Some(&bad) = t.iter().find(|&&t| t as usize >= c.type_vocab) {
                    return Err(FerrumError::invalid(format!(
                        "token type id {bad} in input {i} is outside 0..{}",
                        c.type_vocab
                    )));
                }
            }
        }
        Ok(())
    }

    /// The last hidden state of every input, `[len_i, hidden]` row-major.
    pub fn forward(&self, inputs: &[EncoderInput]) -> Result<Vec<Vec<f32>>> {
        self.validate(inputs)?;
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let c = &self.cfg;
        let (h, im) = (c.hidden, c.intermediate);
        let rows: usize = inputs.iter().map(|s| s.ids.len()).sum();
        let longest = inputs.iter().map(|s| s.ids.len()).max().unwrap_or(0);
        let ctx = &mut B::new_context();

        let mut x = B::alloc(rows * h);
        let mut tmp = B::alloc(rows * h);
        self.embed(ctx, inputs, &mut x, &mut tmp);
        let mut qkv = B::alloc(rows * 3 * h);
        let (mut q, mut k, mut v) = (B::alloc(rows * h), B::alloc(rows * h), B::alloc(rows * h));
        let mut attn = B::alloc(rows * h);
        let mut up = B::alloc(rows * im);
        let mut act = B::alloc(rows * im);
        let mut seq = [(); 7].map(|_| B::alloc(longest * h));
        for lw in &self.w.layers {
            dense::<B>(ctx, &x, &lw.qkv, &mut qkv, rows, 3 * h, h);
            B::split_qkv(ctx, &qkv, [&mut q, &mut k, &mut v], rows, h, h);
            self.attend_each(ctx, inputs, [&q, &k, &v], &mut attn, &mut seq);
            // Post-LN residual blocks: x = LN(x + Attn(x)); x = LN(x + FFN(x)).
            dense::<B>(ctx, &attn, &lw.attn_out, &mut tmp, rows, h, h);
            B::add_inplace(ctx, &mut tmp, &x, rows * h);
            layer_norm::<B>(ctx, &tmp, &lw.attn_norm, c.eps, &mut x, rows, h);
            dense::<B>(ctx, &x, &lw.up, &mut up, rows, im, h);
            B::gelu(ctx, &up, &mut act, rows * im);
            dense::<B>(ctx, &act, &lw.down, &mut tmp, rows, h, im);
            B::add_inplace(ctx, &mut tmp, &x, rows * h);
            layer_norm::<B>(ctx, &tmp, &lw.ffn_norm, c.eps, &mut x, rows, h);
        }
        B::sync(ctx);
        B::take_error(ctx)?;
        let all = B::to_vec(&x, rows * h);
        let mut out = Vec::with_capacity(inputs.len());
        let mut r0 = 0;
        for s in inputs {
            let n = s.ids.len();
            out.push(all[r0 * h..(r0 + n) * h].to_vec());
            r0 += n;
        }
        Ok(out)
    }

    /// Word + position + token-type embeddings of every input's rows,
    /// LayerNormed, into `x` (`tmp`: scratch of the same size).
    fn embed(
        &self,
        ctx: &mut B::Context,
        inputs: &[EncoderInput],
        x: &mut B::Buffer,
        tmp: &mut B::Buffer,
    ) {
        let h = self.cfg.hidden;
        let rows: usize = inputs.iter().map(|s| s.ids.len()).sum();
        let ids: Vec<u32> = inputs.iter().flat_map(|s| s.ids.iter().copied()).collect();
        let positions: Vec<u32> = inputs.iter().flat_map(|s| 0..s.ids.len() as u32).collect();
        let types: Vec<u32> = inputs
            .iter()
            .flat_map(|s| match s.type_ids {
                Some(t) => t.to_vec(),
                None => vec![0; s.ids.len()],
            })
            .collect();
        B::embedding_lookup(ctx, &self.w.word, &ids, tmp, h);
        B::embedding_lookup(ctx, &self.w.position, &positions, x, h);
        B::add_inplace(ctx, tmp, x, rows * h);
        B::embedding_lookup(ctx, &self.w.token_type, &types, x, h);
        B::add_inplace(ctx, tmp, x, rows * h);
        layer_norm::<B>(ctx, tmp, &self.w.emb_norm, self.cfg.eps, x, rows, h);
    }

    /// Bidirectional attention of each input over its own rows of the
    /// token-major `q`, `k`, `v`, written token-major into `attn`. `seq`:
    /// seven scratch buffers of the longest input's rows.
    fn attend_each(
        &self,
        ctx: &mut B::Context,
        inputs: &[EncoderInput],
        [q, k, v]: [&B::Buffer; 3],
        attn: &mut B::Buffer,
        seq: &mut [B::Buffer; 7],
    ) {
        let c = &self.cfg;
        let (h, nh, hd) = (c.hidden, c.heads, c.head_dim());
        let acfg = AttnConfig {
            num_heads: nh,
            num_kv_heads: nh,
            head_dim: hd,
            causal: false,
            scale: 1.0 / (hd as f32).sqrt(),
            kv_seq_stride: 0,
            sliding_window: 0,
            softcap: 0.0,
        };
        let [sq, sk, sv, hq, hk, hv, ho] = seq;
        let mut r0 = 0;
        for s in inputs {
            let n = s.ids.len();
            B::copy_slice(ctx, q, r0 * h, sq, 0, n * h);
            B::copy_slice(ctx, k, r0 * h, sk, 0, n * h);
            B::copy_slice(ctx, v, r0 * h, sv, 0, n * h);
            // Token-major -> head-major: no norm, no RoPE.
            let heads = Heads { tokens: n, heads: nh, head_dim: hd };
            B::qk_norm_rope(ctx, sq, QkOp::Transpose, hq, heads, 0);
            B::qk_norm_rope(ctx, sk, QkOp::Transpose, hk, heads, 0);
            B::qk_norm_rope(ctx, sv, QkOp::Transpose, hv, heads, 0);
            let span = Span { q_len: n, kv_len: n, pos_offset: 0 };
            B::flash_attention(ctx, hq, [hk, hv], ho, 1, span, &acfg);
            B::transpose_head_to_token(ctx, ho, sq, heads);
            B::copy_slice(ctx, sq, 0, attn, r0 * h, n * h);
            r0 += n;
        }
    }

    /// BERT's pooler, `tanh(W·h_CLS + b)`, for checkpoints that carry one.
    pub fn pool_cls(&self, cls_hidden: &[f32]) -> Result<Vec<f32>> {
        let h = self.cfg.hidden;
        let Some(p) = &self.w.pooler else {
            return Err(FerrumError::unsupported(
                "this checkpoint has no pooler weights (pooler.dense)",
            ));
        };
        if cls_hidden.len() != h {
            return Err(FerrumError::invalid(format!(
                "pooler input has {} values; hidden size is {h}",
                cls_hidden.len()
            )));
        }
        let ctx = &mut B::new_context();
        let a = B::from_slice(cls_hidden);
        let mut out = B::alloc(h);
        dense::<B>(ctx, &a, p, &mut out, 1, h, h);
        B::sync(ctx);
        B::take_error(ctx)?;
        Ok(B::to_vec(&out, h).into_iter().map(f32::tanh).collect())
    }
}

fn dense<B: Backend>(
    ctx: &mut B::Context,
    a: &B::Buffer,
    d: &Dense<B>,
    out: &mut B::Buffer,
    m: usize,
    n: usize,
    k: usize,
) {
    B::gemm(ctx, a, &d.w, out, Gemm { m, n, k });
    B::add_bias(ctx, out, &d.b, Mat { rows: m, cols: n });
}

fn layer_norm<B: Backend>(
    ctx: &mut B::Context,
    x: &B::Buffer,
    n: &Norm<B>,
    eps: f32,
    out: &mut B::Buffer,
    rows: usize,
    dim: usize,
) {
    B::layer_norm(ctx, x, &n.gamma, &n.beta, eps, out, Mat { rows, cols: dim });
}
