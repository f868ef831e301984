//! Loading a Llama-family checkpoint (GGUF or safetensors) into backend
//! buffers: every layer's weights by role, the embedding and the head.
//!
//! Weights are addressed by canonical per-layer roles, mapped to each
//! format's tensor names in `tensors.rs`, so one loader serves both. GGUF
//! weights in a block format with a `gemm_quant` kernel stay in their
//! blocks (a quarter to an eighth of f32, `linear.rs`); other types are
//! dequantized to f32 at load. Mixture-of-experts and latent-attention
//! layers load in `moe.rs` and `mla.rs`, beside their forward passes.

use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::quant::random_blocks;
use ferrum_kernels::{Backend, GgufQuantType};
use ferrum_types::{FerrumError, Result};

use super::arch::Arch;
use super::config::LlamaConfig;
use super::linear::{fuse, fuse_or_f32, Embedding, Linear, Qkv};
use super::mla::{load_mla, MlaWeights};
use super::moe::{load_moe, Expert, MoeWeights};
use super::tensors::{
    gather_rows, gguf_row_of, layer_name, partial_rotary_row_of, read, require, vector, Bytes, Raw,
    Role, Source,
};
use crate::LoadProgress;

/// One transformer block's weights in backend memory.
pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Buffer,
    /// Q, K and V; `None` where the layer has latent attention instead.
    pub qkv: Option<Qkv<B>>,
    pub mla: Option<MlaWeights<B>>,
    pub o: Linear<B>,
    pub o_bias: Option<B::Buffer>,
    pub q_norm: Option<B::Buffer>,
    pub k_norm: Option<B::Buffer>,
    pub post_attn_norm: Option<B::Buffer>,
    pub ffn_norm: B::Buffer,
    pub post_ffn_norm: Option<B::Buffer>,
    pub mlp: Mlp<B>,
}

/// A layer's MLP.
pub enum Mlp<B: Backend> {
    /// One gated MLP of the model's `intermediate` width (the same block as
    /// an expert).
    Dense(Expert<B>),
    Moe(MoeWeights<B>),
}

impl<B: Backend> Mlp<B> {
    fn linears_mut(&mut self) -> Vec<&mut Linear<B>> {
        match self {
            Mlp::Dense(e) => vec![&mut e.gate_up, &mut e.down],
            Mlp::Moe(m) => m
                .experts
                .iter_mut()
                .chain(m.shared.as_mut())
                .flat_map(|e| [&mut e.gate_up, &mut e.down])
                .collect(),
        }
    }
}

pub struct Weights<B: Backend> {
    pub embed: Embedding<B>,
    pub layers: Vec<LayerWeights<B>>,
    pub final_norm: B::Buffer,
    /// `None`: tied to the (unscaled, dense) embedding table.
    pub lm_head: Option<Linear<B>>,
}

impl<B: Backend> Weights<B> {
    /// Lets every projection of the layers take its input rounded to 8
    /// bits per 32 values with lone outliers kept exact
    /// (`QuantKind::Gguf::int8_activations`), or none (`on = false`: the
    /// backend's own precision). On SmolLM2-135M Q4_1 (`ferrum perplexity
    /// --ctx 512`) the layers' 8-bit inputs moved perplexity by +0.002% on
    /// GPL-3 and +0.047% on a 31K-token corpus of other licence texts;
    /// without the outliers +0.56% and +0.19% (emulated in f32). On the
    /// k-quants (8-bit inputs in the CPU's k-quant kernels)
    /// Qwen2.5-Coder-1.5B Q4_K_M moved by +0.067% (1.75217 -> 1.75334) and
    /// Qwen2.5-Coder-0.5B by -0.019% on GPL-3.
    ///
    /// The language-model head takes them where it is a k-quant: the
    /// 1.5B's Q6_K head on 8 bits moved GPL-3 by +0.007% (1.7531553 ->
    /// 1.7532780, +0.063% from 16-bit inputs everywhere) and makes it the
    /// faster kernel (a sixth of that model's multiplies: `gemm_quant`
    /// Q6_K m = 8 142 -> 308 Gelem/s, batch-8 decode +7-9% on a Zen 4).
    /// And where it is Q8_0 (the tied embedding table of most small
    /// models): GPL-3 moved +0.075% on SmolLM2 (18.300867 -> 18.314588;
    /// +0.024% on the other licences), +0.018% on Qwen2.5-Coder-0.5B and
    /// -0.013% on Gemma-3-270m, whose heads are a fifth to three fifths of
    /// their multiplies (`gemm_quant` Q8_0 m = 8 361 -> 527 Gelem/s).
    ///
    /// Q8_0 layers keep their precision: a Q4_K_M file gives Q8_0 to the
    /// tensors it wants most exact (`attn_v` in the 0.5B and Gemma), and
    /// with their inputs on 8 bits too Gemma moved +0.084%, not -0.013%.
    pub fn set_int8_inputs(&mut self, on: bool) {
        let layer = |w: &mut Linear<B>| {
            let q8 = w.gguf_type() == Some(GgufQuantType::Q8_0);
            w.set_int8_input(on && !q8)
        };
        for l in &mut self.layers {
            match &mut l.qkv {
                Some(Qkv::Fused { w, .. }) => layer(w),
                Some(Qkv::Split { parts, .. }) => parts.iter_mut().for_each(layer),
                None => {}
            }
            layer(&mut l.o);
            l.mlp.linears_mut().into_iter().for_each(layer);
        }
        if let Some(head) = &mut self.lm_head {
            use GgufQuantType::{Q4K, Q5K, Q6K, Q8_0};
            if matches!(head.gguf_type(), Some(Q4K | Q5K | Q6K | Q8_0)) {
                head.set_int8_input(on);
            }
        }
    }
}

