//! Streaming ("flash") attention on the CPU.
//!
//! Keys are visited in tiles of [`KV_TILE`] positions with an online softmax
//! (running max `m`, running denominator `l`, rescaled accumulator `o`), so
//! memory per task is `rows × (KV_TILE + head_dim)` whatever `q_len × kv_len`
//! is. One task handles one KV head of one batch item for a block of query
//! positions, with every query head of its GQA group, so each K/V tile is
//! loaded into cache once and used by `group × block` query rows. A single
//! query's keys are also split over tasks (see [`Cut`]).

use std::cell::RefCell;

use rayon::prelude::*;

use super::{
    simd::{self, Elem},
    SyncPtr,
};
use crate::{AttnConfig, AttnSegment, PagedKv};

/// Keys per tile: a 64 × 128-float K tile is 32 KiB, about L1-sized.
const KV_TILE: usize = 64;

/// Upper bound on query positions per task.
const MAX_Q_BLOCK: usize = 16;

/// Most rows handed to the tile kernels at once (they take them four at a
/// time).
const PACK: usize = 8;

thread_local! {
    /// Per-thread scratch (scores, accumulators, m, l), grown on first use
    /// and reused by every later call: no heap allocation in steady state.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's slots for split tasks' partial results, kept
    /// across calls like `SCRATCH`.
    static PARTIALS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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

/// Where row `j` of KV head `kvh` of one sequence starts in K and V.
trait KvRows: Sync {
    fn row(&self, kvh: usize, j: usize) -> usize;
}

/// One batch item of `[batch, kv_heads, stride, head_dim]` buffers, whose
/// heads start at `base`.
struct Contiguous {
    base: usize,
    stride: usize,
    hd: usize,
}

impl KvRows for Contiguous {
    #[inline]
    fn row(&self, kvh: usize, j: usize) -> usize {
        self.base + (kvh * self.stride + j) * self.hd
    }
}

/// A sequence's pages of a paged pool.
struct Paged<'a> {
    pages: PagedKv<'a>,
    nkv: usize,
    hd: usize,
}

impl KvRows for Paged<'_> {
    #[inline]
    fn row(&self, kvh: usize, j: usize) -> usize {
        self.pages.offset(j, kvh, self.nkv, self.hd)
    }
}

/// One sequence of a call: its queries `[heads, q_len, head_dim]` (and its
/// output, the same shape) start at element `offset`.
struct Seq<R> {
    rows: R,
    offset: usize,
    q_len: usize,
    kv_len: usize,
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
    let n = batch * nh * q_len * hd;
    let (q, out) = (&q[..n], &mut out[..n]);
    let seq = |b: usize| Seq {
        rows: Contiguous { base: b * nkv * stride * hd, stride, hd },
        offset: b * nh * q_len * hd,
        q_len,
        kv_len,
        pos_offset,
    };
    attend(q, k, v, out, cfg, batch, seq);
}

/// [`flash_attention`] for sequences whose K/V are in a paged pool (of f32
/// or f16 values): the tasks of all of them go to the pool in one parallel
/// step.
pub(crate) fn paged_attention_segments<E: Elem>(
    q: &[f32],
    k_pool: &[E],
    v_pool: &[E],
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
    let seq = |i: usize| {
        let s = &segs[i];
        Seq {
            rows: Paged { pages: s.pages, nkv, hd },
            offset: s.offset,
            q_len: s.q_len,
            kv_len: s.kv_len,
            pos_offset: s.pos_offset,
        }
    };
    attend(q, k_pool, v_pool, out, cfg, segs.len(), seq);
}

/// How one sequence's work is cut into tasks: per KV head, `blocks` blocks
/// of `qb` query positions, each over `splits` chunks of its keys.
///
/// Only a single query (a decode step) is split: its visible keys, from
/// the tile boundary `start` on, in chunks of `chunk` keys, each chunk a
/// task leaving an unnormalised partial result for [`merge`]
/// (flash-decoding). Without it a decode step has one task per KV head,
/// which leaves cores idle at long context (one KV head: one core; three
/// on two cores: two rounds). The cut depends on the sequence's own key
/// range alone, never on the batch or the thread count, so a sequence
/// decodes to the same bits alone and in any batch. (Below 512 visible
/// keys nothing is split, and a decode step gives the same bits as a
/// prefill's last position; above, the merge's order of sums differs
/// from the prefill's in the last bits.)
#[derive(Clone, Copy)]
struct Cut {
    qb: usize,
    blocks: usize,
    splits: usize,
    chunk: usize,
    start: usize,
}

