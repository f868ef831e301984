//! The `Backend` trait: the complete op surface a model is written against.
//!
//! Layout conventions shared by every op (buffers are row-major f32 words,
//! each tagged with what its words hold: [`Dtype`]):
//! - activations are token-major `[tokens, features]`;
//! - a linear weight is `[n_out, k_in]` (PyTorch / GGUF row order), so a
//!   projection is `out[m, n] = a[m, k] · w[n, k]ᵀ`;
//! - attention works head-major: Q is `[batch, heads, q_len, head_dim]`,
//!   K/V are `[batch, kv_heads, kv_seq_stride, head_dim]`;
//! - RoPE rotates the two halves of each head (`x[i]` with `x[i + d/2]`), the
//!   Hugging Face `rotate_half` convention; `cos`/`sin` tables are
//!   `[positions, head_dim / 2]`. Loaders of GGUF `llama` checkpoints, whose
//!   Q/K rows are permuted for interleaved rotation, undo that permutation so a
//!   single rotation kernel serves every model.
//!
//! Buffers may be larger than an op needs (scratch is reused across calls);
//! each op reads and writes only the extent its size arguments describe. A
//! buffer smaller than that extent is a caller bug and panics.

use crate::dtype::Dtype;
use crate::shapes::{Gemm, Heads, Mat, Span};
use ferrum_types::{FerrumError, GgmlType, Result};

/// Which quantization scheme a [`Backend::gemm_quant`] weight uses.
///
/// One parameter instead of one trait method per format keeps the trait
/// small while each scheme still gets its own kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantKind {
    /// GPTQ: group-wise int4/int8 with per-group scales and zero points,
    /// optionally with an activation-order row permutation (`g_idx`).
    Gptq {
        bits: u32,
        group_size: usize,
        desc_act: bool,
    },
    /// AWQ: activation-aware int4 with scales and zero points, packed
    /// differently from GPTQ.
    Awq { bits: u32, group_size: usize },
    /// A GGUF block format; the sub-type fully determines the layout.
    ///
    /// `int8_activations`: the layer tolerates its input rounded to 8 bits
    /// per 32 values, a block's lone outlier (`|x| > 5 · rms`) kept exact
    /// (LLM activations spike in a few channels, and a block scaled to a
    /// spike loses its other values), so a backend with such a kernel for
    /// `quant_type` may use it where it is faster (the CPU's: the k-quants
    /// Q2_K to Q6_K, Q4_1 and Q8_0; twice the multiplies per
    /// instruction). A model sets it per
    /// layer role, where the rounding was measured not to move perplexity;
    /// elsewhere the backend's own activation precision applies. (Not in
    /// the interface this was specified from, which has the quant type
    /// alone: the precision is the model's call, the kernel the backend's.)
    Gguf {
        quant_type: GgufQuantType,
        int8_activations: bool,
    },
}

/// GGUF block formats that have `gemm_quant` kernels. Grows as kernels land.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufQuantType {
    Q4_0,
    Q4_1,
    Q4K,
    Q5K,
    Q6K,
    Q8_0,
    Q5_0,
    Q5_1,
    Q2K,
    Q3K,
    IQ4NL,
    IQ4XS,
    MXFP4,
    /// Whole-precision 16-bit weights (F16 and BF16 GGUF files): kept at
    /// two bytes a weight, where f32 would take twice the memory and the
    /// bytes read per token.
    F16,
    BF16,
}

/// Every GGUF block format with kernels, with its ggml type and its name
/// in kernel names (CUDA's `mmvq1_q6_k`) and on the command line
/// (`--random-type q6_k`): the one list a new block format joins.
const GGUF_KERNEL_TYPES: [(GgufQuantType, GgmlType, &str); 15] = {
    use GgufQuantType as Q;
    [
        (Q::Q4_0, GgmlType::Q4_0, "q4_0"),
        (Q::Q4_1, GgmlType::Q4_1, "q4_1"),
        (Q::Q5_0, GgmlType::Q5_0, "q5_0"),
        (Q::Q5_1, GgmlType::Q5_1, "q5_1"),
        (Q::Q8_0, GgmlType::Q8_0, "q8_0"),
        (Q::Q2K, GgmlType::Q2_K, "q2_k"),
        (Q::Q3K, GgmlType::Q3_K, "q3_k"),
        (Q::Q4K, GgmlType::Q4_K, "q4_k"),
        (Q::Q5K, GgmlType::Q5_K, "q5_k"),
        (Q::Q6K, GgmlType::Q6_K, "q6_k"),
        (Q::IQ4NL, GgmlType::IQ4_NL, "iq4_nl"),
        (Q::IQ4XS, GgmlType::IQ4_XS, "iq4_xs"),
        (Q::MXFP4, GgmlType::MXFP4, "mxfp4"),
        (Q::F16, GgmlType::F16, "f16"),
        (Q::BF16, GgmlType::BF16, "bf16"),
    ]
};

impl GgufQuantType {
    /// `bytes` must be exactly `n` rows of `k` values in this type's
    /// blocks (what [`Backend::load_gguf`] is given), else an error
    /// naming the sizes.
    pub fn check_weight_bytes(self, bytes: usize, n: usize, k: usize) -> Result<()> {
        let ty = self.ggml();
        let (bs, bb) = (ty.block_size(), ty.block_bytes());
        if !k.is_multiple_of(bs) || bytes != n * (k / bs) * bb {
            return Err(FerrumError::invalid(format!(
                "{bytes} bytes are not {n} rows of {k} values in {ty} blocks"
            )));
        }
        Ok(())
    }

