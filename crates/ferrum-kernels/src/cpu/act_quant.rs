//! Activation rows quantized to 16-bit integers for the integer GEMM
//! (`crate::quant::act` describes the format).

use rayon::prelude::*;

use crate::quant::act::{act_scale, quantize_act, ACT_MAX};

/// Rows at or above this count are quantized in parallel.
const PAR_ROWS: usize = 16;

/// Bytes of quantized activations a GEMM pass keeps in L2 while every
/// weight row streams past them (see [`ActRows::blocks`]).
const BLOCK_BYTES: usize = 256 << 10;

/// Values per group sum in [`ActRows::sums`].
pub(crate) const SUM_GROUP: usize = 32;

/// `m` rows of `k` values in groups of `group`. Per row: `k` values in `qs`;
/// `stride` entries (the group count rounded up to 8, zero padded so kernels
/// may read whole eight-lane vectors) in `d` (scales) and `s` (`d · Σq` per
/// group, for weights with a float offset); and `k / 32` integer sums `Σq`
/// of 32 values in `sums` (for the k-quants' sub-block minimums).
#[derive(Default)]
pub(crate) struct ActRows {
    pub(crate) qs: Vec<i16>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) sums: Vec<i32>,
    /// [`ActRows::quantize8`]'s values, and whether they are the ones
    /// filled (`qs` and `sums` are then stale).
    pub(crate) q8: Vec<i8>,
    pub(crate) a8: bool,
    pub(crate) k: usize,
    pub(crate) group: usize,
    pub(crate) stride: usize,
}

impl ActRows {
    /// Re-fills `self` with `a` (`[m, k]`, `k` a multiple of `group`, which
    /// is a multiple of 32); the buffers only grow, so steady-state decoding
    /// does not allocate.
    pub(crate) fn quantize(&mut self, a: &[f32], m: usize, k: usize, group: usize) {
        debug_assert!(
            group.is_multiple_of(SUM_GROUP) && k.is_multiple_of(group) && a.len() >= m * k
        );
        let stride = (k / group).next_multiple_of(8);
        let nsums = k / SUM_GROUP;
        (self.k, self.group, self.stride, self.a8) = (k, group, stride, false);
        self.qs.resize(m * k, 0);
        self.d.resize(m * stride, 0.0);
        self.s.resize(m * stride, 0.0);
        self.sums.resize(m * nsums, 0);
        let rows = a[..m * k]
            .chunks_exact(k)
            .zip(self.qs.chunks_exact_mut(k))
            .zip(self.d.chunks_exact_mut(stride))
            .zip(self.s.chunks_exact_mut(stride))
            .zip(self.sums.chunks_exact_mut(nsums));
        let one = |((((x, qs), d), s), sums): RowMut<'_>| quantize_row(x, group, qs, d, s, sums);
        if m >= PAR_ROWS {
            rows.par_bridge().for_each(one);
        } else {
            rows.for_each(one);
        }
    }
}

impl ActRows {
    /// Re-fills `self` with `a` (`[m, k]`, `k` a multiple of 32) as 8-bit
    /// values for the Q4_1 kernel of [`super::interleaved`]: per 32 values a
    /// scale `d = max|x| / 127` (in `d`), `q = round_half_even(x / d)` (in
    /// `q8`) and `d · Σq` (in `s`). Each run of eight values is stored in
    /// the order 0, 4, 1, 5, 2, 6, 3, 7, which is the order of a weight
    /// word's bytes once masked to low (values 0, 4, 1, 5) or high nibbles
    /// (2, 6, 3, 7), so that four activation bytes broadcast as one word
    /// line up with them for `PMADDUBSW`.
    ///
    /// Only for CPUs with AVX2 (the caller checks
    /// [`super::interleaved::takes_act8`]).
    pub(crate) fn quantize8(&mut self, a: &[f32], m: usize, k: usize) {
        debug_assert!(k.is_multiple_of(32) && a.len() >= m * k);
        let stride = (k / 32).next_multiple_of(8);
        (self.k, self.group, self.stride, self.a8) = (k, 32, stride, true);
        self.q8.resize(m * k, 0);
        self.d.resize(m * stride, 0.0);
        self.s.resize(m * stride, 0.0);
        let rows = a[..m * k]
            .chunks_exact(k)
            .zip(self.q8.chunks_exact_mut(k))
            .zip(self.d.chunks_exact_mut(stride))
            .zip(self.s.chunks_exact_mut(stride));
        let one = |(((x, q), d), s): Row8Mut<'_>| {
            let groups = k / 32;
            #[cfg(target_arch = "x86_64")]
            for g in 0..groups {
                // SAFETY: the caller checked AVX2; group `g` of `x` and `q`
                // is in bounds.
                (d[g], s[g]) =
                    unsafe { x86::quantize8(&x[32 * g..][..32], &mut q[32 * g..][..32]) };
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (x, q);
            d[groups..].fill(0.0);
            s[groups..].fill(0.0);
        };
        if m >= PAR_ROWS {
            rows.par_bridge().for_each(one);
        } else {
            rows.for_each(one);
        }
    }

