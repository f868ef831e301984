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
use crate::{AttnConfig, AttnSegment, PagedKv};

/// Keys per tile: a 64 × 128-float K tile is 32 KiB, about L1-sized.
const KV_TILE: usize = 64;

/// Upper bound on query positions per task.
const MAX_Q_BLOCK: usize = 16;

thread_local! {
    /// Per-thread scratch (scores, accumulators, m, l), grown on first use
    /// and reused by every later call: no heap allocation in steady state.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Scratch [`reserve_scratch`] sets aside: a decode task's rows (a GQA
/// group of up to 16 heads) with head dimensions up to 256.
const RESERVED_SCRATCH: usize = 16 * (KV_TILE + 256 + 2);

/// Sizes this thread's scratch for decoding up front. Which pool thread
/// runs which attention task is up to work stealing, so a thread may take
/// its first one long after warm-up; `cpu::on_pool` calls this on every
/// thread so that decode steps never allocate.
pub(crate) fn reserve_scratch() {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let extra = RESERVED_SCRATCH.saturating_sub(s.len());
        s.reserve(extra);
    });
}

/// Shapes of one call, fixed for all tasks.
struct Dims {
    nh: usize,
    hd: usize,
    q_len: usize,
    kv_len: usize,
    group: usize,
    pos_offset: usize,
}

/// Where row `j` of KV head `kvh` of batch item `b` starts in K and V.
trait KvRows: Sync {
    fn row(&self, b: usize, kvh: usize, j: usize) -> usize;
}

/// `[batch, kv_heads, stride, head_dim]` buffers.
struct Contiguous {
    nkv: usize,
    stride: usize,
    hd: usize,
}

impl KvRows for Contiguous {
    #[inline]
    fn row(&self, b: usize, kvh: usize, j: usize) -> usize {
        ((b * self.nkv + kvh) * self.stride + j) * self.hd
    }
}

/// A paged pool (one sequence, `b` is always 0).
struct Paged<'a> {
    pages: PagedKv<'a>,
    nkv: usize,
    hd: usize,
}

impl KvRows for Paged<'_> {
    #[inline]
    fn row(&self, _b: usize, kvh: usize, j: usize) -> usize {
        self.pages.offset(j, kvh, self.nkv, self.hd)
    }
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
    check_heads(nh, nkv);
    let stride = if cfg.kv_seq_stride == 0 {
        kv_len
    } else {
        cfg.kv_seq_stride
    };
    assert!(
        stride >= kv_len,
        "flash_attention: kv_seq_stride {stride} < kv_len {kv_len}"
    );
    // Touch the last K/V row we will read so a short buffer fails here,
    // not as an out-of-bounds read inside a task.
    if kv_len > 0 && batch > 0 {
        let last = ((batch - 1) * nkv + nkv - 1) * stride * hd + kv_len * hd;
        let _ = (&k[..last], &v[..last]);
    }
    let rows = Contiguous { nkv, stride, hd };
    run(q, k, v, out, batch, q_len, kv_len, pos_offset, cfg, &rows);
}

/// [`flash_attention`] for one sequence whose K/V are in a paged pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention(
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    pages: &PagedKv,
    out: &mut [f32],
    q_len: usize,
    kv_len: usize,
    pos_offset: usize,
    cfg: &AttnConfig,
) {
    let seg = AttnSegment {
        pages: *pages,
        offset: 0,
        q_len,
        kv_len,
        pos_offset,
    };
    paged_attention_segments(q, k_pool, v_pool, &[seg], out, cfg);
}

