//! Matrix products: f32 cuBLAS for dense weights; for GGUF blocks, the
//! q8_1 GEMV (`kernels/mmvq.cu`) for decode-sized batches and, for
//! prefill, the weights dequantized to bf16 for cuBLAS's tensor cores.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use ferrum_types::{FerrumError, Result};

use super::launch::{self, Ptr, PtrMut};
use super::{device, i, linear, scratch, CudaBuffer, CudaContext};
use crate::backend::{ExpertRows, GgufQuantType};

/// Rows up to which `gemm_quant` runs the q8_1 GEMV: tiles of
/// [`MMVQ_ROWS`] rows, each reading the weights again (in part from L2).
/// More rows dequantize the weights to bf16 once for the tensor cores,
/// which writes and reads about four bytes per weight: more than four
/// tiles' reads of 4-bit blocks.
pub(super) const MMVQ_MAX_ROWS: usize = 32;

/// Activation rows one GEMV block takes (`MMVQ_ROWS` in mmvq.cu).
const MMVQ_ROWS: usize = 8;

/// Rows per expert up to which `gemm_quant_experts` runs an expert in the
/// grouped GEMV (tiles of [`MMVQ_ROWS`] that each read the expert's
/// blocks, the repeats mostly from L2); an expert with more rows (prefill)
/// goes through the prefill GEMM.
const GROUPED_GEMV_ROWS: usize = 64;

/// Output columns a warp of the f32 `gemv_q4_k` computes (`Q4K_COLS` in
/// dequant.cu).
const Q4K_COLS: usize = 4;

