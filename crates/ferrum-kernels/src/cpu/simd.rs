//! Vector primitives for the CPU backend: AVX2 + FMA paths picked at run
//! time, and portable versions that run everywhere else (on Arm their
//! eight-lane multiply-add step, [`Elem::fma8`], is NEON's `FMLA`; the
//! compiler left that lane loop scalar).
//!
//! Every public function here dispatches on [`has_avx2`] (see
//! `cpu::features`). The scalar versions take the AVX2 versions' float
//! steps in the same order (eight lanes, the same partial sums, the same
//! reduction tree, fused where AVX2 fuses), so they give the same bits (a
//! test holds them to it): with the quantized kernels' bits also shared, a
//! model computes the same logits on x86 and on Arm.

#[cfg(target_arch = "x86_64")]
use super::features::has_avx2;

/// Asks for the `len` bytes that start 16 KB after `p` to be brought into
/// L2. The interleaved kernels walk each task's weights front to back, but
/// the hardware prefetchers of the VMs measured did not keep up with that
/// stream. Into L2 and far ahead rather than into L1 2 KB ahead: from
/// memory, a decode batch's eight rows then kept the weights coming
/// (`gemm_quant_dram` Q8_0 int8 at m = 8 +35-45% on a Zen 4; the gains and
/// the distances tried are in `docs/perf-log.md`), and L1 misses to L2 are
/// what the out-of-order core hides.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, len: usize) {
    prefetch(p.wrapping_add(16 << 10), len);
}

/// Asks for the `len` bytes at `p` to be brought into L2. A hint past the
/// end of a buffer is harmless: prefetches never fault.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..len).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        // SAFETY: SSE is part of x86-64; a prefetch reads nothing and
        // cannot fault, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(line).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// What the row-gathering kernels ([`dot_many`], [`axpy_many`])
/// read their rows as: f32, or f16 for a half-precision KV pool, widened to
/// f32 as it is loaded so that all arithmetic stays in f32.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    fn widen(self) -> f32;

    /// `dst[i] = src[i]`, rounded to nearest (even) where `Self` is narrower.
    fn narrow_from(dst: &mut [Self], src: &[f32]);

    /// `dst[i] = src[i]` as f32.
    fn widen_into(src: &[Self], dst: &mut [f32]);

    /// `acc[l] = fma(a[l], src[l], acc[l])` for the first eight values
    /// (all three at least eight long): the portable kernels' step,
    /// fused like AVX2's `vfmadd`. On AArch64 two `FMLA` (and, for f16
    /// rows, `FCVTL`): the compiler did not vectorize the lane loop.
    fn fma8(acc: &mut [f32], a: &[f32], src: &[Self]);

    /// Eight values at `p` as f32 lanes.
    ///
    /// # Safety
    /// Eight values must be readable at `p`, and the CPU must have AVX2
    /// and F16C ([`has_avx2`]).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl Elem for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    fn narrow_from(dst: &mut [Self], src: &[f32]) {
        dst.copy_from_slice(src);
    }

    fn widen_into(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    #[inline(always)]
    fn fma8(acc: &mut [f32], a: &[f32], src: &[Self]) {
        let (acc, a, src) = (&mut acc[..8], &a[..8], &src[..8]);
        #[cfg(target_arch = "aarch64")]
        // SAFETY: eight values each (sliced above); NEON is part of every
        // AArch64 CPU.
        unsafe {
            use std::arch::aarch64::*;
            let b = [vld1q_f32(src.as_ptr()), vld1q_f32(src.as_ptr().add(4))];
            neon_fma8(acc, a, b);
        }
        #[cfg(not(target_arch = "aarch64"))]
        for ((acc, &a), &b) in acc.iter_mut().zip(a).zip(src) {
            *acc = a.mul_add(b, *acc);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl Elem for half::f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }

    fn narrow_from(dst: &mut [Self], src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }

    fn widen_into(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }

    #[inline(always)]
    fn fma8(acc: &mut [f32], a: &[f32], src: &[Self]) {
        let (acc, a, src) = (&mut acc[..8], &a[..8], &src[..8]);
        #[cfg(target_arch = "aarch64")]
        // SAFETY: eight values each (sliced above); NEON is part of every
        // AArch64 CPU.
        unsafe {
            neon_fma8(acc, a, super::int_dot::f16x8(src.as_ptr().cast()));
        }
        #[cfg(not(target_arch = "aarch64"))]
        for ((acc, &a), b) in acc.iter_mut().zip(a).zip(src) {
            *acc = a.mul_add(b.to_f32(), *acc);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm_loadu_si128};
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
}

/// `acc[l] = fma(a[l], b[l], acc[l])` for eight lanes (`acc`, `a` at
/// least eight long) in two `FMLA` (the same rounding as `mul_add`).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn neon_fma8(acc: &mut [f32], a: &[f32], b: [std::arch::aarch64::float32x4_t; 2]) {
    use std::arch::aarch64::*;
    for (h, b) in b.into_iter().enumerate() {
        let at = acc.as_mut_ptr().add(4 * h);
        let x = vfmaq_f32(vld1q_f32(at), vld1q_f32(a.as_ptr().add(4 * h)), b);
        vst1q_f32(at, x);
    }
}

macro_rules! dispatch {
    ($name:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx2() {
                // SAFETY: the CPU supports AVX2 and FMA (checked just above).
                return unsafe { avx2::$name($($arg),*) };
            }
        }
        scalar::$name($($arg),*)
    }};
}

