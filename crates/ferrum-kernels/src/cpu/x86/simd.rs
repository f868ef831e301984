//! AVX2 + FMA implementations. Every function requires both features;
//! callers check [`super::has_avx2`] first.

use super::{erf_consts, exp_consts as e, scalar, Elem};
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot<T: Elem>(a: &[f32], b: &[T]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (all loads): i + width <= n = a.len() <= b.len().
    while i + 32 <= n {
        for (w, acc) in acc.iter_mut().enumerate() {
            let at = i + 8 * w;
            *acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(at)), T::load8(pb.add(at)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), T::load8(pb.add(i)), acc[0]);
        i += 8;
    }
    let acc = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(acc);
    while i < n {
        s = (*pa.add(i)).mul_add((*pb.add(i)).widen(), s);
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn sum_sq(x: &[f32]) -> f32 {
    dot(x, x)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn sum(x: &[f32]) -> f32 {
    let n = x.len();
    let p = x.as_ptr();
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        acc = _mm256_add_ps(acc, _mm256_loadu_ps(p.add(i)));
        i += 8;
    }
    hsum(acc) + x[i..].iter().sum::<f32>()
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_mul(out: &mut [f32], x: &[f32], s: f32, w: &[f32]) {
    let n = out.len();
    let vs = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vs);
        let v = _mm256_mul_ps(v, _mm256_loadu_ps(w.as_ptr().add(i)));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        i += 8;
    }
    scalar::scale_mul(&mut out[i..], &x[i..], s, &w[i..]);
}

/// `(first row, rows)` of each kernel pass over `count` rows: four while
/// four are left, then two, then one. Every pass keeps eight independent FMA chains (rows × keys for the
/// scores, rows × vectors for the accumulators): an FMA's four-cycle
/// latency at two per cycle needs eight in flight, and three rows' six
/// chains ran about 10% slower than one row at a time on f32 pools.
fn passes(count: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut first = 0;
    std::iter::from_fn(move || {
        let rows = match count - first {
            0 => return None,
            1 => 1,
            2 | 3 => 2,
            _ => 4,
        };
        first += rows;
        Some((first - rows, rows))
    })
}

/// Callers check the bounds (see `super::dot_many`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_many<T: Elem>(
    qs: &[&[f32]],
    x: &[T],
    rows: &[usize],
    s: f32,
    out: &mut [f32],
    stride: usize,
) {
    for (i, r) in passes(qs.len()) {
        let (qs, out) = (&qs[i..i + r], out.as_mut_ptr().add(i * stride));
        match r {
            1 => dot_pass::<T, 1, 8>(qs, x, rows, s, out, stride),
            2 => dot_pass::<T, 2, 4>(qs, x, rows, s, out, stride),
            _ => dot_pass::<T, 4, 2>(qs, x, rows, s, out, stride),
        }
    }
}

