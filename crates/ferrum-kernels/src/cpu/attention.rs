//! Streaming ("flash") attention on the CPU.
//!
//! Keys are visited in tiles of [`KV_TILE`] positions with an online softmax
//! (running max `m`, running denominator `l`, rescaled accumulator `o`), so
//! memory per task is `rows × (KV_TILE + head_dim)` whatever `q_len × kv_len`
//! is. One task handles one KV head of one batch item for a block of query
//! positions, with every query head of its GQA group, so each K/V tile is
//! loaded into cache once and used by `group × block` query rows.

use std::cell::RefCell;

use rayon::prelude::*;

use super::{simd, SyncPtr};
use crate::AttnConfig;

/// Keys per tile: a 64 × 128-float K tile is 32 KiB, about L1-sized.
const KV_TILE: usize = 64;

/// Upper bound on query positions per task.
const MAX_Q_BLOCK: usize = 16;

thread_local! {
    /// Per-thread scratch (scores, accumulators, m, l), grown on first use
    /// and reused by every later call: no heap allocation in steady state.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Shapes of one call, fixed for all tasks.
struct Dims {
    nh: usize,
    nkv: usize,
    hd: usize,
    q_len: usize,
    kv_len: usize,
    stride: usize,
    group: usize,
    pos_offset: usize,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    batch: usize,
    q_len: usize,
    kv_len: usize,
    pos_offset: usize,
    cfg: &AttnConfig,
) {
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    assert!(
        nkv > 0 && nh % nkv == 0,
        "flash_attention: num_heads {nh} is not a multiple of num_kv_heads {nkv}"
    );
    let stride = if cfg.kv_seq_stride == 0 {
        kv_len
    } else {
        cfg.kv_seq_stride
    };
    assert!(
        stride >= kv_len,
        "flash_attention: kv_seq_stride {stride} < kv_len {kv_len}"
    );
    let d = Dims {
        nh,
        nkv,
        hd,
        q_len,
        kv_len,
        stride,
        group: nh / nkv,
        pos_offset,
    };
    let q = &q[..batch * nh * q_len * hd];
    let out = &mut out[..batch * nh * q_len * hd];
    // Touch the last K/V row we will read so a short buffer fails here,
    // not as an out-of-bounds read inside a task.
    if kv_len > 0 {
        let last = ((batch - 1) * nkv + nkv - 1) * stride * hd + kv_len * hd;
        let _ = (&k[..last], &v[..last]);
    }
    if batch == 0 || q_len == 0 {
        return;
    }

    let threads = rayon::current_num_threads();
    let heads_total = batch * nkv;
    // Shrink the query block until there are a few tasks per thread.
    let mut q_block = MAX_Q_BLOCK.min(q_len);
    while q_block > 1 && heads_total * q_len.div_ceil(q_block) < 4 * threads {
        q_block /= 2;
    }
    let blocks_per_head = q_len.div_ceil(q_block);
    let tasks = heads_total * blocks_per_head;
    let out_ptr = SyncPtr(out.as_mut_ptr());

    let run = |t: usize| {
        let (bh, blk) = (t / blocks_per_head, t % blocks_per_head);
        let (b, kvh) = (bh / nkv, bh % nkv);
        let q0 = blk * q_block;
        let nq = q_block.min(q_len - q0);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            attend_block(&d, cfg, q, k, v, out_ptr, b, kvh, q0, nq, &mut s);
        });
    };
    if tasks == 1 || threads == 1 {
        (0..tasks).for_each(run);
    } else {
        (0..tasks).into_par_iter().for_each(run);
    }
}

/// Visible key range `[lo, hi)` of the query at absolute position `p`.
fn key_range(cfg: &AttnConfig, kv_len: usize, p: usize) -> (usize, usize) {
    let hi = if cfg.causal {
        kv_len.min(p + 1)
    } else {
        kv_len
    };
    let lo = if cfg.sliding_window > 0 {
        (p + 1).saturating_sub(cfg.sliding_window)
    } else {
        0
    };
    (lo.min(hi), hi)
}

#[allow(clippy::too_many_arguments)]
fn attend_block(
    d: &Dims,
    cfg: &AttnConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: SyncPtr,
    b: usize,
    kvh: usize,
    q0: usize,
    nq: usize,
    scratch: &mut Vec<f32>,
) {
    let (hd, group) = (d.hd, d.group);
    let rows = nq * group;
    let need = rows * (KV_TILE + hd + 2);
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (scores, rest) = scratch.split_at_mut(rows * KV_TILE);
    let (acc, rest) = rest.split_at_mut(rows * hd);
    let (m, rest) = rest.split_at_mut(rows);
    let l = &mut rest[..rows];
    acc.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);

    let kv_base = (b * d.nkv + kvh) * d.stride * hd;
    let (k, v) = (&k[kv_base..], &v[kv_base..]);
    // Row r = (query position qi, head g within the group), position-major.
    let q_row = |r: usize| {
        let (qi, g) = (r / group, r % group);
        let h = kvh * group + g;
        ((b * d.nh + h) * d.q_len + q0 + qi) * hd
    };
    let range_of = |r: usize| key_range(cfg, d.kv_len, d.pos_offset + q0 + r / group);

    let first = (0..rows).map(|r| range_of(r).0).min().unwrap_or(0);
    let last = (0..rows).map(|r| range_of(r).1).max().unwrap_or(0);
    let mut t0 = first - first % KV_TILE;
    while t0 < last {
        let t1 = (t0 + KV_TILE).min(last);
        for r in 0..rows {
            let (lo, hi) = range_of(r);
            let (j0, j1) = (lo.max(t0), hi.min(t1));
            if j0 >= j1 {
                continue;
            }
            let qv = &q[q_row(r)..q_row(r) + hd];
            let s = &mut scores[r * KV_TILE..r * KV_TILE + (j1 - j0)];
            let mut tile_max = f32::NEG_INFINITY;
            for (sj, j) in s.iter_mut().zip(j0..j1) {
                *sj = cfg.scale * simd::dot(qv, &k[j * hd..(j + 1) * hd]);
                tile_max = tile_max.max(*sj);
            }
            let m_new = m[r].max(tile_max);
            let tile_sum = simd::exp_sub_sum(s, m_new);
            let o = &mut acc[r * hd..(r + 1) * hd];
            if m[r] != f32::NEG_INFINITY {
                let corr = (m[r] - m_new).exp();
                l[r] *= corr;
                simd::scale(o, corr);
            }
            l[r] += tile_sum;
            m[r] = m_new;
            for (&p, j) in s.iter().zip(j0..j1) {
                simd::axpy(o, p, &v[j * hd..(j + 1) * hd]);
            }
        }
        t0 = t1;
    }

    for r in 0..rows {
        let o = &mut acc[r * hd..(r + 1) * hd];
        let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
        simd::scale(o, inv);
        // SAFETY: q_row(r) indexes this task's own rows of `out`, which has
        // the same [batch, heads, q_len, hd] shape as `q` and was
        // bounds-checked by the caller; no other task writes these rows.
        unsafe { std::ptr::copy_nonoverlapping(o.as_ptr(), out.get().add(q_row(r)), hd) };
    }
}