/// `Σ x[i]²`.
#[inline]
pub(crate) fn sum_sq(x: &[f32]) -> f32 {
    dispatch!(sum_sq(x))
}

/// `Σ x[i]`.
#[inline]
pub(crate) fn sum(x: &[f32]) -> f32 {
    dispatch!(sum(x))
}

/// `out[i] = x[i] · s · w[i]` (the tail of every normalisation).
#[inline]
pub(crate) fn scale_mul(out: &mut [f32], x: &[f32], s: f32, w: &[f32]) {
    let (x, w) = (&x[..out.len()], &w[..out.len()]);
    dispatch!(scale_mul(out, x, s, w))
}

/// `out[i·stride + j] = s · (q_i · x[rows[j]..rows[j] + n])` for the
/// queries `qs` (each `n` long): an attention tile's scores for the query
/// rows that see the same keys, one dispatch for the tile instead of one
/// per key. Each widened key row feeds up to four queries' FMAs: a GQA
/// group's heads share every load (and F16C conversion) of its K rows.
/// Every score is computed by the same operations whatever the number of
/// queries, so the grouping never changes results.
#[inline]
pub(crate) fn dot_many<T: Elem>(
    qs: &[&[f32]],
    x: &[T],
    rows: &[usize],
    s: f32,
    out: &mut [f32],
    stride: usize,
) {
    let n = qs.first().map_or(0, |q| q.len());
    assert!(qs.iter().all(|q| q.len() == n));
    assert!(qs.len() <= 1 || stride >= rows.len());
    if qs.is_empty() || rows.is_empty() {
        return;
    }
    let out = &mut out[..(qs.len() - 1) * stride + rows.len()];
    assert!(rows.iter().all(|&r| r + n <= x.len()));
    dispatch!(dot_many(qs, x, rows, s, out, stride))
}

/// `y_i += Σ_j p_i[j] · x[rows[j]..rows[j] + n]` for each row `y_i` of `n`
/// values of `y` (whose length is a multiple of `n`), with `p_i` starting at
/// `p[i·stride]`. Each element is summed in `j` order by one FMA per key
/// (as `y[i] = fma(p[j], x, y[i])` key after key: scalar and vector paths
/// round alike, whatever the number of rows), with `y` held in registers
/// across the keys and each widened key row shared by up to four rows.
#[inline]
pub(crate) fn axpy_many<T: Elem>(
    y: &mut [f32],
    n: usize,
    p: &[f32],
    stride: usize,
    x: &[T],
    rows: &[usize],
) {
    if n == 0 || rows.is_empty() {
        return;
    }
    let count = y.len() / n;
    assert!(y.len() == count * n && (count <= 1 || stride >= rows.len()));
    if count == 0 {
        return;
    }
    let p = &p[..(count - 1) * stride + rows.len()];
    assert!(rows.iter().all(|&r| r + n <= x.len()));
    dispatch!(axpy_many(y, n, p, stride, x, rows))
}