impl<B: Backend> Weights<B> {
    /// Reads and uploads every weight; `progress(done, total)` is called as
    /// each of the `layers + 1` parts (the layers, then embedding and head)
    /// is ready, so a caller can show how far a large model has come.
    pub fn load(src: &Source, cfg: &LlamaConfig, progress: &LoadProgress<'_>) -> Result<Self> {
        let loader = Loader::new(src, cfg);
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            layers.push(loader.layer(i)?);
            progress(i + 1, cfg.layers + 1);
        }
        let (embed, lm_head) = loader.embedding_and_head()?;
        let final_norm = loader.norm::<B>(loader.names.final_norm, cfg.hidden)?;
        progress(cfg.layers + 1, cfg.layers + 1);
        Ok(Self { embed, layers, final_norm, lm_head })
    }
}

/// The tensor names outside the layers, per format.
struct TopNames {
    embed: &'static str,
    final_norm: &'static str,
    head: &'static str,
}

/// What loading one checkpoint's weights needs at every step: where they
/// come from, the config, and the format's conventions.
struct Loader<'a> {
    src: &'a Source<'a>,
    cfg: &'a LlamaConfig,
    names: TopNames,
    /// HF Gemma stores norm weights as offsets from 1 (GGUF already adds it).
    norm_shift: f32,
    /// Q and K rows in ggml's interleaved RoPE order, to be put back.
    permuted: bool,
    fused_projections: bool,
}

impl<'a> Loader<'a> {
    fn new(src: &'a Source<'a>, cfg: &'a LlamaConfig) -> Self {
        let gguf = matches!(src, Source::Gguf(_));
        let traits = cfg.arch.traits();
        let names = match src {
            Source::Gguf(_) => TopNames {
                embed: "token_embd.weight",
                final_norm: "output_norm.weight",
                head: "output.weight",
            },
            Source::Hf(..) => TopNames {
                embed: "model.embed_tokens.weight",
                final_norm: "model.norm.weight",
                head: "lm_head.weight",
            },
        };
        Self {
            src,
            cfg,
            names,
            norm_shift: if traits.gemma && !gguf { 1.0 } else { 0.0 },
            permuted: gguf && traits.gguf_permuted_qk,
            fused_projections: traits.fused_projections,
        }
    }

    fn name(&self, role: Role, layer: usize) -> String {
        layer_name(self.src, self.cfg.arch, role, layer)
    }

    fn norm<B: Backend>(&self, name: &str, n: usize) -> Result<B::Buffer> {
        let v: Vec<f32> = vector(self.src, name, n)?
            .into_iter()
            .map(|x| x + self.norm_shift)
            .collect();
        Ok(B::from_slice(&v))
    }

    /// Layer `i`'s norm of `role` where the config has one.
    fn norm_if<B: Backend>(
        &self,
        has: bool,
        role: Role,
        i: usize,
        n: usize,
    ) -> Result<Option<B::Buffer>> {
        has.then(|| self.norm::<B>(&self.name(role, i), n))
            .transpose()
    }

    /// Layer `i`'s bias vector of `role` where the config has one.
    fn bias_if<B: Backend>(
        &self,
        has: bool,
        role: Role,
        i: usize,
        n: usize,
    ) -> Result<Option<B::Buffer>> {
        has.then(|| Ok(B::from_slice(&vector(self.src, &self.name(role, i), n)?)))
            .transpose()
    }

