//! AVX2 + FMA code of the f32 matmul.

use std::arch::x86_64::*;

/// Four rows of `a` (`[4, k]`) against one weight row, sharing each load of
/// `w` across the four accumulators.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot4_avx2(a: &[f32], w: &[f32], k: usize) -> [f32; 4] {
    let pw = w.as_ptr();
    let pa = a.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut c = 0;
    while c + 8 <= k {
        let vw = _mm256_loadu_ps(pw.add(c));
        for (r, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(r * k + c)), vw, *acc);
        }
        c += 8;
    }
    let mut res = [0f32; 4];
    for (r, out) in res.iter_mut().enumerate() {
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r]);
        let mut s: f32 = lanes.iter().sum();
        for cc in c..k {
            s = (*pa.add(r * k + cc)).mul_add(*pw.add(cc), s);
        }
        *out = s;
    }
    res
}