    /// Every block format with kernels, in the table's order.
    pub fn all() -> impl Iterator<Item = Self> {
        GGUF_KERNEL_TYPES.iter().map(|e| e.0)
    }

    fn entry(self) -> &'static (GgufQuantType, GgmlType, &'static str) {
        // Every variant has exactly one row (checked by a test).
        let row = GGUF_KERNEL_TYPES.iter().find(|e| e.0 == self);
        row.unwrap_or(&GGUF_KERNEL_TYPES[0])
    }

    /// The block format of a GGUF tensor type, if it has a kernel.
    pub fn from_ggml(t: GgmlType) -> Option<Self> {
        GGUF_KERNEL_TYPES.iter().find(|e| e.1 == t).map(|e| e.0)
    }

    /// The block format named `name` (`q6_k`, any case), if it has a kernel.
    pub fn from_name(name: &str) -> Option<Self> {
        let row = GGUF_KERNEL_TYPES
            .iter()
            .find(|e| e.2.eq_ignore_ascii_case(name));
        row.map(|e| e.0)
    }

    /// The GGUF tensor type.
    pub fn ggml(self) -> GgmlType {
        self.entry().1
    }

    /// Its name in kernel names and on the command line (`q6_k`).
    pub fn name(self) -> &'static str {
        self.entry().2
    }
}

#[cfg(test)]
mod quant_table_tests {
    use super::*;

    /// A variant missing from the table would read as Q4_0.
    #[test]
    fn every_block_format_has_one_row() {
        use GgufQuantType::*;
        let variants = [
            Q4_0, Q4_1, Q4K, Q5K, Q6K, Q8_0, Q5_0, Q5_1, Q2K, Q3K, IQ4NL, IQ4XS, MXFP4, F16, BF16,
        ];
        // Adding a variant fails to compile here until it is listed.
        for v in variants {
            match v {
                Q4_0 | Q4_1 | Q4K | Q5K | Q6K | Q8_0 | Q5_0 | Q5_1 | Q2K | Q3K | IQ4NL | IQ4XS
                | MXFP4 | F16 | BF16 => {}
            }
            let rows = GGUF_KERNEL_TYPES.iter().filter(|e| e.0 == v).count();
            assert_eq!(rows, 1, "{v:?}");
            assert_eq!(GgufQuantType::from_ggml(v.ggml()), Some(v));
            assert_eq!(GgufQuantType::from_name(&v.name().to_uppercase()), Some(v));
            assert_eq!(v.name(), v.ggml().to_string().to_lowercase());
        }
        assert_eq!(GgufQuantType::all().count(), variants.len());
        assert_eq!(GgufQuantType::from_ggml(GgmlType::IQ2_XXS), None);
    }
}

/// The packed buffers of one quantized weight.
///
/// Formats that keep scales inside their blocks (all GGUF types) use only
/// `qweight`; the backend checks that the buffers it needs are present.
/// GGUF blocks travel in an ordinary buffer as raw bits, in the layout
/// [`Backend::load_gguf`] chose: the file's, unless the backend re-lays
/// them out for its kernels.
///
/// `g_idx` with a GGUF kind is an *input order* (u32 values from
/// [`Backend::from_u32`]): weight column
/// `j` multiplies input column `g_idx[j]`. An act-order GPTQ checkpoint,
/// whose groups are scattered over the input columns, is loaded with its
/// columns sorted by group so that every 32-column block has one scale;
/// the backend then reorders the activation once per GEMM (not per group),
/// and the same block kernels run it. (The interface this was specified
/// from passes GPTQ's own `g_idx` here, for kernels that read GPTQ's
/// packing; converting at load instead gives every backend those weights
/// on kernels it already has.)
pub struct QuantWeights<'a, B: Backend> {
    pub qweight: &'a B::Buffer,
    pub scales: Option<&'a B::Buffer>,
    pub zeros: Option<&'a B::Buffer>,
    pub g_idx: Option<&'a B::Buffer>,
}

/// One expert's rows of a grouped GEMM ([`Backend::gemm_quant_experts`]).
pub struct ExpertRows<'a, B: Backend> {
    pub weights: &'a B::Buffer,
    pub start: usize,
    pub rows: usize,
}

/// An input order (see [`QuantWeights`]) as f32 words bit for bit, as
/// backends store one ([`Backend::from_u32`]).
pub(crate) fn input_order(order: &[u32]) -> Vec<f32> {
    order.iter().map(|&i| f32::from_bits(i)).collect()
}

/// Packs raw bytes (a GGUF tensor's blocks) into f32 words bit for bit, for
/// `Backend::from_slice`; the tail is zero-padded to a whole word. Copying
/// f32 values never alters their bits, so backends store them unchanged.
pub fn pack_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            f32::from_bits(u32::from_le_bytes(w))
        })
        .collect()
}

/// Views packed words as the bytes [`pack_bytes`] stored.
pub fn packed_bytes(words: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding or invalid bit patterns; u8 has alignment 1;
    // the byte length is exactly 4 × the word count.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) }
}

