//! Tensors as a checkpoint holds them: where they come from (GGUF or
//! safetensors), the per-layer roles and their names in each format, raw
//! data before upload (blocks kept, or f32), and the row orders RoPE
//! layouts need.

use std::ops::{Deref, Range};
use std::sync::Arc;

use ferrum_formats::gguf::{GgufFile, TensorInfo};
use ferrum_formats::hf_quant::{self, HfLinear, HfQuant};
use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::quant::{dequantize, quantize_q8_0};
use ferrum_kernels::GgufQuantType;
use ferrum_types::{FerrumError, Result};

use super::arch::Arch;
use super::quantized::{convert, Converted};

/// Where weights come from.
pub enum Source<'a> {
    Gguf(&'a GgufFile),
    /// A safetensors checkpoint and its quantization scheme, if any.
    Hf(&'a SafeTensors, Option<&'a HfQuant>),
}

/// A tensor role, independent of file format.
#[derive(Clone, Copy)]
pub(super) enum Role {
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

pub(super) fn layer_name(src: &Source, arch: Arch, role: Role, i: usize) -> String {
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
    pub(super) fn mapped(g: &GgufFile, t: &TensorInfo) -> Self {
        Self {
            owner: g.mapping(),
            range: g.tensor_range(t),
        }
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        let range = 0..v.len();
        Self { owner: Arc::new(v), range }
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

/// A weight matrix `[rows, k]` on the host, as loaded.
pub(super) enum Raw {
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
    pub(super) fn to_f32(&self, rows: usize, k: usize) -> Result<Vec<f32>> {
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
    pub(super) fn split_rows(self, total: usize, parts: &[usize]) -> Vec<Raw> {
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
    pub(super) fn permute_rows(&self, rows: usize, src_of: impl Fn(usize) -> usize) -> Raw {
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
pub(super) fn gather_rows<T: Copy>(
    v: &[T],
    rows: usize,
    src_of: &dyn Fn(usize) -> usize,
) -> Vec<T> {
    let w = v.len() / rows;
    (0..rows)
        .flat_map(|d| v[src_of(d) * w..(src_of(d) + 1) * w].iter().copied())
        .collect()
}

pub(super) fn missing(name: &str) -> FerrumError {
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
pub(super) fn read(src: &Source, name: &str, dims: &[usize]) -> Result<Option<Raw>> {
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
                return Ok(Some(Raw::Blocks { bytes: Bytes::mapped(g, t), ty: qt }));
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
pub(super) fn from_hf_quant(w: HfLinear) -> Result<Raw> {
    match w {
        HfLinear::Ints(g) => Ok(match convert(&g)? {
            Converted::F32(v) => Raw::F32(v),
            Converted::Blocks { bytes, ty, order } => {
                let blocks = Raw::Blocks { bytes: bytes.into(), ty };
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

pub(super) fn require(src: &Source, name: &str, dims: &[usize]) -> Result<Raw> {
    read(src, name, dims)?.ok_or_else(|| missing(name))
}

/// Reads an f32 vector (norm weights, biases).
pub(super) fn vector(src: &Source, name: &str, n: usize) -> Result<Vec<f32>> {
    require(src, name, &[n])?.to_f32(1, n)
}

/// Partial rotary (Phi-3) in the rotate-half kernel: within a head, the
/// `rot` rotating dimensions pair `j` with `j + rot/2`, the kernel pairs
/// `j` with `j + hd/2`. Reordering Q and K rows alike leaves every `q·k`
/// unchanged, so each head is laid out as: rotating first halves, then
/// non-rotating ones, then the rotating second halves, then the rest; the
/// tables give the non-rotating pairs angle 0 (`RopeSpec::partial_tables`).
pub(super) fn partial_rotary_row_of(hd: usize, rot: usize) -> impl Fn(usize) -> usize {
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
pub(super) fn gguf_row_of(hd: usize) -> impl Fn(usize) -> usize {
    let half = hd / 2;
    move |dst| {
        let (h, r) = (dst / hd, dst % hd);
        h * hd + 2 * (r % half) + r / half
    }
}
