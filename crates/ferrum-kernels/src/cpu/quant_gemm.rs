//! GEMM against GGUF-quantized weights, dequantizing rows on the fly.
//!
//! The weight stays in its file blocks in memory (about a quarter to an
//! eighth of f32). Decode-sized batches stream each row through a per-thread
//! f32 buffer and dot it with every activation row; larger batches
//! dequantize a tile of rows and hand it to the blocked f32 GEMM, so the
//! dequantization cost is amortised over all `m` rows.

use std::cell::RefCell;

use ferrum_types::{FerrumError, GgmlType, Result};
use rayon::prelude::*;

use super::matmul::{blocked, multi_dot, ROWS_PER_TASK, STREAMING_MAX_M};
use super::quant_dot;
use super::SyncPtr;
use crate::quant::dequantize;

/// Up to this many groups of `STREAMING_MAX_M` activation rows stream each
/// weight row once per group; above it, dequantizing a tile once and running
/// the blocked GEMM is cheaper. Batched decoding of up to 32 sequences stays
/// on the streaming path (SmolLM2 Q4_1, 2 threads, `ferrum bench --batch 16`:
/// 98 -> 249 tok/s).
const STREAMING_GROUPS: usize = 4;

/// Weight rows dequantized per tile in the large-`m` path.
const TILE_ROWS: usize = 128;

thread_local! {
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[m, n] = a[m, k] · dequant(w)[n, k]ᵀ` with `w` in `ty` blocks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_gguf(
    a: &[f32],
    w: &[u8],
    ty: GgmlType,
    out: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    if k % bs != 0 {
        return Err(FerrumError::invalid(format!(
            "gemm_quant {ty}: k = {k} is not a multiple of the block size {bs}"
        )));
    }
    let row_bytes = k / bs * bb;
    if w.len() < n * row_bytes || a.len() < m * k || out.len() < m * n {
        return Err(FerrumError::invalid(format!(
            "gemm_quant {ty}: buffers too small for m = {m}, n = {n}, k = {k} ({} weight bytes, need {})",
            w.len(),
            n * row_bytes
        )));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (a, out) = (&a[..m * k], &mut out[..m * n]);
    if m <= STREAMING_GROUPS * STREAMING_MAX_M {
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
            let fused = quant_dot::supports(ty);
            for j in t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n) {
                let wrow = &w[j * row_bytes..(j + 1) * row_bytes];
                if !fused {
                    dequantize(ty, wrow, &mut row)?;
                }
                // Activation rows in groups the kernels keep in registers;
                // the weight row stays in L1 between groups.
                for g0 in (0..m).step_by(STREAMING_MAX_M) {
                    let gm = STREAMING_MAX_M.min(m - g0);
                    let ag = &a[g0 * k..(g0 + gm) * k];
                    if fused {
                        quant_dot::dot_rows(ty, wrow, ag, k, &mut dots[..gm]);
                    } else {
                        multi_dot(ag, &row, k, &mut dots[..gm]);
                    }
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
