//! Loading a Llama-family checkpoint (GGUF or safetensors) into backend
//! buffers.
//!
//! Weights are addressed by canonical per-layer roles and mapped to each
//! format's tensor names here, so one loader serves both. This version
//! dequantizes GGUF weights to f32 at load; quantized kernels replace that
//! in the CPU-speed work without changing the model code.

use ferrum_formats::gguf::GgufFile;
use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::quant::dequantize;
use ferrum_kernels::Backend;
use ferrum_types::{FerrumError, Result};

use super::config::{Arch, LlamaConfig};

/// Where weights come from.
pub enum Source<'a> {
    Gguf(&'a GgufFile),
    Hf(&'a SafeTensors),
}

/// A tensor role, independent of file format.
#[derive(Clone, Copy)]
enum Role {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    PostAttnNorm,
    FfnNorm,
    PostFfnNorm,
    Gate,
    Up,
    Down,
}

fn layer_name(src: &Source, arch: Arch, role: Role, i: usize) -> String {
    use Role::*;
    match src {
        Source::Gguf(_) => {
            let s = match role {
                AttnNorm => "attn_norm.weight",
                Q => "attn_q.weight",
                K => "attn_k.weight",
                V => "attn_v.weight",
                O => "attn_output.weight",
                QBias => "attn_q.bias",
                KBias => "attn_k.bias",
                VBias => "attn_v.bias",
                QNorm => "attn_q_norm.weight",
                KNorm => "attn_k_norm.weight",
                PostAttnNorm => "post_attention_norm.weight",
                FfnNorm => "ffn_norm.weight",
                PostFfnNorm => "post_ffw_norm.weight",
                Gate => "ffn_gate.weight",
                Up => "ffn_up.weight",
                Down => "ffn_down.weight",
            };
            format!("blk.{i}.{s}")
        }
        Source::Hf(_) => {
            let gemma = arch == Arch::Gemma3;
            let s = match role {
                AttnNorm => "input_layernorm.weight",
                Q => "self_attn.q_proj.weight",
                K => "self_attn.k_proj.weight",
                V => "self_attn.v_proj.weight",
                O => "self_attn.o_proj.weight",
                QBias => "self_attn.q_proj.bias",
                KBias => "self_attn.k_proj.bias",
                VBias => "self_attn.v_proj.bias",
                QNorm => "self_attn.q_norm.weight",
                KNorm => "self_attn.k_norm.weight",
                PostAttnNorm => "post_attention_layernorm.weight",
                // Gemma's post_attention_layernorm is the sandwich norm; its
                // pre-MLP norm has its own name.
                FfnNorm if gemma => "pre_feedforward_layernorm.weight",
                FfnNorm => "post_attention_layernorm.weight",
                PostFfnNorm => "post_feedforward_layernorm.weight",
                Gate => "mlp.gate_proj.weight",
                Up => "mlp.up_proj.weight",
                Down => "mlp.down_proj.weight",
            };
            format!("model.layers.{i}.{s}")
        }
    }
}

/// Reads a tensor as f32 with its row-major shape.
fn read(src: &Source, name: &str) -> Result<Option<(Vec<f32>, Vec<usize>)>> {
    match src {
        Source::Gguf(g) => {
            let Some(t) = g.tensor(name) else {
                return Ok(None);
            };
            let mut out = vec![0f32; t.numel() as usize];
            dequantize(t.ty, g.tensor_data(t), &mut out)
                .map_err(|e| g.error(format!("tensor {name}: {e}")))?;
            Ok(Some((out, t.shape())))
        }
        Source::Hf(st) => {
            if !st.contains(name) {
                return Ok(None);
            }
            st.to_f32(name).map(Some)
        }
    }
}

fn missing(name: &str) -> FerrumError {
    FerrumError::invalid(format!("tensor {name} is missing from the checkpoint"))
}

/// Reads `name` and checks it has `numel` values.
fn expect(src: &Source, name: &str, numel: usize) -> Result<Vec<f32>> {
    let (v, shape) = read(src, name)?.ok_or_else(|| missing(name))?;
    if v.len() != numel {
        return Err(FerrumError::invalid(format!(
            "tensor {name} has shape {shape:?} ({} values), expected {numel}",
            v.len()
        )));
    }
    Ok(v)
}

/// Undoes llama.cpp's interleaving permutation of Q/K rows in GGUF `llama`
/// checkpoints (so the half-split RoPE kernel applies): within each head,
/// GGUF row `2i + j` is original row `j·hd/2 + i`.
fn unpermute_rows(w: &[f32], heads: usize, head_dim: usize, row_len: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    let half = head_dim / 2;
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + 2 * i + j;
                let dst = h * head_dim + j * half + i;
                out[dst * row_len..(dst + 1) * row_len]
                    .copy_from_slice(&w[src * row_len..(src + 1) * row_len]);
            }
        }
    }
    out
}

