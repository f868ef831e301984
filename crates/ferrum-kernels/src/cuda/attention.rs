//! Attention and the paged KV writes: each a launch over every segment
//! (sequence) of a call, reading block tables from the device
//! (`meta.rs`), so a layer's attention is a few launches whatever the
//! batch, with no copies of K/V.

use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::LaunchConfig;

use super::{device, i, launch, linear, per_row, scratch, CudaContext};
use super::{CudaBackend, CudaBuffer};
use crate::backend::{AttnConfig, AttnSegment, PagedKv, QkPrep};

/// Key splits of a decode step (flash-decoding): one per 256 keys of the
/// longest sequence, rounded up to a power of two, so that the launch
/// shape changes only at those lengths (a captured step is kept per shape,
/// see [`step_key`]).
fn decode_splits(max_kv: usize) -> usize {
    max_kv.div_ceil(256).next_power_of_two().clamp(1, 64)
}

/// The decode splits of the segments last given to the device (`meta.rs`),
/// which a step captured or replayed now will use.
static STEP_SPLITS: AtomicUsize = AtomicUsize::new(1);

pub(super) fn set_step_shape(segs: &[AttnSegment]) {
    let max_kv = segs.iter().map(|s| s.kv_len).max().unwrap_or(0);
    STEP_SPLITS.store(decode_splits(max_kv), Ordering::Relaxed);
}

/// A model's graph key with the step's attention shape folded in.
pub(super) fn step_key(key: u64) -> u64 {
    key ^ (STEP_SPLITS.load(Ordering::Relaxed) as u64) << 56
}

/// Key splits of a call, and the floats of split partials it needs.
fn plan(segs: &[AttnSegment], cfg: &AttnConfig) -> (usize, usize) {
    let (nh, hd) = (cfg.num_heads, cfg.head_dim);
    let max_q = segs.iter().map(|s| s.q_len).max().unwrap_or(1);
    let max_kv = segs.iter().map(|s| s.kv_len).max().unwrap_or(0);
    let warps: usize = segs.iter().map(|s| nh * s.q_len).sum();
    // Split the keys when there are too few queries to fill the GPU.
    let splits = match (warps < 1024, max_q) {
        (false, _) => 1,
        (true, 1) => decode_splits(max_kv),
        // Prefill: ~256 keys per split past 512 keys.
        (true, _) if max_kv > 512 => max_kv.div_ceil(256).min(64),
        (true, _) => 1,
    };
    if splits == 1 {
        return (1, 1);
    }
    // Partials are indexed by the query's row in the call; room for the
    // most splits (fewer than 1024 rows split: at most 67 MB), so that a
    // decode step growing past a split boundary finds it there.
    let rows = segs
        .iter()
        .map(|s| s.offset / hd + nh * s.q_len)
        .max()
        .unwrap_or(0);
    (splits, rows * 64 * (hd + 2))
}

/// Before a decode step is replayed or captured: its segments on the
/// device and the attention partials grown to what it needs (a capture
/// must not allocate).
pub(super) fn prepare_step(ctx: &mut CudaContext, segs: &[AttnSegment], cfg: &AttnConfig) {
    let dev = device::get();
    let r = super::lock(&dev.meta).upload(&ctx.stream, segs).map(|_| ());
    ctx.check(r, "upload of block tables");
    let (_, need) = plan(segs, cfg);
    if scratch(&dev.attn_scratch, need).is_none() {
        ctx.fail("attention scratch allocation failed".into());
    }
}

