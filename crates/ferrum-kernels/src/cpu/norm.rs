//! RMSNorm and LayerNorm over the last dimension.

use rayon::prelude::*;

use super::{rows_mut, simd, PAR_MIN_ELEMS};

fn rms_row(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let ms = simd::sum_sq(x) / x.len() as f32;
    simd::scale_mul(out, x, 1.0 / (ms + eps).sqrt(), w);
}

pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], tokens: usize, dim: usize) {
    let (x, w) = (&x[..tokens * dim], &w[..dim]);
    rows_mut(&mut out[..tokens * dim], dim, |t, o| {
        rms_row(o, &x[t * dim..(t + 1) * dim], w, eps)
    });
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_add_rms_norm(
    residual: &mut [f32],
    x: &[f32],
    w: &[f32],
    eps: f32,
    out: &mut [f32],
    tokens: usize,
    dim: usize,
) {
    let n = tokens * dim;
    let (residual, x, w, out) = (&mut residual[..n], &x[..n], &w[..dim], &mut out[..n]);
    let row = |(res, (xr, o)): (&mut [f32], (&[f32], &mut [f32]))| {
        simd::add(res, xr);
        rms_row(o, res, w, eps);
    };
    if n >= PAR_MIN_ELEMS && tokens > 1 {
        residual
            .par_chunks_mut(dim)
            .zip(x.par_chunks(dim).zip(out.par_chunks_mut(dim)))
            .for_each(row);
    } else {
        residual
            .chunks_mut(dim)
            .zip(x.chunks(dim).zip(out.chunks_mut(dim)))
            .for_each(row);
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_norm(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    out: &mut [f32],
    tokens: usize,
    dim: usize,
) {
    let (x, gamma, beta) = (&x[..tokens * dim], &gamma[..dim], &beta[..dim]);
    rows_mut(&mut out[..tokens * dim], dim, |t, o| {
        let xr = &x[t * dim..(t + 1) * dim];
        let mean = simd::sum(xr) / dim as f32;
        // Two-pass variance: subtract the mean first to avoid cancellation.
        for (o, &v) in o.iter_mut().zip(xr) {
            *o = v - mean;
        }
        let var = simd::sum_sq(o) / dim as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((o, &g), &bb) in o.iter_mut().zip(gamma).zip(beta) {
            *o = (*o * inv).mul_add(g, bb);
        }
    });
}
