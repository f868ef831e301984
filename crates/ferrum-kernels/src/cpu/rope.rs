//! `qk_norm_rope`: optional per-head RMSNorm, rotary embedding and the
//! token-major → head-major transpose, in one pass over Q or K.

use rayon::prelude::*;

use super::{simd, PAR_MIN_ELEMS};
use crate::QkMode as Mode;

#[allow(clippy::too_many_arguments)]
pub(crate) fn qk_norm_rope(
    input: &[f32],
    norm_w: &[f32],
    cos: &[f32],
    sin: &[f32],
    output: &mut [f32],
    tokens: usize,
    heads: usize,
    hd: usize,
    pos_offset: usize,
    eps: f32,
    mode: Mode,
) {
    let half = hd / 2;
    let n = tokens * heads * hd;
    let input = &input[..n];
    if mode != Mode::Transpose {
        assert!(
            hd.is_multiple_of(2),
            "qk_norm_rope: RoPE needs an even head_dim, got {hd}"
        );
        // Fail up front if the tables do not cover the last position.
        let _ = (
            &cos[..(pos_offset + tokens) * half],
            &sin[..(pos_offset + tokens) * half],
        );
    }
    let norm_w = if mode == Mode::NormRope {
        &norm_w[..hd]
    } else {
        &[][..]
    };

    // One output chunk per head: [tokens, hd], contiguous.
    let per_head = |(h, dst): (usize, &mut [f32])| {
        for t in 0..tokens {
            let src = &input[(t * heads + h) * hd..(t * heads + h + 1) * hd];
            let d = &mut dst[t * hd..(t + 1) * hd];
            match mode {
                Mode::Transpose => {
                    d.copy_from_slice(src);
                    continue;
                }
                Mode::NormRope => {
                    let ms = simd::sum_sq(src) / hd as f32;
                    simd::scale_mul(d, src, 1.0 / (ms + eps).sqrt(), norm_w);
                }
                Mode::Rope => d.copy_from_slice(src),
            }
            let p = pos_offset + t;
            let (c, s) = (
                &cos[p * half..(p + 1) * half],
                &sin[p * half..(p + 1) * half],
            );
            let (x1, x2) = d.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    };
    let output = &mut output[..n];
    if n >= PAR_MIN_ELEMS && heads > 1 {
        output
            .par_chunks_mut(tokens * hd)
            .enumerate()
            .for_each(per_head);
    } else {
        output
            .chunks_mut(tokens * hd)
            .enumerate()
            .for_each(per_head);
    }
}