/// Reduction applied by [`Backend::all_reduce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// Shape and masking parameters of one attention call.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnConfig {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Multiplier applied to `q·k` before the softmax (usually `1/√head_dim`).
    pub scale: f32,
    /// Rows between consecutive KV heads in the K/V buffers. `0` means the
    /// heads are packed (`kv_len` rows each); a pre-allocated cache passes its
    /// capacity so only the first `kv_len` of `kv_seq_stride` rows are read.
    pub kv_seq_stride: usize,
    /// Sliding-window size `w`: a query at absolute position `p` sees only
    /// keys at positions `j` with `p - j < w` (the `w` most recent positions,
    /// itself included), in addition to the causal bound. `0` disables it.
    pub sliding_window: usize,
    /// Gemma 2's attention logit soft-capping: scaled scores `s` become
    /// `c · tanh(s / c)` before the mask and softmax. `0` disables it.
    pub softcap: f32,
}

impl Default for AttnConfig {
    fn default() -> Self {
        Self {
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            causal: false,
            scale: 1.0,
            kv_seq_stride: 0,
            softcap: 0.0,
            sliding_window: 0,
        }
    }
}

/// One layer's K/V cache for one sequence, head-major `[kv_heads, capacity,
/// head_dim]`, of which the first `len` positions are valid.
pub struct KvCache<B: Backend> {
    pub k: B::Buffer,
    pub v: B::Buffer,
    pub len: usize,
    pub capacity: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl<B: Backend> KvCache<B> {
    /// A zeroed cache able to hold `capacity` positions.
    pub fn new(num_kv_heads: usize, capacity: usize, head_dim: usize) -> Self {
        let elems = num_kv_heads * capacity * head_dim;
        Self {
            k: B::alloc(elems),
            v: B::alloc(elems),
            len: 0,
            capacity,
            num_kv_heads,
            head_dim,
        }
    }

    /// Positions still free.
    pub fn remaining(&self) -> usize {
        self.capacity - self.len
    }
}

/// The element type a paged KV pool stores (`--kv-cache-dtype`).
///
/// f16 halves the pool's memory and the bytes a decode step reads from it,
/// which at long context are as many as the weights' (SmolLM2 at 2,048
/// positions: 94 MB of f32 K/V against 85 MB of Q4_1 weights per token).
/// Its 11-bit significand keeps K/V to a relative 2^-11, well inside what
/// attention's softmax can tell apart (llama.cpp's default is f16 too).
/// Arithmetic stays in f32: rows are widened as they are loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    #[default]
    F16,
}

impl KvDtype {
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }

    /// Bytes one element takes in the pool.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" | "half" => Ok(Self::F16),
            other => Err(format!(
                "unknown KV cache dtype '{other}': expected f16 or f32"
            )),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a backend can do beyond the ops every backend has
/// ([`Backend::capabilities`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend's name in messages (`--device`'s word for it).
    pub name: &'static str,
    /// The KV pool element types its attention reads; the first is its
    /// default.
    pub kv_dtypes: &'static [KvDtype],
    /// [`Backend::gemm_quant_experts`] and [`Backend::gather_add_rows`]
    /// run, so that a mixture-of-experts layer runs all its experts of a
    /// step in one pass. A GPU needs that: one expert's GEMV (a few rows, a
    /// short matrix) leaves most of it idle, and launches per expert cost
    /// more than the work. The CPU goes without: its per-expert GEMMs
    /// already use every core and read each expert once (running experts
    /// side by side there measured no gain, docs/perf-log.md).
    pub grouped_experts: bool,
    /// Decode steps are captured and replayed (the graph hooks below run),
    /// and [`Backend::attention`] takes a lone decoding sequence through
    /// the row ops, so that a step's launches depend on the batch size
    /// alone.
    pub graphs: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            name: "this backend",
            kv_dtypes: &[KvDtype::F32],
            grouped_experts: false,
            graphs: false,
        }
    }
}

impl Capabilities {
    /// The KV element type to use when `asked` (None: the backend's
    /// default), or an error naming the types this backend reads.
    pub fn kv_dtype(&self, asked: Option<KvDtype>) -> Result<KvDtype> {
        let Some(dtype) = asked else {
            return Ok(self.kv_dtypes.first().copied().unwrap_or(KvDtype::F32));
        };
        if self.kv_dtypes.contains(&dtype) {
            return Ok(dtype);
        }
        let names: Vec<&str> = self.kv_dtypes.iter().map(|d| d.name()).collect();
        Err(FerrumError::unsupported(format!(
            "an {dtype} KV cache is not supported on {} (its attention reads {}); \
             choose one of those or leave the KV cache type unset",
            self.name,
            names.join(" or ")
        )))
    }
}

/// Where one sequence's K/V live in a paged pool. Pools are laid out
/// `[blocks, kv_heads, block_size, head_dim]`, so a block of one head is a
/// contiguous run and a whole block (every head) is one range that
/// copy-on-write can copy with a single `copy_slice`. Position `p` is slot
/// `p % block_size` of block `block_table[p / block_size]`.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    pub block_table: &'a [u32],
    pub block_size: usize,
}

impl PagedKv<'_> {
    /// Offset in a pool of position `pos` of KV head `head`.
    #[inline]
    pub fn offset(&self, pos: usize, head: usize, nkv: usize, hd: usize) -> usize {
        let block = self.block_table[pos / self.block_size] as usize;
        ((block * nkv + head) * self.block_size + pos % self.block_size) * hd
    }

    /// Floats in one block of a pool (every head).
    pub fn block_len(&self, nkv: usize, hd: usize) -> usize {
        nkv * self.block_size * hd
    }
}