/// Fewest keys per chunk of a split query: a chunk is then tens of
/// microseconds of work, against about one for its task and merge.
/// Chunks are equal, so a query is split once it sees twice this many.
const SPLIT_MIN_KEYS: usize = 256;

/// Most chunks per split query, which bounds the partials' scratch.
const MAX_SPLITS: usize = 16;

impl Cut {
    fn new<R>(s: &Seq<R>, cfg: &AttnConfig, heads_total: usize, threads: usize) -> Self {
        let qb = query_block(s.q_len, heads_total, threads);
        let mut cut = Self {
            qb,
            blocks: s.q_len.div_ceil(qb),
            splits: 1,
            chunk: 0,
            start: 0,
        };
        if s.q_len == 1 {
            let (lo, hi) = key_range(cfg, s.kv_len, s.pos_offset);
            let start = lo - lo % KV_TILE;
            let span = hi - start;
            let splits = (span / SPLIT_MIN_KEYS).clamp(1, MAX_SPLITS);
            let chunk = span.div_ceil(splits).next_multiple_of(KV_TILE);
            (cut.splits, cut.chunk, cut.start) = (span.div_ceil(chunk).max(1), chunk, start);
        }
        cut
    }

    fn tasks(&self, nkv: usize) -> usize {
        nkv * self.blocks * self.splits
    }

    /// Keys `[lo, hi)` of chunk `c` (every key when unsplit).
    fn keys(&self, c: usize) -> (usize, usize) {
        if self.splits == 1 {
            (0, usize::MAX)
        } else {
            let lo = self.start + c * self.chunk;
            (lo, lo + self.chunk)
        }
    }
}

/// Runs every task of sequences `seq(0..n)` in one parallel step, then
/// merges the split ones. The callers have bounds-checked `q`, `out` and
/// the K/V rows against the sequences.
fn attend<E: Elem, R: KvRows, S: Fn(usize) -> Seq<R> + Sync>(
    q: &[f32],
    k: &[E],
    v: &[E],
    out: &mut [f32],
    cfg: &AttnConfig,
    n: usize,
    seq: S,
) {
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let group = nh / nkv;
    let threads = rayon::current_num_threads();
    let cut = |s: &Seq<R>| Cut::new(s, cfg, n * nkv, threads);
    // Partial slots, one per task of a split sequence; the scratch is sized
    // for the most splits any single query can take, so that it stops
    // growing once the batch has been seen.
    let slot_len = group * (hd + 2);
    let (mut tasks, mut most_slots) = (0, 0);
    for i in 0..n {
        let s = seq(i);
        tasks += cut(&s).tasks(nkv);
        if s.q_len == 1 {
            most_slots += nkv * MAX_SPLITS;
        }
    }
    PARTIALS.with(|partials| {
        let mut partials = partials.borrow_mut();
        if partials.len() < most_slots * slot_len {
            partials.resize(most_slots * slot_len, 0.0);
        }
        let (out_ptr, part_ptr) = (SyncPtr(out.as_mut_ptr()), SyncPtr(partials.as_mut_ptr()));
        let task = |t: usize| {
            let (mut t, mut slot) = (t, 0);
            for i in 0..n {
                let s = seq(i);
                let c = cut(&s);
                let count = c.tasks(nkv);
                if t >= count {
                    t -= count;
                    slot += if c.splits > 1 { count } else { 0 };
                    continue;
                }
                let per_head = c.blocks * c.splits;
                let (blk, split) = ((t % per_head) / c.splits, t % c.splits);
                let q0 = blk * c.qb;
                let at = Task {
                    kvh: t / per_head,
                    q0,
                    nq: c.qb.min(s.q_len - q0),
                    keys: c.keys(split),
                    partial: (c.splits > 1)
                        .then(|| SyncPtr(part_ptr.get().wrapping_add((slot + t) * slot_len))),
                };
                SCRATCH.with(|scratch| {
                    attend_block(cfg, q, k, v, &s, out_ptr, at, &mut scratch.borrow_mut());
                });
                return;
            }
        };
        if tasks == 1 || threads == 1 {
            (0..tasks).for_each(task);
        } else {
            (0..tasks).into_par_iter().for_each(task);
        }
        let mut slot = 0;
        for i in 0..n {
            let s = seq(i);
            let c = cut(&s);
            if c.splits == 1 {
                continue;
            }
            for h in 0..nh {
                let first = slot + (h / group) * c.splits;
                let slots = &partials[first * slot_len..(first + c.splits) * slot_len];
                let o = &mut out[s.offset + h * hd..s.offset + (h + 1) * hd];
                merge(o, slots, h % group, group, hd);
            }
            slot += c.tasks(nkv);
        }
    });
}