/// `attention` then, with split keys, `attention_combine` over `segs`.
pub(super) fn attend(
    ctx: &mut CudaContext,
    q: &CudaBuffer,
    k_pool: &CudaBuffer,
    v_pool: &CudaBuffer,
    segs: &[AttnSegment],
    out: &mut CudaBuffer,
    cfg: &AttnConfig,
) {
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    if hd > 256 {
        return ctx.fail(format!(
            "CUDA attention supports head_dim up to 256, got {hd}"
        ));
    }
    if segs.is_empty() || ctx.error.is_some() {
        return;
    }
    let bs = segs[0].pages.block_size;
    let max_q = segs.iter().map(|s| s.q_len).max().unwrap_or(1);
    let (splits, need) = plan(segs, cfg);
    // Keys per shared-memory tile (K and V tiles fit in 32 KiB) for
    // decode, where the block's warps are the heads of one GQA group;
    // prefill reads K/V from L2 at full occupancy instead.
    let tile = match (max_q, hd) {
        (1, 0..=128) => 32,
        (1, _) => 16,
        _ => 0,
    };
    let group = nh / nkv;
    let qblocks = (max_q * group).div_ceil(4);
    let dev = device::get();
    let mut meta = super::lock(&dev.meta);
    let r = meta.upload(&ctx.stream, segs);
    let Some(words) = ctx.check(r, "upload of block tables") else {
        return;
    };
    let (seg_words, tables) = words.split_at(5 * segs.len());
    let mut guard = scratch(&dev.attn_scratch, need);
    let Some(part) = guard.as_mut() else {
        return ctx.fail("attention scratch allocation failed".into());
    };
    let lc = LaunchConfig {
        grid_dim: ((segs.len() * nkv * qblocks) as u32, splits as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: (2 * tile * hd * 4) as u32,
    };
    launch::attention(
        ctx,
        lc,
        q,
        k_pool,
        v_pool,
        &mut *out,
        &mut *part,
        &seg_words,
        &tables,
        i(qblocks),
        i(nh),
        i(nkv),
        i(hd),
        i(bs),
        i(cfg.causal as usize),
        cfg.scale,
        i(cfg.sliding_window),
        i(tile),
        cfg.softcap,
    );
    if splits > 1 {
        let lc = LaunchConfig {
            grid_dim: ((nh * max_q).div_ceil(4) as u32, segs.len() as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        launch::attention_combine(ctx, lc, &*part, out, &seg_words, i(nh), i(splits), i(hd));
    }
}

/// Contiguous caches (`flash_attention`): batch item b is a segment whose
/// one block is b, of `stride` positions.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_contiguous(
    ctx: &mut CudaContext,
    q: &CudaBuffer,
    k: &CudaBuffer,
    v: &CudaBuffer,
    out: &mut CudaBuffer,
    batch: usize,
    q_len: usize,
    kv_len: usize,
    pos_offset: usize,
    cfg: &AttnConfig,
) {
    let stride = if cfg.kv_seq_stride == 0 {
        kv_len
    } else {
        cfg.kv_seq_stride
    };
    let blocks: Vec<u32> = (0..batch as u32).collect();
    let segs: Vec<AttnSegment> = (0..batch)
        .map(|b| AttnSegment {
            pages: PagedKv {
                block_table: &blocks[b..b + 1],
                block_size: stride.max(1),
            },
            offset: b * cfg.num_heads * q_len * cfg.head_dim,
            q_len,
            kv_len,
            pos_offset,
        })
        .collect();
    attend(ctx, q, k, v, &segs, out, cfg);
}

/// New head-major K/V rows of one sequence into its pages.
#[allow(clippy::too_many_arguments)]
pub(super) fn append(
    ctx: &mut CudaContext,
    k_pool: &mut CudaBuffer,
    v_pool: &mut CudaBuffer,
    pages: &PagedKv,
    pos: usize,
    new_k: &CudaBuffer,
    new_v: &CudaBuffer,
    n: usize,
    nkv: usize,
    hd: usize,
) {
    if n == 0 || ctx.error.is_some() {
        return;
    }
    let seg = AttnSegment {
        pages: *pages,
        offset: 0,
        q_len: n,
        kv_len: pos + n,
        pos_offset: pos,
    };
    let mut meta = super::lock(&device::get().meta);
    let r = meta.upload(&ctx.stream, &[seg]);
    let Some(words) = ctx.check(r, "upload of block tables") else {
        return;
    };
    let (seg_words, tables) = words.split_at(5);
    launch::paged_kv_append(
        ctx,
        linear(nkv * n * hd),
        k_pool,
        v_pool,
        new_k,
        new_v,
        &seg_words,
        &tables,
        i(n),
        i(nkv),
        i(hd),
        i(pages.block_size),
    );
}

/// A decode batch's Q (rotated, into `q_out`) and K/V (into the pages),
/// one launch: see `Backend::decode_rows_qkv`.
pub(super) fn rows_qkv(
    ctx: &mut CudaContext,
    [q, k, v]: [&CudaBuffer; 3],
    prep: QkPrep<'_, CudaBackend>,
    q_out: &mut CudaBuffer,
    [k_pool, v_pool]: [&mut CudaBuffer; 2],
    segs: &[AttnSegment],
    cfg: &AttnConfig,
) {
    // One mode for Q and K; they differ in their norm weight only. `q`
    // stands in for the weights of a layer without QK-norm (never read).
    let (mode, q_norm, [cos, sin], eps) = prep.q().operands(q);
    let (_, k_norm, _, _) = prep.k().operands(q);
    if segs.is_empty() || ctx.error.is_some() {
        return;
    }
    if let Some(s) = segs.iter().find(|s| s.q_len != 1) {
        return ctx.fail(format!(
            "decode_rows_qkv: one token per sequence, got {}",
            s.q_len
        ));
    }
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let mut meta = super::lock(&device::get().meta);
    let r = meta.upload(&ctx.stream, segs);
    let Some(words) = ctx.check(r, "upload of block tables") else {
        return;
    };
    let (seg_words, tables) = words.split_at(5 * segs.len());
    let threads = (hd / 2).div_ceil(32).clamp(1, 32) as u32 * 32;
    launch::rows_qkv(
        ctx,
        per_row(segs.len() * (nh + 2 * nkv), threads),
        q,
        k,
        v,
        q_norm,
        k_norm,
        cos,
        sin,
        q_out,
        k_pool,
        v_pool,
        &seg_words,
        &tables,
        i(nh),
        i(nkv),
        i(hd),
        i(segs[0].pages.block_size),
        eps,
        mode as i32,
    );
}
