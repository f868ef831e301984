//! The CUDA backend (`--features cuda`): cuBLAS for dense GEMM, NVRTC-
//! compiled kernels (`kernels.cu`) for everything else, GGUF weights kept in
//! their blocks on the device.
//!
//! Built with `cudarc`'s dynamic loading, so it compiles on machines without
//! CUDA; [`CudaBackend::init`] reports a missing driver or GPU as an error.
//!
//! Status: every required op is implemented and checked against the CPU
//! backend. Attention is one warp per query, split over the keys for decode
//! (flash-decoding); prefill attention is not tiled yet, dense GEMM runs in
//! f32 (no bf16 weights yet) and graph capture keeps the trait's defaults.

mod device;

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use ferrum_types::{FerrumError, Result};

use crate::backend::{
    AttnConfig, Backend, ExpertRows, GgufQuantType, QkMode, QuantKind, QuantWeights,
};

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

/// Rows per expert up to which `gemm_quant_experts` runs an expert in the
/// grouped GEMV (tiles of 8 rows that each read the expert's blocks, the
/// repeats mostly from L2); an expert with more rows (prefill) is
/// dequantized once and multiplied by cuBLAS.
const GROUPED_GEMV_ROWS: usize = 64;

/// Output columns a warp of `gemv_q4_k` computes (`Q4K_COLS` in
/// kernels.cu).
const Q4K_COLS: usize = 4;

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

/// Pushes kernel arguments, binding each to a local so temporaries (the
/// `&i(n)` scalars) live until the launch.
macro_rules! push_args {
    ($b:ident;) => {};
    ($b:ident; $a:expr $(, $rest:expr)*) => {
        let arg = $a;
        $b.arg(arg);
        push_args!($b; $($rest),*);
    };
}

/// Launches kernel `$name`, unless the context already failed; a failed
/// launch is recorded in the context (see [`Backend::take_error`]).
macro_rules! launch {
    ($ctx:expr, $name:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        if $ctx.error.is_none() {
            let f = &device::get().funcs[$name];
            let mut b = $ctx.stream.launch_builder(f);
            push_args!(b; $($arg),*);
            // SAFETY: argument lists match the kernel signatures in
            // kernels.cu and every buffer covers the range the kernel
            // touches (the Backend contract's shapes).
            let r = unsafe { b.launch($cfg) };
            $ctx.check(r, $name);
        }
    }};
}

fn quant_name(t: GgufQuantType) -> &'static str {
    match t {
        GgufQuantType::Q4_0 => "q4_0",
        GgufQuantType::Q4_1 => "q4_1",
        GgufQuantType::Q5_0 => "q5_0",
        GgufQuantType::Q5_1 => "q5_1",
        GgufQuantType::Q8_0 => "q8_0",
        GgufQuantType::Q2K => "q2_k",
        GgufQuantType::Q3K => "q3_k",
        GgufQuantType::Q4K => "q4_k",
        GgufQuantType::Q5K => "q5_k",
        GgufQuantType::Q6K => "q6_k",
    }
}

/// `out[m, n] = a[m, k] · w[n, k]ᵀ` with cuBLAS (column-major: outᵀ = w · aᵀ).
fn sgemm(
    ctx: &mut CudaContext,
    a: &impl DevicePtr<f32>,
    w: &impl DevicePtr<f32>,
    out: &mut impl DevicePtrMut<f32>,
    m: usize,
    n: usize,
    k: usize,
) {
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: i(n),
        n: i(m),
        k: i(k),
        alpha: 1.0f32,
        lda: i(k),
        ldb: i(k),
        beta: 0.0f32,
        ldc: i(n),
    };
    if ctx.error.is_some() {
        return;
    }
    // SAFETY: a holds m·k, w n·k and out m·n values (the gemm contract).
    let r = unsafe { device::get().blas.gemm(cfg, w, a, out) };
    ctx.check(r, "cuBLAS sgemm");
}

/// `out[m, n] = a[m, k] · dequant(w)[n, k]ᵀ` for many rows: the blocks of
/// `w` (type `t`) dequantized into the shared scratch, then cuBLAS.
#[allow(clippy::too_many_arguments)]
fn dequant_sgemm(
    ctx: &mut CudaContext,
    t: &str,
    w: &CudaSlice<f32>,
    a: &impl DevicePtr<f32>,
    out: &mut impl DevicePtrMut<f32>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let mut guard = scratch(&device::get().scratch, n * k);
    let Some(scratch) = guard.as_mut() else {
        return Err(FerrumError::Device("scratch allocation failed".into()));
    };
    launch!(
        ctx,
        &format!("dequant_{t}"),
        linear(n * k),
        w,
        &mut *scratch,
        &i(n),
        &i(k)
    );
    sgemm(ctx, a, &*scratch, out, m, n, k);
    Ok(())
}

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