    /// The `m` rows in consecutive blocks of a multiple of 8 rows whose
    /// values fit in [`BLOCK_BYTES`]. A GEMM runs one block at a time over
    /// all its weight rows: a prompt's activations (5 MB for 512 rows of
    /// 4,864) would otherwise be streamed from L3 again for every few weight
    /// rows. Results do not depend on the blocking.
    pub(crate) fn blocks(&self, m: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
        let rows = (BLOCK_BYTES / (2 * self.k.max(1))).max(8) / 8 * 8;
        (0..m).step_by(rows).map(move |r| r..(r + rows).min(m))
    }
}

type Row8Mut<'a> = (((&'a [f32], &'a mut [i8]), &'a mut [f32]), &'a mut [f32]);

type RowMut<'a> = (
    (((&'a [f32], &'a mut [i16]), &'a mut [f32]), &'a mut [f32]),
    &'a mut [i32],
);

/// One row: values and scales, the sums, and zero padding after the last
/// group.
fn quantize_row(
    x: &[f32],
    group: usize,
    qs: &mut [i16],
    d: &mut [f32],
    s: &mut [f32],
    sums: &mut [i32],
) {
    let groups = x.len() / group;
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx2() {
        // SAFETY: AVX2 and FMA were detected; the slices hold `groups` groups.
        unsafe { x86::quantize(x, group, qs, &mut d[..groups]) };
    } else {
        quantize_act(x, group, qs, &mut d[..groups]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    quantize_act(x, group, qs, &mut d[..groups]);
    for (sum, q) in sums.iter_mut().zip(qs.chunks_exact(SUM_GROUP)) {
        *sum = q.iter().map(|&v| i32::from(v)).sum();
    }
    for (g, sg) in s[..groups].iter_mut().enumerate() {
        let per = group / SUM_GROUP;
        let total: i32 = sums[g * per..(g + 1) * per].iter().sum();
        *sg = d[g] * total as f32;
    }
    d[groups..].fill(0.0);
    s[groups..].fill(0.0);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
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
    /// (reordered); returns `(d, d · Σq)`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize8(x: &[f32], q: &mut [i8]) -> (f32, f32) {
        let (x, q) = (&x[..32], &mut q[..32]);
        let sign = _mm256_set1_ps(-0.0);
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let mut m = _mm256_setzero_ps();
        for v in v {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
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
            0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15, 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9,
            13, 10, 14, 11, 15,
        );
        _mm256_storeu_si256(q.as_mut_ptr().cast(), _mm256_shuffle_epi8(b, order));
        (d, d * _mm_cvtsi128_si32(sum) as f32)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::{quantize_act, ActRows};

    /// The vector quantizer writes exactly the scalar reference's values.
    #[test]
    fn vector_quantizer_matches_the_reference() {
        if !super::super::simd::has_avx2() {
            return;
        }
        let mut rng = StdRng::seed_from_u64(3);
        for group in [32, 256] {
            let (m, k) = (3, 512);
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-3.0f32..3.0)).collect();
            let mut act = ActRows::default();
            act.quantize(&a, m, k, group);
            for r in 0..m {
                let mut qs = vec![0i16; k];
                let mut d = vec![0f32; k / group];
                quantize_act(&a[r * k..(r + 1) * k], group, &mut qs, &mut d);
                assert_eq!(qs, act.qs[r * k..(r + 1) * k], "group {group} row {r}");
                assert_eq!(d, act.d[r * act.stride..r * act.stride + k / group]);
            }
        }
    }
}
