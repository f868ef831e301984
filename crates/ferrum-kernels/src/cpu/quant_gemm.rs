//! GEMM against GGUF-quantized weights, which stay in blocks in memory
//! (about a quarter to an eighth of f32).
//!
//! Types with an integer kernel quantize the activations to 16-bit integers
//! (or 8-bit ones where the model allows) once per call and stream every
//! weight row against them in groups of eight activation rows, for any `m`:
//! the same arithmetic for every row keeps batched results equal to
//! unbatched ones. The 32-value block types are interleaved at load
//! (`interleaved`), the k-quants grouped by rows (`kquant_rows`). Other
//! types, and every type on CPUs without these kernels (x86 without AVX2),
//! dequantize: rows through a per-thread f32 buffer for decode-sized
//! batches, tiles handed to the blocked f32 GEMM for larger ones.

use std::cell::RefCell;

use ferrum_types::{FerrumError, GgmlType, Result};
use rayon::prelude::*;

use super::act_quant::ActRows;
#[cfg(target_arch = "x86_64")]
use super::matmul::multi_dot_halves;
use super::matmul::{blocked, multi_dot, ROWS_PER_TASK, STREAMING_MAX_M};
use super::profile::{self, Op};
use super::SyncPtr;
use super::{interleaved, kquant_rows};
use crate::quant::dequantize;
use crate::Dtype;

/// Up to this many groups of `STREAMING_MAX_M` activation rows stream each
/// dequantized weight row once per group; above it, dequantizing a tile once
/// and running the blocked GEMM is cheaper.
const STREAMING_GROUPS: usize = 4;

/// Weight rows dequantized per tile in the large-`m` path.
const TILE_ROWS: usize = 512;

thread_local! {
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static ACT: RefCell<ActRows> = RefCell::new(ActRows::default());
}

/// Runs `f` with this thread's cached value of `key`, or with a fresh one
/// when it is already in use: a pool thread waiting inside a parallel loop
/// may pick up a second GEMM of another caller.
fn with_scratch<T: Default + 'static, R>(
    key: &'static std::thread::LocalKey<RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut T::default()),
    })
}

/// `out[m, n] = a[m, k] · dequant(w)[n, k]ᵀ` with `w` in `ty` blocks, in
/// the repacked layout if `layout` says so (and names `ty`). With
/// `int8_activations`, the k-quants, Q4_1 and Q8_0 take 8-bit activations
/// (`interleaved::takes_act8`, `kquant_rows::supports`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_gguf(
    a: &[f32],
    w: &[u8],
    ty: GgmlType,
    layout: Dtype,
    int8_activations: bool,
    out: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let repacked = layout.weight_layout(ty, "gemm_quant")?;
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    if !k.is_multiple_of(bs) {
        return Err(FerrumError::invalid(format!(
            "gemm_quant {ty}: k = {k} is not a multiple of the block size {bs}"
        )));
    }
    let row_bytes = k / bs * bb;
    let need = if repacked && interleaved::supports(ty) {
        interleaved::weight_bytes(ty, n, k)
    } else if repacked && kquant_rows::supports(ty) {
        kquant_rows::weight_bytes(ty, n, k)
    } else {
        n * row_bytes
    };
    if w.len() < need || a.len() < m * k || out.len() < m * n {
        return Err(FerrumError::invalid(format!(
            "gemm_quant {ty}: buffers too small for m = {m}, n = {n}, k = {k} ({} weight bytes, need {need})",
            w.len(),
        )));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (a, out) = (&a[..m * k], &mut out[..m * n]);
    if repacked && interleaved::supports(ty) {
        let act8 = int8_activations && interleaved::takes_act8(ty);
        with_scratch(&ACT, |act| {
            let quantizing = profile::phase(Op::ActQuant);
            if act8 && ty == GgmlType::Q8_0 {
                act.quantize8(a, m, k, true);
                interleaved::prepare_q8_0(act, m);
            } else if act8 {
                act.quantize8(a, m, k, false);
            } else {
                act.quantize(a, m, k, 32);
            }
            drop(quantizing);
            interleaved::gemm(act, w, ty, out, m, n);
        });
        Ok(())
    } else if repacked && kquant_rows::supports(ty) {
        with_scratch(&ACT, |act| {
            let quantizing = profile::phase(Op::ActQuant);
            kquant_rows::quantize(act, a, m, k, int8_activations);
            drop(quantizing);
            kquant_rows::gemm(act, w, ty, out, m, n);
        });
        Ok(())
    } else if m <= STREAMING_GROUPS * STREAMING_MAX_M {
        streaming(a, w, ty, row_bytes, out, m, n, k)
    } else {
        tiled(a, w, ty, row_bytes, out, m, n, k)
    }
}

#[allow(clippy::too_many_arguments)]
fn streaming(
    a: &[f32],
    w: &[u8],
    ty: GgmlType,
    row_bytes: usize,
    out: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let ptr = SyncPtr(out.as_mut_ptr());
    let tasks = n.div_ceil(ROWS_PER_TASK);
    (0..tasks).into_par_iter().try_for_each(|t| {
        ROW.with(|row| {
            let mut row = row.borrow_mut();
            row.resize(k, 0.0);
            let mut dots = [0f32; STREAMING_MAX_M];
            // F16/BF16 rows widen as they are loaded where AVX2 can.
            let halves = matches!(ty, GgmlType::F16 | GgmlType::BF16)
                && cfg!(target_arch = "x86_64")
                && super::features::has_avx2();
            for j in t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n) {
                let wrow = &w[j * row_bytes..(j + 1) * row_bytes];
                if !halves {
                    dequantize(ty, wrow, &mut row)?;
                }
                // Activation rows in groups the kernels keep in registers;
                // the weight row stays in L1 between groups.
                for g0 in (0..m).step_by(STREAMING_MAX_M) {
                    let gm = STREAMING_MAX_M.min(m - g0);
                    let ag = &a[g0 * k..(g0 + gm) * k];
                    #[cfg(target_arch = "x86_64")]
                    if halves {
                        let bf16 = ty == GgmlType::BF16;
                        multi_dot_halves(ag, wrow, bf16, k, &mut dots[..gm]);
                    } else {
                        multi_dot(ag, &row, k, &mut dots[..gm]);
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    multi_dot(ag, &row, k, &mut dots[..gm]);
                    for (i, &d) in dots[..gm].iter().enumerate() {
                        // SAFETY: g0 + i < m, j < n; only this task writes
                        // column j.
                        unsafe { *ptr.get().add((g0 + i) * n + j) = d };
                    }
                }
            }
            Ok(())
        })
    })
}

#[allow(clippy::too_many_arguments)]
fn tiled(
    a: &[f32],
    w: &[u8],
    ty: GgmlType,
    row_bytes: usize,
    out: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    TILE.with(|tile| {
        let mut tile = tile.borrow_mut();
        tile.resize(TILE_ROWS * k, 0.0);
        let mut j0 = 0;
        while j0 < n {
            let rows = TILE_ROWS.min(n - j0);
            tile[..rows * k]
                .par_chunks_mut(k)
                .enumerate()
                .try_for_each(|(r, dst)| {
                    dequantize(ty, &w[(j0 + r) * row_bytes..(j0 + r + 1) * row_bytes], dst)
                })?;
            // SAFETY: columns j0..j0+rows of every row of `out` ([m, n]).
            unsafe {
                blocked(
                    a,
                    &tile[..rows * k],
                    out.as_mut_ptr().add(j0),
                    n,
                    m,
                    rows,
                    k,
                )
            };
            j0 += rows;
        }
        Ok(())
    })
}