/// Locks a scratch slot holding at least `len` floats (grown on demand).
/// Launches on the one stream run in order, so reuse across calls is safe.
fn scratch(slot: &ScratchSlot, len: usize) -> std::sync::MutexGuard<'_, Option<CudaSlice<f32>>> {
    let mut guard = match slot.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if guard.as_ref().is_none_or(|s| s.len() < len) {
        *guard = Some(CudaBackend::alloc(len));
    }
    guard
}

impl Backend for CudaBackend {
    type Buffer = CudaSlice<f32>;
    type Context = CudaContext;
    type GptqStore = ();

    fn new_context() -> CudaContext {
        CudaContext {
            stream: device::get().stream.clone(),
            error: None,
        }
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
        m: usize,
        n: usize,
        k: usize,
    ) {
        sgemm(ctx, a, b, out, m, n, k);
    }

    fn rms_norm(
        ctx: &mut CudaContext,
        x: &Self::Buffer,
        w: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        tokens: usize,
        dim: usize,
    ) {
        launch!(
            ctx,
            "rms_norm",
            per_row(tokens, 256),
            x,
            w,
            out,
            &eps,
            &i(dim)
        );
    }

    fn fused_add_rms_norm(
        ctx: &mut CudaContext,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        tokens: usize,
        dim: usize,
    ) {
        launch!(
            ctx,
            "fused_add_rms_norm",
            per_row(tokens, 256),
            residual,
            x,
            w,
            out,
            &eps,
            &i(dim)
        );
    }

