//! `qk_norm_rope`: optional per-head RMSNorm, rotary embedding and the
//! token-major → head-major transpose, in one pass over Q or K.

use rayon::prelude::*;

use super::{simd, Elem, PAR_MIN_ELEMS};
use crate::QkMode as Mode;
use crate::{AttnConfig, AttnSegment};

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
    let n = tokens * heads * hd;
    let input = &input[..n];
    let norm_w = checked_norm(norm_w, (cos, sin), pos_offset + tokens, hd, mode);

    // One output chunk per head: [tokens, hd], contiguous.
    let per_head = |(h, dst): (usize, &mut [f32])| {
        for t in 0..tokens {
            let src = &input[(t * heads + h) * hd..(t * heads + h + 1) * hd];
            let d = &mut dst[t * hd..(t + 1) * hd];
            head(src, d, norm_w, (cos, sin), pos_offset + t, eps, mode);
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

/// Checks up front that the tables cover positions below `end` and the
/// head dimension suits RoPE (as the kernels would fail halfway
/// otherwise); the norm weights the mode uses.
fn checked_norm<'a>(
    norm_w: &'a [f32],
    (cos, sin): (&[f32], &[f32]),
    end: usize,
    hd: usize,
    mode: Mode,
) -> &'a [f32] {
    if mode != Mode::Transpose {
        assert!(
            hd.is_multiple_of(2),
            "qk_norm_rope: RoPE needs an even head_dim, got {hd}"
        );
        let _ = (&cos[..end * hd / 2], &sin[..end * hd / 2]);
    }
    if mode == Mode::NormRope {
        &norm_w[..hd]
    } else {
        &[]
    }
}

/// One head of one token at position `p`: `dst = mode(src)`.
#[inline]
fn head(
    src: &[f32],
    dst: &mut [f32],
    norm_w: &[f32],
    (cos, sin): (&[f32], &[f32]),
    p: usize,
    eps: f32,
    mode: Mode,
) {
    let hd = src.len();
    match mode {
        Mode::Transpose => {
            dst.copy_from_slice(src);
            return;
        }
        Mode::NormRope => {
            let ms = simd::sum_sq(src) / hd as f32;
            simd::scale_mul(dst, src, 1.0 / (ms + eps).sqrt(), norm_w);
        }
        Mode::Rope => dst.copy_from_slice(src),
    }
    let half = hd / 2;
    let (c, s) = (
        &cos[p * half..(p + 1) * half],
        &sin[p * half..(p + 1) * half],
    );
    let (x1, x2) = dst.split_at_mut(half);
    for i in 0..half {
        let (a, b) = (x1[i], x2[i]);
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
    }
}

/// Largest head dimension [`decode_rows`] takes (its K staging row is on
/// the stack).
const MAX_HEAD_DIM: usize = 1024;

/// `Backend::decode_rows_qkv`: per segment, its row's Q heads through
/// `mode` into `q_out`, its K heads through `mode` and its V heads into
/// its pages, rounded to the pools' type. Serial: a decode batch's rows
/// are a few thousand values, less work than waking the pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_rows<T: Elem>(
    [q, k, v]: [&[f32]; 3],
    [q_norm, k_norm]: [&[f32]; 2],
    tables: (&[f32], &[f32]),
    q_out: &mut [f32],
    k_pool: &mut [T],
    v_pool: &mut [T],
    segs: &[AttnSegment],
    cfg: &AttnConfig,
    eps: f32,
    mode: Mode,
) {
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let (qd, kvd) = (nh * hd, nkv * hd);
    assert!(
        hd <= MAX_HEAD_DIM,
        "decode_rows_qkv: head_dim {hd} above {MAX_HEAD_DIM}"
    );
    let mut row = [0f32; MAX_HEAD_DIM];
    let row = &mut row[..hd];
    for s in segs {
        assert_eq!(s.q_len, 1, "decode_rows_qkv: one token per sequence");
        let (r, p) = (s.offset / qd, s.pos_offset);
        let qn = checked_norm(q_norm, tables, p + 1, hd, mode);
        let (src, dst) = (&q[r * qd..][..qd], &mut q_out[s.offset..][..qd]);
        for (src, dst) in src.chunks_exact(hd).zip(dst.chunks_exact_mut(hd)) {
            head(src, dst, qn, tables, p, eps, mode);
        }
        let kn = checked_norm(k_norm, tables, p + 1, hd, mode);
        let (ks, vs) = (&k[r * kvd..][..kvd], &v[r * kvd..][..kvd]);
        for h in 0..nkv {
            let at = s.pages.offset(p, h, nkv, hd);
            head(&ks[h * hd..][..hd], row, kn, tables, p, eps, mode);
            T::narrow_from(&mut k_pool[at..at + hd], row);
            T::narrow_from(&mut v_pool[at..at + hd], &vs[h * hd..][..hd]);
        }
    }
}
