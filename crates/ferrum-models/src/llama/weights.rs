//! Loading a Llama-family checkpoint (GGUF or safetensors) into backend
//! buffers.
//!
//! Weights are addressed by canonical per-layer roles and mapped to each
//! format's tensor names here, so one loader serves both. GGUF weights in a
//! block format with a `gemm_quant` kernel stay in their blocks (a quarter
//! to an eighth of f32); other types are dequantized to f32 at load.

use std::ops::{Deref, Range};
use std::sync::Arc;

use ferrum_formats::gguf::{GgufFile, TensorInfo};
use ferrum_formats::hf_quant::{self, HfLinear, HfQuant};
use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::quant::{dequantize, quantize_q8_0, random_blocks};
use ferrum_kernels::{input_order, Backend, GgufQuantType, QuantKind, QuantWeights};
use ferrum_types::{FerrumError, Result};

use super::arch::Arch;
use super::config::{LlamaConfig, MlaConfig, MoeConfig, Scoring};
use super::mla::{MlaQuery, MlaWeights};
use super::moe::{Expert, MoeWeights};
use super::quantized::{convert, Converted};
use crate::LoadProgress;

/// Where weights come from.
pub enum Source<'a> {
    Gguf(&'a GgufFile),
    /// A safetensors checkpoint and its quantization scheme, if any.
    Hf(&'a SafeTensors, Option<&'a HfQuant>),
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
    OBias,
    QNorm,
    KNorm,
    PostAttnNorm,
    FfnNorm,
    PostFfnNorm,
    Gate,
    Up,
    Down,
    GateBias,
    UpBias,
    DownBias,
    /// Phi-3's fused projections: `[q; k; v]` rows, and `[gate; up]`.
    QkvFused,
    GateUpFused,
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
                OBias => "attn_output.bias",
                QNorm => "attn_q_norm.weight",
                KNorm => "attn_k_norm.weight",
                PostAttnNorm => "post_attention_norm.weight",
                FfnNorm => "ffn_norm.weight",
                PostFfnNorm => "post_ffw_norm.weight",
                Gate => "ffn_gate.weight",
                Up | GateUpFused => "ffn_up.weight",
                Down => "ffn_down.weight",
                GateBias => "ffn_gate.bias",
                UpBias => "ffn_up.bias",
                DownBias => "ffn_down.bias",
                QkvFused => "attn_qkv.weight",
            };
            format!("blk.{i}.{s}")
        }
        Source::Hf(..) => {
            let gemma = arch.traits().gemma;
            let s = match role {
                AttnNorm => "input_layernorm.weight",
                Q => "self_attn.q_proj.weight",
                K => "self_attn.k_proj.weight",
                V => "self_attn.v_proj.weight",
                O => "self_attn.o_proj.weight",
                QBias => "self_attn.q_proj.bias",
                KBias => "self_attn.k_proj.bias",
                VBias => "self_attn.v_proj.bias",
                OBias => "self_attn.o_proj.bias",
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
                GateBias => "mlp.gate_proj.bias",
                UpBias => "mlp.up_proj.bias",
                DownBias => "mlp.down_proj.bias",
                QkvFused => "self_attn.qkv_proj.weight",
                GateUpFused => "mlp.gate_up_proj.weight",
            };
            format!("model.layers.{i}.{s}")
        }
    }
}