/// `y[i] *= s`.
#[inline]
pub(crate) fn scale(y: &mut [f32], s: f32) {
    dispatch!(scale(y, s))
}

/// `y[i] += x[i]`.
#[inline]
pub(crate) fn add(y: &mut [f32], x: &[f32]) {
    let x = &x[..y.len()];
    dispatch!(add(y, x))
}

/// `x[i] = exp(x[i] - m)`, returning `Σ x[i]` (the softmax numerator pass).
#[inline]
pub(crate) fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    dispatch!(exp_sub_sum(x, m))
}

/// `out[i] = silu(g[i]) · u[i]`.
#[inline]
pub(crate) fn silu_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
    let (g, u) = (&g[..out.len()], &u[..out.len()]);
    dispatch!(silu_mul(out, g, u))
}

/// `out[i] = gelu_tanh(g[i]) · u[i]` (tanh approximation of GELU).
#[inline]
pub(crate) fn gelu_tanh_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
    let (g, u) = (&g[..out.len()], &u[..out.len()]);
    dispatch!(gelu_tanh_mul(out, g, u))
}

/// `√(2/π)`, the tanh-GELU input scale.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The tanh-GELU cubic coefficient.
const GELU_CUBIC: f32 = 0.044_715;

/// `out[i] = gelu(x[i])` with the erf form.
#[inline]
pub(crate) fn gelu(out: &mut [f32], x: &[f32]) {
    let x = &x[..out.len()];
    dispatch!(gelu(out, x))
}

/// Cephes-style `exp` constants shared by both paths.
mod exp_consts {
    pub const HI: f32 = 88.376_26;
    pub const LO: f32 = -87.336_55;
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const C1: f32 = 0.693_359_4;
    pub const C2: f32 = -2.121_944_4e-4;
    pub const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
}

/// Abramowitz & Stegun 7.1.26 erf coefficients (|error| < 1.5e-7).
mod erf_consts {
    pub const P: f32 = 0.327_591_1;
    pub const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152_1,
        1.061_405_4,
    ];
}

pub(crate) mod scalar {
    use super::{erf_consts, exp_consts as e, Elem};

    /// Eight lanes summed as AVX2's `hsum` adds them:
    /// `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
    #[inline(always)]
    pub fn hsum8(v: [f32; 8]) -> f32 {
        let s: [f32; 4] = std::array::from_fn(|l| v[l] + v[l + 4]);
        (s[0] + s[2]) + (s[1] + s[3])
    }