/// `out[m, n] = a[m, k] · w[n, k]ᵀ` with cuBLAS (column-major: outᵀ = w · aᵀ).
pub(super) fn sgemm(
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

/// `out[m, n] = a[m, k] · dequant(w)[n, k]ᵀ` for many rows (prefill).
/// The default: `w` (type `t`) and `a` converted to bf16 in a scratch,
/// multiplied on the tensor cores with f32 accumulation (bf16's 8-bit
/// significand costs ~2⁻⁹ relative per value, below the weights' own
/// quantization step). With f32 activations (`Device::f32_activations`),
/// the f32 dequant and SGEMM.
#[allow(clippy::too_many_arguments)]
pub(super) fn dequant_gemm(
    ctx: &mut CudaContext,
    t: GgufQuantType,
    w: &CudaBuffer,
    a: &(impl DevicePtr<f32> + Ptr),
    out: &mut impl DevicePtrMut<f32>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let dev = device::get();
    if dev.f32_activations.load(Ordering::Relaxed) {
        let mut guard = scratch(&dev.scratch, n * k);
        let Some(buf) = guard.as_mut() else {
            return Err(FerrumError::Device("scratch allocation failed".into()));
        };
        launch::dequant(ctx, t, linear(n * k), w, &mut *buf, i(n), i(k));
        sgemm(ctx, a, &*buf, out, m, n, k);
        return Ok(());
    }
    // Two bf16 values a float of the scratch: k is a multiple of 32.
    let (wl, al) = (n * k / 2, m * k / 2);
    let mut guard = scratch(&dev.bf16_scratch, wl + al);
    let Some(buf) = guard.as_mut() else {
        return Err(FerrumError::Device("scratch allocation failed".into()));
    };
    let (mut wb, mut rest) = buf.split_at_mut(wl);
    let mut ab = rest.slice_mut(..al);
    let groups = n * k / 8;
    let lc = LaunchConfig {
        grid_dim: (groups.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let stream = ctx.stream.clone();
    launch::dequant_bf16(ctx, t, lc, w, &mut wb, i(n), i(k));
    launch::to_bf16(ctx, linear(m * k), a, &mut ab, i(m * k));
    if ctx.error.is_some() {
        return Ok(());
    }
    let (wp, _w) = wb.device_ptr(&stream);
    let (ap, _a) = ab.device_ptr(&stream);
    let (op, _o) = out.device_ptr_mut(&stream);
    let (one, zero) = (1.0f32, 0.0f32);
    // SAFETY: wb holds n·k and ab m·k bf16 values, out m·n f32 (column-
    // major outᵀ = wᵀᵀ · aᵀ as in `sgemm`); alpha and beta outlive the call.
    let r = unsafe {
        cudarc::cublas::result::gemm_ex(
            *dev.blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            i(n),
            i(m),
            i(k),
            (&one as *const f32).cast::<c_void>(),
            wp as *const c_void,
            cudaDataType::CUDA_R_16BF,
            i(k),
            ap as *const c_void,
            cudaDataType::CUDA_R_16BF,
            i(k),
            (&zero as *const f32).cast::<c_void>(),
            op as *mut c_void,
            cudaDataType::CUDA_R_32F,
            i(n),
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    ctx.check(r, "cuBLAS bf16 GEMM");
    Ok(())
}

/// Quantizes `rows` rows of `a` to q8_1 into the device's scratch and
/// hands the int8 values and the block scales to `run`.
fn with_q8(
    ctx: &mut CudaContext,
    a: &impl Ptr,
    rows: usize,
    k: usize,
    run: impl FnOnce(&mut CudaContext, &CudaSlice<f32>, usize),
) -> Result<()> {
    // int8 values (k / 4 floats a row), then (d, d·Σq) per 32 values.
    let (ql, dl) = (rows * k / 4, rows * k / 16);
    let mut guard = scratch(&device::get().q8_scratch, ql + dl);
    let Some(buf) = guard.as_mut() else {
        return Err(FerrumError::Device("scratch allocation failed".into()));
    };
    let blocks = rows * k / 32;
    let lc = LaunchConfig {
        grid_dim: ((blocks * 32).div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    {
        let (mut xq, mut xd) = buf.split_at_mut(ql);
        launch::quantize_q8_1(ctx, lc, a, &mut xq, &mut xd, i(blocks));
    }
    run(ctx, buf, ql);
    Ok(())
}

/// `out[m, n] = a[m, k] · w[n, k]ᵀ` for GGUF blocks of type `quant_type`,
/// `a` already in the weight's input order. With f32 activations
/// (`Device::f32_activations`), the f32 GEMV kernels up to 8 rows.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_blocks(
    ctx: &mut CudaContext,
    quant_type: GgufQuantType,
    w: &CudaBuffer,
    a: &(impl DevicePtr<f32> + Ptr),
    out: &mut (impl DevicePtrMut<f32> + PtrMut),
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let dev = device::get();
    let f32_activations = dev.f32_activations.load(Ordering::Relaxed);
    if f32_activations && m <= 8 {
        // A warp per output column (Q4_K: per Q4K_COLS) reads the blocks
        // once for all m rows.
        let warps = match quant_type {
            GgufQuantType::Q4K => n.div_ceil(Q4K_COLS),
            _ => n,
        };
        let lc = LaunchConfig {
            grid_dim: ((warps * 32).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        launch::gemv(ctx, quant_type, lc, w, a, out, i(m), i(n), i(k));
        return Ok(());
    }
    if f32_activations || m > dev.mmvq_rows {
        return dequant_gemm(ctx, quant_type, w, a, out, m, n, k);
    }
    let tune = dev.tune;
    with_q8(ctx, a, m, k, |ctx, q8, ql| {
        let lc = LaunchConfig {
            grid_dim: (
                n.div_ceil(tune.cols) as u32,
                m.div_ceil(MMVQ_ROWS) as u32,
                1,
            ),
            block_dim: (tune.threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xq, xd) = q8.split_at(ql);
        // One token: the one-row kernel (a third of the registers).
        let mmvq = if m == 1 { launch::mmvq1 } else { launch::mmvq };
        mmvq(ctx, quant_type, lc, w, &xq, &xd, out, i(m), i(n), i(k));
    })
}

/// Every expert group with at most [`GROUPED_GEMV_ROWS`] rows in one
/// launch (a table of tiles: weight pointer, first row, rows); the rest
/// through [`dequant_gemm`] one by one.
pub(super) fn gemm_experts(
    ctx: &mut CudaContext,
    a: &CudaBuffer,
    groups: &[ExpertRows<'_, super::CudaBackend>],
    out: &mut CudaBuffer,
    n: usize,
    k: usize,
    quant_type: GgufQuantType,
) -> Result<()> {
    let dev = device::get();
    let stream = ctx.stream.clone();
    let mut tiles: Vec<u64> = Vec::new();
    let (mut rows_used, mut one_row) = (0, true);
    for g in groups.iter().filter(|g| g.rows > 0) {
        if g.rows > GROUPED_GEMV_ROWS {
            let rows_a = a.slice(g.start * k..(g.start + g.rows) * k);
            let mut rows_out = out.slice_mut(g.start * n..(g.start + g.rows) * n);
            dequant_gemm(
                ctx,
                quant_type,
                g.weights,
                &rows_a,
                &mut rows_out,
                g.rows,
                n,
                k,
            )?;
            continue;
        }
        // The pointer is read by kernels queued on this same stream.
        let (ptr, _sync) = g.weights.device_ptr(&stream);
        for r0 in (0..g.rows).step_by(MMVQ_ROWS) {
            let rows = (g.rows - r0).min(MMVQ_ROWS);
            tiles.extend([ptr, (g.start + r0) as u64 | (rows as u64) << 32]);
            one_row &= rows == 1;
        }
        rows_used = rows_used.max(g.start + g.rows);
    }
    if tiles.is_empty() {
        return Ok(());
    }
    let r = ctx.stream.clone_htod(&tiles);
    let Some(dev_tiles) = ctx.check(r, "upload of expert tiles") else {
        return Ok(());
    };
    if dev.f32_activations.load(Ordering::Relaxed) {
        let lc = LaunchConfig {
            grid_dim: ((n * 32).div_ceil(256) as u32, (tiles.len() / 2) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        launch::gemv_experts(ctx, quant_type, lc, &dev_tiles, a, out, i(n), i(k));
        return Ok(());
    }
    let tune = dev.tune;
    with_q8(ctx, a, rows_used, k, |ctx, q8, ql| {
        let lc = LaunchConfig {
            grid_dim: (n.div_ceil(tune.cols) as u32, (tiles.len() / 2) as u32, 1),
            block_dim: (tune.threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xq, xd) = q8.split_at(ql);
        let mmvq = if one_row {
            launch::mmvq1_experts
        } else {
            launch::mmvq_experts
        };
        mmvq(ctx, quant_type, lc, &dev_tiles, &xq, &xd, out, i(n), i(k));
    })
}