/// [`paged_attention`] for several sequences: the tasks of all of them
/// (KV head × query block) go to the pool in one parallel step.
pub(crate) fn paged_attention_segments(
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    segs: &[AttnSegment],
    out: &mut [f32],
    cfg: &AttnConfig,
) {
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    check_heads(nh, nkv);
    // Bounds-check every query, output and block the tasks will touch, and
    // that the segments' outputs are disjoint.
    let mut end = 0;
    for s in segs {
        assert!(
            s.offset >= end,
            "paged attention: segments overlap or are out of order"
        );
        end = s.offset + nh * s.q_len * hd;
        let _ = (&q[s.offset..end], &out[s.offset..end]);
        let used = &s.pages.block_table[..s.kv_len.div_ceil(s.pages.block_size)];
        if let Some(&max) = used.iter().max() {
            let last = (max as usize + 1) * s.pages.block_len(nkv, hd);
            let _ = (&k_pool[..last], &v_pool[..last]);
        }
    }
    let threads = rayon::current_num_threads();
    let heads_total = segs.len() * nkv;
    // A segment's query block and its number of blocks per KV head.
    let blocks = |s: &AttnSegment| {
        let qb = query_block(s.q_len, heads_total, threads);
        (qb, s.q_len.div_ceil(qb))
    };
    let tasks: usize = segs.iter().map(|s| nkv * blocks(s).1).sum();
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let mut t = t;
        for s in segs {
            let (qb, blocks) = blocks(s);
            if t >= nkv * blocks {
                t -= nkv * blocks;
                continue;
            }
            let (kvh, q0) = (t / blocks, (t % blocks) * qb);
            let d = Dims {
                nh,
                hd,
                q_len: s.q_len,
                kv_len: s.kv_len,
                group: nh / nkv,
                pos_offset: s.pos_offset,
            };
            let rows = Paged {
                pages: s.pages,
                nkv,
                hd,
            };
            // The segment's rows of `out` start at its offset (checked above).
            let seg_out = SyncPtr(out_ptr.get().wrapping_add(s.offset));
            let at = Task {
                b: 0,
                kvh,
                q0,
                nq: qb.min(s.q_len - q0),
            };
            SCRATCH.with(|scratch| {
                let q = &q[s.offset..];
                attend_block(
                    &d,
                    cfg,
                    q,
                    k_pool,
                    v_pool,
                    &rows,
                    seg_out,
                    at,
                    &mut scratch.borrow_mut(),
                );
            });
            return;
        }
    };
    if tasks == 1 || threads == 1 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// Query positions per task for `q_len` queries over `heads_total` KV
/// heads: [`MAX_Q_BLOCK`], halved until there are a few tasks per thread.
fn query_block(q_len: usize, heads_total: usize, threads: usize) -> usize {
    let mut qb = MAX_Q_BLOCK.min(q_len).max(1);
    while qb > 1 && heads_total * q_len.div_ceil(qb) < 4 * threads {
        qb /= 2;
    }
    qb
}

fn check_heads(nh: usize, nkv: usize) {
    assert!(
        nkv > 0 && nh.is_multiple_of(nkv),
        "flash_attention: num_heads {nh} is not a multiple of num_kv_heads {nkv}"
    );
}

#[allow(clippy::too_many_arguments)]
fn run<R: KvRows>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    batch: usize,
    q_len: usize,
    kv_len: usize,
    pos_offset: usize,
    cfg: &AttnConfig,
    rows: &R,
) {
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let d = Dims {
        nh,
        hd,
        q_len,
        kv_len,
        group: nh / nkv,
        pos_offset,
    };
    let q = &q[..batch * nh * q_len * hd];
    let out = &mut out[..batch * nh * q_len * hd];
    if batch == 0 || q_len == 0 {
        return;
    }

    let threads = rayon::current_num_threads();
    let heads_total = batch * nkv;
    let q_block = query_block(q_len, heads_total, threads);
    let blocks_per_head = q_len.div_ceil(q_block);
    let tasks = heads_total * blocks_per_head;
    let out_ptr = SyncPtr(out.as_mut_ptr());

    let task = |t: usize| {
        let (bh, blk) = (t / blocks_per_head, t % blocks_per_head);
        let (b, kvh) = (bh / nkv, bh % nkv);
        let q0 = blk * q_block;
        let nq = q_block.min(q_len - q0);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let at = Task { b, kvh, q0, nq };
            attend_block(&d, cfg, q, k, v, rows, out_ptr, at, &mut s);
        });
    };
    if tasks == 1 || threads == 1 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// One task: KV head `kvh` of batch item `b`, queries `q0..q0 + nq`.
struct Task {
    b: usize,
    kvh: usize,
    q0: usize,
    nq: usize,
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
fn attend_block<R: KvRows>(
    d: &Dims,
    cfg: &AttnConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kv_rows: &R,
    out: SyncPtr,
    at: Task,
    scratch: &mut Vec<f32>,
) {
    let Task { b, kvh, q0, nq } = at;
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

    // Row offsets of the current tile's keys, shared by all query rows.
    let mut offs = [0usize; KV_TILE];
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
        for (o, j) in offs.iter_mut().zip(t0..t1) {
            *o = kv_rows.row(b, kvh, j);
        }
        for r in 0..rows {
            let (lo, hi) = range_of(r);
            let (j0, j1) = (lo.max(t0), hi.min(t1));
            if j0 >= j1 {
                continue;
            }
            let qv = &q[q_row(r)..q_row(r) + hd];
            let s = &mut scores[r * KV_TILE..r * KV_TILE + (j1 - j0)];
            let tile = &offs[j0 - t0..j1 - t0];
            simd::dot_many(qv, k, tile, cfg.scale, s);
            let tile_max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
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
            simd::axpy_many(o, s, v, tile);
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
