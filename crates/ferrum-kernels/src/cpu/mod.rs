//! The CPU backend: f32 activations, all cores through rayon's global pool,
//! AVX2/FMA kernels chosen at run time with scalar fallbacks.

/// Runs `$e` with the const `$M` equal to the activation row count `$m`
/// (1..=8), so each count gets its own compiled kernel whose loops unroll
/// and whose accumulators stay in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! by_m {
    ($m:expr, $M:ident => $e:expr) => {{
        match $m {
            1 => { const $M: usize = 1; $e }
            2 => { const $M: usize = 2; $e }
            3 => { const $M: usize = 3; $e }
            4 => { const $M: usize = 4; $e }
            5 => { const $M: usize = 5; $e }
            6 => { const $M: usize = 6; $e }
            7 => { const $M: usize = 7; $e }
            _ => { const $M: usize = 8; $e }
        }
    }};
}

mod act_quant;
mod act_tiles;
mod activation;
mod attention;
mod awake;
mod denormals;
mod features;
mod gptq;
#[cfg(target_arch = "x86_64")]
#[path = "x86/int_dot.rs"]
mod int_dot;
#[cfg(target_arch = "aarch64")]
#[path = "arm/int_dot.rs"]
mod int_dot;
mod interleaved;
mod kquant_rows;
mod layout;
mod matmul;
mod norm;
mod outliers;
pub mod profile;
mod quant_gemm;
mod rope;
pub(crate) mod simd;

use std::ops::{Deref, DerefMut};

use ferrum_types::{FerrumError, Result};
use half::f16;
use profile::Op;
use rayon::prelude::*;
use simd::Elem;

pub use gptq::CpuGptqWeight;

use crate::batch_attention::{self, AttnLayer, AttnPlan, AttnScratch};
use crate::seed_ops::SeedOps;
use crate::shapes::{Gemm, Heads, Mat, Span};
use crate::{
    packed_bytes, AttnConfig, AttnSegment, Backend, Capabilities, Dtype, GgufQuantType, KvDtype,
    PagedKv, QkOp, QkPrep, QuantKind, QuantWeights,
};

/// Element-wise work below this many values stays on the calling thread:
/// waking the pool costs more than it saves (decode-sized rows).
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 14;

/// Runs `f(row_index, row)` over the `dim`-wide rows of `out`, in parallel
/// when the work is large enough to pay for it.
pub(crate) fn rows_mut(out: &mut [f32], dim: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    rows_mut_from(PAR_MIN_ELEMS, out, dim, f);
}

