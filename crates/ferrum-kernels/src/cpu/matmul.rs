//! Dense f32 GEMM: `out[m, n] = a[m, k] · b[n, k]ᵀ`.
//!
//! Two regimes. Decode-sized `m` is memory-bound: each weight row is
//! streamed once and dotted with every activation row while it is in L1, with
//! the `n` rows split across threads. Larger `m` is compute-bound and goes to
//! the `gemm` crate's packed, cache-blocked micro-kernels.

use rayon::prelude::*;

use super::{simd, SyncPtr};

#[cfg(target_arch = "x86_64")]
#[path = "x86/matmul.rs"]
mod x86;

/// Up to this many activation rows use the streaming kernel: from 16 rows
/// the `gemm` crate is faster (`cargo bench -p ferrum-kernels --bench
/// gemm`; figures in `docs/perf-log.md`), so streaming is kept for
/// decode-sized batches only.
pub(crate) const STREAMING_MAX_M: usize = 8;

/// Weight rows per parallel task: enough to amortise task overhead.
pub(crate) const ROWS_PER_TASK: usize = 16;

pub(crate) fn gemm(a: &[f32], b: &[f32], out: &mut [f32], m: usize, n: usize, k: usize) {
    let (a, b, out) = (&a[..m * k], &b[..n * k], &mut out[..m * n]);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    if m <= STREAMING_MAX_M {
        streaming(a, b, out, m, n, k);
    } else {
        // SAFETY: `out` holds exactly m × n values with row stride n.
        unsafe { blocked(a, b, out.as_mut_ptr(), n, m, n, k) };
    }
}

fn streaming(a: &[f32], b: &[f32], out: &mut [f32], m: usize, n: usize, k: usize) {
    let ptr = SyncPtr(out.as_mut_ptr());
    let tasks = n.div_ceil(ROWS_PER_TASK);
    let run = |t: usize| {
        let lo = t * ROWS_PER_TASK;
        let hi = (lo + ROWS_PER_TASK).min(n);
        let mut dots = [0f32; STREAMING_MAX_M];
        for j in lo..hi {
            let w = &b[j * k..(j + 1) * k];
            multi_dot(a, w, k, &mut dots[..m]);
            for (i, &d) in dots[..m].iter().enumerate() {
                // SAFETY: i < m, j < n, so i * n + j is inside `out`, and
                // only the task owning row j writes column j.
                unsafe { *ptr.get().add(i * n + j) = d };
            }
        }
    };
    if tasks == 1 || rayon::current_num_threads() == 1 {
        (0..tasks).for_each(run);
    } else {
        (0..tasks).into_par_iter().for_each(run);
    }
}

/// `dots[i] = a[i, :] · w` for every row of `a`, reading `w` once.
pub(crate) fn multi_dot(a: &[f32], w: &[f32], k: usize, dots: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::features::has_avx2() {
        let mut i = 0;
        while i + 4 <= dots.len() {
            // SAFETY: AVX2/FMA present; rows i..i+4 exist in `a`.
            let d = unsafe { x86::dot4_avx2(&a[i * k..(i + 4) * k], w, k) };
            dots[i..i + 4].copy_from_slice(&d);
            i += 4;
        }
        for (r, d) in dots.iter_mut().enumerate().skip(i) {
            *d = simd::dot(&a[r * k..(r + 1) * k], w);
        }
        return;
    }
    for (r, d) in dots.iter_mut().enumerate() {
        *d = simd::dot(&a[r * k..(r + 1) * k], w);
    }
}

/// `out[i, j] = a[i, :] · b[j, :]` through the `gemm` crate, writing row `i`
/// of the result at `out + i · ldo` (a column block of a wider matrix).
///
/// # Safety
/// `out` must be valid for writes of `m` rows of `n` values at stride `ldo`,
/// and nothing else may access that memory during the call.
pub(crate) unsafe fn blocked(
    a: &[f32],
    b: &[f32],
    out: *mut f32,
    ldo: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    let (a, b) = (&a[..m * k], &b[..n * k]);
    let threads = rayon::current_num_threads();
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the strides describe a[m, k] (row-major), bᵀ viewed as a
    // [k, n] matrix with column stride k, and out[m, n] with row stride ldo,
    // which the caller guarantees is writable.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out,
            1,
            ldo as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
}