    fn flash_attention(
        ctx: &mut CudaContext,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        out: &mut Self::Buffer,
        batch: usize,
        q_len: usize,
        kv_len: usize,
        pos_offset: usize,
        cfg: &AttnConfig,
    ) {
        if cfg.head_dim > 256 {
            return ctx.fail(format!(
                "CUDA attention supports head_dim up to 256, got {}",
                cfg.head_dim
            ));
        }
        let stride = if cfg.kv_seq_stride == 0 {
            kv_len
        } else {
            cfg.kv_seq_stride
        };
        let warps = batch * cfg.num_heads * q_len;
        // Split the keys when there are too few queries to fill the GPU
        // (decode) and enough keys to share out: ~256 keys per split.
        let splits = if warps < 1024 && kv_len > 512 {
            kv_len.div_ceil(256).min(64)
        } else {
            1
        };
        let hd = cfg.head_dim;
        // Keys per shared-memory tile (K and V tiles fit in 32 KiB) for
        // decode, where the block's warps are the heads of one GQA group;
        // prefill reads K/V from L2 at full occupancy instead.
        let tile = match (q_len, hd) {
            (1, 0..=128) => 32,
            (1, _) => 16,
            _ => 0,
        };
        let group = cfg.num_heads / cfg.num_kv_heads;
        let blocks = batch * cfg.num_kv_heads * (q_len * group).div_ceil(4);
        let lc = LaunchConfig {
            grid_dim: (blocks as u32, splits as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: (2 * tile * hd * 4) as u32,
        };
        let need = if splits > 1 {
            warps * splits * (hd + 2)
        } else {
            1
        };
        let mut guard = scratch(&device::get().attn_scratch, need);
        let Some(part) = guard.as_mut() else {
            return ctx.fail("attention scratch allocation failed".into());
        };
        launch!(
            ctx,
            "attention",
            lc,
            q,
            k,
            v,
            &mut *out,
            &mut *part,
            &i(cfg.num_heads),
            &i(cfg.num_kv_heads),
            &i(q_len),
            &i(kv_len),
            &i(stride),
            &i(hd),
            &i(pos_offset),
            &i(cfg.causal as usize),
            &cfg.scale,
            &i(cfg.sliding_window),
            &i(tile),
            &cfg.softcap
        );
        if splits > 1 {
            let lc = LaunchConfig {
                grid_dim: (warps.div_ceil(4) as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                ctx,
                "attention_combine",
                lc,
                &*part,
                out,
                &i(warps),
                &i(splits),
                &i(hd)
            );
        }
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
        launch!(
            ctx,
            "embedding",
            linear(ids.len() * dim),
            table,
            &dev_ids,
            out,
            &i(ids.len()),
            &i(dim)
        );
    }

    fn split_qkv(
        ctx: &mut CudaContext,
        qkv: &Self::Buffer,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        v: &mut Self::Buffer,
        tokens: usize,
        q_dim: usize,
        kv_dim: usize,
    ) {
        launch!(
            ctx,
            "split_qkv",
            linear(tokens * (q_dim + 2 * kv_dim)),
            qkv,
            q,
            k,
            v,
            &i(tokens),
            &i(q_dim),
            &i(kv_dim)
        );
    }

    fn fused_silu_mul_split(
        ctx: &mut CudaContext,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        tokens: usize,
        im: usize,
    ) {
        launch!(
            ctx,
            "silu_mul",
            linear(tokens * im),
            gate_up,
            out,
            &i(tokens),
            &i(im)
        );
    }

    fn fused_gelu_tanh_mul_split(
        ctx: &mut CudaContext,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        tokens: usize,
        im: usize,
    ) {
        launch!(
            ctx,
            "gelu_tanh_mul",
            linear(tokens * im),
            gate_up,
            out,
            &i(tokens),
            &i(im)
        );
    }

    fn qk_norm_rope(
        ctx: &mut CudaContext,
        input: &Self::Buffer,
        norm_w: &Self::Buffer,
        cos: &Self::Buffer,
        sin: &Self::Buffer,
        output: &mut Self::Buffer,
        tokens: usize,
        heads: usize,
        head_dim: usize,
        pos_offset: usize,
        eps: f32,
        mode: QkMode,
    ) {
        let threads = (head_dim / 2).div_ceil(32).clamp(1, 32) as u32 * 32;
        launch!(
            ctx,
            "qk_norm_rope",
            per_row(tokens * heads, threads),
            input,
            norm_w,
            cos,
            sin,
            output,
            &i(tokens),
            &i(heads),
            &i(head_dim),
            &i(pos_offset),
            &eps,
            &(mode as i32)
        );
    }

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
        launch!(
            ctx,
            "kv_append",
            linear(nkv * new_tokens * hd),
            cache_k,
            cache_v,
            new_k_head_major,
            new_v_head_major,
            &i(cache_len),
            &i(cache_capacity),
            &i(new_tokens),
            &i(nkv),
            &i(hd)
        );
    }

    fn transpose_head_to_token(
        ctx: &mut CudaContext,
        src: &Self::Buffer,
        dst: &mut Self::Buffer,
        tokens: usize,
        heads: usize,
        dim: usize,
    ) {
        launch!(
            ctx,
            "head_to_token",
            linear(tokens * heads * dim),
            src,
            dst,
            &i(tokens),
            &i(heads),
            &i(dim)
        );
    }

    fn add_inplace(
        ctx: &mut CudaContext,
        residual: &mut Self::Buffer,
        x: &Self::Buffer,
        len: usize,
    ) {
        launch!(ctx, "add_inplace", linear(len), residual, x, &i(len));
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
        launch!(
            ctx,
            "scale_add_rows",
            linear(rows.len() * dim),
            src,
            &dev_rows,
            &dev_w,
            dst,
            &i(rows.len()),
            &i(dim)
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
        launch!(
            ctx,
            "gather_add_rows",
            linear(tokens * dim),
            src,
            &dev_rows,
            &dev_w,
            dst,
            &i(tokens),
            &i(per),
            &i(dim)
        );
        Ok(())
    }

    fn add_bias(
        ctx: &mut CudaContext,
        data: &mut Self::Buffer,
        bias: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) {
        launch!(
            ctx,
            "add_bias",
            linear(rows * cols),
            data,
            bias,
            &i(rows),
            &i(cols)
        );
    }

    fn layer_norm(
        ctx: &mut CudaContext,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        beta: &Self::Buffer,
        eps: f32,
        out: &mut Self::Buffer,
        tokens: usize,
        dim: usize,
    ) {
        launch!(
            ctx,
            "layer_norm",
            per_row(tokens, 256),
            x,
            gamma,
            beta,
            out,
            &eps,
            &i(dim)
        );
    }

    fn gelu(ctx: &mut CudaContext, x: &Self::Buffer, out: &mut Self::Buffer, len: usize) {
        launch!(ctx, "gelu_erf", linear(len), x, out, &i(len));
    }

    /// Running out of device memory here panics, as a failed host
    /// allocation aborts: the seed's signature has no error, and callers
    /// allocate at load or when scratch grows, never per step (the engine's
    /// step fence turns it into failed requests). The same holds for
    /// `from_slice` and `to_vec`.
    fn alloc(len: usize) -> Self::Buffer {
        match device::get().stream.alloc_zeros::<f32>(len.max(1)) {
            Ok(b) => b,
            Err(e) => panic!("CUDA allocation of {len} floats failed: {e:?}"),
        }
    }

    fn to_vec(buf: &Self::Buffer, len: usize) -> Vec<f32> {
        match device::get().stream.clone_dtoh(&buf.slice(..len)) {
            Ok(v) => v,
            Err(e) => panic!("CUDA download failed: {e:?}"),
        }
    }

    fn from_slice(data: &[f32]) -> Self::Buffer {
        if data.is_empty() {
            return Self::alloc(1);
        }
        match device::get().stream.clone_htod(data) {
            Ok(b) => b,
            Err(e) => panic!("CUDA upload of {} floats failed: {e:?}", data.len()),
        }
    }

    fn gemm_quant(
        ctx: &mut CudaContext,
        a: &Self::Buffer,
        weights: &QuantWeights<'_, Self>,
        out: &mut Self::Buffer,
        m: usize,
        n: usize,
        k: usize,
        kind: &QuantKind,
    ) -> Result<()> {
        let QuantKind::Gguf { quant_type, .. } = kind else {
            return Err(FerrumError::unsupported(format!(
                "CUDA gemm_quant({kind:?}): only GGUF block formats"
            )));
        };
        let t = quant_name(*quant_type);
        let w = weights.qweight;
        // An act-order weight's input order (see `QuantWeights`): the
        // activation is gathered once, then the block kernels run as usual.
        let mut reordered = weights
            .g_idx
            .map(|_| scratch(&device::get().reorder_scratch, m * k));
        let a = match (weights.g_idx, reordered.as_mut()) {
            (Some(order), Some(guard)) => {
                let Some(buf) = guard.as_mut() else {
                    return Err(FerrumError::Device("scratch allocation failed".into()));
                };
                launch!(
                    ctx,
                    "gather_columns",
                    linear(m * k),
                    a,
                    order,
                    &mut *buf,
                    &i(m),
                    &i(k)
                );
                &*buf
            }
            _ => a,
        };
        if m <= 8 {
            // A warp per output column (Q4_K: per Q4K_COLS) reads the
            // blocks once for all m rows.
            let warps = match quant_type {
                GgufQuantType::Q4K => n.div_ceil(Q4K_COLS),
                _ => n,
            };
            let lc = LaunchConfig {
                grid_dim: ((warps * 32).div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                ctx,
                &format!("gemv_{t}"),
                lc,
                w,
                a,
                out,
                &i(m),
                &i(n),
                &i(k)
            );
            return Ok(());
        }
        dequant_sgemm(ctx, t, w, a, out, m, n, k)
    }

    const GROUPED_EXPERTS: bool = true;

    /// Experts with at most [`GROUPED_GEMV_ROWS`] rows share one launch
    /// (a table of 8-row tiles: weight pointer, first row, rows); the rest
    /// are dequantized and multiplied by cuBLAS one by one.
    fn gemm_quant_experts(
        ctx: &mut CudaContext,
        a: &Self::Buffer,
        groups: &[ExpertRows<'_, Self>],
        out: &mut Self::Buffer,
        n: usize,
        k: usize,
        quant_type: GgufQuantType,
    ) -> Result<()> {
        let t = quant_name(quant_type);
        let stream = ctx.stream.clone();
        let mut tiles: Vec<u64> = Vec::new();
        for g in groups.iter().filter(|g| g.rows > 0) {
            if g.rows > GROUPED_GEMV_ROWS {
                let rows_a = a.slice(g.start * k..(g.start + g.rows) * k);
                let mut rows_out = out.slice_mut(g.start * n..(g.start + g.rows) * n);
                dequant_sgemm(ctx, t, g.weights, &rows_a, &mut rows_out, g.rows, n, k)?;
                continue;
            }
            // The pointer is read by kernels queued on this same stream.
            let (ptr, _sync) = g.weights.device_ptr(&stream);
            for r0 in (0..g.rows).step_by(8) {
                let rows = (g.rows - r0).min(8);
                tiles.extend([ptr, (g.start + r0) as u64 | (rows as u64) << 32]);
            }
        }
        if tiles.is_empty() {
            return Ok(());
        }
        let r = ctx.stream.clone_htod(&tiles);
        let Some(dev_tiles) = ctx.check(r, "upload of expert tiles") else {
            return Ok(());
        };
        let lc = LaunchConfig {
            grid_dim: ((n * 32).div_ceil(256) as u32, (tiles.len() / 2) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            ctx,
            &format!("gemv_experts_{t}"),
            lc,
            &dev_tiles,
            a,
            out,
            &i(n),
            &i(k)
        );
        Ok(())
    }
}