/// [`rows_mut`], in parallel from `min_elems` values on (a lower bound
/// for work heavier per value than a copy or an add).
pub(crate) fn rows_mut_from(
    min_elems: usize,
    out: &mut [f32],
    dim: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if dim == 0 {
        return;
    }
    if out.len() >= min_elems && out.len() > dim {
        out.par_chunks_mut(dim)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    } else {
        out.chunks_mut(dim).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// `dst.copy_from_slice(src)`, split over the pool's threads when it is
/// large: a decode batch's logits (eight rows of a 49-152k vocabulary,
/// 1.5-4.9 MB) are read out every step, which on one thread left the
/// others idle for about 1.5% of a SmolLM2 batch-8 step.
fn copy_par(src: &[f32], dst: &mut [f32]) {
    const CHUNK: usize = 1 << 15;
    if src.len() >= 2 * CHUNK {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| d.copy_from_slice(s));
    } else {
        dst.copy_from_slice(src);
    }
}

/// A raw output pointer handed to parallel tasks that each write a disjoint
/// region; the code creating it proves disjointness at the use site.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(pub(crate) *mut f32);

impl SyncPtr {
    /// The pointer; a method so closures capture the whole (Send) wrapper.
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: only used for disjoint writes, see above.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

/// The vector instruction set the CPU kernels use on this machine
/// (`"avx2+fma+vnni"` for AVX-512 VNNI, `"avx2+fma+avx-vnni"`,
/// `"avx2+fma"`, `"neon+dotprod+i8mm"`, `"neon+dotprod"`, `"neon"` or
/// `"scalar"`), for logs and `ferrum system-info`.
pub fn simd_level() -> &'static str {
    use features::*;
    match (
        has_avx2(),
        has_vnni(),
        has_neon(),
        has_dotprod(),
        has_i8mm(),
    ) {
        (true, true, ..) => "avx2+fma+vnni",
        (true, false, ..) if has_avx_vnni() => "avx2+fma+avx-vnni",
        (true, false, ..) => "avx2+fma",
        (_, _, true, true, true) => "neon+dotprod+i8mm",
        (_, _, true, true, false) => "neon+dotprod",
        (_, _, true, false, _) => "neon",
        _ => "scalar",
    }
}

/// Whether `gemm_quant` with `ty` weights (loaded by [`Backend::load_gguf`])
/// honours `QuantKind::Gguf::int8_activations` on this CPU: 8-bit values
/// per 32, with the scale `max|x| / 127`, rounded half to even.
pub fn takes_int8_activations(ty: crate::GgufQuantType) -> bool {
    interleaved::takes_act8(ty.ggml()) || kquant_rows::supports(ty.ggml())
}

/// The activation group size when `gemm_quant` with `ty` weights (loaded
/// by [`Backend::load_gguf`]) quantizes the activations
/// ([`crate::quant::act`]) and uses integer dot products on this CPU;
/// `None` where it computes in f32.
pub fn integer_activation_group(ty: crate::GgufQuantType) -> Option<usize> {
    (interleaved::supports(ty.ggml()) || kquant_rows::supports(ty.ggml())).then_some(32)
}

/// Worker threads the CPU kernels split work over: the current rayon pool's
/// (`RAYON_NUM_THREADS`, or one per core, unless [`on_pool`] chose).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// Runs `f` on a worker of a new rayon pool of `threads` threads (default:
/// `RAYON_NUM_THREADS`, or one per core), whose threads flush subnormal
/// floats to zero (`denormals`: Intel cores slow down on them).
///
/// A model's forward pass is hundreds of small parallel ops. Started from a
/// thread outside the pool, each op is handed to sleeping workers and the
/// caller blocks; started from a pool worker, the caller takes part in the
/// op and the others are already spinning, which makes decode markedly
/// faster on few cores (`docs/perf-log.md`), so drivers of the model (the
/// CLI commands, the server's model thread) run inside one.
pub fn on_pool<R: Send>(
    threads: Option<usize>,
    f: impl FnOnce() -> R + Send,
) -> ferrum_types::Result<R> {
    let mut b = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("ferrum-cpu-{i}"));
    if let Some(t) = threads {
        b = b.num_threads(t);
    }
    let pool = b
        .build()
        .map_err(|e| ferrum_types::FerrumError::Device(format!("cannot start CPU threads: {e}")))?;
    pool.broadcast(|_| {
        attention::reserve_scratch();
        denormals::flush_on_this_thread();
    });
    Ok(pool.install(|| {
        let _spinners = awake::Spinners::start();
        f()
    }))
}

/// A host buffer of 32-bit words and what they hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuBuffer {
    data: Vec<f32>,
    dtype: Dtype,
}

impl CpuBuffer {
    /// Takes ownership of `data` (f32 values) without copying.
    pub fn from_vec(data: Vec<f32>) -> Self {
        Self { data, dtype: Dtype::F32 }
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn is_f16(&self) -> bool {
        self.dtype == Dtype::F16
    }

    /// Gives the values back.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// The values of an f16 buffer.
    fn halves(&self) -> &[f16] {
        debug_assert!(self.is_f16());
        // SAFETY: `f16` is a `repr(transparent)` u16, so any bits are a
        // value, its alignment (2) divides f32's, and the words' bytes are
        // exactly `2 × len` of them.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast(), 2 * self.data.len()) }
    }

    fn halves_mut(&mut self) -> &mut [f16] {
        debug_assert!(self.is_f16());
        // SAFETY: as in `halves`; the borrow is unique.
        unsafe {
            std::slice::from_raw_parts_mut(self.data.as_mut_ptr().cast(), 2 * self.data.len())
        }
    }
}

impl Deref for CpuBuffer {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data
    }
}

impl DerefMut for CpuBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