/// One sequence's part of a [`Backend::paged_attention_segments`] call.
#[derive(Clone, Copy, Debug)]
pub struct AttnSegment<'a> {
    /// Its K/V pages.
    pub pages: PagedKv<'a>,
    /// Where its head-major queries `[heads, q_len, head_dim]` start in the
    /// call's `q`, and its output in `out` (elements).
    pub offset: usize,
    /// Its queries (new tokens), keys in its cache including them, and the
    /// position of its first query: as in [`Backend::paged_attention`].
    pub q_len: usize,
    pub kv_len: usize,
    pub pos_offset: usize,
}

/// What [`Backend::qk_norm_rope`] does to each head on its way from
/// token-major to head-major, with what that step reads. Each input lives
/// in the variant that reads it (a norm weight only in `NormRope`), where
/// loose arguments needed "ignored unless" rules and dummies at call sites.
pub enum QkOp<'a, B: Backend> {
    /// Only the transpose (V, BERT's Q and K).
    Transpose,
    /// RoPE with the tables `cos`/`sin` (Q/K of Llama, Mistral, Qwen2).
    Rope {
        cos: &'a B::Buffer,
        sin: &'a B::Buffer,
    },
    /// Per-head RMS norm with `weight[head_dim]` and `eps`, then RoPE (Q/K
    /// of models with QK-norm such as Qwen3 and Gemma 3).
    NormRope {
        weight: &'a B::Buffer,
        eps: f32,
        cos: &'a B::Buffer,
        sin: &'a B::Buffer,
    },
}

// By hand: a derive would ask `B: Copy`, where only references are copied.
impl<B: Backend> Clone for QkOp<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for QkOp<'_, B> {}

impl<'a, B: Backend> QkOp<'a, B> {
    /// The kernels' view: the mode, norm weight, RoPE tables and epsilon.
    /// Kernels take every operand whatever the mode, so `unused` (any live
    /// buffer, never read) stands in for what this op does not read.
    pub fn operands(
        &self,
        unused: &'a B::Buffer,
    ) -> (QkMode, &'a B::Buffer, [&'a B::Buffer; 2], f32) {
        match *self {
            Self::Transpose => (QkMode::Transpose, unused, [unused, unused], 0.0),
            Self::Rope { cos, sin } => (QkMode::Rope, unused, [cos, sin], 0.0),
            Self::NormRope { weight, eps, cos, sin } => (QkMode::NormRope, weight, [cos, sin], eps),
        }
    }
}

/// How one attention layer prepares its Q and K: the optional per-head
/// norm (Qwen3, Gemma 3), then RoPE with the layer's tables (a sliding
/// layer may have its own). V is only transposed.
pub struct QkPrep<'a, B: Backend> {
    pub norm: Option<QkNorm<'a, B>>,
    pub cos: &'a B::Buffer,
    pub sin: &'a B::Buffer,
}

/// Q's and K's per-head RMS norm weights, and its epsilon.
pub struct QkNorm<'a, B: Backend> {
    pub q: &'a B::Buffer,
    pub k: &'a B::Buffer,
    pub eps: f32,
}

impl<B: Backend> Clone for QkPrep<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for QkPrep<'_, B> {}

impl<B: Backend> Clone for QkNorm<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for QkNorm<'_, B> {}

impl<'a, B: Backend> QkPrep<'a, B> {
    /// What Q goes through.
    pub fn q(&self) -> QkOp<'a, B> {
        self.op(self.norm.map(|n| (n.q, n.eps)))
    }

    /// What K goes through.
    pub fn k(&self) -> QkOp<'a, B> {
        self.op(self.norm.map(|n| (n.k, n.eps)))
    }

    fn op(&self, norm: Option<(&'a B::Buffer, f32)>) -> QkOp<'a, B> {
        let (cos, sin) = (self.cos, self.sin);
        match norm {
            Some((weight, eps)) => QkOp::NormRope { weight, eps, cos, sin },
            None => QkOp::Rope { cos, sin },
        }
    }
}

/// The kernels' name for a [`QkOp`] (the seed passes the mode as an `i32`;
/// an enum makes an unknown mode unrepresentable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum QkMode {
    /// Only the transpose (V).
    Transpose = 0,
    /// Per-head RMS norm with weight `norm_w[head_dim]`, then RoPE (Q/K of
    /// models with QK-norm such as Qwen3 and Gemma 3).
    NormRope = 1,
    /// RoPE only (Q/K of Llama, Mistral, Qwen2).
    Rope = 2,
}