    fn layer<B: Backend>(&self, i: usize) -> Result<LayerWeights<B>> {
        let cfg = self.cfg;
        let (h, hd, nh) = (cfg.hidden, cfg.head_dim, cfg.heads);
        let (qkv, mla, o_in) = match &cfg.mla {
            Some(m) => (None, Some(load_mla(self.src, m, i, h, nh)?), nh * m.v),
            None => (Some(self.qkv(i)?), None, nh * hd),
        };
        let mlp = match &cfg.moe {
            Some(m) if m.sparse[i] => Mlp::Moe(load_moe(self.src, cfg.arch, m, i, h)?),
            _ => Mlp::Dense(self.dense_mlp(i)?),
        };
        let o = require(self.src, &self.name(Role::O, i), &[h, o_in])?;
        Ok(LayerWeights {
            attn_norm: self.norm::<B>(&self.name(Role::AttnNorm, i), h)?,
            qkv,
            mla,
            o: Linear::upload(o, h, o_in)?,
            o_bias: self.bias_if::<B>(cfg.o_bias, Role::OBias, i, h)?,
            q_norm: self.norm_if::<B>(cfg.qk_norm, Role::QNorm, i, hd)?,
            k_norm: self.norm_if::<B>(cfg.qk_norm, Role::KNorm, i, hd)?,
            post_attn_norm: self.norm_if::<B>(cfg.sandwich_norms, Role::PostAttnNorm, i, h)?,
            ffn_norm: self.norm::<B>(&self.name(Role::FfnNorm, i), h)?,
            post_ffn_norm: self.norm_if::<B>(cfg.sandwich_norms, Role::PostFfnNorm, i, h)?,
            mlp,
        })
    }

    /// Layer `i`'s Q, K and V projections (and biases), their rows in the
    /// order the attention kernels expect, fused into one where they can be.
    fn qkv<B: Backend>(&self, i: usize) -> Result<Qkv<B>> {
        use Role::*;
        let cfg = self.cfg;
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let (qd, kvd) = (cfg.heads * hd, cfg.kv_heads * hd);
        let src = self.src;
        let (mut q, mut k, v) = if self.fused_projections {
            let fused = require(src, &self.name(QkvFused, i), &[qd + 2 * kvd, h])?;
            let [q, k, v]: [Raw; 3] = fused
                .split_rows(qd + 2 * kvd, &[qd, kvd, kvd])
                .try_into()
                .map_err(|_| FerrumError::invalid("qkv split into other than 3 parts"))?;
            (q, k, v)
        } else {
            (
                require(src, &self.name(Q, i), &[qd, h])?,
                require(src, &self.name(K, i), &[kvd, h])?,
                require(src, &self.name(V, i), &[kvd, h])?,
            )
        };
        if self.permuted {
            q = q.permute_rows(qd, gguf_row_of(hd));
            k = k.permute_rows(kvd, gguf_row_of(hd));
        }
        if cfg.rotary_dims < hd {
            q = q.permute_rows(qd, partial_rotary_row_of(hd, cfg.rotary_dims));
            k = k.permute_rows(kvd, partial_rotary_row_of(hd, cfg.rotary_dims));
        }
        let bias = if cfg.qkv_bias {
            let mut qb = vector(src, &self.name(QBias, i), qd)?;
            let mut kb = vector(src, &self.name(KBias, i), kvd)?;
            if self.permuted {
                qb = gather_rows(&qb, qd, &gguf_row_of(hd));
                kb = gather_rows(&kb, kvd, &gguf_row_of(hd));
            }
            Some([qb, kb, vector(src, &self.name(VBias, i), kvd)?])
        } else {
            None
        };
        Ok(match fuse(vec![(q, qd), (k, kvd), (v, kvd)]) {
            Ok(w) => Qkv::Fused {
                w: Linear::upload(w, qd + 2 * kvd, h)?,
                bias: bias.map(|b| B::from_slice(&b.concat())),
            },
            Err(parts) => {
                let [q, k, v]: [(Raw, usize); 3] = parts
                    .try_into()
                    .map_err(|_| FerrumError::invalid("fuse returned other than 3 parts"))?;
                Qkv::Split {
                    parts: [
                        Linear::upload(q.0, q.1, h)?,
                        Linear::upload(k.0, k.1, h)?,
                        Linear::upload(v.0, v.1, h)?,
                    ],
                    bias: bias.map(|b| b.map(|b| B::from_slice(&b))),
                }
            }
        })
    }

