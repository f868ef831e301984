//! Activation rows quantized to 16-bit integers for the integer GEMM
//! (`crate::quant::act` describes the format).

use rayon::prelude::*;

use crate::quant::act::quantize_act;
#[cfg(target_arch = "x86_64")]
use crate::quant::act::{act_scale, ACT_MAX};

/// Rows at or above this count are quantized in parallel.
const PAR_ROWS: usize = 16;

/// Bytes of quantized activations a GEMM pass keeps in L2 while every
/// weight row streams past them (see [`ActRows::blocks`]).
const BLOCK_BYTES: usize = 256 << 10;

/// Values per group sum in [`ActRows::sums`].
pub(crate) const SUM_GROUP: usize = 32;

/// A value [`ActRows::quantize8`] leaves out of its 8-bit block: index
/// `at` in its row, kept exact as `x`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Outlier {
    pub(crate) at: u32,
    pub(crate) x: f32,
}

/// A block's largest value is an outlier where its square exceeds this
/// share of the block's sum of squares, i.e. `|x| > 5 · rms`; at most one
/// value per 32 can be. LLM activations have such lone spikes in a few
/// channels, and a block scaled to one loses most of its other values'
/// bits: with every Q4_1 projection of SmolLM2 on 8 bits (emulated in
/// f32), keeping them exact takes perplexity from +0.56% to -0.05% (GPL-3)
/// and from +0.19% to -0.003% (31K tokens of other licences), for 0.17% of
/// the values; this kernel measures +0.002% and +0.047%.
pub(crate) const OUTLIER_SHARE: f32 = 25.0 / 32.0;

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
    /// [`ActRows::quantize8`]'s outliers: row `r`'s are the first
    /// `outlier_count[r]` of `outliers[r · k/32..]`, in value order.
    pub(crate) outliers: Vec<Outlier>,
    pub(crate) outlier_count: Vec<usize>,
    /// The 8-bit values regrouped for the grouped k-quant kernels
    /// (`kquant_rows::quantize` fills them; `act_tiles::Tiles` describes
    /// the layout).
    pub(crate) tiles: super::act_tiles::Tiles,
    /// The distinct outlier positions of all rows, ascending, and each
    /// outlier's index in it (parallel to `outliers`), for the k-quant
    /// kernels' outlier pass (`super::outliers::index` fills them).
    pub(crate) outlier_union: Vec<u32>,
    pub(crate) outlier_slot: Vec<u32>,
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
        // Lengths only grow (see `quantize8`).
        grow(&mut self.qs, m * k, 0);
        grow(&mut self.d, m * stride, 0.0);
        grow(&mut self.s, m * stride, 0.0);
        grow(&mut self.sums, m * nsums, 0);
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
    /// values for the Q4_1 kernel of [`super::interleaved`] and the k-quant
    /// kernels of [`super::kquant_rows`]. Per 32 values:
    /// the largest is set aside as an [`Outlier`] (its `q` is 0) if its
    /// square exceeds [`OUTLIER_SHARE`] of the block's sum of squares; of
    /// the others, `d = max|x| / 127` (in `d`), `q = round_half_even(x / d)`
    /// (in `q8`) and `d · Σq` (in `s`). Each run of eight values is stored
    /// in the order 0, 4, 1, 5, 2, 6, 3, 7, which is the order of a weight
    /// word's bytes once masked to low (values 0, 4, 1, 5) or high nibbles
    /// (2, 6, 3, 7), so that four activation bytes broadcast as one word
    /// line up with them for `PMADDUBSW` and `VPDPBUSD`; with `natural`, in value order.
    ///
    /// The reordered layout is for the interleaved Q4_1 kernels (the caller
    /// checks [`super::interleaved::takes_act8`]); the natural one serves
    /// [`super::kquant_rows`]. Off x86, `quantize8_group` quantizes and
    /// the order is applied afterwards.
    pub(crate) fn quantize8(&mut self, a: &[f32], m: usize, k: usize, natural: bool) {
        debug_assert!(k.is_multiple_of(32) && a.len() >= m * k);
        let groups = k / 32;
        let stride = groups.next_multiple_of(8);
        (self.k, self.group, self.stride, self.a8) = (k, 32, stride, true);
        // Lengths only grow: one thread's buffers serve GEMMs of several
        // widths in turn, and shrinking then growing again re-zeroed them
        // each time (1.2% of a SmolLM2 batch-8 step on one thread). The
        // row loops zip the rows of `a`, so longer buffers are fine.
        grow(&mut self.q8, m * k, 0);
        grow(&mut self.d, m * stride, 0.0);
        grow(&mut self.s, m * stride, 0.0);
        grow(&mut self.outliers, m * groups, Outlier::default());
        grow(&mut self.outlier_count, m, 0);
        let one = |(((((x, q), d), s), outliers), count): Row8Mut<'_>| {
            *count = 0;
            #[cfg(target_arch = "x86_64")]
            for g in 0..groups {
                // SAFETY: the caller checked AVX2; group `g` of `x` and `q`
                // is in bounds.
                let (dg, sg, spike) =
                    unsafe { x86::quantize8(&x[32 * g..][..32], &mut q[32 * g..][..32], natural) };
                (d[g], s[g]) = (dg, sg);
                if let Some(i) = spike {
                    let at = 32 * g + i;
                    outliers[*count] = Outlier { at: at as u32, x: x[at] };
                    *count += 1;
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            for g in 0..groups {
                let x = &x[32 * g..][..32];
                let (qg, dg, spike) = quantize8_group(x);
                let q = &mut q[32 * g..][..32];
                if natural {
                    q.copy_from_slice(&qg);
                } else {
                    for (q, run) in q.chunks_exact_mut(8).zip(qg.chunks_exact(8)) {
                        for (q, at) in q.iter_mut().zip(REORDER) {
                            *q = run[at];
                        }
                    }
                }
                d[g] = dg;
                s[g] = dg * qg.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
                if let Some(o) = spike {
                    outliers[*count] = Outlier { at: (32 * g) as u32 + o.at, x: o.x };
                    *count += 1;
                }
            }
            d[groups..].fill(0.0);
            s[groups..].fill(0.0);
        };
        // Row by row in parallel (one row, a decode step's, stays on this
        // thread): the other threads would only wait for the GEMM that
        // reads them, and a batch of eight decoding sequences spent 4% of
        // a step quantizing on one thread.
        a[..m * k]
            .par_chunks_exact(k)
            .zip(self.q8.par_chunks_exact_mut(k))
            .zip(self.d.par_chunks_exact_mut(stride))
            .zip(self.s.par_chunks_exact_mut(stride))
            .zip(self.outliers.par_chunks_exact_mut(groups))
            .zip(self.outlier_count.par_iter_mut())
            .for_each(one);
    }

    /// After [`ActRows::quantize8`] in natural order: the sums per 32 of
    /// the 8-bit values into `sums` (the Q8_0 `VPDPBUSD` kernel takes them
    /// off its offset weights) and, with `values`, the values widened into
    /// `qs` (for the 16-bit kernels that run Q8_0 on other CPUs; see
    /// `super::interleaved::takes_act8`).
    pub(crate) fn widen8(&mut self, m: usize, values: bool) {
        let k = self.k;
        grow(&mut self.sums, m * k / 32, 0);
        let groups = self.q8[..m * k].chunks_exact(32);
        for (q, sum) in groups.clone().zip(self.sums.iter_mut()) {
            *sum = q.iter().map(|&q| i32::from(q)).sum();
        }
        if values {
            grow(&mut self.qs, m * k, 0);
            for (q, w) in groups.zip(self.qs.chunks_exact_mut(32)) {
                for (w, &q) in w.iter_mut().zip(q) {
                    *w = i16::from(q);
                }
            }
        }
    }

    /// Row `r`'s outliers from the last [`ActRows::quantize8`].
    pub(crate) fn row_outliers(&self, r: usize) -> &[Outlier] {
        let groups = self.k / 32;
        &self.outliers[r * groups..][..self.outlier_count[r]]
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

/// The reordered 8-bit layout's value order within each run of eight.
#[cfg(not(target_arch = "x86_64"))]
const REORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

type Row8Mut<'a> = (
    (
        (((&'a [f32], &'a mut [i8]), &'a mut [f32]), &'a mut [f32]),
        &'a mut [Outlier],
    ),
    &'a mut usize,
);

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
    if super::features::has_avx2() {
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

/// One 32-value group of [`ActRows::quantize8`] in its scalar statement:
/// values in their natural order, the scale and the outlier (its position
/// in the group). The x86 kernel computes exactly this (tested), its sum
/// of squares in the same order; other CPUs run it as it stands.
#[cfg(any(test, not(target_arch = "x86_64")))]
fn quantize8_group(x: &[f32]) -> ([i8; 32], f32, Option<Outlier>) {
    let lanes: [f32; 8] = std::array::from_fn(|l| {
        (1..4).fold(x[l] * x[l], |s, i| x[l + 8 * i].mul_add(x[l + 8 * i], s))
    });
    let half: [f32; 4] = std::array::from_fn(|l| lanes[l] + lanes[l + 4]);
    let sum_sq = (half[0] + half[2]) + (half[1] + half[3]);
    let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut rest = [0f32; 32];
    rest.copy_from_slice(&x[..32]);
    let mut outlier = None;
    if max * max > OUTLIER_SHARE * sum_sq {
        let i = x.iter().position(|v| v.abs() == max).unwrap_or(0);
        rest[i] = 0.0;
        outlier = Some(Outlier { at: i as u32, x: x[i] });
    }
    let d = rest.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let q = std::array::from_fn(|i| (rest[i] * inv).round_ties_even() as i8);
    (q, d, outlier)
}

#[cfg(target_arch = "x86_64")]
#[path = "x86/act_quant.rs"]
mod x86;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::{quantize8_group, quantize_act, ActRows, Outlier};

    /// The vector quantizer writes exactly the scalar reference's values.
    #[test]
    fn vector_quantizer_matches_the_reference() {
        if !super::super::features::has_avx2() {
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

    /// The vector 8-bit quantizer gives the scalar statement's values (in
    /// its 0, 4, 1, 5, 2, 6, 3, 7 order), scales, sums and outliers, on
    /// rows with planted spikes of either side of the threshold.
    #[test]
    fn quantize8_matches_its_statement() {
        if cfg!(target_arch = "x86_64") && !super::super::features::has_avx2() {
            return;
        }
        let mut rng = StdRng::seed_from_u64(4);
        let (m, k) = (17, 576);
        let mut a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        for _ in 0..300 {
            let i = rng.random_range(0..m * k);
            a[i] = rng.random_range(2.0f32..20.0) * if rng.random() { 1.0 } else { -1.0 };
        }
        a[32..64].fill(0.0);
        a[64..96].fill(0.0);
        a[70] = -3.0;
        let mut act = ActRows::default();
        act.quantize8(&a, m, k, false);
        let order = [0, 4, 1, 5, 2, 6, 3, 7];
        let mut spikes = 0;
        for r in 0..m {
            let mut want_outliers = Vec::new();
            for g in 0..k / 32 {
                let (q, d, outlier) = quantize8_group(&a[r * k + 32 * g..][..32]);
                let got = &act.q8[r * k + 32 * g..][..32];
                for (i, &v) in got.iter().enumerate() {
                    assert_eq!(v, q[8 * (i / 8) + order[i % 8]], "row {r} block {g} at {i}");
                }
                assert_eq!(act.d[r * act.stride + g], d);
                let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
                assert_eq!(act.s[r * act.stride + g], d * sum as f32);
                want_outliers.extend(outlier.map(|o| Outlier { at: o.at + 32 * g as u32, x: o.x }));
            }
            spikes += want_outliers.len();
            assert_eq!(act.row_outliers(r), want_outliers, "row {r}");
        }
        assert!(
            spikes > 50,
            "only {spikes} outliers: the test lost its spikes"
        );
    }
}

/// Lengthens `v` to `len` with `fill`; never shortens it.
fn grow<T: Clone>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.resize(len, fill);
    }
}
