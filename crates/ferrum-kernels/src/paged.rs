//! Paged-KV ops built from other [`Backend`] ops: the default path of
//! [`Backend::paged_attention`] and [`Backend::paged_kv_append`] on
//! backends without dedicated kernels, and the reference the dedicated
//! kernels are tested against.

use crate::{AttnConfig, Backend, PagedKv};

/// Gathers keys/values `0..kv_len` into contiguous head-major buffers and
/// runs [`Backend::flash_attention`] on them.
#[allow(clippy::too_many_arguments)]
pub fn gather_attention<B: Backend>(
    ctx: &mut B::Context,
    q: &B::Buffer,
    k_pool: &B::Buffer,
    v_pool: &B::Buffer,
    pages: &PagedKv,
    out: &mut B::Buffer,
    q_len: usize,
    kv_len: usize,
    pos_offset: usize,
    cfg: &AttnConfig,
) {
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
    let cfg = AttnConfig {
        kv_seq_stride: kv_len,
        ..cfg.clone()
    };
    B::flash_attention(ctx, q, &k, &v, out, 1, q_len, kv_len, pos_offset, &cfg);
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
