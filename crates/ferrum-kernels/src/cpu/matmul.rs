//! Dense f32 GEMM: `out[m, n] = a[m, k] · b[n, k]ᵀ`.
//!
//! Two regimes. Decode-sized `m` is memory-bound: each weight row is
//! streamed once and dotted with every activation row while it is in L1, with
//! the `n` rows split across threads. Larger `m` is compute-bound and goes to
//! the `gemm` crate's packed, cache-blocked micro-kernels, except for small
//! weight matrices (MoE routers), which keep streaming so that a row's
//! results never depend on the batch.

use rayon::prelude::*;

use super::SyncPtr;

#[cfg(target_arch = "x86_64")]
#[path = "x86/matmul.rs"]
mod x86;

/// Up to this many activation rows use the streaming kernel: from 16 rows
/// the `gemm` crate is faster (`cargo bench -p ferrum-benches --bench
/// gemm`; figures in `docs/perf-log.md`), so streaming is kept for
/// decode-sized batches only.
pub(crate) const STREAMING_MAX_M: usize = 8;

/// Weight matrices of at most this many rows stream for any `m`, so that
/// each activation row's results are the same bits however many rows come
/// with it (the `gemm` crate's blocking rounds differently for different
/// `m`). These are MoE routers (8 to 256 experts): their scores pick the
/// experts, and a batch must pick what each sequence alone picks. Their
/// weights stay in cache, so streaming costs little even for a prompt.
pub(crate) const ROW_INVARIANT_MAX_N: usize = 256;

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
    if m <= STREAMING_MAX_M || n <= ROW_INVARIANT_MAX_N {
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
            for r0 in (0..m).step_by(STREAMING_MAX_M) {
                let rows = STREAMING_MAX_M.min(m - r0);
                multi_dot(&a[r0 * k..], w, k, &mut dots[..rows]);
                for (i, &d) in dots[..rows].iter().enumerate() {
                    // SAFETY: r0 + i < m, j < n, so (r0 + i) * n + j is
                    // inside `out`, and only the task owning row j writes
                    // column j.
                    unsafe { *ptr.get().add((r0 + i) * n + j) = d };
                }
            }
        }
    };
    if tasks == 1 || rayon::current_num_threads() == 1 {
        (0..tasks).for_each(run);
    } else {
        (0..tasks).into_par_iter().for_each(run);
    }
}

/// `dots[i] = a[i, :] · w` for every row of `a`, reading `w` once. A row's
/// result does not depend on how many rows come with it or where it sits
/// among them (four at a time share the loads of `w`, the same arithmetic
/// per row as one alone).
pub(crate) fn multi_dot(a: &[f32], w: &[f32], k: usize, dots: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::features::has_avx2() {
        let fours = dots.len() / 4 * 4;
        for (i, d) in dots[..fours].chunks_exact_mut(4).enumerate() {
            // SAFETY: AVX2/FMA present; `dots_avx2` asserts its extents.
            d.copy_from_slice(&unsafe { x86::dots_avx2::<4>(&a[4 * i * k..], w, k) });
        }
        for (i, d) in dots.iter_mut().enumerate().skip(fours) {
            // SAFETY: as above.
            *d = unsafe { x86::dots_avx2::<1>(&a[i * k..], w, k) }[0];
        }
        return;
    }
    for (r, d) in dots.iter_mut().enumerate() {
        *d = dot_row(&a[r * k..(r + 1) * k], &w[..k]);
    }
}

/// [`multi_dot`] against a weight row of `k` F16 (`bf16`: BF16) values in
/// the file's bytes, widened as they are loaded, on AVX2 (with F16C): the
/// same float steps as `multi_dot` on the widened row, so the same bits,
/// reading half the bytes of f32 weights.
#[cfg(target_arch = "x86_64")]
pub(crate) fn multi_dot_halves(a: &[f32], w: &[u8], bf16: bool, k: usize, dots: &mut [f32]) {
    assert!(super::features::has_avx2() && w.len() >= 2 * k);
    fn rows<const R: usize>(a: &[f32], w: &[u8], bf16: bool, k: usize) -> [f32; R] {
        // SAFETY: AVX2/FMA/F16C present and `w` holds `k` 16-bit values
        // (asserted by the caller; read unaligned); `dots_of` asserts `a`.
        unsafe {
            if bf16 {
                x86::dots_of::<R, half::bf16>(a, w.as_ptr().cast(), k)
            } else {
                x86::dots_of::<R, half::f16>(a, w.as_ptr().cast(), k)
            }
        }
    }
    let fours = dots.len() / 4 * 4;
    for (i, d) in dots[..fours].chunks_exact_mut(4).enumerate() {
        d.copy_from_slice(&rows::<4>(&a[4 * i * k..], w, bf16, k));
    }
    for (i, d) in dots.iter_mut().enumerate().skip(fours) {
        *d = rows::<1>(&a[i * k..], w, bf16, k)[0];
    }
}

/// One row of [`multi_dot`] in `x86::dots_avx2`'s float steps, so that
/// other CPUs give its bits: two eight-lane chains over alternate runs of
/// eight, one more run into the first, the chains added, the lanes summed
/// in order, then the tail.
fn dot_row(a: &[f32], w: &[f32]) -> f32 {
    let k = a.len();
    let mut acc = [[0f32; 8]; 2];
    let mut c = 0;
    let run = |acc: &mut [f32; 8], c: usize| {
        for (l, acc) in acc.iter_mut().enumerate() {
            *acc = a[c + l].mul_add(w[c + l], *acc);
        }
    };
    while c + 16 <= k {
        run(&mut acc[0], c);
        run(&mut acc[1], c + 8);
        c += 16;
    }
    if c + 8 <= k {
        run(&mut acc[0], c);
        c += 8;
    }
    let lanes: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut s: f32 = lanes.iter().sum();
    for (&a, &w) in a[c..].iter().zip(&w[c..]) {
        s = a.mul_add(w, s);
    }
    s
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// The portable row dot gives the AVX2 kernel's bits (so other CPUs
    /// stream f32 weights to x86's results), for lengths with and without
    /// tails.
    #[test]
    fn portable_rows_give_the_avx2_bits() {
        if !super::super::features::has_avx2() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let mut rng = StdRng::seed_from_u64(11);
        for k in [1usize, 7, 8, 15, 16, 24, 33, 100, 896] {
            let a: Vec<f32> = (0..k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            let w: Vec<f32> = (0..k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            // SAFETY: AVX2 checked; one row of k values each.
            let want = unsafe { super::x86::dots_avx2::<1>(&a, &w, k) }[0];
            assert_eq!(super::dot_row(&a, &w).to_bits(), want.to_bits(), "k={k}");
        }
    }
}