    /// Layer `i`'s gated MLP, gate and up fused into one projection.
    fn dense_mlp<B: Backend>(&self, i: usize) -> Result<Expert<B>> {
        use Role::*;
        let (h, im, src) = (self.cfg.hidden, self.cfg.intermediate, self.src);
        let gate_up = if self.fused_projections {
            require(src, &self.name(GateUpFused, i), &[2 * im, h])?
        } else {
            fuse_or_f32(
                vec![
                    (require(src, &self.name(Gate, i), &[im, h])?, im),
                    (require(src, &self.name(Up, i), &[im, h])?, im),
                ],
                h,
            )?
        };
        let bias = if self.cfg.mlp_bias {
            let gate_up = [
                vector(src, &self.name(GateBias, i), im)?,
                vector(src, &self.name(UpBias, i), im)?,
            ]
            .concat();
            let down = vector(src, &self.name(DownBias, i), h)?;
            Some([B::from_slice(&gate_up), B::from_slice(&down)])
        } else {
            None
        };
        Ok(Expert {
            gate_up: Linear::upload(gate_up, 2 * im, h)?,
            down: Linear::upload(require(src, &self.name(Down, i), &[h, im])?, h, im)?,
            bias,
        })
    }

    /// The embedding table and the output head (`None`: the tied table).
    fn embedding_and_head<B: Backend>(&self) -> Result<(Embedding<B>, Option<Linear<B>>)> {
        let (cfg, src, h) = (self.cfg, self.src, self.cfg.hidden);
        let head_name = self.names.head;
        let embed_raw = require(src, self.names.embed, &[cfg.vocab, h])?;
        let head = match (src, cfg.tied_head) {
            (_, true) => None,
            (Source::Hf(..), false) => {
                Some(require(src, head_name, &[cfg.vocab, h]).map_err(|_| {
                    FerrumError::invalid(format!(
                        "{head_name} is missing and the config does not tie the embeddings \
                     (tie_word_embeddings is false or, for this family, absent)"
                    ))
                })?)
            }
            (Source::Gguf(_), false) => read(src, head_name, &[cfg.vocab, h])?,
        };
        Ok(match (embed_raw, head) {
            (Raw::Blocks { bytes, ty }, head) => {
                let row_bytes = bytes.len() / cfg.vocab;
                let lm_head = match head {
                    Some(raw) => Linear::upload(raw, cfg.vocab, h)?,
                    None => Linear::upload(Raw::Blocks { bytes: bytes.clone(), ty }, cfg.vocab, h)?,
                };
                let scale = cfg.embed_scale;
                (
                    Embedding::Blocks { bytes, ty, row_bytes, scale },
                    Some(lm_head),
                )
            }
            (raw, head) => {
                // Lookups need rows in their own column order.
                let table = match raw {
                    Raw::F32(t) => t,
                    other => other.to_f32(cfg.vocab, h)?,
                };
                match (cfg.embed_scale, head) {
                    (None, head) => (
                        Embedding::Dense(B::from_slice(&table)),
                        head.map(|raw| Linear::upload(raw, cfg.vocab, h))
                            .transpose()?,
                    ),
                    // Lookups use the scaled table; a tied head the unscaled one.
                    (Some(s), head) => {
                        let lm_head = match head {
                            Some(raw) => Linear::upload(raw, cfg.vocab, h)?,
                            None => Linear::Dense(B::from_slice(&table)),
                        };
                        let scaled: Vec<f32> = table.iter().map(|v| v * s).collect();
                        (Embedding::Dense(B::from_slice(&scaled)), Some(lm_head))
                    }
                }
            }
        })
    }
}

impl<B: Backend> Weights<B> {
    /// Random weights of `cfg`'s shapes, every projection (and the
    /// embedding and output) in `ty` blocks, norms 1 and biases 0: for
    /// measuring speed where the checkpoint is not at hand.
    pub fn random(
        cfg: &LlamaConfig,
        ty: GgufQuantType,
        act_order: bool,
        seed: u64,
    ) -> Result<Self> {
        let g = ty.ggml();
        let bs = g.block_size();
        let (h, im) = (cfg.hidden, cfg.intermediate);
        let (qd, kvd) = (cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
        if h % bs != 0 || im % bs != 0 {
            return Err(FerrumError::invalid(format!(
                "hidden {h} and intermediate {im} must be multiples of the {bs}-value blocks of {g:?}"
            )));
        }
        let mut r = RandomLinears {
            ty,
            seed,
            salt: seed,
            act_order,
            vocab: cfg.vocab,
        };
        let ones = |n: usize| B::from_slice(&vec![1.0; n]);
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let mlp = random_mlp(cfg, l, &mut r)?;
            layers.push(LayerWeights {
                attn_norm: ones(h),
                qkv: Some(Qkv::Fused {
                    w: r.linear(qd + 2 * kvd, h)?,
                    bias: cfg.qkv_bias.then(|| B::alloc(qd + 2 * kvd)),
                }),
                mla: None,
                o: r.linear(h, qd)?,
                o_bias: None,
                q_norm: cfg.qk_norm.then(|| ones(cfg.head_dim)),
                k_norm: cfg.qk_norm.then(|| ones(cfg.head_dim)),
                post_attn_norm: cfg.sandwich_norms.then(|| ones(h)),
                ffn_norm: ones(h),
                post_ffn_norm: cfg.sandwich_norms.then(|| ones(h)),
                mlp,
            });
        }
        let lm_head = Some(r.linear(cfg.vocab, h)?);
        let bytes: Bytes = random_blocks(g, cfg.vocab * h / bs, seed ^ 0xE3B)
            .ok_or_else(|| FerrumError::unsupported(format!("random weights in {g:?}")))?
            .into();
        Ok(Self {
            embed: Embedding::Blocks {
                row_bytes: bytes.len() / cfg.vocab,
                bytes,
                ty,
                scale: cfg.embed_scale,
            },
            layers,
            final_norm: ones(h),
            lm_head,
        })
    }
}

