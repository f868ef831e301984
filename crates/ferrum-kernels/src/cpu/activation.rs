//! Element-wise activations and additions.

use rayon::prelude::*;

use super::{rows_mut, rows_mut_from, simd, PAR_MIN_ELEMS};

/// A gated activation's rows go to separate threads from this many values
/// on, a quarter of `super::rows_mut`'s bound: an exponential or tanh per value
/// makes them several times the work of an add, and a batch-8 SmolLM2
/// step's 12k values took 3% of the step on one thread.
const GATED_PAR_MIN: usize = PAR_MIN_ELEMS / 4;

pub(crate) fn fused_silu_mul_split(gate_up: &[f32], out: &mut [f32], tokens: usize, im: usize) {
    let gate_up = &gate_up[..tokens * 2 * im];
    rows_mut_from(GATED_PAR_MIN, &mut out[..tokens * im], im, |t, o| {
        let row = &gate_up[t * 2 * im..(t + 1) * 2 * im];
        simd::silu_mul(o, &row[..im], &row[im..]);
    });
}

pub(crate) fn fused_gelu_tanh_mul_split(
    gate_up: &[f32],
    out: &mut [f32],
    tokens: usize,
    im: usize,
) {
    let gate_up = &gate_up[..tokens * 2 * im];
    rows_mut_from(GATED_PAR_MIN, &mut out[..tokens * im], im, |t, o| {
        let row = &gate_up[t * 2 * im..(t + 1) * 2 * im];
        simd::gelu_tanh_mul(o, &row[..im], &row[im..]);
    });
}

/// Elements per parallel chunk of a flat element-wise op.
const FLAT_CHUNK: usize = 1 << 13;

pub(crate) fn gelu(x: &[f32], out: &mut [f32], len: usize) {
    let (x, out) = (&x[..len], &mut out[..len]);
    if len >= PAR_MIN_ELEMS {
        out.par_chunks_mut(FLAT_CHUNK)
            .zip(x.par_chunks(FLAT_CHUNK))
            .for_each(|(o, x)| simd::gelu(o, x));
    } else {
        simd::gelu(out, x);
    }
}

pub(crate) fn add_inplace(residual: &mut [f32], x: &[f32], len: usize) {
    let (residual, x) = (&mut residual[..len], &x[..len]);
    if len >= PAR_MIN_ELEMS {
        residual
            .par_chunks_mut(FLAT_CHUNK)
            .zip(x.par_chunks(FLAT_CHUNK))
            .for_each(|(r, x)| simd::add(r, x));
    } else {
        simd::add(residual, x);
    }
}

pub(crate) fn scale_add_rows(
    src: &[f32],
    rows: &[u32],
    weights: &[f32],
    dst: &mut [f32],
    dim: usize,
) {
    for ((&r, &w), s) in rows.iter().zip(weights).zip(src.chunks_exact(dim)) {
        let d = &mut dst[r as usize * dim..][..dim];
        for (d, s) in d.iter_mut().zip(s) {
            *d += w * s;
        }
    }
}

pub(crate) fn add_bias(data: &mut [f32], bias: &[f32], rows: usize, cols: usize) {
    let bias = &bias[..cols];
    rows_mut(&mut data[..rows * cols], cols, |_, r| simd::add(r, bias));
}
