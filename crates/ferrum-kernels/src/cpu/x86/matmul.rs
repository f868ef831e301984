//! AVX2 + FMA code of the f32 matmul.

use std::arch::x86_64::*;

/// `R` rows of `a` (`[R, k]`) against one weight row, sharing each load of
/// `w` across the rows. Each row's result is the same bits for any `R`:
/// two eight-lane accumulators (alternate chunks of eight, so one row
/// alone is not held up by the latency of a single chain), added, their
/// lanes summed in order, then the tail. So a row does not depend on the
/// rows computed beside it.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dots_avx2<const R: usize>(a: &[f32], w: &[f32], k: usize) -> [f32; R] {
    assert!(w.len() >= k);
    dots_of::<R, f32>(a, w.as_ptr(), k)
}

/// A weight row's element type: f32, or 16-bit floats widened as loaded.
pub(super) trait Elem {
    /// Eight values from `p`.
    unsafe fn load8(p: *const Self) -> __m256;
    unsafe fn at(p: *const Self) -> f32;
}
impl Elem for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn at(p: *const f32) -> f32 {
        *p
    }
}
impl Elem for half::f16 {
    /// F16C's `VCVTPH2PS`.
    #[inline(always)]
    unsafe fn load8(p: *const half::f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    unsafe fn at(p: *const half::f16) -> f32 {
        p.read_unaligned().to_f32()
    }
}
impl Elem for half::bf16 {
    /// The bits moved to an f32's top half.
    #[inline(always)]
    unsafe fn load8(p: *const half::bf16) -> __m256 {
        let x = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(x, 16))
    }
    #[inline(always)]
    unsafe fn at(p: *const half::bf16) -> f32 {
        p.read_unaligned().to_f32()
    }
}

/// [`dots_avx2`] for a weight row of `k` values of `E` at `pw`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dots_of<const R: usize, E: Elem>(
    a: &[f32],
    pw: *const E,
    k: usize,
) -> [f32; R] {
    assert!(a.len() >= R * k);
    let pa = a.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut c = 0;
    while c + 16 <= k {
        for h in 0..2 {
            let vw = E::load8(pw.add(c + 8 * h));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(pa.add(r * k + c + 8 * h));
                acc[h] = _mm256_fmadd_ps(x, vw, acc[h]);
            }
        }
        c += 16;
    }
    if c + 8 <= k {
        let vw = E::load8(pw.add(c));
        for (r, acc) in acc.iter_mut().enumerate() {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(r * k + c)), vw, acc[0]);
        }
        c += 8;
    }
    let mut res = [0f32; R];
    for (r, out) in res.iter_mut().enumerate() {
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc[r][0], acc[r][1]));
        let mut s: f32 = lanes.iter().sum();
        for cc in c..k {
            s = (*pa.add(r * k + cc)).mul_add(E::at(pw.add(cc)), s);
        }
        *out = s;
    }
    res
}