    /// Four chains of eight lanes over runs of 32, then one over runs of
    /// eight, the chains added, [`hsum8`], then the tail: AVX2's order.
    pub fn dot<T: Elem>(a: &[f32], b: &[T]) -> f32 {
        let b = &b[..a.len()];
        let mut acc = [[0f32; 8]; 4];
        let (a32, b32) = (a.chunks_exact(32), b.chunks_exact(32));
        let (a_rest, b_rest) = (a32.remainder(), b32.remainder());
        for (a, b) in a32.zip(b32) {
            for (w, acc) in acc.iter_mut().enumerate() {
                T::fma8(acc, &a[8 * w..], &b[8 * w..]);
            }
        }
        let (a8, b8) = (a_rest.chunks_exact(8), b_rest.chunks_exact(8));
        let (a_tail, b_tail) = (a8.remainder(), b8.remainder());
        for (a, b) in a8.zip(b8) {
            T::fma8(&mut acc[0], a, b);
        }
        let v = std::array::from_fn(|l| (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]));
        let mut s = hsum8(v);
        for (&a, b) in a_tail.iter().zip(b_tail) {
            s = a.mul_add(b.widen(), s);
        }
        s
    }

    pub fn sum_sq(x: &[f32]) -> f32 {
        dot(x, x)
    }

    /// Eight lanes over runs of eight, [`hsum8`], plus the tail's running
    /// sum (a sum of 384 values near 4 in one running total lost a layer
    /// norm 1e-6 of relative accuracy).
    pub fn sum(x: &[f32]) -> f32 {
        let mut acc = [0f32; 8];
        let chunks = x.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += v;
            }
        }
        hsum8(acc) + tail.iter().sum::<f32>()
    }

    pub fn scale_mul(out: &mut [f32], x: &[f32], s: f32, w: &[f32]) {
        for ((o, &x), &w) in out.iter_mut().zip(x).zip(w) {
            *o = x * s * w;
        }
    }

    /// Eight values at a time, then the tail: one FMA per value either way.
    pub fn axpy<T: Elem>(y: &mut [f32], a: f32, x: &[T]) {
        let x = &x[..y.len()];
        let (mut y8, x8) = (y.chunks_exact_mut(8), x.chunks_exact(8));
        let x_tail = x8.remainder();
        let a8 = [a; 8];
        for (y, x) in (&mut y8).zip(x8) {
            T::fma8(y, &a8, x);
        }
        for (y, &x) in y8.into_remainder().iter_mut().zip(x_tail) {
            *y = a.mul_add(x.widen(), *y);
        }
    }

    /// Lengths that are a multiple of eight: one eight-lane chain per
    /// (query, key) over the whole row, its lanes added pairwise
    /// `((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))` (AVX2's `hadd` tree),
    /// for the keys up to the last multiple of eight; the others [`dot`].
    pub fn dot_many<T: Elem>(
        qs: &[&[f32]],
        x: &[T],
        rows: &[usize],
        s: f32,
        out: &mut [f32],
        stride: usize,
    ) {
        let n = qs.first().map_or(0, |q| q.len());
        let full = if n.is_multiple_of(8) {
            rows.len() / 8 * 8
        } else {
            0
        };
        for (i, q) in qs.iter().enumerate() {
            for (j, &r) in rows.iter().enumerate() {
                let key = &x[r..r + n];
                out[i * stride + j] = if j < full {
                    let mut acc = [0f32; 8];
                    for (q, k) in q.chunks_exact(8).zip(key.chunks_exact(8)) {
                        T::fma8(&mut acc, q, k);
                    }
                    let a = acc;
                    (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) * s
                } else {
                    s * dot(q, key)
                };
            }
        }
    }

    pub fn axpy_many<T: Elem>(
        y: &mut [f32],
        n: usize,
        p: &[f32],
        stride: usize,
        x: &[T],
        rows: &[usize],
    ) {
        for (i, y) in y.chunks_exact_mut(n).enumerate() {
            for (&a, &r) in p[i * stride..].iter().zip(rows) {
                axpy(y, a, &x[r..r + n]);
            }
        }
    }

    pub fn scale(y: &mut [f32], s: f32) {
        for y in y {
            *y *= s;
        }
    }

    pub fn add(y: &mut [f32], x: &[f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += x;
        }
    }

    /// `exp` with the same range reduction and polynomial as the AVX2 path.
    pub fn exp(x: f32) -> f32 {
        // `max` then `min`, as AVX2's `maxps` / `minps` (a NaN becomes
        // `LO` there and here; `clamp` would keep it).
        #[allow(clippy::manual_clamp)]
        let x = x.max(e::LO).min(e::HI);
        let n = x.mul_add(e::LOG2E, 0.5).floor();
        let r = n.mul_add(-e::C2, n.mul_add(-e::C1, x));
        let mut y = e::P[0];
        for &p in &e::P[1..] {
            y = y.mul_add(r, p);
        }
        let y = y.mul_add(r * r, r) + 1.0;
        y * f32::from_bits((((n as i32) + 127) as u32) << 23)
    }

    /// Eight lanes of sums over runs of eight, [`hsum8`], plus
    /// [`exp_sub_tail`]'s.
    pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
        let mut acc = [0f32; 8];
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            for (a, v) in acc.iter_mut().zip(c) {
                *v = exp(*v - m);
                *a += *v;
            }
        }
        hsum8(acc) + exp_sub_tail(chunks.into_remainder(), m)
    }

    /// [`exp_sub_sum`] as one running sum (the vector paths' tails).
    pub fn exp_sub_tail(x: &mut [f32], m: f32) -> f32 {
        let mut s = 0.0;
        for v in x {
            *v = exp(*v - m);
            s += *v;
        }
        s
    }

    pub fn silu_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + exp(0.0 - g)) * u;
        }
    }

    /// `0.5·x·(1 + tanh(z))` written as `x · σ(2z)`, which needs one exp.
    pub fn gelu_tanh_mul(out: &mut [f32], g: &[f32], u: &[f32]) {
        for ((o, &x), &u) in out.iter_mut().zip(g).zip(u) {
            let z = super::SQRT_2_OVER_PI * super::GELU_CUBIC.mul_add(x * x * x, x);
            *o = x / (1.0 + exp(-2.0 * z)) * u;
        }
    }

    pub fn erf(x: f32) -> f32 {
        let a = x.abs();
        let t = 1.0 / a.mul_add(erf_consts::P, 1.0);
        let c = &erf_consts::A;
        let poly = t * c[4]
            .mul_add(t, c[3])
            .mul_add(t, c[2])
            .mul_add(t, c[1])
            .mul_add(t, c[0]);
        let r = (-poly).mul_add(exp(0.0 - a * a), 1.0);
        // x's sign ORed in, as the vector path does.
        f32::from_bits(r.to_bits() | (x.to_bits() & 0x8000_0000))
    }

    pub fn gelu(out: &mut [f32], x: &[f32]) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "x86/simd.rs"]
