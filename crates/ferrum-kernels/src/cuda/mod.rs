//! The CUDA backend (`--features cuda`): cuBLAS for dense GEMM, NVRTC-
//! compiled kernels (`kernels/`) for everything else, GGUF weights kept in
//! their blocks on the device.
//!
//! Built with `cudarc`'s dynamic loading, so it compiles on machines without
//! CUDA; [`CudaBackend::init`] reports a missing driver or GPU as an error.
//!
//! Status: every required op is implemented and checked against the CPU
//! backend. Decode GEMVs run on q8_1 activations with integer dot products
//! (`gemm.rs`); prefill GEMMs dequantize to bf16 for the tensor cores.
//! Paged attention and the paged KV writes are kernels over block tables
//! (`attention.rs`), one launch for all the sequences of a batch; attention
//! is one warp per query, split over the keys for decode (flash-decoding).
//! Prefill attention is not tiled yet, KV is f32 and graph capture keeps
//! the trait's defaults.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig};
use ferrum_types::{FerrumError, Result};

use crate::backend::{
    AttnConfig, AttnSegment, Backend, Capabilities, ExpertRows, GgufQuantType, KvDtype, PagedKv,
    QkOp, QkPrep, QuantKind, QuantWeights,
};
use crate::batch_attention::{self, AttnLayer, AttnPlan, AttnScratch};
use crate::seed_ops::SeedOps;
use crate::shapes::{Gemm, Heads, Mat, Span};
use crate::Dtype;

/// `Backend` on an NVIDIA GPU.
pub struct CudaBackend;

/// Launches go to the device's stream.
pub struct CudaContext {
    stream: Arc<CudaStream>,
    /// The first failure since the last `take_error`. Later ops on the
    /// context are skipped (their inputs may be garbage), as CUDA's own
    /// errors are sticky.
    error: Option<String>,
}

impl CudaContext {
    /// `r`'s value, or `None` with the failure recorded.
    fn check<T, E: std::fmt::Debug>(
        &mut self,
        r: std::result::Result<T, E>,
        what: &str,
    ) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.fail(format!("CUDA {what} failed: {e:?}"));
                None
            }
        }
    }

    fn fail(&mut self, msg: String) {
        self.error.get_or_insert(msg);
    }
}

pub use buffer::CudaBuffer;
pub use device::{precompile, ptxas_report};

/// The kernels' source as NVRTC compiles it (the files of `kernels/`, in
/// order, then each kernel's declaration from `launch.rs`), for the
/// compile test that needs no GPU.
pub fn kernel_source() -> &'static str {
    device::full_source()
}

impl CudaBackend {
    /// Opens `cuda:ordinal` for the rest of the process. Call before any
    /// other use; a missing driver, library or GPU is an error, not a crash.
    pub fn init(ordinal: usize) -> Result<()> {
        device::init(ordinal).map(|_| ())
    }

    /// Whether a usable GPU is there at all (tests skip when not; any
    /// other `init` failure is a real error).
    pub fn device_present() -> bool {
        device::present()
    }

    /// Turns decode-step capture on or off for the rest of the process
    /// (`FERRUM_CUDA_GRAPHS=0` starts it off); dropping every graph. For
    /// comparing the two in one process (tests, benchmarks).
    pub fn set_graphs(on: bool) -> Result<()> {
        let d = device::init(0)?;
        let mut g = lock(&d.graphs);
        g.enabled = on;
        g.invalidate();
        Ok(())
    }

    /// f32 activations in every GEMM on blocks (see `FERRUM_CUDA_F32`) on
    /// or off for the rest of the process, dropping every graph: the
    /// reference a test compares the fast kernels' models against.
    pub fn set_f32_activations(on: bool) -> Result<()> {
        let d = device::init(0)?;
        d.f32_activations
            .store(on, std::sync::atomic::Ordering::Relaxed);
        lock(&d.graphs).invalidate();
        Ok(())
    }

    /// How many captured steps the device holds now.
    pub fn captured_graphs() -> usize {
        device::init(0).map_or(0, |d| lock(&d.graphs).len())
    }

    /// The device's name and compute capability, once initialised.
    pub fn describe() -> Option<String> {
        CudaBackend::init(0).ok()?;
        let d = device::get();
        Some(format!("{} (sm_{}{})", d.name, d.arch.0, d.arch.1))
    }
}

