//! One layer's attention over a whole batch ([`Backend::attention`]), and
//! the execution strategies a backend picks from for it.
//!
//! A model hands a backend the batch's token-major Q/K/V rows, its segments
//! (one per sequence) and the layer's [`AttnConfig`]; how the rows become
//! rotated head-major queries, pool writes and attention output is the
//! backend's business. The model therefore never asks what a backend has
//! kernels for (as vLLM's attention backends and llama.cpp's `build_attn`
//! keep that choice out of the model code).

use crate::{AttnConfig, AttnSegment, Backend, Heads, QkOp, QkPrep, Span};

/// What one layer's attention reads and writes, besides the segments and
/// the scratch space.
pub struct AttnLayer<'a, B: Backend> {
    /// Token-major projections: `q` `[rows, nh·hd]`, `k` and `v` `[rows,
    /// nkv·hd]`. Segment `s` holds rows `s.offset / (nh·hd)` onward.
    pub q: &'a B::Buffer,
    pub k: &'a B::Buffer,
    pub v: &'a B::Buffer,
    /// How Q and K are normed and rotated.
    pub prep: QkPrep<'a, B>,
    pub cfg: &'a AttnConfig,
    /// The layer's paged K/V pools, which the new tokens are written into.
    pub k_pool: &'a mut B::Buffer,
    pub v_pool: &'a mut B::Buffer,
}

/// Buffers an attention strategy works in, grown to the largest batch and
/// sequence seen (so that a step allocates nothing once they have grown).
pub struct AttnScratch<B: Backend> {
    rows: usize,
    seg_rows: usize,
    /// One sequence's token-major Q/K/V rows copied out of the batch.
    seg_q: B::Buffer,
    seg_k: B::Buffer,
    seg_v: B::Buffer,
    /// The same rotated and head-major.
    seg_qh: B::Buffer,
    seg_kh: B::Buffer,
    seg_vh: B::Buffer,
    /// One sequence's head-major attention output, and it token-major.
    seg_attn: B::Buffer,
    seg_tok: B::Buffer,
    /// Every segment's head-major queries and attention output, back to
    /// back, for [`Backend::paged_attention_segments`].
    heads_q: B::Buffer,
    heads_out: B::Buffer,
}

impl<B: Backend> Default for AttnScratch<B> {
    fn default() -> Self {
        let e = || B::alloc(0);
        Self {
            rows: 0,
            seg_rows: 0,
            seg_q: e(),
            seg_k: e(),
            seg_v: e(),
            seg_qh: e(),
            seg_kh: e(),
            seg_vh: e(),
            seg_attn: e(),
            seg_tok: e(),
            heads_q: e(),
            heads_out: e(),
        }
    }
}

impl<B: Backend> AttnScratch<B> {
    /// Grows the buffers for batches of `rows` tokens with at most
    /// `seg_rows` in one sequence, of `q_dim` query and `kv_dim` key
    /// values per token. Says whether any buffer was replaced (a captured
    /// step holds the old addresses).
    pub fn ensure(&mut self, rows: usize, seg_rows: usize, q_dim: usize, kv_dim: usize) -> bool {
        let mut replaced = false;
        if rows > self.rows {
            self.heads_q = B::alloc(rows * q_dim);
            self.heads_out = B::alloc(rows * q_dim);
            self.rows = rows;
            replaced = true;
        }
        if seg_rows > self.seg_rows {
            self.seg_q = B::alloc(seg_rows * q_dim);
            self.seg_k = B::alloc(seg_rows * kv_dim);
            self.seg_v = B::alloc(seg_rows * kv_dim);
            self.seg_qh = B::alloc(seg_rows * q_dim);
            self.seg_kh = B::alloc(seg_rows * kv_dim);
            self.seg_vh = B::alloc(seg_rows * kv_dim);
            self.seg_attn = B::alloc(seg_rows * q_dim);
            self.seg_tok = B::alloc(seg_rows * q_dim);
            self.seg_rows = seg_rows;
            replaced = true;
        }
        replaced
    }
}

/// How a backend runs [`Backend::attention`]: which of its ops have kernels
/// of their own, and how many sequences one call of them takes.
#[derive(Clone, Copy, Debug)]
pub struct AttnPlan {
    /// Decode batches (one token per sequence) go through
    /// [`Backend::decode_rows_qkv`] and [`Backend::paged_attention_segments`],
    /// `rows_chunk` sequences a call: one token's head-major rows are its
    /// token-major row, so nothing is copied in or out.
    pub decode_rows: bool,
    /// The same for a lone decoding sequence (a backend that captures
    /// steps: its row ops read positions and tables from device memory).
    pub rows_alone: bool,
    pub rows_chunk: usize,
    /// Other batches of several sequences: rows rotated per sequence, then
    /// attention in [`Backend::paged_attention_segments`] calls of
    /// `seg_chunk` sequences. Otherwise [`Backend::paged_attention`] per
    /// sequence.
    pub segmented: bool,
    pub seg_chunk: usize,
}

impl AttnPlan {
    /// Every sequence on its own, through ops any backend has (the
    /// [`Backend::attention`] default).
    pub const PER_SEQUENCE: Self = Self {
        decode_rows: false,
        rows_alone: false,
        rows_chunk: 1,
        segmented: false,
        seg_chunk: 1,
    };
}