pub(crate) mod avx2;

#[cfg(test)]
mod tests {
    //! Both paths against f64 references on random data with odd lengths.
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_vec(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    }

    fn rel_err(got: f64, want: f64) -> f64 {
        (got - want).abs() / want.abs().max(1e-30)
    }

    /// erf in f64 via its Maclaurin series (|x| < 3) or the continued
    /// fraction of erfc (|x| >= 3): accurate to ~1e-15, far beyond f32.
    fn erf64(x: f64) -> f64 {
        let a = x.abs();
        let r = if a < 3.0 {
            let mut term = a;
            let mut s = a;
            let mut n = 0.0;
            while term.abs() > 1e-17 * s.abs() {
                n += 1.0;
                term *= -a * a / n;
                s += term / (2.0 * n + 1.0);
            }
            s * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (a + f);
            }
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f)
        };
        r.copysign(x)
    }

    /// Runs `check` through the scalar path and, where available, the AVX2 path.
    fn both_paths(mut check: impl FnMut(&str, bool)) {
        check("scalar", false);
        if super::super::features::has_avx2() {
            check("avx2", true);
        }
    }

    /// The scalar versions give the AVX2 versions' bits, for every
    /// function, lengths with and without tails, f32 and f16 rows, and
    /// inputs reaching exp's clamps: what lets Arm (scalar here) compute
    /// x86's logits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn scalar_gives_the_avx2_bits() {
        if !super::super::features::has_avx2() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for n in [0usize, 1, 7, 8, 15, 16, 31, 32, 33, 40, 64, 100, 257, 1023] {
            let a = rand_vec(&mut rng, n, 3.0);
            let b = rand_vec(&mut rng, n, 3.0);
            let u = rand_vec(&mut rng, n, 2.0);
            let h: Vec<half::f16> = b.iter().map(|&v| half::f16::from_f32(v)).collect();
            // SAFETY: AVX2 checked; the slices have equal lengths.
            unsafe {
                let what = format!("n={n}");
                assert_eq!(
                    scalar::dot(&a, &b).to_bits(),
                    avx2::dot(&a, &b).to_bits(),
                    "dot {what}"
                );
                assert_eq!(
                    scalar::dot(&a, &h).to_bits(),
                    avx2::dot(&a, &h).to_bits(),
                    "f16 {what}"
                );
                assert_eq!(
                    scalar::sum(&a).to_bits(),
                    avx2::sum(&a).to_bits(),
                    "sum {what}"
                );
                // Wide inputs: exp's clamps and the sign of zero.
                let wide: Vec<f32> = a.iter().map(|&x| x * 40.0).collect();
                let (mut es, mut ev) = (wide.clone(), wide.clone());
                let (ss, sv) = (
                    scalar::exp_sub_sum(&mut es, 1.5),
                    avx2::exp_sub_sum(&mut ev, 1.5),
                );
                assert_eq!(
                    (bits(&es), ss.to_bits()),
                    (bits(&ev), sv.to_bits()),
                    "exp {what}"
                );
                type Unary = fn(&mut [f32], &[f32]);
                type Binary = fn(&mut [f32], &[f32], &[f32]);
                let unary: [(&str, Unary, Unary); 1] =
                    [("gelu", scalar::gelu, |o, x| avx2::gelu(o, x))];
                let binary: [(&str, Binary, Binary); 2] = [
                    ("silu", scalar::silu_mul, |o, g, u| avx2::silu_mul(o, g, u)),
                    ("gelu_tanh", scalar::gelu_tanh_mul, |o, g, u| {
                        avx2::gelu_tanh_mul(o, g, u)
                    }),
                ];
                for x in [&a, &wide] {
                    let (mut os, mut ov) = (vec![0f32; n], vec![0f32; n]);
                    for (name, f, g) in unary {
                        f(&mut os, x);
                        g(&mut ov, x);
                        assert_eq!(bits(&os), bits(&ov), "{name} {what}");
                    }
                    for (name, f, g) in binary {
                        f(&mut os, x, &u);
                        g(&mut ov, x, &u);
                        assert_eq!(bits(&os), bits(&ov), "{name} {what}");
                    }
                }
            }
        }
        // Scores of the tile kernel on lengths with and without tails and
        // key counts past a multiple of eight.
        for n in [8usize, 12, 64, 136] {
            let x = rand_vec(&mut rng, 40 * n, 2.0);
            let rows: Vec<usize> = (0..19).map(|_| rng.random_range(0..=x.len() - n)).collect();
            let q = rand_vec(&mut rng, 4 * n, 2.0);
            let qs: Vec<&[f32]> = q.chunks_exact(n).collect();
            let (p, y0) = (
                rand_vec(&mut rng, 4 * 19, 1.0),
                rand_vec(&mut rng, 4 * n, 2.0),
            );
            let (d, y) = tile_kernels(false, &qs, &y0, &p, 19, &x, &rows);
            let (dv, yv) = tile_kernels(true, &qs, &y0, &p, 19, &x, &rows);
            assert_eq!((bits(&d), bits(&y)), (bits(&dv), bits(&yv)), "tiles n={n}");
        }
    }

    #[test]
    fn reductions_match_f64() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 64, 100, 1023] {
            let a = rand_vec(&mut rng, n, 1.0);
            let b = rand_vec(&mut rng, n, 1.0);
            let want_dot: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let want_ss: f64 = a.iter().map(|&x| x as f64 * x as f64).sum();
            let want_sum: f64 = a.iter().map(|&x| x as f64).sum();
            let abs_scale: f64 = a.iter().map(|&x| x.abs() as f64).sum::<f64>() + 1e-30;
            both_paths(|name, vec| {
                let (d, ss, s) = if vec {
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        (avx2::dot(&a, &b), avx2::sum_sq(&a), avx2::sum(&a))
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    unreachable!()
                } else {
                    (scalar::dot(&a, &b), scalar::sum_sq(&a), scalar::sum(&a))
                };
                // f32 accumulation of n terms: error bounded by ~n·eps·Σ|terms|.
                let tol = (n as f64 + 1.0) * 6e-8 * abs_scale;
                assert!((d as f64 - want_dot).abs() <= tol, "{name} dot n={n}");
                assert!((ss as f64 - want_ss).abs() <= tol, "{name} sum_sq n={n}");
                assert!((s as f64 - want_sum).abs() <= tol, "{name} sum n={n}");
            });
        }
    }

    #[test]
    fn exp_silu_gelu_match_f64() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let x = rand_vec(&mut rng, 1001, 12.0);
        let u = rand_vec(&mut rng, 1001, 2.0);
        both_paths(|name, vec| {
            let mut e = x.clone();
            let mut silu = vec![0f32; x.len()];
            let mut gelu = vec![0f32; x.len()];
            let s = if vec {
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx2::silu_mul(&mut silu, &x, &u);
                    avx2::gelu(&mut gelu, &x);
                    avx2::exp_sub_sum(&mut e, 1.5)
                }
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!()
            } else {
                scalar::silu_mul(&mut silu, &x, &u);
                scalar::gelu(&mut gelu, &x);
                scalar::exp_sub_sum(&mut e, 1.5)
            };
            let mut want_sum = 0f64;
            for i in 0..x.len() {
                let xi = x[i] as f64;
                let want_e = (xi - 1.5).exp();
                want_sum += want_e;
                // Cephes exp: a few ulp.
                assert!(rel_err(e[i] as f64, want_e) < 5e-7, "{name} exp({xi})");
                let want_silu = xi / (1.0 + (-xi).exp()) * u[i] as f64;
                assert!(
                    (silu[i] as f64 - want_silu).abs() < 1e-6 * (1.0 + want_silu.abs()),
                    "{name} silu({xi})"
                );
                let want_gelu = 0.5 * xi * (1.0 + erf64(xi / 2f64.sqrt()));
                // erf approximation error < 1.5e-7 absolute, scaled by |x|/2.
                assert!(
                    (gelu[i] as f64 - want_gelu).abs()
                        < 1e-7 * (1.0 + xi.abs()) + 1e-6 * want_gelu.abs(),
                    "{name} gelu({xi}) = {} want {want_gelu}",
                    gelu[i]
                );
            }
            assert!(rel_err(s as f64, want_sum) < 1e-5, "{name} exp sum");
        });
    }

    #[test]
    fn elementwise_match_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for n in [1usize, 5, 8, 13, 64, 257] {
            let x = rand_vec(&mut rng, n, 3.0);
            let w = rand_vec(&mut rng, n, 3.0);
            let y0 = rand_vec(&mut rng, n, 3.0);
            both_paths(|name, vec| {
                let mut sm = vec![0f32; n];
                let mut sc = y0.clone();
                let mut ad = y0.clone();
                if vec {
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        avx2::scale_mul(&mut sm, &x, 0.7, &w);
                        avx2::scale(&mut sc, 2.5);
                        avx2::add(&mut ad, &x);
                    }
                } else {
                    scalar::scale_mul(&mut sm, &x, 0.7, &w);
                    scalar::scale(&mut sc, 2.5);
                    scalar::add(&mut ad, &x);
                }
                for i in 0..n {
                    let (xi, wi, yi) = (x[i] as f64, w[i] as f64, y0[i] as f64);
                    let close =
                        |g: f32, want: f64| (g as f64 - want).abs() <= 4e-7 * (1.0 + want.abs());
                    assert!(close(sm[i], xi * 0.7 * wi), "{name} scale_mul");
                    assert!(close(sc[i], yi * 2.5), "{name} scale");
                    assert!(close(ad[i], yi + xi), "{name} add");
                }
            });
        }
    }

    /// The attention tile kernels against f64 sums over random rows, for one
    /// to six query (and accumulator) rows, on f32 rows and on f16 rows
    /// (whose values, widened exactly, are the reference's). Bit for bit:
    /// `axpy_many` on both paths (one FMA per row, key and element), and
    /// each path's results for several rows against the same rows one at a
    /// time (the grouping must not change a result).
    #[test]
    fn many_row_kernels_match_reference() {
        check_many_rows(|x| x.to_vec());
        check_many_rows(|x| x.iter().map(|&v| half::f16::from_f32(v)).collect());
    }

    /// Runs both tile kernels on `nq` rows at once (`vec`: the AVX2 path),
    /// returning the scores (`nq` rows, `stride` apart) and the updated
    /// accumulators.
    fn tile_kernels<T: Elem>(
        vec: bool,
        qs: &[&[f32]],
        y0: &[f32],
        p: &[f32],
        stride: usize,
        xs: &[T],
        rows: &[usize],
    ) -> (Vec<f32>, Vec<f32>) {
        let n = qs[0].len();
        let (mut d, mut y) = (vec![0f32; qs.len() * stride], y0.to_vec());
        if vec {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: only called when `has_avx2()`; the test's rows are in
            // bounds.
            unsafe {
                avx2::dot_many(qs, xs, rows, 0.5, &mut d, stride);
                avx2::axpy_many(&mut y, n, p, stride, xs, rows);
            }
        } else {
            scalar::dot_many(qs, xs, rows, 0.5, &mut d, stride);
            scalar::axpy_many(&mut y, n, p, stride, xs, rows);
        }
        (d, y)
    }

    fn check_many_rows<T: Elem>(rows_of: impl Fn(&[f32]) -> Vec<T>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        for n in [1usize, 5, 8, 16, 64, 72, 136, 256] {
            for (nq, nrows) in [(1usize, 19usize), (2, 19), (3, 16), (4, 21), (5, 8), (6, 3)] {
                let stride = nrows + 3;
                let xs = rows_of(&rand_vec(&mut rng, 12 * n + 3, 2.0));
                let x: Vec<f32> = xs.iter().map(|v| v.widen()).collect();
                let rows: Vec<usize> = (0..nrows)
                    .map(|_| rng.random_range(0..=x.len() - n))
                    .collect();
                let q = rand_vec(&mut rng, nq * n, 2.0);
                let qs: Vec<&[f32]> = q.chunks_exact(n).collect();
                let (p, y0) = (
                    rand_vec(&mut rng, nq * stride, 1.0),
                    rand_vec(&mut rng, nq * n, 2.0),
                );
                let mut ys = Vec::new();
                both_paths(|name, vec| {
                    let (d, y) = tile_kernels(vec, &qs, &y0, &p, stride, &xs, &rows);
                    for (i, (y, y0)) in y.chunks_exact(n).zip(y0.chunks_exact(n)).enumerate() {
                        let p = &p[i * stride..];
                        for (e, &got) in y.iter().enumerate() {
                            let terms = rows
                                .iter()
                                .zip(p)
                                .map(|(&r, &a)| a as f64 * x[r + e] as f64);
                            let want = y0[e] as f64 + terms.clone().sum::<f64>();
                            let size = y0[e].abs() as f64 + terms.map(f64::abs).sum::<f64>();
                            let tol = (nrows as f64 + 1.0) * 6e-8 * size;
                            assert!(
                                (got as f64 - want).abs() <= tol,
                                "{name} axpy_many n={n} nq={nq} row {i} e={e}"
                            );
                        }
                    }
                    for (i, q) in qs.iter().enumerate() {
                        for (j, &got) in d[i * stride..][..nrows].iter().enumerate() {
                            let terms = q
                                .iter()
                                .zip(&x[rows[j]..])
                                .map(|(&a, &b)| a as f64 * b as f64);
                            let want = 0.5 * terms.clone().sum::<f64>();
                            let tol =
                                (n as f64 + 1.0) * 6e-8 * 0.5 * terms.map(f64::abs).sum::<f64>();
                            assert!(
                                (got as f64 - want).abs() <= tol,
                                "{name} dot_many n={n} nq={nq} row {i} j={j}"
                            );
                        }
                    }
                    // The same rows one at a time give the same bits.
                    for (i, q) in qs.iter().enumerate() {
                        let (d1, y1) = tile_kernels(
                            vec,
                            &[q],
                            &y0[i * n..(i + 1) * n],
                            &p[i * stride..],
                            stride,
                            &xs,
                            &rows,
                        );
                        assert_eq!(
                            d1[..nrows],
                            d[i * stride..][..nrows],
                            "{name} n={n} nq={nq}"
                        );
                        assert_eq!(y1, y[i * n..(i + 1) * n], "{name} n={n} nq={nq}");
                    }
                    ys.push(y);
                });
                assert!(
                    ys.windows(2).all(|w| w[0] == w[1]),
                    "axpy_many paths differ, n={n} nq={nq}"
                );
            }
        }
    }
}