/// `R` queries against `KEYS` keys at a time (`R · KEYS = 8`) when the
/// length is a multiple of 8: one FMA chain per (query, key) pair, each
/// widened key vector feeding all `R` queries, and one reduction tree
/// for the eight sums. A pair's chain and its lane of the tree are the
/// same for any `R`, so scores do not depend on the grouping. Keys past
/// the last multiple of eight (and every key of other lengths) take
/// [`dot`], as they do for one query.
#[inline(always)]
unsafe fn dot_pass<T: Elem, const R: usize, const KEYS: usize>(
    qs: &[&[f32]],
    x: &[T],
    rows: &[usize],
    s: f32,
    out: *mut f32,
    stride: usize,
) {
    let n = qs[0].len();
    let q: [*const f32; R] = std::array::from_fn(|i| qs[i].as_ptr());
    let full = if n.is_multiple_of(8) {
        rows.len() / 8 * 8
    } else {
        0
    };
    for j in (0..full).step_by(KEYS) {
        let r: [*const T; KEYS] = std::array::from_fn(|t| x.as_ptr().add(rows[j + t]));
        let mut acc = [_mm256_setzero_ps(); 8];
        for c in (0..n).step_by(8) {
            let kv: [__m256; KEYS] = std::array::from_fn(|t| T::load8(r[t].add(c)));
            for (i, &q) in q.iter().enumerate() {
                let qv = _mm256_loadu_ps(q.add(c));
                for (t, &kv) in kv.iter().enumerate() {
                    acc[i * KEYS + t] = _mm256_fmadd_ps(qv, kv, acc[i * KEYS + t]);
                }
            }
        }
        let h = |a: usize| _mm256_hadd_ps(acc[a], acc[a + 1]);
        let (lo, hi) = (_mm256_hadd_ps(h(0), h(2)), _mm256_hadd_ps(h(4), h(6)));
        let sums = _mm256_add_ps(
            _mm256_permute2f128_ps(lo, hi, 0x20),
            _mm256_permute2f128_ps(lo, hi, 0x31),
        );
        let sums = _mm256_mul_ps(sums, _mm256_set1_ps(s));
        // Lane `i · KEYS + t` holds query `i`'s score for key `j + t`.
        let (lo, hi) = (_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1));
        let at = |i: usize| out.add(i * stride + j);
        match KEYS {
            8 => _mm256_storeu_ps(at(0), sums),
            4 => {
                _mm_storeu_ps(at(0), lo);
                _mm_storeu_ps(at(1), hi);
            }
            _ => {
                // Two scores (one 64-bit lane) per query.
                let pair = |v: __m128| _mm_cvtsi128_si64(_mm_castps_si128(v));
                let pairs = [lo, _mm_movehl_ps(lo, lo), hi, _mm_movehl_ps(hi, hi)];
                for (i, &v) in pairs.iter().enumerate() {
                    at(i).cast::<i64>().write_unaligned(pair(v));
                }
            }
        }
    }
    for (i, q) in qs.iter().enumerate() {
        for (j, &r) in rows.iter().enumerate().skip(full) {
            *out.add(i * stride + j) = s * dot(q, x.get_unchecked(r..r + n));
        }
    }
}

/// Callers check the bounds (see `super::axpy_many`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_many<T: Elem>(
    y: &mut [f32],
    n: usize,
    p: &[f32],
    stride: usize,
    x: &[T],
    rows: &[usize],
) {
    for (i, r) in passes(y.len() / n) {
        let (y, p) = (&mut y[i * n..(i + r) * n], p.as_ptr().add(i * stride));
        match r {
            1 => axpy_pass::<T, 1, 8>(y, n, p, stride, x, rows),
            2 => axpy_pass::<T, 2, 4>(y, n, p, stride, x, rows),
            _ => axpy_pass::<T, 4, 2>(y, n, p, stride, x, rows),
        }
    }
}

/// `R` rows of `y` in column blocks of `W` vectors (`R · W = 8`
/// accumulators), each loaded and stored once, against the same columns
/// of every key; then blocks of one vector, then a scalar tail.
#[inline(always)]
unsafe fn axpy_pass<T: Elem, const R: usize, const W: usize>(
    y: &mut [f32],
    n: usize,
    p: *const f32,
    stride: usize,
    x: &[T],
    rows: &[usize],
) {
    let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
    let mut c = 0;
    while c + 8 * W <= n {
        axpy_block::<T, R, W>(yp.add(c), n, p, stride, xp.add(c), rows);
        c += 8 * W;
    }
    while c + 8 <= n {
        axpy_block::<T, R, 1>(yp.add(c), n, p, stride, xp.add(c), rows);
        c += 8;
    }
    if c < n {
        for (i, y) in y.chunks_exact_mut(n).enumerate() {
            for (j, &r) in rows.iter().enumerate() {
                scalar::axpy(
                    &mut y[c..],
                    *p.add(i * stride + j),
                    x.get_unchecked(r + c..r + n),
                );
            }
        }
    }
}

