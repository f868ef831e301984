//! Integer activations for the CPU's integer GEMM kernels.
//!
//! Each group of `group` values (32 for the legacy block types, 256 for the
//! k-quants, whose integer sub-block scales then apply in integer arithmetic)
//! gets an f32 scale `d = max|x| / ACT_MAX` and 16-bit values
//! `q = round_half_even(x / d)` in `-ACT_MAX..=ACT_MAX`. Fifteen bits keep the
//! rounding error about 100x below 8-bit activations (ggml's `Q8_K`), whose
//! noise moved perplexity by 0.2-0.3% on our reference models. On AVX2 they
//! cost no more multiplies: two `PMADDWD` per 32 values, as 8-bit values need
//! `PMADDUBSW` plus a widening `PMADDWD` (and one `VPDPWSSD` does 32 with
//! AVX-512 VNNI); the price is twice the activation bytes, which stay in L1.
//!
//! This scalar version is the reference that the vectorized CPU quantizer
//! matches bit for bit.

/// Largest activation magnitude: 14 bits, so that the k-quant kernels' i32
/// lanes cannot overflow (32 products of at most 4,096 · 16,383 per lane per
/// super-block: 2,147,352,576 < 2³¹).
pub const ACT_MAX: i16 = 16383;

/// Scale and reciprocal for a group whose largest magnitude is `amax`; both
/// the scalar and the vector quantizer compute them this way.
#[inline]
pub(crate) fn act_scale(amax: f32) -> (f32, f32) {
    let d = amax / f32::from(ACT_MAX);
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

/// Quantizes `x` (a whole number of `group`-value groups) into `qs` and one
/// scale per group in `d` (`x.len()`, `x.len()` and `x.len() / group` long).
pub fn quantize_act(x: &[f32], group: usize, qs: &mut [i16], d: &mut [f32]) {
    let max = f32::from(ACT_MAX);
    for ((xg, qg), dg) in x
        .chunks_exact(group)
        .zip(qs.chunks_exact_mut(group))
        .zip(d.iter_mut())
    {
        let amax = xg.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (scale, inv) = act_scale(amax);
        *dg = scale;
        for (q, &v) in qg.iter_mut().zip(xg) {
            *q = (v * inv).round_ties_even().clamp(-max, max) as i16;
        }
    }
}
