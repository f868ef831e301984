use std::arch::x86_64::*;

use super::{act_scale, ACT_MAX};

/// The vector twin of `quantize_act`: the same scale, the same product
/// `x · (1/d)` and round-half-even, so the same values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize(x: &[f32], group: usize, qs: &mut [i16], d: &mut [f32]) {
    let sign = _mm256_set1_ps(-0.0);
    let max = f32::from(ACT_MAX);
    let (lo, hi) = (_mm256_set1_ps(-max), _mm256_set1_ps(max));
    for (g, dg) in d.iter_mut().enumerate() {
        let p = x.as_ptr().add(g * group);
        let mut m = _mm256_setzero_ps();
        for o in (0..group).step_by(8) {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(o))));
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        let (scale, inv) = act_scale(_mm_cvtss_f32(m));
        *dg = scale;
        let inv = _mm256_set1_ps(inv);
        let q = |o: usize| {
            let r = _mm256_round_ps(
                _mm256_mul_ps(_mm256_loadu_ps(p.add(o)), inv),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
        };
        for o in (0..group).step_by(16) {
            // Packing interleaves 128-bit lanes; the permute restores order.
            let packed = _mm256_packs_epi32(q(o), q(o + 8));
            let packed = _mm256_permute4x64_epi64(packed, 0b11_01_10_00);
            _mm256_storeu_si256(qs.as_mut_ptr().add(g * group + o).cast(), packed);
        }
    }
}

/// One group of [`super::ActRows::quantize8`]: 32 values of `x` to `q`
/// (reordered unless `natural`); returns `(d, d · Σq)` and the outlier's
/// index, if any.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize8(
    x: &[f32],
    q: &mut [i8],
    natural: bool,
) -> (f32, f32, Option<usize>) {
    let (x, q) = (&x[..32], &mut q[..32]);
    let mut v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
    let max = abs_max(&v);
    // Σx² in f32: per lane l, x[l]² then fused multiply-adds of x[l + 8],
    // x[l + 16], x[l + 24]; then lanes l + (l + 4), then (0 + 2) + (1 + 3).
    let mut sq = _mm256_mul_ps(v[0], v[0]);
    for v in &v[1..] {
        sq = _mm256_fmadd_ps(*v, *v, sq);
    }
    let sq = _mm_add_ps(_mm256_castps256_ps128(sq), _mm256_extractf128_ps(sq, 1));
    let sq = _mm_add_ps(sq, _mm_movehl_ps(sq, sq));
    let sum_sq = _mm_cvtss_f32(_mm_add_ss(sq, _mm_shuffle_ps(sq, sq, 1)));
    let mut spike = None;
    let mut m = max;
    if max * max > super::OUTLIER_SHARE * sum_sq {
        // The first value of the largest magnitude; the rest's scale.
        let i = x.iter().position(|v| v.abs() == max).unwrap_or(0);
        let mut rest = [0f32; 32];
        rest.copy_from_slice(x);
        rest[i] = 0.0;
        v = std::array::from_fn(|j| _mm256_loadu_ps(rest.as_ptr().add(8 * j)));
        m = abs_max(&v);
        spike = Some(i);
    }
    let d = m / 127.0;
    let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let qi = v.map(|v| {
        _mm256_cvtps_epi32(_mm256_round_ps(
            _mm256_mul_ps(v, inv),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        ))
    });
    let sum = _mm256_add_epi32(
        _mm256_add_epi32(qi[0], qi[1]),
        _mm256_add_epi32(qi[2], qi[3]),
    );
    let sum = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256(sum, 1),
    );
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b01_00_11_10));
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b10_11_00_01));
    // Packing interleaves 128-bit lanes (i32 -> i16 -> i8 leaves the
    // eight dwords in the order 0, 2, 4, 6, 1, 3, 5, 7); the permute
    // restores order and the shuffle reorders each run of eight.
    let b = _mm256_packs_epi16(
        _mm256_packs_epi32(qi[0], qi[1]),
        _mm256_packs_epi32(qi[2], qi[3]),
    );
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let order = _mm256_setr_epi8(
        0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13,
        10, 14, 11, 15,
    );
    let b = if natural {
        b
    } else {
        _mm256_shuffle_epi8(b, order)
    };
    _mm256_storeu_si256(q.as_mut_ptr().cast(), b);
    (d, d * _mm_cvtsi128_si32(sum) as f32, spike)
}

/// The largest magnitude of 32 values.
#[inline(always)]
unsafe fn abs_max(v: &[__m256; 4]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for v in v {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)))
}