/// Bytes that stay where they are: a range of a GGUF file's mapping (no
/// copy; the pages are read from the page cache as needed), or a vector of
/// bytes built in memory.
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl Bytes {
    fn mapped(g: &GgufFile, t: &TensorInfo) -> Self {
        Self {
            owner: g.mapping(),
            range: g.tensor_range(t),
        }
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        let range = 0..v.len();
        Self {
            owner: Arc::new(v),
            range,
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

/// A weight matrix `[rows, k]` on the host, as loaded.
enum Raw {
    F32(Vec<f32>),
    Blocks {
        bytes: Bytes,
        ty: GgufQuantType,
    },
    /// An act-order checkpoint's weight with its columns sorted by group:
    /// column `j` of `inner` multiplies input column `order[j]`.
    Reordered {
        order: Arc<[u32]>,
        inner: Box<Raw>,
    },
}

impl Raw {
    fn to_f32(&self, rows: usize, k: usize) -> Result<Vec<f32>> {
        match self {
            Raw::F32(v) => Ok(v.clone()),
            Raw::Blocks { bytes, ty } => {
                let mut out = vec![0f32; rows * k];
                dequantize(ty.ggml(), bytes, &mut out)?;
                Ok(out)
            }
            Raw::Reordered { order, inner } => {
                let sorted = inner.to_f32(rows, k)?;
                let mut out = vec![0f32; rows * k];
                for (dst, src) in out.chunks_exact_mut(k).zip(sorted.chunks_exact(k)) {
                    for (&o, &v) in order.iter().zip(src) {
                        dst[o as usize] = v;
                    }
                }
                Ok(out)
            }
        }
    }

    /// Cuts `total` rows into consecutive parts of `parts` rows each.
    fn split_rows(self, total: usize, parts: &[usize]) -> Vec<Raw> {
        let mut out = Vec::with_capacity(parts.len());
        let mut at = 0;
        match self {
            Raw::F32(v) => {
                let w = v.len() / total;
                for &n in parts {
                    out.push(Raw::F32(v[at * w..(at + n) * w].to_vec()));
                    at += n;
                }
            }
            Raw::Blocks { bytes, ty } => {
                let w = bytes.len() / total;
                for &n in parts {
                    out.push(Raw::Blocks {
                        bytes: bytes[at * w..(at + n) * w].to_vec().into(),
                        ty,
                    });
                    at += n;
                }
            }
            Raw::Reordered { order, inner } => {
                out.extend(inner.split_rows(total, parts).into_iter().map(|inner| {
                    Raw::Reordered {
                        order: order.clone(),
                        inner: Box::new(inner),
                    }
                }));
            }
        }
        out
    }

    /// Reorders rows: row `dst` of the result is row `src_of(dst)` here.
    fn permute_rows(&self, rows: usize, src_of: impl Fn(usize) -> usize) -> Raw {
        match self {
            Raw::F32(v) => Raw::F32(gather_rows(v, rows, &src_of)),
            Raw::Blocks { bytes, ty } => Raw::Blocks {
                bytes: gather_rows(bytes, rows, &src_of).into(),
                ty: *ty,
            },
            Raw::Reordered { order, inner } => Raw::Reordered {
                order: order.clone(),
                inner: Box::new(inner.permute_rows(rows, src_of)),
            },
        }
    }
}

/// Row `d` of the result is row `src_of(d)` of `v` (`rows` equal rows).
fn gather_rows<T: Copy>(v: &[T], rows: usize, src_of: &dyn Fn(usize) -> usize) -> Vec<T> {
    let w = v.len() / rows;
    (0..rows)
        .flat_map(|d| v[src_of(d) * w..(src_of(d) + 1) * w].iter().copied())
        .collect()
}

fn missing(name: &str) -> FerrumError {
    FerrumError::invalid(format!("tensor {name} is missing from the checkpoint"))
}

/// Reads `name` (expected to hold `numel` values), keeping supported GGUF
/// block formats as they are.
/// Tensor `name` of shape `dims` (`[rows, columns]` as PyTorch writes a
/// linear weight, or `[n]`), or `None` when the file lacks it. The shape
/// is checked dimension by dimension where the file gives one of the same
/// rank (GGUF lists them innermost first), so a transposed weight is an
/// error, not garbage; other ranks (llama.cpp's 3-D latent attention
/// tensors) are held to the element count.
fn read(src: &Source, name: &str, dims: &[usize]) -> Result<Option<Raw>> {
    let numel: usize = dims.iter().product();
    let wrong = |shape: &[usize], got: u64| {
        FerrumError::invalid(format!(
            "tensor {name} has shape {shape:?} ({got} values), expected {dims:?}"
        ))
    };
    let same = |shape: &[usize]| shape.len() != dims.len() || shape == dims;
    match src {
        Source::Gguf(g) => {
            let Some(t) = g.tensor(name) else {
                return Ok(None);
            };
            let shape = t.shape();
            if t.numel() != numel as u64 || !same(&shape) {
                return Err(wrong(&shape, t.numel()));
            }
            let data = g.tensor_data(t);
            if let Some(qt) = GgufQuantType::from_ggml(t.ty).filter(|_| t.dims.len() == 2) {
                return Ok(Some(Raw::Blocks {
                    bytes: Bytes::mapped(g, t),
                    ty: qt,
                }));
            }
            let mut out = vec![0f32; numel];
            dequantize(t.ty, data, &mut out).map_err(|e| g.error(format!("tensor {name}: {e}")))?;
            Ok(Some(Raw::F32(out)))
        }
        Source::Hf(st, quant) => {
            if let Some(scheme) = quant {
                if let Some(w) = hf_quant::load_linear(st, scheme, name, numel)? {
                    return from_hf_quant(w).map(Some);
                }
            }
            if !st.contains(name) {
                return Ok(None);
            }
            let (v, shape) = st.to_f32(name)?;
            if v.len() != numel || !same(&shape) {
                return Err(wrong(&shape, v.len() as u64));
            }
            Ok(Some(Raw::F32(v)))
        }
    }
}

/// A quantized checkpoint's weight in the formats the backends run:
/// integer ones exactly as blocks (`quantized.rs`), FP8 rounded to Q8_0
/// (8 bits per value, as FP8, with a scale per 32 instead of per tensor,
/// row or 128x128 block; `ferrum inspect` says so).
fn from_hf_quant(w: HfLinear) -> Result<Raw> {
    match w {
        HfLinear::Ints(g) => Ok(match convert(&g)? {
            Converted::F32(v) => Raw::F32(v),
            Converted::Blocks { bytes, ty, order } => {
                let blocks = Raw::Blocks {
                    bytes: bytes.into(),
                    ty,
                };
                match order {
                    Some(order) => Raw::Reordered {
                        order: order.into(),
                        inner: Box::new(blocks),
                    },
                    None => blocks,
                }
            }
        }),
        // Rows of whole blocks only: a block must not straddle two rows.
        HfLinear::Floats { k, values } if k.is_multiple_of(32) => Ok(Raw::Blocks {
            bytes: quantize_q8_0(&values)?.into(),
            ty: GgufQuantType::Q8_0,
        }),
        HfLinear::Floats { values, .. } => Ok(Raw::F32(values)),
    }
}

fn require(src: &Source, name: &str, dims: &[usize]) -> Result<Raw> {
    read(src, name, dims)?.ok_or_else(|| missing(name))
}

/// Reads an f32 vector (norm weights, biases).
fn vector(src: &Source, name: &str, n: usize) -> Result<Vec<f32>> {
    require(src, name, &[n])?.to_f32(1, n)
}

/// A projection weight `[n, k]` in backend memory.
pub enum Linear<B: Backend> {
    Dense(B::Buffer),
    /// Blocks in the backend's layout; `order`: an act-order weight's input
    /// order (see `QuantWeights`).
    Quant {
        w: B::Buffer,
        kind: QuantKind,
        order: Option<B::Buffer>,
    },
}

impl<B: Backend> Linear<B> {
    /// Moves an `[n, k]` weight into backend memory (blocks in the layout
    /// the backend's `gemm_quant` reads).
    fn upload(raw: Raw, n: usize, k: usize) -> Result<Self> {
        Ok(match raw {
            Raw::F32(v) => Linear::Dense(B::from_slice(&v)),
            Raw::Blocks { bytes, ty } => Linear::Quant {
                w: B::load_gguf(&bytes, ty, n, k)?,
                kind: QuantKind::Gguf {
                    quant_type: ty,
                    int8_activations: false,
                },
                order: None,
            },
            Raw::Reordered { order, inner } => match Self::upload(*inner, n, k)? {
                Linear::Quant { w, kind, .. } => Linear::Quant {
                    w,
                    kind,
                    order: Some(B::from_slice(&input_order(&order))),
                },
                Linear::Dense(_) => {
                    return Err(FerrumError::invalid(
                        "an input order is only kept with block weights",
                    ))
                }
            },
        })
    }

    /// The GGUF block type of a weight kept in blocks.
    fn gguf_type(&self) -> Option<GgufQuantType> {
        match self {
            Linear::Quant {
                kind: QuantKind::Gguf { quant_type, .. },
                ..
            } => Some(*quant_type),
            _ => None,
        }
    }

    /// Sets `QuantKind::Gguf::int8_activations` (a dense weight has none).
    fn set_int8_input(&mut self, on: bool) {
        if let Linear::Quant {
            kind: QuantKind::Gguf {
                int8_activations, ..
            },
            ..
        } = self
        {
            *int8_activations = on;
        }
    }

    /// `out[m, n] = x[m, k] · Wᵀ`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ctx: &mut B::Context,
        x: &B::Buffer,
        out: &mut B::Buffer,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        match self {
            Linear::Dense(w) => {
                B::gemm(ctx, x, w, out, m, n, k);
                Ok(())
            }
            Linear::Quant { w, kind, order } => {
                let qw = QuantWeights::<B> {
                    qweight: w,
                    scales: None,
                    zeros: None,
                    g_idx: order.as_ref(),
                };
                B::gemm_quant(ctx, x, &qw, out, m, n, k, kind)
            }
        }
    }
}

/// Concatenates row blocks into one weight when every part has the same
/// format (all the same block type, or all f32); otherwise hands the parts
/// back.
fn fuse(parts: Vec<(Raw, usize)>) -> std::result::Result<Raw, Vec<(Raw, usize)>> {
    // Act-order parts fuse when they share one input order (GPTQ quantizes
    // projections of the same input with the same order).
    if let Some((Raw::Reordered { order, .. }, _)) = parts.first() {
        let order = order.clone();
        if !parts
            .iter()
            .all(|(r, _)| matches!(r, Raw::Reordered { order: o, .. } if *o == order))
        {
            return Err(parts);
        }
        let inner = parts
            .into_iter()
            .map(|(r, rows)| match r {
                Raw::Reordered { inner, .. } => (*inner, rows),
                other => (other, rows),
            })
            .collect();
        return match fuse(inner) {
            Ok(inner) => Ok(Raw::Reordered {
                order,
                inner: Box::new(inner),
            }),
            Err(inner) => Err(inner
                .into_iter()
                .map(|(inner, rows)| {
                    let order = order.clone();
                    let inner = Box::new(inner);
                    (Raw::Reordered { order, inner }, rows)
                })
                .collect()),
        };
    }
    let same_blocks = match parts.first() {
        Some((Raw::Blocks { ty, .. }, _)) => {
            let t = *ty;
            parts
                .iter()
                .all(|(r, _)| matches!(r, Raw::Blocks { ty, .. } if *ty == t))
                .then_some(t)
        }
        _ => None,
    };
    if let Some(ty) = same_blocks {
        let mut bytes = Vec::new();
        for (r, _) in parts {
            if let Raw::Blocks { bytes: b, .. } = r {
                bytes.extend_from_slice(&b);
            }
        }
        return Ok(Raw::Blocks {
            bytes: bytes.into(),
            ty,
        });
    }
    if parts.iter().all(|(r, _)| matches!(r, Raw::F32(_))) {
        let mut all = Vec::new();
        for (r, _) in parts {
            if let Raw::F32(v) = r {
                all.extend(v);
            }
        }
        return Ok(Raw::F32(all));
    }
    Err(parts)
}

/// [`fuse`], falling back to f32 for parts of mixed formats.
fn fuse_or_f32(parts: Vec<(Raw, usize)>, k: usize) -> Result<Raw> {
    match fuse(parts) {
        Ok(raw) => Ok(raw),
        Err(parts) => {
            let mut all = Vec::new();
            for (r, rows) in parts {
                all.extend(r.to_f32(rows, k)?);
            }
            Ok(Raw::F32(all))
        }
    }
}

/// The token embedding table, for lookups.
pub enum Embedding<B: Backend> {
    /// f32 rows in backend memory (pre-scaled when the model scales).
    Dense(B::Buffer),
    /// GGUF blocks on the host (for a file, its mapping: only looked-up
    /// rows are ever read back in); rows are dequantized per call.
    Blocks {
        bytes: Bytes,
        ty: GgufQuantType,
        row_bytes: usize,
        scale: Option<f32>,
    },
}

impl<B: Backend> Embedding<B> {
    /// Writes the rows of `ids` into `out` (`[ids.len(), dim]`); `host` is
    /// scratch for rows dequantized on the host.
    pub fn lookup(
        &self,
        ctx: &mut B::Context,
        ids: &[u32],
        out: &mut B::Buffer,
        dim: usize,
        host: &mut Vec<f32>,
    ) -> Result<()> {
        match self {
            Embedding::Dense(t) => B::embedding_lookup(ctx, t, ids, out, dim),
            Embedding::Blocks {
                bytes,
                ty,
                row_bytes,
                scale,
            } => {
                host.resize(ids.len() * dim, 0.0);
                for (r, &id) in host.chunks_exact_mut(dim).zip(ids) {
                    let start = id as usize * row_bytes;
                    let src = bytes.get(start..start + row_bytes).ok_or_else(|| {
                        FerrumError::invalid(format!(
                            "token id {id} is outside the embedding table"
                        ))
                    })?;
                    dequantize(ty.ggml(), src, r)?;
                    if let Some(s) = scale {
                        r.iter_mut().for_each(|v| *v *= s);
                    }
                }
                B::write_from(ctx, host, out, 0);
            }
        }
        Ok(())
    }
}

/// The Q, K and V projections and their biases.
pub enum Qkv<B: Backend> {
    /// One `[q_dim + 2·kv_dim, hidden]` GEMM, when the three share a format.
    Fused {
        w: Linear<B>,
        bias: Option<B::Buffer>,
    },
    /// Three GEMMs straight into Q, K and V when they do not (Qwen2.5's
    /// Q4_K_M files mix Q5_0 Q/K with Q8_0 V): fusing them would need f32
    /// weights, four to seven times the bytes read per token.
    Split {
        parts: [Linear<B>; 3],
        bias: Option<[B::Buffer; 3]>,
    },
}

impl<B: Backend> Qkv<B> {
    /// Projects `x[m, hidden]` into `q[m, qd]`, `k[m, kvd]` and `v[m, kvd]`
    /// (biases added); `fused` is scratch of `m·(qd + 2·kvd)` values.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ctx: &mut B::Context,
        x: &B::Buffer,
        fused: &mut B::Buffer,
        [q, k, v]: [&mut B::Buffer; 3],
        m: usize,
        qd: usize,
        kvd: usize,
        hidden: usize,
    ) -> Result<()> {
        match self {
            Qkv::Fused { w, bias } => {
                w.forward(ctx, x, fused, m, qd + 2 * kvd, hidden)?;
                if let Some(b) = bias {
                    B::add_bias(ctx, fused, b, m, qd + 2 * kvd);
                }
                B::split_qkv(ctx, fused, q, k, v, m, qd, kvd);
            }
            Qkv::Split { parts, bias } => {
                for ((w, out), n) in parts
                    .iter()
                    .zip([&mut *q, &mut *k, &mut *v])
                    .zip([qd, kvd, kvd])
                {
                    w.forward(ctx, x, out, m, n, hidden)?;
                }
                if let Some(bias) = bias {
                    for ((b, out), n) in bias.iter().zip([q, k, v]).zip([qd, kvd, kvd]) {
                        B::add_bias(ctx, out, b, m, n);
                    }
                }
            }
        }
        Ok(())
    }
}

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

/// The `experts` matrices `[rows, k]` of one stacked GGUF tensor
/// (`[experts, rows, k]`, expert-major): each keeps its blocks.
fn read_stacked(
    g: &GgufFile,
    name: &str,
    experts: usize,
    rows: usize,
    k: usize,
) -> Result<Vec<Raw>> {
    let t = g.tensor(name).ok_or_else(|| missing(name))?;
    let numel = experts * rows * k;
    if t.numel() != numel as u64 {
        return Err(FerrumError::invalid(format!(
            "tensor {name} has shape {:?}, expected {experts} experts of [{rows}, {k}]",
            t.shape()
        )));
    }
    let data = g.tensor_data(t);
    match GgufQuantType::from_ggml(t.ty) {
        Some(ty) => {
            let bytes = Bytes::mapped(g, t);
            let per = bytes.len() / experts;
            Ok((0..experts)
                .map(|e| Raw::Blocks {
                    bytes: bytes[e * per..(e + 1) * per].to_vec().into(),
                    ty,
                })
                .collect())
        }
        None => {
            let mut all = vec![0f32; numel];
            dequantize(t.ty, data, &mut all).map_err(|e| g.error(format!("tensor {name}: {e}")))?;
            Ok(all
                .chunks_exact(rows * k)
                .map(|c| Raw::F32(c.to_vec()))
                .collect())
        }
    }
}

/// Layer `i`'s router and experts: GGUF's stacked `ffn_*_exps` tensors, or
/// Hugging Face's per-expert ones (Qwen3-MoE's `mlp.experts.{e}.*_proj`,
/// Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`).
fn load_moe<B: Backend>(
    src: &Source,
    arch: Arch,
    m: &MoeConfig,
    i: usize,
    h: usize,
) -> Result<MoeWeights<B>> {
    let (ne, im) = (m.experts, m.intermediate);
    let (router, gates, ups, downs) = match src {
        Source::Gguf(g) => {
            let n = |s: &str| format!("blk.{i}.{s}");
            (
                require(src, &n("ffn_gate_inp.weight"), &[ne, h])?,
                read_stacked(g, &n("ffn_gate_exps.weight"), ne, im, h)?,
                read_stacked(g, &n("ffn_up_exps.weight"), ne, im, h)?,
                read_stacked(g, &n("ffn_down_exps.weight"), ne, h, im)?,
            )
        }
        Source::Hf(..) => {
            let names = arch.traits().moe.ok_or_else(|| {
                FerrumError::invalid(format!("{arch:?} has no mixture-of-experts layers"))
            })?;
            let (block, [gate, up, down]) = (names.block, names.gate_up_down);
            let p = format!("model.layers.{i}.{block}");
            let each = |w: &str, rows: usize, k: usize| -> Result<Vec<Raw>> {
                (0..ne)
                    .map(|e| require(src, &format!("{p}.experts.{e}.{w}.weight"), &[rows, k]))
                    .collect()
            };
            (
                require(src, &format!("{p}.gate.weight"), &[ne, h])?,
                each(gate, im, h)?,
                each(up, im, h)?,
                each(down, h, im)?,
            )
        }
    };
    let shared = match m.shared_intermediate {
        Some(sim) => {
            let name = |n: usize| match src {
                Source::Gguf(_) => {
                    let g = ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"][n];
                    format!("blk.{i}.{g}.weight")
                }
                Source::Hf(..) => {
                    let p = ["gate_proj", "up_proj", "down_proj"][n];
                    format!("model.layers.{i}.mlp.shared_experts.{p}.weight")
                }
            };
            let gate_up = vec![
                (require(src, &name(0), &[sim, h])?, sim),
                (require(src, &name(1), &[sim, h])?, sim),
            ];
            Some(Expert {
                gate_up: Linear::upload(fuse_or_f32(gate_up, h)?, 2 * sim, h)?,
                down: Linear::upload(require(src, &name(2), &[h, sim])?, h, sim)?,
                bias: None,
            })
        }
        None => None,
    };
    let experts = gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .map(|((g, u), d)| {
            Ok(Expert {
                gate_up: Linear::upload(fuse_or_f32(vec![(g, im), (u, im)], h)?, 2 * im, h)?,
                down: Linear::upload(d, h, im)?,
                bias: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // DeepSeek V3's selection bias (`e_score_correction_bias`).
    let choice_bias = match m.scoring {
        Scoring::Softmax => None,
        Scoring::Sigmoid => Some(vector(
            src,
            &match src {
                Source::Gguf(_) => format!("blk.{i}.exp_probs_b.bias"),
                Source::Hf(..) => format!("model.layers.{i}.mlp.gate.e_score_correction_bias"),
            },
            ne,
        )?),
    };
    Ok(MoeWeights {
        choice_bias,
        router: Linear::upload(router, ne, h)?,
        experts,
        shared,
    })
}

/// `d` rope dims in the rotate-half order `(i, i + d/2)` the kernels use:
/// slot `i` takes dim `src(i)`. Interleaved pairs `(2i, 2i + 1)`
/// (DeepSeek's checkpoints) are gathered; halves stay where they are.
fn rope_to_half(d: usize, interleaved: bool) -> impl Fn(usize) -> usize {
    move |i| match (interleaved, i < d / 2) {
        (false, _) => i,
        (true, true) => 2 * i,
        (true, false) => 2 * (i - d / 2) + 1,
    }
}

/// Latent attention of layer `i`: see `mla.rs`. A query
/// head's `nope + rope` rows are reordered as `[rope (rotate-half); nope]`
/// and then as partial rotary (`partial_rotary_row_of`), and the absorbed
/// maps are built in that order.
fn load_mla<B: Backend>(
    src: &Source,
    m: &MlaConfig,
    i: usize,
    h: usize,
    heads: usize,
) -> Result<MlaWeights<B>> {
    let (nope, rope, rank, v) = (m.nope, m.rope, m.kv_lora_rank, m.v);
    let (qk, dkv) = (nope + rope, rank + rope);
    // Hugging Face's names, and llama.cpp's (`deepseek2`).
    let name = |hf: &str| match src {
        Source::Gguf(_) => {
            let g = match hf {
                "q_proj.weight" => "attn_q.weight",
                "q_a_proj.weight" => "attn_q_a.weight",
                "q_a_layernorm.weight" => "attn_q_a_norm.weight",
                "q_b_proj.weight" => "attn_q_b.weight",
                "kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
                "kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
                other => other,
            };
            format!("blk.{i}.{g}")
        }
        Source::Hf(..) => format!("model.layers.{i}.self_attn.{hf}"),
    };
    let inter = rope_to_half(rope, m.rope_interleaved);
    let partial = partial_rotary_row_of(qk, rope);
    // Head slot -> the Hugging Face dim it holds (within a head).
    let hf_dim = |slot: usize| {
        let b = partial(slot);
        if b < rope {
            nope + inter(b)
        } else {
            b - rope
        }
    };
    let head_rows = |r: usize| (r / qk) * qk + hf_dim(r % qk);
    let query = match m.q_lora_rank {
        Some(rank) => MlaQuery::LowRank {
            rank,
            a: Linear::upload(require(src, &name("q_a_proj.weight"), &[rank, h])?, rank, h)?,
            norm: B::from_slice(&vector(src, &name("q_a_layernorm.weight"), rank)?),
            b: Linear::upload(
                require(src, &name("q_b_proj.weight"), &[heads * qk, rank])?
                    .permute_rows(heads * qk, head_rows),
                heads * qk,
                rank,
            )?,
        },
        None => MlaQuery::Full(Linear::upload(
            require(src, &name("q_proj.weight"), &[heads * qk, h])?
                .permute_rows(heads * qk, head_rows),
            heads * qk,
            h,
        )?),
    };
    let [c, kr]: [Raw; 2] = require(src, &name("kv_a_proj_with_mqa.weight"), &[dkv, h])?
        .split_rows(dkv, &[rank, rope])
        .try_into()
        .map_err(|_| FerrumError::invalid("kv_a split into other than 2 parts"))?;
    let kr = kr.permute_rows(rope, &inter);
    // `kv_b_proj` `[heads · (nope + v), rank]`; llama.cpp splits it into
    // `attn_k_b` (each head's part transposed, `[heads, rank, nope]`) and
    // `attn_v_b` (`[heads, v, rank]`).
    let kv_b = match src {
        Source::Hf(..) => require(src, &name("kv_b_proj.weight"), &[heads * (nope + v), rank])?
            .to_f32(heads * (nope + v), rank)?,
        Source::Gguf(_) => {
            let k_b = require(
                src,
                &format!("blk.{i}.attn_k_b.weight"),
                &[heads, rank, nope],
            )?
            .to_f32(heads * rank, nope)?;
            let v_b = require(src, &format!("blk.{i}.attn_v_b.weight"), &[heads, v, rank])?
                .to_f32(heads * v, rank)?;
            let mut kv_b = vec![0f32; heads * (nope + v) * rank];
            for hh in 0..heads {
                for r in 0..rank {
                    for d in 0..nope {
                        kv_b[(hh * (nope + v) + d) * rank + r] = k_b[(hh * rank + r) * nope + d];
                    }
                }
                for j in 0..v {
                    let row = (hh * (nope + v) + nope + j) * rank;
                    kv_b[row..row + rank].copy_from_slice(&v_b[(hh * v + j) * rank..][..rank]);
                }
            }
            kv_b
        }
    };
    let w = |head: usize, row: usize, r: usize| kv_b[(head * (nope + v) + row) * rank + r];
    let mut absorb_q = Vec::with_capacity(heads);
    let mut to_v = Vec::with_capacity(heads);
    for hh in 0..heads {
        let mut a = vec![0f32; dkv * qk];
        for t in 0..qk {
            let b = partial(t);
            if b < rope {
                a[(rank + b) * qk + t] = 1.0;
            } else {
                for r in 0..rank {
                    a[r * qk + t] = w(hh, b - rope, r);
                }
            }
        }
        absorb_q.push(B::from_slice(&a));
        let mut o = vec![0f32; v * dkv];
        for j in 0..v {
            for r in 0..rank {
                o[j * dkv + r] = w(hh, nope + j, r);
            }
        }
        to_v.push(B::from_slice(&o));
    }
    let mut place_latent = vec![0f32; dkv * rank];
    (0..rank).for_each(|r| place_latent[r * rank + r] = 1.0);
    let mut place_rope = vec![0f32; dkv * rope];
    (0..rope).for_each(|j| place_rope[(rank + j) * rope + j] = 1.0);
    Ok(MlaWeights {
        query,
        kv_a: Linear::upload(c, rank, h)?,
        kv_a_norm: B::from_slice(&vector(src, &name("kv_a_layernorm.weight"), rank)?),
        k_rope: Linear::upload(kr, rope, h)?,
        absorb_q,
        to_v,
        place_latent: B::from_slice(&place_latent),
        place_rope: B::from_slice(&place_rope),
    })
}

/// Partial rotary (Phi-3) in the rotate-half kernel: within a head, the
/// `rot` rotating dimensions pair `j` with `j + rot/2`, the kernel pairs
/// `j` with `j + hd/2`. Reordering Q and K rows alike leaves every `q·k`
/// unchanged, so each head is laid out as: rotating first halves, then
/// non-rotating ones, then the rotating second halves, then the rest; the
/// tables give the non-rotating pairs angle 0 (`RopeSpec::partial_tables`).
fn partial_rotary_row_of(hd: usize, rot: usize) -> impl Fn(usize) -> usize {
    let (half, rh, fixed_half) = (hd / 2, rot / 2, (hd - rot) / 2);
    move |dst| {
        let (h, slot) = (dst / hd, dst % hd);
        let (j, second) = (slot % half, slot >= half);
        let src = match (j < rh, second) {
            (true, false) => j,
            (true, true) => j + rh,
            (false, false) => rot + (j - rh),
            (false, true) => rot + fixed_half + (j - rh),
        };
        h * hd + src
    }
}

/// llama.cpp interleaves Q/K rows in GGUF `llama` checkpoints; this maps
/// each row of the original (half-split RoPE) order to its GGUF row: within
/// a head, original row `j·hd/2 + i` is GGUF row `2i + j`.
fn gguf_row_of(hd: usize) -> impl Fn(usize) -> usize {
    let half = hd / 2;
    move |dst| {
        let (h, r) = (dst / hd, dst % hd);
        h * hd + 2 * (r % half) + r / half
    }
}

impl<B: Backend> Weights<B> {
    /// Reads and uploads every weight; `progress(done, total)` is called as
    /// each of the `layers + 1` parts (the layers, then embedding and head)
    /// is ready, so a caller can show how far a large model has come.
    pub fn load(src: &Source, cfg: &LlamaConfig, progress: &LoadProgress<'_>) -> Result<Self> {
        let (h, hd, nh, nkv) = (cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads);
        let (qd, kvd, im) = (nh * hd, nkv * hd, cfg.intermediate);
        let gguf = matches!(src, Source::Gguf(_));
        // HF Gemma stores norm weights as offsets from 1 (GGUF already adds it).
        let traits = cfg.arch.traits();
        let norm_shift = if traits.gemma && !gguf { 1.0 } else { 0.0 };
        let permuted = gguf && traits.gguf_permuted_qk;
        let norm = |name: &str, n: usize| -> Result<B::Buffer> {
            let v: Vec<f32> = vector(src, name, n)?
                .into_iter()
                .map(|x| x + norm_shift)
                .collect();
            Ok(B::from_slice(&v))
        };
        let name = |role, i| layer_name(src, cfg.arch, role, i);
        let (embed_name, norm_name, head_name) = match src {
            Source::Gguf(_) => ("token_embd.weight", "output_norm.weight", "output.weight"),
            Source::Hf(..) => (
                "model.embed_tokens.weight",
                "model.norm.weight",
                "lm_head.weight",
            ),
        };
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            use Role::*;
            let (qkv, mla, o_in) = if let Some(m) = &cfg.mla {
                let mla = load_mla(src, m, i, h, nh)?;
                (None, Some(mla), nh * m.v)
            } else {
                let (mut q, mut k, v) = if traits.fused_projections {
                    let fused = require(src, &name(QkvFused, i), &[qd + 2 * kvd, h])?;
                    let [q, k, v]: [Raw; 3] = fused
                        .split_rows(qd + 2 * kvd, &[qd, kvd, kvd])
                        .try_into()
                        .map_err(|_| FerrumError::invalid("qkv split into other than 3 parts"))?;
                    (q, k, v)
                } else {
                    (
                        require(src, &name(Q, i), &[qd, h])?,
                        require(src, &name(K, i), &[kvd, h])?,
                        require(src, &name(V, i), &[kvd, h])?,
                    )
                };
                if permuted {
                    q = q.permute_rows(qd, gguf_row_of(hd));
                    k = k.permute_rows(kvd, gguf_row_of(hd));
                }
                if cfg.rotary_dims < hd {
                    q = q.permute_rows(qd, partial_rotary_row_of(hd, cfg.rotary_dims));
                    k = k.permute_rows(kvd, partial_rotary_row_of(hd, cfg.rotary_dims));
                }
                let bias = if cfg.qkv_bias {
                    let mut qb = vector(src, &name(QBias, i), qd)?;
                    let mut kb = vector(src, &name(KBias, i), kvd)?;
                    if permuted {
                        qb = gather_rows(&qb, qd, &gguf_row_of(hd));
                        kb = gather_rows(&kb, kvd, &gguf_row_of(hd));
                    }
                    Some([qb, kb, vector(src, &name(VBias, i), kvd)?])
                } else {
                    None
                };
                let qkv = match fuse(vec![(q, qd), (k, kvd), (v, kvd)]) {
                    Ok(w) => Qkv::Fused {
                        w: Linear::upload(w, qd + 2 * kvd, h)?,
                        bias: bias.map(|b| B::from_slice(&b.concat())),
                    },
                    Err(parts) => {
                        let [q, k, v]: [(Raw, usize); 3] = parts.try_into().map_err(|_| {
                            FerrumError::invalid("fuse returned other than 3 parts")
                        })?;
                        Qkv::Split {
                            parts: [
                                Linear::upload(q.0, q.1, h)?,
                                Linear::upload(k.0, k.1, h)?,
                                Linear::upload(v.0, v.1, h)?,
                            ],
                            bias: bias.map(|b| b.map(|b| B::from_slice(&b))),
                        }
                    }
                };
                (Some(qkv), None, qd)
            };
            let mlp = match &cfg.moe {
                Some(m) if m.sparse[i] => Mlp::Moe(load_moe(src, cfg.arch, m, i, h)?),
                _ => {
                    let gate_up = if traits.fused_projections {
                        require(src, &name(GateUpFused, i), &[2 * im, h])?
                    } else {
                        fuse_or_f32(
                            vec![
                                (require(src, &name(Gate, i), &[im, h])?, im),
                                (require(src, &name(Up, i), &[im, h])?, im),
                            ],
                            h,
                        )?
                    };
                    let bias = if cfg.mlp_bias {
                        let gate_up = [
                            vector(src, &name(GateBias, i), im)?,
                            vector(src, &name(UpBias, i), im)?,
                        ]
                        .concat();
                        let down = vector(src, &name(DownBias, i), h)?;
                        Some([B::from_slice(&gate_up), B::from_slice(&down)])
                    } else {
                        None
                    };
                    Mlp::Dense(Expert {
                        gate_up: Linear::upload(gate_up, 2 * im, h)?,
                        down: Linear::upload(require(src, &name(Down, i), &[h, im])?, h, im)?,
                        bias,
                    })
                }
            };
            let opt_norm =
                |role, n| -> Result<Option<B::Buffer>> { Ok(Some(norm(&name(role, i), n)?)) };
            layers.push(LayerWeights {
                attn_norm: norm(&name(AttnNorm, i), h)?,
                qkv,
                mla,
                o: Linear::upload(require(src, &name(O, i), &[h, o_in])?, h, o_in)?,
                o_bias: if cfg.o_bias {
                    Some(B::from_slice(&vector(src, &name(OBias, i), h)?))
                } else {
                    None
                },
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
                mlp,
            });
            progress(i + 1, cfg.layers + 1);
        }
        let embed_raw = require(src, embed_name, &[cfg.vocab, h])?;
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
        let (embed, lm_head) = match (embed_raw, head) {
            (Raw::Blocks { bytes, ty }, head) => {
                let row_bytes = bytes.len() / cfg.vocab;
                let lm_head = match head {
                    Some(raw) => Linear::upload(raw, cfg.vocab, h)?,
                    None => Linear::upload(
                        Raw::Blocks {
                            bytes: bytes.clone(),
                            ty,
                        },
                        cfg.vocab,
                        h,
                    )?,
                };
                let scale = cfg.embed_scale;
                (
                    Embedding::Blocks {
                        bytes,
                        ty,
                        row_bytes,
                        scale,
                    },
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
        };
        let final_norm = norm(norm_name, h)?;
        progress(cfg.layers + 1, cfg.layers + 1);
        Ok(Self {
            embed,
            layers,
            final_norm,
            lm_head,
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
        let mut salt = seed;
        let mut blocks = |rows: usize, k: usize| -> Result<Vec<u8>> {
            salt = salt.wrapping_add(1);
            random_blocks(g, rows * k / bs, salt)
                .ok_or_else(|| FerrumError::unsupported(format!("random weights in {g:?}")))
        };
        let mut linear = |rows: usize, k: usize| -> Result<Linear<B>> {
            let raw = Raw::Blocks {
                bytes: blocks(rows, k)?.into(),
                ty,
            };
            if !act_order || rows == cfg.vocab {
                return Linear::upload(raw, rows, k);
            }
            // A shuffled input order, as an act-order checkpoint has.
            let mut order: Vec<u32> = (0..k as u32).collect();
            let mut x = seed ^ k as u64;
            for i in (1..k).rev() {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                order.swap(i, (x >> 33) as usize % (i + 1));
            }
            let inner = Box::new(raw);
            Linear::upload(
                Raw::Reordered {
                    order: order.into(),
                    inner,
                },
                rows,
                k,
            )
        };
        let ones = |n: usize| B::from_slice(&vec![1.0; n]);
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let mlp = match &cfg.moe {
                Some(m) if m.sparse[l] => {
                    let eim = m.intermediate;
                    let experts = (0..m.experts)
                        .map(|_| {
                            Ok(Expert {
                                gate_up: linear(2 * eim, h)?,
                                down: linear(h, eim)?,
                                bias: None,
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    // An f32 router, as GGUF files keep it.
                    let router: Vec<f32> = (0..m.experts * h)
                        .map(|i| ((i * 2654435761) % 1000) as f32 / 1000.0 - 0.5)
                        .collect();
                    Mlp::Moe(MoeWeights {
                        router: Linear::Dense(B::from_slice(&router)),
                        choice_bias: None,
                        experts,
                        shared: None,
                    })
                }
                _ => Mlp::Dense(Expert {
                    gate_up: linear(2 * im, h)?,
                    down: linear(h, im)?,
                    bias: None,
                }),
            };
            layers.push(LayerWeights {
                attn_norm: ones(h),
                qkv: Some(Qkv::Fused {
                    w: linear(qd + 2 * kvd, h)?,
                    bias: cfg.qkv_bias.then(|| B::alloc(qd + 2 * kvd)),
                }),
                mla: None,
                o: linear(h, qd)?,
                o_bias: None,
                q_norm: cfg.qk_norm.then(|| ones(cfg.head_dim)),
                k_norm: cfg.qk_norm.then(|| ones(cfg.head_dim)),
                post_attn_norm: cfg.sandwich_norms.then(|| ones(h)),
                ffn_norm: ones(h),
                post_ffn_norm: cfg.sandwich_norms.then(|| ones(h)),
                mlp,
            });
        }
        let lm_head = Some(linear(cfg.vocab, h)?);
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