/// `W` vectors of `R` rows of `y` (`n` apart, from `y`) against the same
/// columns of each key row.
#[inline(always)]
unsafe fn axpy_block<T: Elem, const R: usize, const W: usize>(
    y: *mut f32,
    n: usize,
    p: *const f32,
    stride: usize,
    x: *const T,
    rows: &[usize],
) {
    let mut acc: [[__m256; W]; R] =
        std::array::from_fn(|i| std::array::from_fn(|w| _mm256_loadu_ps(y.add(i * n + 8 * w))));
    for (j, &r) in rows.iter().enumerate() {
        let xr = x.add(r);
        let xv: [__m256; W] = std::array::from_fn(|w| T::load8(xr.add(8 * w)));
        for (i, acc) in acc.iter_mut().enumerate() {
            let a = _mm256_set1_ps(*p.add(i * stride + j));
            for (acc, &xv) in acc.iter_mut().zip(&xv) {
                *acc = _mm256_fmadd_ps(a, xv, *acc);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (w, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(y.add(i * n + 8 * w), *acc);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale(y: &mut [f32], s: f32) {
    let n = y.len();
    let vs = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        let py = y.as_mut_ptr().add(i);
        _mm256_storeu_ps(py, _mm256_mul_ps(_mm256_loadu_ps(py), vs));
        i += 8;
    }
    scalar::scale(&mut y[i..], s);
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn add(y: &mut [f32], x: &[f32]) {
    let n = y.len();
    let mut i = 0;
    while i + 8 <= n {
        let py = y.as_mut_ptr().add(i);
        _mm256_storeu_ps(
            py,
            _mm256_add_ps(_mm256_loadu_ps(py), _mm256_loadu_ps(x.as_ptr().add(i))),
        );
        i += 8;
    }
    scalar::add(&mut y[i..], &x[i..]);
}

/// Eight-lane `exp`, same reduction and polynomial as [`scalar::exp`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(e::LO)),
        _mm256_set1_ps(e::HI),
    );
    let n = _mm256_floor_ps(_mm256_fmadd_ps(
        x,
        _mm256_set1_ps(e::LOG2E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(e::C1), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(e::C2), r);
    let mut y = _mm256_set1_ps(e::P[0]);
    for &p in &e::P[1..] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(p));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let pow2 = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let vm = _mm256_set1_ps(m);
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let p = x.as_mut_ptr().add(i);
        let v = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), vm));
        _mm256_storeu_ps(p, v);
        acc = _mm256_add_ps(acc, v);
        i += 8;
    }
    hsum(acc) + scalar::exp_sub_tail(&mut x[i..], m)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn silu_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
    let n = out.len();
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let vg = _mm256_loadu_ps(g.as_ptr().add(i));
        let denom = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), vg)));
        let v = _mm256_mul_ps(_mm256_div_ps(vg, denom), _mm256_loadu_ps(u.as_ptr().add(i)));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        i += 8;
    }
    scalar::silu_mul(&mut out[i..], &g[i..], &u[i..]);
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gelu_tanh_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
    let n = out.len();
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(g.as_ptr().add(i));
        let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        let z = _mm256_mul_ps(
            _mm256_set1_ps(super::SQRT_2_OVER_PI),
            _mm256_fmadd_ps(_mm256_set1_ps(super::GELU_CUBIC), x3, x),
        );
        let e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0), z));
        let v = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(
            out.as_mut_ptr().add(i),
            _mm256_mul_ps(v, _mm256_loadu_ps(u.as_ptr().add(i))),
        );
        i += 8;
    }
    scalar::gelu_tanh_mul(&mut out[i..], &g[i..], &u[i..]);
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gelu(out: &mut [f32], x: &[f32]) {
    let n = out.len();
    let c = &erf_consts::A;
    let sign_mask = _mm256_set1_ps(-0.0);
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let vx = _mm256_loadu_ps(x.as_ptr().add(i));
        let z = _mm256_mul_ps(vx, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
        let a = _mm256_andnot_ps(sign_mask, z);
        let t = _mm256_div_ps(one, _mm256_fmadd_ps(a, _mm256_set1_ps(erf_consts::P), one));
        let mut poly = _mm256_set1_ps(c[4]);
        for &ci in c[..4].iter().rev() {
            poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(ci));
        }
        poly = _mm256_mul_ps(poly, t);
        let ex = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(a, a)));
        let erf_abs = _mm256_fnmadd_ps(poly, ex, one);
        let erf = _mm256_or_ps(erf_abs, _mm256_and_ps(z, sign_mask));
        let v = _mm256_mul_ps(
            _mm256_mul_ps(_mm256_set1_ps(0.5), vx),
            _mm256_add_ps(one, erf),
        );
        _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        i += 8;
    }
    scalar::gelu(&mut out[i..], &x[i..]);
}
