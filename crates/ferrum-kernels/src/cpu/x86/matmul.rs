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
    assert!(a.len() >= R * k && w.len() >= k);
    let pw = w.as_ptr();
    let pa = a.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut c = 0;
    while c + 16 <= k {
        for h in 0..2 {
            let vw = _mm256_loadu_ps(pw.add(c + 8 * h));
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(pa.add(r * k + c + 8 * h));
                acc[h] = _mm256_fmadd_ps(x, vw, acc[h]);
            }
        }
        c += 16;
    }
    if c + 8 <= k {
        let vw = _mm256_loadu_ps(pw.add(c));
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
            s = (*pa.add(r * k + cc)).mul_add(*pw.add(cc), s);
        }
        *out = s;
    }
    res
}