/// Runs one layer's attention for `segs` (their queries and output at
/// `s.offset` in `a.q` and `out`, token-major) the way `plan` says.
pub fn run<B: Backend>(
    ctx: &mut B::Context,
    a: AttnLayer<'_, B>,
    segs: &[AttnSegment],
    s: &mut AttnScratch<B>,
    out: &mut B::Buffer,
    plan: AttnPlan,
) {
    let decode = segs.iter().all(|s| s.q_len == 1);
    if plan.decode_rows && decode && (segs.len() > 1 || plan.rows_alone) {
        for part in segs.chunks(plan.rows_chunk.max(1)) {
            B::decode_rows_qkv(
                ctx,
                [a.q, a.k, a.v],
                a.prep,
                &mut s.heads_q,
                [a.k_pool, a.v_pool],
                part,
                a.cfg,
            );
            B::paged_attention_segments(ctx, &s.heads_q, [a.k_pool, a.v_pool], part, out, a.cfg);
        }
        return;
    }
    per_sequence(ctx, a, segs, s, out, plan);
}

/// Rotates and appends each sequence's rows on its own, then attends per
/// sequence or, with `plan.segmented`, per chunk of sequences.
fn per_sequence<B: Backend>(
    ctx: &mut B::Context,
    a: AttnLayer<'_, B>,
    segs: &[AttnSegment],
    s: &mut AttnScratch<B>,
    out: &mut B::Buffer,
    plan: AttnPlan,
) {
    let cfg = a.cfg;
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let (qd, kvd) = (nh * hd, nkv * hd);
    let batched = plan.segmented && segs.len() > 1;
    // A lone segment is the whole batch: its rows are read and written in
    // place rather than copied out and back.
    let direct = segs.len() == 1;
    let mut first = 0;
    for (i, seg) in segs.iter().enumerate() {
        let (n, p) = (seg.q_len, seg.pos_offset);
        let r0 = seg.offset / qd.max(1);
        if !direct {
            B::copy_slice(ctx, a.q, r0 * qd, &mut s.seg_q, 0, n * qd);
            B::copy_slice(ctx, a.k, r0 * kvd, &mut s.seg_k, 0, n * kvd);
            B::copy_slice(ctx, a.v, r0 * kvd, &mut s.seg_v, 0, n * kvd);
        }
        let (q_in, k_in, v_in) = if direct {
            (a.q, a.k, a.v)
        } else {
            (&s.seg_q, &s.seg_k, &s.seg_v)
        };
        let kv_heads = Heads { tokens: n, heads: nkv, head_dim: hd };
        let q_heads = Heads { tokens: n, heads: nh, head_dim: hd };
        B::qk_norm_rope(ctx, q_in, a.prep.q(), &mut s.seg_qh, q_heads, p);
        B::qk_norm_rope(ctx, k_in, a.prep.k(), &mut s.seg_kh, kv_heads, p);
        B::qk_norm_rope(ctx, v_in, QkOp::Transpose, &mut s.seg_vh, kv_heads, p);
        let (kp, vp) = (&mut *a.k_pool, &mut *a.v_pool);
        B::paged_kv_append(
            ctx,
            [kp, vp],
            &seg.pages,
            p,
            [&s.seg_kh, &s.seg_vh],
            Heads { tokens: n, heads: nkv, head_dim: hd },
        );
        if batched {
            B::copy_slice(ctx, &s.seg_qh, 0, &mut s.heads_q, seg.offset, n * qd);
            if i + 1 - first == plan.seg_chunk.max(1) || i + 1 == segs.len() {
                let part = &segs[first..=i];
                B::paged_attention_segments(ctx, &s.heads_q, [kp, vp], part, &mut s.heads_out, cfg);
                first = i + 1;
            }
            continue;
        }
        let (q_h, kv_len) = (&s.seg_qh, seg.kv_len);
        B::paged_attention(
            ctx,
            q_h,
            [kp, vp],
            &seg.pages,
            &mut s.seg_attn,
            Span { q_len: n, kv_len, pos_offset: p },
            cfg,
        );
        if direct {
            B::transpose_head_to_token(
                ctx,
                &s.seg_attn,
                out,
                Heads { tokens: n, heads: nh, head_dim: hd },
            );
        } else {
            B::transpose_head_to_token(
                ctx,
                &s.seg_attn,
                &mut s.seg_tok,
                Heads { tokens: n, heads: nh, head_dim: hd },
            );
            B::copy_slice(ctx, &s.seg_tok, 0, out, seg.offset, n * qd);
        }
    }
    if batched {
        // Head-major back to token-major rows; one query's heads already
        // are its row.
        for seg in segs {
            let (n, at) = (seg.q_len, seg.offset);
            if n == 1 {
                B::copy_slice(ctx, &s.heads_out, at, out, at, qd);
            } else {
                B::copy_slice(ctx, &s.heads_out, at, &mut s.seg_attn, 0, n * qd);
                B::transpose_head_to_token(
                    ctx,
                    &s.seg_attn,
                    &mut s.seg_tok,
                    Heads { tokens: n, heads: nh, head_dim: hd },
                );
                B::copy_slice(ctx, &s.seg_tok, 0, out, at, n * qd);
            }
        }
    }
}