/// One transformer block's weights in backend memory.
pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Buffer,
    /// Fused `[q_dim + 2·kv_dim, hidden]`.
    pub qkv: B::Buffer,
    pub qkv_bias: Option<B::Buffer>,
    pub o: B::Buffer,
    pub q_norm: Option<B::Buffer>,
    pub k_norm: Option<B::Buffer>,
    pub post_attn_norm: Option<B::Buffer>,
    pub ffn_norm: B::Buffer,
    pub post_ffn_norm: Option<B::Buffer>,
    /// Fused `[2·intermediate, hidden]`, gate rows first.
    pub gate_up: B::Buffer,
    pub down: B::Buffer,
}

pub struct Weights<B: Backend> {
    pub embed: B::Buffer,
    pub layers: Vec<LayerWeights<B>>,
    pub final_norm: B::Buffer,
    /// `None`: tied to `embed` (which is then unscaled).
    pub lm_head: Option<B::Buffer>,
}

impl<B: Backend> Weights<B> {
    pub fn load(src: &Source, cfg: &LlamaConfig) -> Result<Self> {
        let (h, hd, nh, nkv) = (cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads);
        let (qd, kvd, im) = (nh * hd, nkv * hd, cfg.intermediate);
        let gguf = matches!(src, Source::Gguf(_));
        // HF Gemma stores norm weights as offsets from 1 (GGUF already adds it).
        let norm_shift = if cfg.arch == Arch::Gemma3 && !gguf {
            1.0
        } else {
            0.0
        };
        let unpermute = gguf && cfg.arch == Arch::Llama;
        let norm = |name: &str, n: usize| -> Result<B::Buffer> {
            let v: Vec<f32> = expect(src, name, n)?
                .into_iter()
                .map(|x| x + norm_shift)
                .collect();
            Ok(B::from_slice(&v))
        };
        let name = |role, i| layer_name(src, cfg.arch, role, i);
        let (embed_name, norm_name, head_name) = match src {
            Source::Gguf(_) => ("token_embd.weight", "output_norm.weight", "output.weight"),
            Source::Hf(_) => (
                "model.embed_tokens.weight",
                "model.norm.weight",
                "lm_head.weight",
            ),
        };
        let embed_f32 = expect(src, embed_name, cfg.vocab * h)?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            use Role::*;
            let mut q = expect(src, &name(Q, i), qd * h)?;
            let mut k = expect(src, &name(K, i), kvd * h)?;
            if unpermute {
                q = unpermute_rows(&q, nh, hd, h);
                k = unpermute_rows(&k, nkv, hd, h);
            }
            let v = expect(src, &name(V, i), kvd * h)?;
            let qkv: Vec<f32> = [q, k, v].concat();
            let qkv_bias = if cfg.qkv_bias {
                let mut qb = expect(src, &name(QBias, i), qd)?;
                let mut kb = expect(src, &name(KBias, i), kvd)?;
                if unpermute {
                    qb = unpermute_rows(&qb, nh, hd, 1);
                    kb = unpermute_rows(&kb, nkv, hd, 1);
                }
                let vb = expect(src, &name(VBias, i), kvd)?;
                Some(B::from_slice(&[qb, kb, vb].concat()))
            } else {
                None
            };
            let gate_up = [
                expect(src, &name(Gate, i), im * h)?,
                expect(src, &name(Up, i), im * h)?,
            ]
            .concat();
            let opt_norm =
                |role, n| -> Result<Option<B::Buffer>> { Ok(Some(norm(&name(role, i), n)?)) };
            layers.push(LayerWeights {
                attn_norm: norm(&name(AttnNorm, i), h)?,
                qkv: B::from_slice(&qkv),
                qkv_bias,
                o: B::from_slice(&expect(src, &name(O, i), h * qd)?),
                q_norm: if cfg.qk_norm {
                    opt_norm(QNorm, hd)?
                } else {
                    None
                },
                k_norm: if cfg.qk_norm {
                    opt_norm(KNorm, hd)?
                } else {
                    None
                },
                post_attn_norm: if cfg.sandwich_norms {
                    opt_norm(PostAttnNorm, h)?
                } else {
                    None
                },
                ffn_norm: norm(&name(FfnNorm, i), h)?,
                post_ffn_norm: if cfg.sandwich_norms {
                    opt_norm(PostFfnNorm, h)?
                } else {
                    None
                },
                gate_up: B::from_slice(&gate_up),
                down: B::from_slice(&expect(src, &name(Down, i), h * im)?),
            });
        }
        let mut lm_head = match read(src, head_name)? {
            Some((v, _)) if v.len() == cfg.vocab * h => Some(B::from_slice(&v)),
            Some((v, shape)) => {
                return Err(FerrumError::invalid(format!(
                    "tensor {head_name} has shape {shape:?} ({} values), expected {}",
                    v.len(),
                    cfg.vocab * h
                )))
            }
            None => None,
        };
        // Models that scale embeddings (Gemma: ×√hidden) get a pre-scaled
        // lookup table; a tied output head keeps the unscaled one.
        let embed = match cfg.embed_scale {
            Some(scale) => {
                if lm_head.is_none() {
                    lm_head = Some(B::from_slice(&embed_f32));
                }
                B::from_slice(&embed_f32.iter().map(|v| v * scale).collect::<Vec<_>>())
            }
            None => B::from_slice(&embed_f32),
        };
        Ok(Self {
            embed,
            layers,
            final_norm: norm(norm_name, h)?,
            lm_head,
        })
    }
}
