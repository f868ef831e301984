//! Paged-KV ops built from other [`Backend`] ops: the default path of
//! [`Backend::paged_attention`], [`Backend::paged_kv_append`] and
//! [`Backend::decode_rows_qkv`] on
//! backends without dedicated kernels, and the reference the dedicated
//! kernels are tested against.

use crate::{AttnConfig, AttnSegment, Backend, Heads, PagedKv, QkPrep, Span};

/// Gathers keys/values `0..kv_len` into contiguous head-major buffers and
/// runs [`Backend::flash_attention`] on them.
pub fn gather_attention<B: Backend>(
    ctx: &mut B::Context,
    q: &B::Buffer,
    pools: [&B::Buffer; 2],
    pages: &PagedKv,
    out: &mut B::Buffer,
    span: Span,
    cfg: &AttnConfig,
) {
    let Span { q_len, kv_len, pos_offset } = span;
    let [k_pool, v_pool] = pools;
    let (nkv, hd, bs) = (cfg.num_kv_heads, cfg.head_dim, pages.block_size);
    let mut k = B::alloc(nkv * kv_len * hd);
    let mut v = B::alloc(nkv * kv_len * hd);
    for h in 0..nkv {
        for p0 in (0..kv_len).step_by(bs) {
            let run = bs.min(kv_len - p0) * hd;
            let src = pages.offset(p0, h, nkv, hd);
            let dst = (h * kv_len + p0) * hd;
            B::copy_slice(ctx, k_pool, src, &mut k, dst, run);
            B::copy_slice(ctx, v_pool, src, &mut v, dst, run);
        }
    }
    let cfg = AttnConfig { kv_seq_stride: kv_len, ..cfg.clone() };
    B::flash_attention(
        ctx,
        q,
        [&k, &v],
        out,
        1,
        Span { q_len, kv_len, pos_offset },
        &cfg,
    );
}

/// Writes head-major new K/V rows into their pages, one copy per run of
/// positions that share a block.
#[allow(clippy::too_many_arguments)]
pub fn copy_append<B: Backend>(
    ctx: &mut B::Context,
    k_pool: &mut B::Buffer,
    v_pool: &mut B::Buffer,
    pages: &PagedKv,
    pos: usize,
    new_k: &B::Buffer,
    new_v: &B::Buffer,
    n: usize,
    nkv: usize,
    hd: usize,
) {
    let bs = pages.block_size;
    for h in 0..nkv {
        let mut t = 0;
        while t < n {
            let p = pos + t;
            let run = (bs - p % bs).min(n - t);
            let dst = pages.offset(p, h, nkv, hd);
            let src = (h * n + t) * hd;
            B::copy_slice(ctx, new_k, src, k_pool, dst, run * hd);
            B::copy_slice(ctx, new_v, src, v_pool, dst, run * hd);
            t += run;
        }
    }
}

/// [`Backend::decode_rows_qkv`] as per-sequence `qk_norm_rope` and
/// `paged_kv_append` calls on one-token temporaries.
pub fn rows_by_parts<B: Backend>(
    ctx: &mut B::Context,
    [q, k, v]: [&B::Buffer; 3],
    prep: QkPrep<'_, B>,
    q_out: &mut B::Buffer,
    [k_pool, v_pool]: [&mut B::Buffer; 2],
    segs: &[AttnSegment],
    cfg: &AttnConfig,
) {
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let (qd, kvd) = (nh * hd, nkv * hd);
    let (mut x, mut y) = (B::alloc(qd.max(kvd)), B::alloc(qd));
    let (mut kh, mut vh) = (B::alloc(kvd), B::alloc(kvd));
    for s in segs {
        assert_eq!(s.q_len, 1, "decode_rows_qkv: one token per sequence");
        let (r, p) = (s.offset / qd, s.pos_offset);
        B::copy_slice(ctx, q, r * qd, &mut x, 0, qd);
        B::qk_norm_rope(
            ctx,
            &x,
            prep.q(),
            &mut y,
            Heads { tokens: 1, heads: nh, head_dim: hd },
            p,
        );
        B::copy_slice(ctx, &y, 0, q_out, s.offset, qd);
        B::copy_slice(ctx, k, r * kvd, &mut x, 0, kvd);
        B::qk_norm_rope(
            ctx,
            &x,
            prep.k(),
            &mut kh,
            Heads { tokens: 1, heads: nkv, head_dim: hd },
            p,
        );
        // One token's V is already head-major.
        B::copy_slice(ctx, v, r * kvd, &mut vh, 0, kvd);
        B::paged_kv_append(
            ctx,
            [k_pool, v_pool],
            &s.pages,
            p,
            [&kh, &vh],
            Heads { tokens: 1, heads: nkv, head_dim: hd },
        );
    }
}

/// The words a GPU's paged kernels read for `segs` (`Seg` in the CUDA
/// source): five per segment (its query offset, queries, keys, first
/// position, and where its block table starts among the tables), then the
/// block tables, each cut to the blocks its keys reach (callers have
/// checked that the tables reach that far). `words` is cleared
/// first (callers keep one to reuse).
pub fn encode_segments(words: &mut Vec<u32>, segs: &[AttnSegment]) {
    words.clear();
    let mut table_at = 0;
    for s in segs {
        let blocks = s.kv_len.div_ceil(s.pages.block_size.max(1));
        words.extend([s.offset, s.q_len, s.kv_len, s.pos_offset, table_at].map(|v| v as u32));
        table_at += blocks;
    }
    for s in segs {
        let blocks = s.kv_len.div_ceil(s.pages.block_size.max(1));
        let table = s.pages.block_table;
        words.extend_from_slice(&table[..blocks.min(table.len())]);
    }
}