/// The device abstraction: buffers, an execution context and every op a
/// model needs.
///
/// Ops record work into a [`Backend::Context`]: on CPU the context is `()`
/// and ops run immediately; on a GPU it is a stream and ops are launches that
/// complete by [`Backend::sync`]. Model code threads one context through a
/// whole forward pass and syncs only when it must read results.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A device buffer of f32 words, tagged with what they hold
    /// ([`Backend::dtype`]).
    type Buffer: Send + Sync;

    /// Where work accumulates until `sync` (CPU: `()`, CUDA: a stream).
    type Context;

    /// Starts a new context.
    fn new_context() -> Self::Context;

    /// Waits until everything recorded in `ctx` has completed.
    fn sync(ctx: &mut Self::Context);

    /// The first failure of an op on `ctx` since the last call, if any. Op
    /// signatures are infallible (as the seed has them) and a GPU reports
    /// failures asynchronously anyway, so a backend that can fail records
    /// the first failure, skips the context's later ops and reports it
    /// here; callers check after [`Backend::sync`]. (Not in the seed.)
    /// Default: the backend's ops cannot fail.
    fn take_error(_ctx: &mut Self::Context) -> Result<()> {
        Ok(())
    }

    // ── Graph capture (decode-step replay; GPU backends only) ─────────────
    //
    // A decode step is the same launch sequence every token, so a GPU backend
    // captures it once and replays it, removing per-launch overhead. The loop
    // (the model's, for an all-decode batch): look the tokens up; then
    // `set_decode_state` writes the step's positions, lengths and block
    // tables to device memory; `replay_graph(key)`; if it returns `Ok(false)`,
    // `begin_graph_capture(key)`, the step's ops, `end_graph_capture`, and
    // `replay_graph(key)` to run it. Where capture is unsupported or turned
    // off (`Err`), the same ops run eagerly: output is the same either way.
    //
    // Against the seed: `set_decode_state` takes the batch's segments, not
    // one token and step (the token ids are looked up before the captured
    // part: quantized tables are read on the host); graphs are kept per key
    // (a server's batches change size), not as one "last graph"; and the
    // seed's `set_dev_state_mode` is gone, because the ops such a step uses
    // (`decode_rows_qkv`, `paged_attention_segments`) always read their
    // per-step values from device memory.

    /// What the backend can do beyond the ops every backend has: the KV
    /// element types its attention reads, grouped experts, captured steps.
    /// (Not in the seed, whose models read per-op flags; asking once keeps
    /// the choices in one place and lets a caller refuse, with a clear
    /// error, what a device cannot do.) The default: f32 KV only, nothing
    /// more.
    fn capabilities() -> Capabilities {
        Capabilities::default()
    }

    /// Copies a decode step's per-sequence state (positions, lengths, block
    /// tables: the segments its attention ops will be given, with `cfg`) to
    /// device memory, where a replayed step reads it, and grows what the
    /// step's ops will need (a capture cannot allocate).
    fn set_decode_state(_ctx: &mut Self::Context, _segs: &[AttnSegment], _cfg: &AttnConfig) {}

    /// Starts recording launches into a graph to be kept under `key`.
    fn begin_graph_capture(_ctx: &mut Self::Context, _key: u64) -> Result<()> {
        Err(FerrumError::unsupported("graph capture not supported"))
    }

    /// Stops recording and keeps the graph under the key capture began
    /// with.
    fn end_graph_capture(_ctx: &mut Self::Context) -> Result<()> {
        Err(FerrumError::unsupported("graph capture not supported"))
    }

    /// Replays the graph kept under `key`; `Ok(false)` when there is none
    /// (never captured, or dropped because a buffer it used was replaced).
    fn replay_graph(_ctx: &mut Self::Context, _key: u64) -> Result<bool> {
        Ok(false)
    }

    /// Forgets every captured graph. Must be called before buffers a graph
    /// was captured against are freed or replaced: it holds their
    /// addresses.
    fn reset_graph(_ctx: &mut Self::Context) {}

    // ── Dense GEMM ────────────────────────────────────────────────────────

    /// `out[m, n] = a[m, k] · b[n, k]ᵀ` (b is a linear weight).
    fn gemm(
        ctx: &mut Self::Context,
        a: &Self::Buffer,
        b: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Gemm,
    );

    // ── Norms ─────────────────────────────────────────────────────────────

    /// `out[t] = x[t] / rms(x[t]) * w` for each row `t` of `x`.
    fn rms_norm(
        ctx: &mut Self::Context,
        x: &Self::Buffer,
        w: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    );

    /// `residual += x`, then `out = rms_norm(residual)`: the pre-norm
    /// transformer's residual update and next norm in one pass.
    fn fused_add_rms_norm(
        ctx: &mut Self::Context,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    );

    // ── Attention ─────────────────────────────────────────────────────────

    /// Softmax attention, `out[b, h, i] = Σ_j softmax(scale · q·k_j) v_j`.
    ///
    /// Query `i` sits at absolute position `pos_offset + i`; with `causal`
    /// it sees keys `j <= pos_offset + i`, further limited by
    /// `cfg.sliding_window`. Query head `h` reads KV head
    /// `h / (num_heads / num_kv_heads)` (grouped-query attention).
    fn flash_attention(
        ctx: &mut Self::Context,
        q: &Self::Buffer,
        kv: [&Self::Buffer; 2],
        out: &mut Self::Buffer,
        batch: usize,
        span: Span,
        cfg: &AttnConfig,
    );

    /// The KV block size models use on this backend when none is
    /// configured, for sequences of at most `capacity` positions. The
    /// default, one block per sequence, suits backends that run the generic
    /// gather path below (one copy per KV head and layer, not one per
    /// block); backends with paged kernels return a small block size.
    fn kv_block_size(capacity: usize) -> usize {
        capacity.max(1)
    }

    /// One layer's attention for a whole batch: the one attention call a
    /// model makes. Each segment's token-major Q/K/V rows (`layer.q`, from
    /// row `s.offset / (nh · hd)`) get `layer.mode` (QK norm, RoPE at
    /// positions `s.pos_offset..`), its new K/V go into its pages of
    /// `layer.k_pool`/`v_pool`, and its attention output lands token-major
    /// at `s.offset` of `out`. How is the backend's choice (a
    /// [`crate::AttnPlan`]: per sequence, rows at once, segmented calls),
    /// so a model never asks which kernels a backend has. (Not in the
    /// seed, whose models called the per-step ops themselves.) The default
    /// runs every sequence through the ops any backend has.
    fn attention(
        ctx: &mut Self::Context,
        layer: crate::AttnLayer<'_, Self>,
        segs: &[AttnSegment],
        scratch: &mut crate::AttnScratch<Self>,
        out: &mut Self::Buffer,
    ) {
        let plan = crate::AttnPlan::PER_SEQUENCE;
        crate::batch_attention::run::<Self>(ctx, layer, segs, scratch, out, plan);
    }

    /// [`Backend::flash_attention`] for one sequence whose K/V live in a
    /// paged pool (see [`PagedKv`]): `q` is `[heads, q_len, head_dim]`, keys
    /// `0..kv_len` are read through the block table, `cfg.kv_seq_stride` is
    /// ignored. The default gathers the pages into contiguous buffers and
    /// calls `flash_attention`: exact on any backend, one extra copy of the
    /// context per call; backends with a paged kernel override it.
    fn paged_attention(
        ctx: &mut Self::Context,
        q: &Self::Buffer,
        pools: [&Self::Buffer; 2],
        pages: &PagedKv,
        out: &mut Self::Buffer,
        span: Span,
        cfg: &AttnConfig,
    ) {
        crate::paged::gather_attention::<Self>(ctx, q, pools, pages, out, span, cfg);
    }

    /// [`Backend::paged_attention`] for several sequences in one call, each
    /// segment's queries and output at its own offset of `q` and `out`
    /// (segments in order, not overlapping). A decode batch is one query
    /// per sequence: one call lets a CPU spread every (sequence, KV head)
    /// task of a layer over its cores in one parallel step, where one call
    /// per sequence paid a fork and join for a few microseconds of work
    /// each and left cores idle (3 KV heads on 2 cores). The default runs
    /// `paged_attention` per segment through copies into temporaries.
    fn paged_attention_segments(
        ctx: &mut Self::Context,
        q: &Self::Buffer,
        pools: [&Self::Buffer; 2],
        segs: &[AttnSegment],
        out: &mut Self::Buffer,
        cfg: &AttnConfig,
    ) {
        let [k_pool, v_pool] = pools;
        for s in segs {
            let len = cfg.num_heads * s.q_len * cfg.head_dim;
            let (mut sq, mut so) = (Self::alloc(len), Self::alloc(len));
            Self::copy_slice(ctx, q, s.offset, &mut sq, 0, len);
            Self::paged_attention(
                ctx,
                &sq,
                [k_pool, v_pool],
                &s.pages,
                &mut so,
                Span {
                    q_len: s.q_len,
                    kv_len: s.kv_len,
                    pos_offset: s.pos_offset,
                },
                cfg,
            );
            Self::copy_slice(ctx, &so, 0, out, s.offset, len);
        }
    }

    // ── Data movement ─────────────────────────────────────────────────────

    /// `dst[dst_offset..][..len] = src[src_offset..][..len]`, e.g. to pick the
    /// last token's hidden state out of a prefill without a host round trip.
    /// Offsets and lengths count values, also in KV pools from
    /// [`Backend::alloc_kv`], and a copy between an f16 pool and an f32
    /// buffer converts.
    fn copy_slice(
        ctx: &mut Self::Context,
        src: &Self::Buffer,
        src_offset: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        len: usize,
    );

    /// `out[i] = table[ids[i]]` for a `[vocab, dim]` table. Callers validate
    /// ids against the vocabulary first; an id out of range is a bug.
    fn embedding_lookup(
        ctx: &mut Self::Context,
        table: &Self::Buffer,
        ids: &[u32],
        out: &mut Self::Buffer,
        dim: usize,
    );

    /// Splits a fused `[tokens, q_dim + 2·kv_dim]` projection into Q
    /// `[tokens, q_dim]`, K and V `[tokens, kv_dim]`.
    fn split_qkv(
        ctx: &mut Self::Context,
        qkv: &Self::Buffer,
        out: [&mut Self::Buffer; 3],
        tokens: usize,
        q_dim: usize,
        kv_dim: usize,
    );

    /// `out[t, i] = silu(gate_up[t, i]) · gate_up[t, im + i]`: the SwiGLU
    /// activation over a fused `[tokens, 2·im]` gate/up projection, `out`
    /// being `shape = [tokens, im]`.
    fn fused_silu_mul_split(
        ctx: &mut Self::Context,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Mat,
    );

    /// `out[t, i] = gelu_tanh(gate_up[t, i]) · gate_up[t, im + i]`: GeGLU
    /// with the tanh approximation of GELU (Gemma's `gelu_pytorch_tanh`).
    /// Not in the original seed; the second gated activation models use,
    /// with the same shape contract as `fused_silu_mul_split`.
    fn fused_gelu_tanh_mul_split(
        ctx: &mut Self::Context,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Mat,
    );

    /// Prepares Q, K or V for attention: token-major `[tokens, heads,
    /// head_dim]` in, head-major `[heads, tokens, head_dim]` out, through
    /// `op` on the way (see [`QkOp`]). Token `i` is at position
    /// `pos_offset + i`.
    fn qk_norm_rope(
        ctx: &mut Self::Context,
        input: &Self::Buffer,
        op: QkOp<'_, Self>,
        output: &mut Self::Buffer,
        shape: Heads,
        pos_offset: usize,
    );

    /// Writes `new_tokens` head-major K/V rows (`[nkv, new_tokens, hd]`) at
    /// positions `pos..pos + new_tokens` of a paged pool. The caller has
    /// reserved the blocks. The default copies one run per (head, block).
    fn paged_kv_append(
        ctx: &mut Self::Context,
        pools: [&mut Self::Buffer; 2],
        pages: &PagedKv,
        pos: usize,
        new: [&Self::Buffer; 2],
        shape: Heads,
    ) {
        let Heads {
            tokens: new_tokens,
            heads: nkv,
            head_dim: hd,
        } = shape;
        let [new_k_head_major, new_v_head_major] = new;
        let [k_pool, v_pool] = pools;
        crate::paged::copy_append::<Self>(
            ctx,
            k_pool,
            v_pool,
            pages,
            pos,
            new_k_head_major,
            new_v_head_major,
            new_tokens,
            nkv,
            hd,
        );
    }

    /// Q, K and V of a decode batch (one new token per sequence) prepared
    /// in one call: what `qk_norm_rope` and `paged_kv_append` do per
    /// sequence. Segment `s`'s token is row `r = s.offset / (nh · hd)` of
    /// the token-major `q` (`[rows, nh · hd]`), `k` and `v` (`[rows, nkv ·
    /// hd]`), at position `s.pos_offset` (`q_len` must be 1). Its Q goes
    /// through `prep.q()` into `q_out` at `s.offset` (one token's head-major
    /// rows are its row), its K through `prep.k()` and its V unchanged into
    /// its pages at that position.
    ///
    /// Why one call: per sequence and layer this was nine small calls
    /// (three copies out of the batch, three `qk_norm_rope`, one append,
    /// two copies around attention); SmolLM2's batch of 8 made 2,160 of
    /// them a step. One call a layer leaves the rotations and the pool
    /// writes and drops the copies and the calls' own cost (about 2% of
    /// that step on a Zen 4, `ferrum bench --profile`); on a backend that
    /// launches a kernel per call, it is 30 launches instead of 2,160.
    /// The default is those per-sequence calls, through temporaries.
    fn decode_rows_qkv(
        ctx: &mut Self::Context,
        qkv: [&Self::Buffer; 3],
        prep: QkPrep<'_, Self>,
        q_out: &mut Self::Buffer,
        pools: [&mut Self::Buffer; 2],
        segs: &[AttnSegment],
        cfg: &AttnConfig,
    ) {
        crate::paged::rows_by_parts::<Self>(ctx, qkv, prep, q_out, pools, segs, cfg);
    }

    /// `[heads, tokens, dim]` → `[tokens, heads, dim]`, to bring attention
    /// output back to token-major for the output projection.
    fn transpose_head_to_token(
        ctx: &mut Self::Context,
        src: &Self::Buffer,
        dst: &mut Self::Buffer,
        shape: Heads,
    );

    // ── Element-wise ──────────────────────────────────────────────────────

    /// `residual[i] += x[i]` for `i < len`.
    fn add_inplace(
        ctx: &mut Self::Context,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        len: usize,
    );

    /// `dst[rows[i], :] += weights[i] · src[i, :]` for each of `rows.len()`
    /// rows of `dim` values: a mixture-of-experts layer adds each expert's
    /// output rows, weighted by the router, back to the tokens they came
    /// from. `rows` holds distinct indices (a token goes to an expert once).
    fn scale_add_rows(
        ctx: &mut Self::Context,
        src: &Self::Buffer,
        rows: &[u32],
        weights: &[f32],
        dst: &mut Self::Buffer,
        dim: usize,
    );

    /// `data[r, c] += bias[c]` (biased projections: BERT, Qwen2's QKV).
    fn add_bias(ctx: &mut Self::Context, data: &mut Self::Buffer, bias: &Self::Buffer, shape: Mat);

    /// LayerNorm over the last dimension:
    /// `out = (x - mean) / sqrt(var + eps) · gamma + beta` (biased variance).
    fn layer_norm(
        ctx: &mut Self::Context,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        beta: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    );

    /// Exact (erf) GELU, PyTorch's default: `x · Φ(x)`.
    fn gelu(ctx: &mut Self::Context, x: &Self::Buffer, out: &mut Self::Buffer, len: usize);

    // ── Buffers ───────────────────────────────────────────────────────────

    /// A zero-filled buffer of `len` values.
    fn alloc(len: usize) -> Self::Buffer;

    /// A zero-filled paged KV pool of `len` values stored as `dtype`, one
    /// of [`Capabilities::kv_dtypes`] (callers check first:
    /// [`Capabilities::kv_dtype`]). The default stores f32, the one type
    /// the default capabilities name.
    fn alloc_kv(len: usize, dtype: KvDtype) -> Self::Buffer {
        debug_assert!(Self::capabilities().kv_dtypes.contains(&dtype));
        Self::alloc(len)
    }
    /// Copies the first `len` values to the host.
    fn to_vec(buf: &Self::Buffer, len: usize) -> Vec<f32>;
    /// A buffer holding a copy of `data`.
    fn from_slice(data: &[f32]) -> Self::Buffer;

    /// A buffer holding `data` as u32 values ([`Dtype::U32`]): an input
    /// order for [`QuantWeights::g_idx`]. (Not in the seed, which packs
    /// such values into an f32 buffer; the tag lets `gemm_quant` refuse
    /// an order made of values.)
    fn from_u32(data: &[u32]) -> Self::Buffer;

    /// What `buf`'s words hold, as the call that made it tagged them:
    /// `alloc`/`from_slice` f32, `alloc_kv` its dtype, `from_u32` u32,
    /// `load_gguf` blocks (repacked where the backend re-lays them out).
    /// (Not in the seed, whose buffers are untyped f32; ops that take
    /// weights or orders check the tag, so no op reads one layout as
    /// another.)
    fn dtype(buf: &Self::Buffer) -> Dtype;

    /// Copies the first `out.len()` values to the host into `out`: the
    /// allocation-free [`Backend::to_vec`], for per-token reads (logits).
    /// Default: through `to_vec`.
    fn read_into(buf: &Self::Buffer, out: &mut [f32]) {
        out.copy_from_slice(&Self::to_vec(buf, out.len()));
    }

    /// Writes host values `data` into `dst` at `offset` (per-token uploads
    /// such as looked-up embedding rows) without a new buffer where the
    /// backend can. Default: through `from_slice` and `copy_slice`.
    fn write_from(ctx: &mut Self::Context, data: &[f32], dst: &mut Self::Buffer, offset: usize) {
        Self::copy_slice(ctx, &Self::from_slice(data), 0, dst, offset, data.len());
    }

    // ── Quantized GEMM ────────────────────────────────────────────────────

    /// Prepares one GGUF weight (`n` rows of `k` values in `quant_type`
    /// blocks, `bytes` as in the file) for [`Backend::gemm_quant`], once at
    /// load. A backend may re-lay the blocks out for its kernels (the CPU
    /// interleaves rows), so such a buffer is only meaningful to
    /// `gemm_quant`; the default keeps the file's bytes (see [`pack_bytes`]).
    fn load_gguf(
        bytes: &[u8],
        quant_type: GgufQuantType,
        n: usize,
        k: usize,
    ) -> Result<Self::Buffer> {
        quant_type.check_weight_bytes(bytes.len(), n, k)?;
        Ok(Self::from_slice(&pack_bytes(bytes)))
    }

    /// `out[m, n] = a[m, k] · dequant(w)[n, k]ᵀ` with `w` packed as `kind`.
    /// Backends implement the kinds they have kernels for; the rest report
    /// `Unsupported` rather than computing something wrong.
    fn gemm_quant(
        _ctx: &mut Self::Context,
        _a: &Self::Buffer,
        _weights: &QuantWeights<'_, Self>,
        _out: &mut Self::Buffer,
        _shape: Gemm,
        kind: &QuantKind,
    ) -> Result<()> {
        Err(FerrumError::unsupported(format!(
            "gemm_quant({kind:?}) is not implemented for this backend"
        )))
    }

    /// A grouped GEMM over experts: for each group, rows
    /// `start..start + rows` of `out[·, n]` = the same rows of `a[·, k]` ·
    /// `dequant(weights)[n, k]ᵀ`, where every group's weights are GGUF
    /// `quant_type` blocks from [`Backend::load_gguf`]. Groups do not
    /// overlap; rows outside them are left as they are.
    fn gemm_quant_experts(
        _ctx: &mut Self::Context,
        _a: &Self::Buffer,
        _groups: &[ExpertRows<'_, Self>],
        _out: &mut Self::Buffer,
        _n: usize,
        _k: usize,
        quant_type: GgufQuantType,
    ) -> Result<()> {
        Err(FerrumError::unsupported(format!(
            "gemm_quant_experts({quant_type:?}) is not implemented for this backend"
        )))
    }

    /// `dst[t, :] += Σ_j weights[t·per + j] · src[rows[t·per + j], :]` for
    /// each of `rows.len() / per` tokens, `j` in order: adds every token's
    /// `per` expert outputs (rows of a grouped GEMM's output) back, weighted
    /// by the router, in one pass and without atomics, so the sum's order
    /// is fixed.
    fn gather_add_rows(
        _ctx: &mut Self::Context,
        _src: &Self::Buffer,
        _rows: &[u32],
        _weights: &[f32],
        _dst: &mut Self::Buffer,
        _per: usize,
        _dim: usize,
    ) -> Result<()> {
        Err(FerrumError::unsupported(
            "gather_add_rows is not implemented for this backend",
        ))
    }

    // ── Tensor-parallel collectives ───────────────────────────────────────
    //
    // Single-rank defaults: one process owns the whole model, so every
    // collective is the identity and model code may call them
    // unconditionally at no cost. Status: every backend today runs at world
    // size 1 with these identities; a multi-GPU backend overrides them.

    /// Number of ranks sharing the model.
    fn world_size(_ctx: &Self::Context) -> usize {
        1
    }
    /// This rank's index.
    fn rank(_ctx: &Self::Context) -> usize {
        0
    }
    /// Reduces `buf[..len]` across ranks in place.
    fn all_reduce(_ctx: &mut Self::Context, _buf: &mut Self::Buffer, _len: usize, _op: ReduceOp) {}
    /// Concatenates every rank's `local[..local_len]` into `global`. With one
    /// rank that is a plain copy, so callers need no single-rank special case.
    fn all_gather(
        ctx: &mut Self::Context,
        local: &Self::Buffer,
        global: &mut Self::Buffer,
        local_len: usize,
    ) {
        Self::copy_slice(ctx, local, 0, global, 0, local_len);
    }
    /// Copies `buf[..len]` from `src_rank` to every rank.
    fn broadcast(_ctx: &mut Self::Context, _buf: &mut Self::Buffer, _len: usize, _src_rank: usize) {
    }
}