/// Random projections in `ty` blocks for [`Weights::random`]: each a new
/// salt, and with `act_order` a shuffled input order (as an act-order
/// checkpoint has) on all but the head.
struct RandomLinears {
    ty: GgufQuantType,
    seed: u64,
    salt: u64,
    act_order: bool,
    vocab: usize,
}

impl RandomLinears {
    fn linear<B: Backend>(&mut self, rows: usize, k: usize) -> Result<Linear<B>> {
        let g = self.ty.ggml();
        self.salt = self.salt.wrapping_add(1);
        let blocks = random_blocks(g, rows * k / g.block_size(), self.salt)
            .ok_or_else(|| FerrumError::unsupported(format!("random weights in {g:?}")))?;
        let raw = Raw::Blocks { bytes: blocks.into(), ty: self.ty };
        if !self.act_order || rows == self.vocab {
            return Linear::upload(raw, rows, k);
        }
        let mut order: Vec<u32> = (0..k as u32).collect();
        let mut x = self.seed ^ k as u64;
        for i in (1..k).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (x >> 33) as usize % (i + 1));
        }
        let inner = Box::new(raw);
        Linear::upload(Raw::Reordered { order: order.into(), inner }, rows, k)
    }
}

/// Layer `l`'s MLP of random weights: a mixture where `cfg` has one (an
/// f32 router, as GGUF files keep it), else dense.
fn random_mlp<B: Backend>(cfg: &LlamaConfig, l: usize, r: &mut RandomLinears) -> Result<Mlp<B>> {
    let (h, im) = (cfg.hidden, cfg.intermediate);
    let Some(m) = cfg.moe.as_ref().filter(|m| m.sparse[l]) else {
        return Ok(Mlp::Dense(Expert {
            gate_up: r.linear(2 * im, h)?,
            down: r.linear(h, im)?,
            bias: None,
        }));
    };
    let eim = m.intermediate;
    let experts = (0..m.experts)
        .map(|_| {
            Ok(Expert {
                gate_up: r.linear(2 * eim, h)?,
                down: r.linear(h, eim)?,
                bias: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let router: Vec<f32> = (0..m.experts * h)
        .map(|i| ((i * 2654435761) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    Ok(Mlp::Moe(MoeWeights {
        router: Linear::Dense(B::from_slice(&router)),
        choice_bias: None,
        experts,
        shared: None,
    }))
}

/// Tensors of a safetensors checkpoint that loading did not read, less
/// those transformers does not read either: a step they stand for would
/// be missing from the model (a bias, a vision tower), so loading refuses
/// them. Not read on purpose: RoPE's stored inverse frequencies (computed
/// from the config instead), a tied head's own `lm_head.weight`,
/// FP8 checkpoints' static activation and KV-cache scales (activations and
/// the cache keep more precision here), and DeepSeek V3's multi-token
/// prediction layers past `num_hidden_layers`.
pub fn unused_tensors<'a>(st: &'a SafeTensors, cfg: &LlamaConfig) -> Vec<&'a str> {
    let extra_layer = |name: &str| {
        name.strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| i >= cfg.layers)
    };
    st.unread()
        .into_iter()
        .filter(|n| {
            !(n.ends_with("rotary_emb.inv_freq")
                || (cfg.tied_head && *n == "lm_head.weight")
                || n.ends_with(".input_scale")
                || n.ends_with(".k_scale")
                || n.ends_with(".v_scale")
                || (cfg.arch == Arch::DeepseekV3 && extra_layer(n)))
        })
        .collect()
}