/// The CPU implementation of [`Backend`]. Ops run inline; the context is `()`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;
    type Context = ();

    fn new_context() -> Self::Context {}

    fn sync(_ctx: &mut Self::Context) {}

    /// GGUF block formats; GPTQ and AWQ go through `load_gptq` / `gemm_gptq`.
    fn gemm_quant(
        _ctx: &mut Self::Context,
        a: &Self::Buffer,
        weights: &QuantWeights<'_, Self>,
        out: &mut Self::Buffer,
        shape: Gemm,
        kind: &QuantKind,
    ) -> Result<()> {
        let Gemm { m, n, k } = shape;
        let _profile = profile::span(Op::GemmQuant);
        let _awake = awake::keep_awake();
        match kind {
            QuantKind::Gguf { quant_type, int8_activations } => {
                let run = |a: &[f32], out: &mut [f32]| {
                    quant_gemm::gemm_gguf(
                        a,
                        packed_bytes(weights.qweight),
                        quant_type.ggml(),
                        weights.qweight.dtype,
                        *int8_activations,
                        out,
                        m,
                        n,
                        k,
                    )
                };
                match weights.g_idx {
                    None => run(a, out),
                    Some(order) => {
                        order.dtype.check_order("gemm_quant")?;
                        layout::with_reordered(a, order, m, k, |a| run(a, out))
                    }
                }
            }
            other => Err(FerrumError::unsupported(format!(
                "gemm_quant({other:?}) on the CPU: load GPTQ weights with load_gptq"
            ))),
        }
    }

    fn gemm(
        _ctx: &mut Self::Context,
        a: &Self::Buffer,
        b: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Gemm,
    ) {
        let Gemm { m, n, k } = shape;
        let _profile = profile::span(Op::Gemm);
        let _awake = awake::keep_awake();
        matmul::gemm(a, b, out, m, n, k);
    }

    fn rms_norm(
        _ctx: &mut Self::Context,
        x: &Self::Buffer,
        w: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: dim } = shape;
        let _profile = profile::span(Op::Norm);
        norm::rms_norm(x, w, eps, out, tokens, dim);
    }

    fn fused_add_rms_norm(
        _ctx: &mut Self::Context,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: dim } = shape;
        let _profile = profile::span(Op::Norm);
        norm::fused_add_rms_norm(residual, x, w, eps, out, tokens, dim);
    }

    fn flash_attention(
        _ctx: &mut Self::Context,
        q: &Self::Buffer,
        kv: [&Self::Buffer; 2],
        out: &mut Self::Buffer,
        batch: usize,
        span: Span,
        cfg: &AttnConfig,
    ) {
        let Span { q_len, kv_len, pos_offset } = span;
        let [k, v] = kv;
        let _profile = profile::span(Op::Attention);
        let _awake = awake::keep_awake();
        attention::flash_attention(q, k, v, out, batch, q_len, kv_len, pos_offset, cfg);
    }

    /// 16 positions (vLLM's default): at most 15 wasted per sequence,
    /// fine-grained prefix sharing, and table lookups that the attention
    /// kernel amortises over a 64-key tile.
    fn kv_block_size(_capacity: usize) -> usize {
        16
    }

    fn paged_attention(
        ctx: &mut Self::Context,
        q: &Self::Buffer,
        pools: [&Self::Buffer; 2],
        pages: &PagedKv,
        out: &mut Self::Buffer,
        span: Span,
        cfg: &AttnConfig,
    ) {
        let Span { q_len, kv_len, pos_offset } = span;
        let _profile = profile::span(Op::Attention);
        let seg = AttnSegment {
            pages: *pages,
            offset: 0,
            q_len,
            kv_len,
            pos_offset,
        };
        Self::paged_attention_segments(ctx, q, pools, &[seg], out, cfg);
    }

    /// Decode batches of several sequences as rows, 16 sequences a call
    /// (every (sequence, KV head) task of a chunk in one parallel step);
    /// other batches of several sequences rotate per sequence and attend in
    /// segmented calls of 16. A lone sequence attends on its own, in place.
    fn attention(
        ctx: &mut (),
        layer: AttnLayer<'_, Self>,
        segs: &[AttnSegment],
        scratch: &mut AttnScratch<Self>,
        out: &mut CpuBuffer,
    ) {
        let plan = AttnPlan {
            decode_rows: true,
            rows_alone: false,
            rows_chunk: 16,
            segmented: true,
            seg_chunk: 16,
        };
        batch_attention::run::<Self>(ctx, layer, segs, scratch, out, plan);
    }

    fn paged_attention_segments(
        _ctx: &mut Self::Context,
        q: &Self::Buffer,
        pools: [&Self::Buffer; 2],
        segs: &[AttnSegment],
        out: &mut Self::Buffer,
        cfg: &AttnConfig,
    ) {
        let [k_pool, v_pool] = pools;
        let _profile = profile::span(Op::Attention);
        let _awake = awake::keep_awake();
        match (k_pool.is_f16(), v_pool.is_f16()) {
            (false, false) => {
                attention::paged_attention_segments(q, k_pool, v_pool, segs, out, cfg)
            }
            (true, true) => {
                let (k, v) = (k_pool.halves(), v_pool.halves());
                attention::paged_attention_segments(q, k, v, segs, out, cfg)
            }
            _ => panic!("paged attention: K and V pools of different dtypes"),
        }
    }

    fn paged_kv_append(
        _ctx: &mut Self::Context,
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
        let _profile = profile::span(Op::KvAppend);
        let (new_k, new_v) = (&new_k_head_major[..], &new_v_head_major[..]);
        let rows = (pages, pos, new_tokens, nkv, hd);
        match (k_pool.is_f16(), v_pool.is_f16()) {
            (false, false) => layout::paged_kv_append(k_pool, v_pool, new_k, new_v, rows),
            (true, true) => {
                let (k, v) = (k_pool.halves_mut(), v_pool.halves_mut());
                layout::paged_kv_append(k, v, new_k, new_v, rows)
            }
            _ => panic!("paged_kv_append: K and V pools of different dtypes"),
        }
    }

    fn decode_rows_qkv(
        _ctx: &mut Self::Context,
        [q, k, v]: [&Self::Buffer; 3],
        prep: QkPrep<'_, Self>,
        q_out: &mut Self::Buffer,
        pools: [&mut Self::Buffer; 2],
        segs: &[AttnSegment],
        cfg: &AttnConfig,
    ) {
        let [k_pool, v_pool] = pools;
        // Q's and K's ops differ only in their norm weight.
        let (mode, q_norm, [cos, sin], eps) = prep.q().operands(q);
        let (_, k_norm, _, _) = prep.k().operands(q);
        let _profile = profile::span(Op::QkNormRope);
        let (qkv, norms) = ([&q[..], &k[..], &v[..]], [&q_norm[..], &k_norm[..]]);
        let tables = (&cos[..], &sin[..]);
        match (k_pool.is_f16(), v_pool.is_f16()) {
            (false, false) => rope::decode_rows(
                qkv, norms, tables, q_out, k_pool, v_pool, segs, cfg, eps, mode,
            ),
            (true, true) => {
                let (kp, vp) = (k_pool.halves_mut(), v_pool.halves_mut());
                rope::decode_rows(qkv, norms, tables, q_out, kp, vp, segs, cfg, eps, mode)
            }
            _ => panic!("decode_rows_qkv: K and V pools of different dtypes"),
        }
    }

    fn copy_slice(
        _ctx: &mut Self::Context,
        src: &Self::Buffer,
        src_offset: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        len: usize,
    ) {
        let _profile = profile::span(Op::Copy);
        let (s, d) = (src_offset..src_offset + len, dst_offset..dst_offset + len);
        match (src.is_f16(), dst.is_f16()) {
            (false, false) => dst[d].copy_from_slice(&src[s]),
            (true, true) => dst.halves_mut()[d].copy_from_slice(&src.halves()[s]),
            (true, false) => f16::widen_into(&src.halves()[s], &mut dst[d]),
            (false, true) => f16::narrow_from(&mut dst.halves_mut()[d], &src[s]),
        }
    }

    fn embedding_lookup(
        _ctx: &mut Self::Context,
        table: &Self::Buffer,
        ids: &[u32],
        out: &mut Self::Buffer,
        dim: usize,
    ) {
        let _profile = profile::span(Op::Embedding);
        layout::embedding_lookup(table, ids, out, dim);
    }

    fn split_qkv(
        _ctx: &mut Self::Context,
        qkv: &Self::Buffer,
        out: [&mut Self::Buffer; 3],
        tokens: usize,
        q_dim: usize,
        kv_dim: usize,
    ) {
        let [q, k, v] = out;
        let _profile = profile::span(Op::Copy);
        layout::split_qkv(qkv, q, k, v, tokens, q_dim, kv_dim);
    }

    fn fused_silu_mul_split(
        _ctx: &mut Self::Context,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: im } = shape;
        let _profile = profile::span(Op::Activation);
        activation::fused_silu_mul_split(gate_up, out, tokens, im);
    }

    fn fused_gelu_tanh_mul_split(
        _ctx: &mut Self::Context,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: im } = shape;
        let _profile = profile::span(Op::Activation);
        activation::fused_gelu_tanh_mul_split(gate_up, out, tokens, im);
    }

    fn qk_norm_rope(
        _ctx: &mut Self::Context,
        input: &Self::Buffer,
        op: QkOp<'_, Self>,
        output: &mut Self::Buffer,
        shape: Heads,
        pos_offset: usize,
    ) {
        let Heads { tokens, heads, head_dim } = shape;
        let (mode, norm_w, [cos, sin], eps) = op.operands(input);
        let _profile = profile::span(Op::QkNormRope);
        rope::qk_norm_rope(
            input, norm_w, cos, sin, output, tokens, heads, head_dim, pos_offset, eps, mode,
        );
    }

    fn transpose_head_to_token(
        _ctx: &mut Self::Context,
        src: &Self::Buffer,
        dst: &mut Self::Buffer,
        shape: Heads,
    ) {
        let Heads { tokens, heads, head_dim: dim } = shape;
        let _profile = profile::span(Op::Copy);
        layout::transpose_head_to_token(src, dst, tokens, heads, dim);
    }

    fn add_inplace(
        _ctx: &mut Self::Context,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        len: usize,
    ) {
        let _profile = profile::span(Op::Activation);
        activation::add_inplace(residual, x, len);
    }

    fn scale_add_rows(
        _ctx: &mut Self::Context,
        src: &Self::Buffer,
        rows: &[u32],
        weights: &[f32],
        dst: &mut Self::Buffer,
        dim: usize,
    ) {
        let _profile = profile::span(Op::Activation);
        activation::scale_add_rows(src, rows, weights, dst, dim);
    }

    fn add_bias(
        _ctx: &mut Self::Context,
        data: &mut Self::Buffer,
        bias: &Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows, cols } = shape;
        let _profile = profile::span(Op::Activation);
        activation::add_bias(data, bias, rows, cols);
    }

    fn layer_norm(
        _ctx: &mut Self::Context,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        beta: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: dim } = shape;
        let _profile = profile::span(Op::Norm);
        norm::layer_norm(x, gamma, beta, eps, out, tokens, dim);
    }

    fn gelu(_ctx: &mut Self::Context, x: &Self::Buffer, out: &mut Self::Buffer, len: usize) {
        let _profile = profile::span(Op::Activation);
        activation::gelu(x, out, len);
    }

    fn alloc(len: usize) -> Self::Buffer {
        CpuBuffer::from_vec(vec![0.0; len])
    }

    /// f16 and f32 KV (f16 the default: half the bytes a long context's
    /// decode reads); experts one at a time; no captured steps.
    fn capabilities() -> Capabilities {
        Capabilities {
            name: "the CPU",
            kv_dtypes: &[KvDtype::F16, KvDtype::F32],
            grouped_experts: false,
            graphs: false,
        }
    }

    /// f16 pools hold two values per word; the paged kernels widen rows as
    /// they read them.
    fn alloc_kv(len: usize, dtype: KvDtype) -> Self::Buffer {
        match dtype {
            KvDtype::F32 => Self::alloc(len),
            KvDtype::F16 => CpuBuffer {
                data: vec![0.0; len.div_ceil(2)],
                dtype: Dtype::F16,
            },
        }
    }

    fn to_vec(buf: &Self::Buffer, len: usize) -> Vec<f32> {
        buf[..len].to_vec()
    }

    fn from_slice(data: &[f32]) -> Self::Buffer {
        CpuBuffer::from_vec(data.to_vec())
    }

    fn from_u32(data: &[u32]) -> Self::Buffer {
        CpuBuffer {
            data: crate::backend::input_order(data),
            dtype: Dtype::U32,
        }
    }

    fn dtype(buf: &Self::Buffer) -> Dtype {
        buf.dtype
    }

    fn read_into(buf: &Self::Buffer, out: &mut [f32]) {
        let _profile = profile::span(Op::Copy);
        copy_par(&buf[..out.len()], out);
    }

    fn write_from(_ctx: &mut Self::Context, data: &[f32], dst: &mut Self::Buffer, offset: usize) {
        let _profile = profile::span(Op::Copy);
        dst[offset..offset + data.len()].copy_from_slice(data);
    }

    /// The 32-value block types and the 4-bit codebook types are
    /// interleaved sixteen rows at a time, the k-quants (Q2_K to Q6_K)
    /// grouped eight rows at a time, where the CPU has their kernels
    /// (`interleaved`, `kquant_rows`: x86 with AVX2, AArch64; within 6% of
    /// the file's size); other types stay as in the file.
    fn load_gguf(
        bytes: &[u8],
        quant_type: GgufQuantType,
        n: usize,
        k: usize,
    ) -> Result<Self::Buffer> {
        let _awake = awake::keep_awake();
        quant_type.check_weight_bytes(bytes.len(), n, k)?;
        let ty = quant_type.ggml();
        Ok(
            if interleaved::supports(ty) && interleaved::repackable(bytes, ty) {
                CpuBuffer {
                    data: interleaved::repack(bytes, ty, n, k)?,
                    dtype: Dtype::Repacked(ty),
                }
            } else if kquant_rows::supports(ty) {
                CpuBuffer {
                    data: kquant_rows::repack(bytes, ty, n, k)?,
                    dtype: Dtype::Repacked(ty),
                }
            } else {
                CpuBuffer {
                    data: crate::pack_bytes(bytes),
                    dtype: Dtype::Blocks(ty),
                }
            },
        )
    }
}