/// Grid-stride launch over `n` elements.
fn linear(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` per row.
fn per_row(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Kernel-argument integers: sizes are far below `i32::MAX` for any model.
fn i(x: usize) -> i32 {
    x as i32
}

mod attention;
mod buffer;
mod device;
mod gemm;
mod graphs;
mod launch;
mod meta;

/// A mixture step's expert rows and router weights on the device, for
/// `scale_add_rows` / `gather_add_rows`; `None` with the failure recorded.
fn upload_rows(
    ctx: &mut CudaContext,
    rows: &[u32],
    weights: &[f32],
) -> Option<(CudaSlice<u32>, CudaSlice<f32>)> {
    let r = ctx.stream.clone_htod(rows);
    let dev_rows = ctx.check(r, "upload of expert rows")?;
    let r = ctx.stream.clone_htod(weights);
    let dev_w = ctx.check(r, "upload of expert weights")?;
    Some((dev_rows, dev_w))
}

type ScratchSlot = std::sync::Mutex<Option<CudaSlice<f32>>>;

/// A lock that survives a panic elsewhere (the data are buffers and
/// caches, valid whatever was interrupted).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Locks a scratch slot holding at least `len` floats (grown on demand).
/// Launches on the one stream run in order, so reuse across calls is safe.
fn scratch(slot: &ScratchSlot, len: usize) -> std::sync::MutexGuard<'_, Option<CudaSlice<f32>>> {
    let mut guard = match slot.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if guard.as_ref().is_none_or(|s| s.len() < len) {
        // Captured steps hold the old buffer's address.
        lock(&device::get().graphs).invalidate();
        *guard = Some(buffer::zeros(len));
    }
    guard
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type Context = CudaContext;

    fn new_context() -> CudaContext {
        CudaContext {
            stream: device::get().stream.clone(),
            error: None,
        }
    }

    /// f32 KV only (the attention kernels read f32 K/V), grouped experts
    /// and captured decode steps.
    fn capabilities() -> Capabilities {
        Capabilities {
            name: "CUDA",
            kv_dtypes: &[KvDtype::F32],
            grouped_experts: true,
            graphs: true,
        }
    }

    fn set_decode_state(ctx: &mut CudaContext, segs: &[AttnSegment], cfg: &AttnConfig) {
        attention::prepare_step(ctx, segs, cfg);
    }

    /// Refused while `FERRUM_CUDA_GRAPHS=0`. The graph is kept under `key`
    /// and the step's attention shape (`attention::step_shape`), so a
    /// sequence growing past a split boundary is captured anew.
    fn begin_graph_capture(ctx: &mut CudaContext, key: u64) -> Result<()> {
        let mut g = lock(&device::get().graphs);
        if !g.enabled {
            return Err(FerrumError::unsupported(
                "CUDA graphs are off (FERRUM_CUDA_GRAPHS=0)",
            ));
        }
        if let Some(e) = &ctx.error {
            return Err(FerrumError::Device(e.clone()));
        }
        let mode = cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        ctx.stream
            .begin_capture(mode)
            .map_err(|e| FerrumError::Device(format!("CUDA graph capture: {e:?}")))?;
        g.capturing = Some(attention::step_key(key));
        Ok(())
    }

    fn end_graph_capture(ctx: &mut CudaContext) -> Result<()> {
        let mut g = lock(&device::get().graphs);
        let Some(key) = g.capturing.take() else {
            return Err(FerrumError::invalid("end_graph_capture without a capture"));
        };
        let flags = cudarc::driver::sys::CUgraphInstantiate_flags(0);
        let graph = ctx.stream.end_capture(flags);
        if let Some(e) = &ctx.error {
            return Err(FerrumError::Device(e.clone()));
        }
        match graph {
            Ok(Some(graph)) => {
                g.insert(key, graph);
                Ok(())
            }
            Ok(None) => Err(FerrumError::Device(
                "CUDA graph capture recorded nothing".into(),
            )),
            Err(e) => Err(FerrumError::Device(format!("CUDA graph capture: {e:?}"))),
        }
    }

    fn replay_graph(ctx: &mut CudaContext, key: u64) -> Result<bool> {
        let g = lock(&device::get().graphs);
        let Some(graph) = g.get(attention::step_key(key)) else {
            return Ok(false);
        };
        if ctx.error.is_none() {
            let r = graph.launch();
            ctx.check(r, "CUDA graph launch");
        }
        Ok(true)
    }

    fn reset_graph(_ctx: &mut CudaContext) {
        lock(&device::get().graphs).invalidate();
    }

    fn sync(ctx: &mut CudaContext) {
        let r = ctx.stream.synchronize();
        ctx.check(r, "stream synchronize");
    }

    fn take_error(ctx: &mut CudaContext) -> Result<()> {
        ctx.error
            .take()
            .map_or(Ok(()), |m| Err(FerrumError::Device(m)))
    }

    fn gemm(
        ctx: &mut CudaContext,
        a: &Self::Buffer,
        b: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Gemm,
    ) {
        let Gemm { m, n, k } = shape;
        gemm::sgemm(ctx, a, b, out, m, n, k);
    }

    fn rms_norm(
        ctx: &mut CudaContext,
        x: &Self::Buffer,
        w: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: dim } = shape;
        launch::rms_norm(ctx, per_row(tokens, 256), x, w, out, eps, i(dim));
    }

    fn fused_add_rms_norm(
        ctx: &mut CudaContext,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: dim } = shape;
        launch::fused_add_rms_norm(ctx, per_row(tokens, 256), residual, x, w, out, eps, i(dim));
    }

    fn flash_attention(
        ctx: &mut CudaContext,
        q: &Self::Buffer,
        kv: [&Self::Buffer; 2],
        out: &mut Self::Buffer,
        batch: usize,
        span: Span,
        cfg: &AttnConfig,
    ) {
        let Span { q_len, kv_len, pos_offset } = span;
        let [k, v] = kv;
        attention::attend_contiguous(ctx, q, k, v, out, batch, q_len, kv_len, pos_offset, cfg);
    }

    /// Blocks of 16 positions: the paged kernels read through block
    /// tables, so small blocks cost nothing and let the pool hold as many
    /// sequences as their lengths allow (one block per sequence held four).
    fn kv_block_size(_capacity: usize) -> usize {
        16
    }

    fn paged_attention(
        ctx: &mut CudaContext,
        q: &Self::Buffer,
        pools: [&Self::Buffer; 2],
        pages: &PagedKv,
        out: &mut Self::Buffer,
        span: Span,
        cfg: &AttnConfig,
    ) {
        let Span { q_len, kv_len, pos_offset } = span;
        let [k_pool, v_pool] = pools;
        let seg = AttnSegment {
            pages: *pages,
            offset: 0,
            q_len,
            kv_len,
            pos_offset,
        };
        attention::attend(ctx, q, k_pool, v_pool, &[seg], out, cfg);
    }

    /// Decode batches as rows, a lone sequence included (captured steps
    /// read positions and tables from device memory), up to
    /// 64 sequences a call (as many as the models capture in one step, so
    /// a captured layer is two launches); other batches rotate per
    /// sequence and attend in segmented calls of 16.
    fn attention(
        ctx: &mut CudaContext,
        layer: AttnLayer<'_, Self>,
        segs: &[AttnSegment],
        scratch: &mut AttnScratch<Self>,
        out: &mut Self::Buffer,
    ) {
        let plan = AttnPlan {
            decode_rows: true,
            rows_alone: true,
            rows_chunk: 64,
            segmented: true,
            seg_chunk: 16,
        };
        batch_attention::run::<Self>(ctx, layer, segs, scratch, out, plan);
    }

    fn paged_attention_segments(
        ctx: &mut CudaContext,
        q: &Self::Buffer,
        pools: [&Self::Buffer; 2],
        segs: &[AttnSegment],
        out: &mut Self::Buffer,
        cfg: &AttnConfig,
    ) {
        let [k_pool, v_pool] = pools;
        attention::attend(ctx, q, k_pool, v_pool, segs, out, cfg);
    }

    fn paged_kv_append(
        ctx: &mut CudaContext,
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
        attention::append(
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

    fn decode_rows_qkv(
        ctx: &mut CudaContext,
        qkv: [&Self::Buffer; 3],
        prep: QkPrep<'_, Self>,
        q_out: &mut Self::Buffer,
        pools: [&mut Self::Buffer; 2],
        segs: &[AttnSegment],
        cfg: &AttnConfig,
    ) {
        attention::rows_qkv(ctx, qkv, prep, q_out, pools, segs, cfg);
    }

    fn copy_slice(
        ctx: &mut CudaContext,
        src: &Self::Buffer,
        src_offset: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        len: usize,
    ) {
        let s = src.slice(src_offset..src_offset + len);
        let mut d = dst.slice_mut(dst_offset..dst_offset + len);
        if ctx.error.is_none() {
            let r = ctx.stream.memcpy_dtod(&s, &mut d);
            ctx.check(r, "copy");
        }
    }

    fn embedding_lookup(
        ctx: &mut CudaContext,
        table: &Self::Buffer,
        ids: &[u32],
        out: &mut Self::Buffer,
        dim: usize,
    ) {
        let r = ctx.stream.clone_htod(ids);
        let Some(dev_ids) = ctx.check(r, "upload of token ids") else {
            return;
        };
        launch::embedding(
            ctx,
            linear(ids.len() * dim),
            table,
            &dev_ids,
            out,
            i(ids.len()),
            i(dim),
        );
    }

    fn split_qkv(
        ctx: &mut CudaContext,
        qkv: &Self::Buffer,
        out: [&mut Self::Buffer; 3],
        tokens: usize,
        q_dim: usize,
        kv_dim: usize,
    ) {
        let [q, k, v] = out;
        launch::split_qkv(
            ctx,
            linear(tokens * (q_dim + 2 * kv_dim)),
            qkv,
            q,
            k,
            v,
            i(tokens),
            i(q_dim),
            i(kv_dim),
        );
    }

    fn fused_silu_mul_split(
        ctx: &mut CudaContext,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: im } = shape;
        launch::silu_mul(ctx, linear(tokens * im), gate_up, out, i(tokens), i(im));
    }

    fn fused_gelu_tanh_mul_split(
        ctx: &mut CudaContext,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: im } = shape;
        launch::gelu_tanh_mul(ctx, linear(tokens * im), gate_up, out, i(tokens), i(im));
    }

    fn qk_norm_rope(
        ctx: &mut CudaContext,
        input: &Self::Buffer,
        op: QkOp<'_, Self>,
        output: &mut Self::Buffer,
        shape: Heads,
        pos_offset: usize,
    ) {
        let Heads { tokens, heads, head_dim } = shape;
        // The kernel reads only what the mode needs; `input` fills the rest.
        let (mode, norm_w, [cos, sin], eps) = op.operands(input);
        let threads = (head_dim / 2).div_ceil(32).clamp(1, 32) as u32 * 32;
        launch::qk_norm_rope(
            ctx,
            per_row(tokens * heads, threads),
            input,
            norm_w,
            cos,
            sin,
            output,
            i(tokens),
            i(heads),
            i(head_dim),
            i(pos_offset),
            eps,
            mode as i32,
        );
    }

    fn transpose_head_to_token(
        ctx: &mut CudaContext,
        src: &Self::Buffer,
        dst: &mut Self::Buffer,
        shape: Heads,
    ) {
        let Heads { tokens, heads, head_dim: dim } = shape;
        launch::head_to_token(
            ctx,
            linear(tokens * heads * dim),
            src,
            dst,
            i(tokens),
            i(heads),
            i(dim),
        );
    }

    fn add_inplace(
        ctx: &mut CudaContext,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        len: usize,
    ) {
        launch::add_inplace(ctx, linear(len), residual, x, i(len));
    }

    fn scale_add_rows(
        ctx: &mut CudaContext,
        src: &Self::Buffer,
        rows: &[u32],
        weights: &[f32],
        dst: &mut Self::Buffer,
        dim: usize,
    ) {
        let Some((dev_rows, dev_w)) = upload_rows(ctx, rows, weights) else {
            return;
        };
        launch::scale_add_rows(
            ctx,
            linear(rows.len() * dim),
            src,
            &dev_rows,
            &dev_w,
            dst,
            i(rows.len()),
            i(dim),
        );
    }

    fn gather_add_rows(
        ctx: &mut CudaContext,
        src: &Self::Buffer,
        rows: &[u32],
        weights: &[f32],
        dst: &mut Self::Buffer,
        per: usize,
        dim: usize,
    ) -> Result<()> {
        let tokens = rows.len() / per.max(1);
        let Some((dev_rows, dev_w)) = upload_rows(ctx, rows, weights) else {
            return Ok(());
        };
        launch::gather_add_rows(
            ctx,
            linear(tokens * dim),
            src,
            &dev_rows,
            &dev_w,
            dst,
            i(tokens),
            i(per),
            i(dim),
        );
        Ok(())
    }

    fn add_bias(ctx: &mut CudaContext, data: &mut Self::Buffer, bias: &Self::Buffer, shape: Mat) {
        let Mat { rows, cols } = shape;
        launch::add_bias(ctx, linear(rows * cols), data, bias, i(rows), i(cols));
    }

    fn layer_norm(
        ctx: &mut CudaContext,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        beta: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        shape: Mat,
    ) {
        let Mat { rows: tokens, cols: dim } = shape;
        launch::layer_norm(ctx, per_row(tokens, 256), x, gamma, beta, out, eps, i(dim));
    }

    fn gelu(ctx: &mut CudaContext, x: &Self::Buffer, out: &mut Self::Buffer, len: usize) {
        launch::gelu_erf(ctx, linear(len), x, out, i(len));
    }

    /// Running out of device memory panics (see `buffer::zeros`); so do
    /// `from_slice` and `to_vec`.
    fn alloc(len: usize) -> Self::Buffer {
        CudaBuffer::new(buffer::zeros(len), Dtype::F32)
    }

    fn to_vec(buf: &Self::Buffer, len: usize) -> Vec<f32> {
        match device::get().stream.clone_dtoh(&buf.slice(..len)) {
            Ok(v) => v,
            Err(e) => panic!("CUDA download failed: {e:?}"),
        }
    }

    fn from_slice(data: &[f32]) -> Self::Buffer {
        CudaBuffer::new(buffer::upload(data), Dtype::F32)
    }

    fn from_u32(data: &[u32]) -> Self::Buffer {
        let words = crate::backend::input_order(data);
        CudaBuffer::new(buffer::upload(&words), Dtype::U32)
    }

    fn dtype(buf: &Self::Buffer) -> Dtype {
        buf.dtype()
    }

    /// The file's blocks, unchanged (the kernels read GGUF's layout).
    fn load_gguf(
        bytes: &[u8],
        quant_type: GgufQuantType,
        n: usize,
        k: usize,
    ) -> Result<Self::Buffer> {
        quant_type.check_weight_bytes(bytes.len(), n, k)?;
        let ty = quant_type.ggml();
        let words = crate::pack_bytes(bytes);
        Ok(CudaBuffer::new(buffer::upload(&words), Dtype::Blocks(ty)))
    }

    fn gemm_quant(
        ctx: &mut CudaContext,
        a: &Self::Buffer,
        weights: &QuantWeights<'_, Self>,
        out: &mut Self::Buffer,
        shape: Gemm,
        kind: &QuantKind,
    ) -> Result<()> {
        let Gemm { m, n, k } = shape;
        let QuantKind::Gguf { quant_type, .. } = kind else {
            return Err(FerrumError::unsupported(format!(
                "CUDA gemm_quant({kind:?}): only GGUF block formats"
            )));
        };
        let w = weights.qweight;
        w.dtype()
            .weight_layout(quant_type.ggml(), "CUDA gemm_quant")?;
        // An act-order weight's input order (see `QuantWeights`): the
        // activation is gathered once, then the block kernels run as usual.
        let Some(order) = weights.g_idx else {
            return gemm::gemm_blocks(ctx, *quant_type, w, a, out, m, n, k);
        };
        order.dtype().check_order("CUDA gemm_quant")?;
        let mut guard = scratch(&device::get().reorder_scratch, m * k);
        let Some(buf) = guard.as_mut() else {
            return Err(FerrumError::Device("scratch allocation failed".into()));
        };
        launch::gather_columns(ctx, linear(m * k), a, order, &mut *buf, i(m), i(k));
        gemm::gemm_blocks(ctx, *quant_type, w, &*buf, out, m, n, k)
    }

    /// Experts with few rows share one launch of the q8_1 GEMV; see
    /// `gemm::gemm_experts`.
    fn gemm_quant_experts(
        ctx: &mut CudaContext,
        a: &Self::Buffer,
        groups: &[ExpertRows<'_, Self>],
        out: &mut Self::Buffer,
        n: usize,
        k: usize,
        quant_type: GgufQuantType,
    ) -> Result<()> {
        for g in groups {
            let what = "CUDA gemm_quant_experts";
            g.weights.dtype().weight_layout(quant_type.ggml(), what)?;
        }
        gemm::gemm_experts(ctx, a, groups, out, n, k, quant_type)
    }
}

impl SeedOps for CudaBackend {
    type GptqStore = ();

    fn kv_cache_append_head_major(
        ctx: &mut CudaContext,
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
        if cache_len + new_tokens > cache_capacity {
            return ctx.fail(format!(
                "KV cache overflow: {cache_len} + {new_tokens} positions in a cache of {cache_capacity}"
            ));
        }
        launch::kv_append(
            ctx,
            linear(nkv * new_tokens * hd),
            cache_k,
            cache_v,
            new_k_head_major,
            new_v_head_major,
            i(cache_len),
            i(cache_capacity),
            i(new_tokens),
            i(nkv),
            i(hd),
        );
    }
}
