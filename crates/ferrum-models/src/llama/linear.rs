//! Projections and embeddings in backend memory: a dense or quantized
//! matrix, Q/K/V fused or apart, an embedding table, and the fusing of
//! raw parts at load.

use ferrum_kernels::quant::dequantize;
use ferrum_kernels::{Backend, Gemm, GgufQuantType, Mat, QuantKind, QuantWeights};
use ferrum_types::{FerrumError, Result};

use super::tensors::{Bytes, Raw};

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
    pub(super) fn upload(raw: Raw, n: usize, k: usize) -> Result<Self> {
        Ok(match raw {
            Raw::F32(v) => Linear::Dense(B::from_slice(&v)),
            Raw::Blocks { bytes, ty } => Linear::Quant {
                w: B::load_gguf(&bytes, ty, n, k)?,
                kind: QuantKind::Gguf { quant_type: ty, int8_activations: false },
                order: None,
            },
            Raw::Reordered { order, inner } => match Self::upload(*inner, n, k)? {
                Linear::Quant { w, kind, .. } => Linear::Quant {
                    w,
                    kind,
                    order: Some(B::from_u32(&order)),
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
    pub(super) fn gguf_type(&self) -> Option<GgufQuantType> {
        match self {
            Linear::Quant {
                kind: QuantKind::Gguf { quant_type, .. }, ..
            } => Some(*quant_type),
            _ => None,
        }
    }

    /// Sets `QuantKind::Gguf::int8_activations` (a dense weight has none).
    pub(super) fn set_int8_input(&mut self, on: bool) {
        if let Linear::Quant {
            kind: QuantKind::Gguf { int8_activations, .. },
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
                B::gemm(ctx, x, w, out, Gemm { m, n, k });
                Ok(())
            }
            Linear::Quant { w, kind, order } => {
                let qw = QuantWeights::<B> {
                    qweight: w,
                    scales: None,
                    zeros: None,
                    g_idx: order.as_ref(),
                };
                B::gemm_quant(ctx, x, &qw, out, Gemm { m, n, k }, kind)
            }
        }
    }
}

/// Concatenates row blocks into one weight when every part has the same
/// format (all the same block type, or all f32); otherwise hands the parts
/// back.
pub(super) fn fuse(parts: Vec<(Raw, usize)>) -> std::result::Result<Raw, Vec<(Raw, usize)>> {
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
            Ok(inner) => Ok(Raw::Reordered { order, inner: Box::new(inner) }),
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
        return Ok(Raw::Blocks { bytes: bytes.into(), ty });
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
pub(super) fn fuse_or_f32(parts: Vec<(Raw, usize)>, k: usize) -> Result<Raw> {
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
            Embedding::Blocks { bytes, ty, row_bytes, scale } => {
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
                    B::add_bias(ctx, fused, b, Mat { rows: m, cols: qd + 2 * kvd });
                }
                B::split_qkv(ctx, fused, [q, k, v], m, qd, kvd);
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
                        B::add_bias(ctx, out, b, Mat { rows: m, cols: n });
                    }
                }
            }
        }
        Ok(())
    }
}