impl SeedOps for CpuBackend {
    type GptqStore = CpuGptqWeight;

    fn load_gptq(
        qweight: &[i32],
        scales: &[f32],
        qzeros: &[i32],
        g_idx: Option<&[i32]>,
        bits: u32,
        group_size: usize,
        k: usize,
        n: usize,
    ) -> Result<Self::GptqStore> {
        gptq::load(qweight, scales, qzeros, g_idx, bits, group_size, k, n)
    }

    fn gemm_gptq(
        _ctx: &mut Self::Context,
        a: &Self::Buffer,
        weight: &Self::GptqStore,
        out: &mut Self::Buffer,
        m: usize,
    ) -> Result<()> {
        let _profile = profile::span(Op::GemmQuant);
        let _awake = awake::keep_awake();
        let (n, k) = (weight.n, weight.k);
        if a.len() < m * k || out.len() < m * n {
            return Err(FerrumError::invalid(format!(
                "gemm_gptq: buffers of {} and {} values are too small for m = {m}, k = {k}, n = {n}",
                a.len(),
                out.len()
            )));
        }
        matmul::gemm(a, &weight.w, out, m, n, k);
        Ok(())
    }

    fn kv_cache_append_head_major(
        _ctx: &mut Self::Context,
        cache_k: &mut Self::Buffer,
        cache_v: &mut Self::Buffer,
        cache_len: usize,
        cache_capacity: usize,
        new_k_head_major: &Self::Buffer,
        new_v_head_major: &Self::Buffer,
        new_tokens: usize,
        nkv: usize,
        hd: usize,
    ) {
        let _profile = profile::span(Op::KvAppend);
        layout::kv_cache_append_head_major(
            cache_k,
            cache_v,
            cache_len,
            cache_capacity,
            new_k_head_major,
            new_v_head_major,
            new_tokens,
            nkv,
            hd,
        );
    }
}