/// Row `g`'s output from the partials of its key chunks: `slots` holds one
/// slot per chunk, each `[o; rows × hd] [m; rows] [l; rows]` (the
/// unnormalised accumulator, running maximum and denominator of `rows`
/// rows, as [`attend_block`] keeps them).
fn merge(out: &mut [f32], slots: &[f32], g: usize, rows: usize, hd: usize) {
    let slot_len = rows * (hd + 2);
    let chunks = slots.len() / slot_len;
    let m = |c: usize| slots[c * slot_len + rows * hd + g];
    let l = |c: usize| slots[c * slot_len + rows * hd + rows + g];
    let top = (0..chunks)
        .filter(|&c| l(c) > 0.0)
        .map(m)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut weights = [0f32; MAX_SPLITS];
    let mut at = [0usize; MAX_SPLITS];
    let mut z = 0.0;
    for c in 0..chunks {
        if l(c) > 0.0 {
            weights[c] = (m(c) - top).exp();
            z += weights[c] * l(c);
        }
        at[c] = c * slot_len + g * hd;
    }
    out.fill(0.0);
    simd::axpy_many(out, hd, &weights[..chunks], 0, slots, &at[..chunks]);
    simd::scale(out, if z > 0.0 { 1.0 / z } else { 0.0 });
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

/// One task of a sequence: KV head `kvh`, queries `q0..q0 + nq`, keys
/// within `keys`. A split task leaves its rows' running state in its
/// `partial` slot (see [`merge`]) instead of writing the output.
struct Task {
    kvh: usize,
    q0: usize,
    nq: usize,
    keys: (usize, usize),
    partial: Option<SyncPtr>,
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
fn attend_block<E: Elem, R: KvRows>(
    cfg: &AttnConfig,
    q: &[f32],
    k: &[E],
    v: &[E],
    seq: &Seq<R>,
    out: SyncPtr,
    at: Task,
    scratch: &mut Vec<f32>,
) {
    let Task { kvh, q0, nq, keys, partial } = at;
    let (hd, group) = (cfg.head_dim, cfg.num_heads / cfg.num_kv_heads);
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

    let row_bytes = hd * std::mem::size_of::<E>();
    // Row offsets of the current tile's keys, shared by all query rows, and
    // of the next tile's, found (and prefetched) one tile early.
    let (mut offs, mut next) = ([0usize; KV_TILE], [0usize; KV_TILE]);
    // Row r = (query position qi, head g within the group), position-major.
    let q_row = |r: usize| {
        let (qi, g) = (r / group, r % group);
        let h = kvh * group + g;
        seq.offset + (h * seq.q_len + q0 + qi) * hd
    };
    let range_of = |r: usize| {
        let (lo, hi) = key_range(cfg, seq.kv_len, seq.pos_offset + q0 + r / group);
        let (lo, hi) = (lo.max(keys.0), hi.min(keys.1));
        (lo.min(hi), hi)
    };

    let first = (0..rows).map(|r| range_of(r).0).min().unwrap_or(0);
    let last = (0..rows).map(|r| range_of(r).1).max().unwrap_or(0);
    let tile_rows = |offs: &mut [usize; KV_TILE], t: usize| {
        for (o, j) in offs.iter_mut().zip(t..(t + KV_TILE).min(last)) {
            *o = seq.rows.row(kvh, j);
        }
    };
    let mut t0 = first - first % KV_TILE;
    tile_rows(&mut offs, t0);
    while t0 < last {
        let t1 = (t0 + KV_TILE).min(last);
        // Ask for the next tile's rows while this one is worked on. A head's
        // keys are runs of one block (4 KB of f32 at head_dim 64), each on
        // a page of its own, and the hardware prefetchers do not run ahead
        // across pages. One decode step's attention over SmolLM2's 30
        // layers at 2,048 keys (`--bench attention`, paged_decode, two
        // threads) took 8.6-9.1 ms with f16 pools and 9.4-12 with f32;
        // with this 5.7-7.8 and 8.7-10.5 (this VM's runs vary that much).
        // Into L2, not L1: L1's few outstanding misses capped the stream,
        // and the prefetches themselves stalled (f16 pools at 2,048 keys
        // 5.1-5.4 -> 3.6-4.3 ms; eight sequences at 512 keys, 8.4-9.1 ->
        // 6.8-7.6 ms, on a Zen 4; a tile further ahead gained nothing).
        tile_rows(&mut next, t1);
        for &o in &next[..(t1 + KV_TILE).min(last) - t1] {
            simd::prefetch(k.as_ptr().wrapping_add(o).cast(), row_bytes);
            simd::prefetch(v.as_ptr().wrapping_add(o).cast(), row_bytes);
        }
        // Rows that see the same keys of this tile (a GQA group's heads at
        // one position; every row of a tile below the causal diagonal) go
        // through the tile kernels together, which load each key row once
        // for up to four of them.
        let visible = |r: usize| {
            let (lo, hi) = range_of(r);
            (lo.max(t0), hi.min(t1))
        };
        let mut r = 0;
        while r < rows {
            let (j0, j1) = visible(r);
            let mut end = r + 1;
            while end < rows && end - r < PACK && visible(end) == (j0, j1) {
                end += 1;
            }
            if j0 < j1 {
                let mut qs: [&[f32]; PACK] = [&[]; PACK];
                for (i, qs) in qs[..end - r].iter_mut().enumerate() {
                    *qs = &q[q_row(r + i)..][..hd];
                }
                let tile = &offs[j0 - t0..j1 - t0];
                let s = &mut scores[r * KV_TILE..end * KV_TILE];
                simd::dot_many(&qs[..end - r], k, tile, cfg.scale, s, KV_TILE);
                if cfg.softcap > 0.0 {
                    let (c, inv) = (cfg.softcap, 1.0 / cfg.softcap);
                    for row in s.chunks_exact_mut(KV_TILE) {
                        row[..j1 - j0]
                            .iter_mut()
                            .for_each(|x| *x = c * (*x * inv).tanh());
                    }
                }
                for (i, s) in s.chunks_exact_mut(KV_TILE).enumerate() {
                    let s = &mut s[..j1 - j0];
                    let row = r + i;
                    let tile_max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let m_new = m[row].max(tile_max);
                    let tile_sum = simd::exp_sub_sum(s, m_new);
                    if m[row] != f32::NEG_INFINITY {
                        let corr = (m[row] - m_new).exp();
                        l[row] *= corr;
                        simd::scale(&mut acc[row * hd..(row + 1) * hd], corr);
                    }
                    l[row] += tile_sum;
                    m[row] = m_new;
                }
                let o = &mut acc[r * hd..end * hd];
                simd::axpy_many(o, hd, &scores[r * KV_TILE..], KV_TILE, v, tile);
            }
            r = end;
        }
        std::mem::swap(&mut offs, &mut next);
        t0 = t1;
    }

    if let Some(slot) = partial {
        // SAFETY: the slot is this task's own, `rows × (hd + 2)` floats of
        // the caller's partials, sized for every slot of the call.
        let state = &scratch[rows * KV_TILE..rows * (KV_TILE + hd + 2)];
        unsafe { std::ptr::copy_nonoverlapping(state.as_ptr(), slot.get(), state.len()) };
        return;
    }
    for r in 0..rows {
        let o = &mut acc[r * hd..(r + 1) * hd];
        let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
        simd::scale(o, inv);
        // SAFETY: q_row(r) indexes this task's own rows of `out`, which has
        // the same shape as `q` and was bounds-checked by the caller; no
        // other task writes these rows.
        unsafe { std::ptr::copy_nonoverlapping(o.as_ptr(), out.get().add(q_row(r)), hd) };
    }
}
