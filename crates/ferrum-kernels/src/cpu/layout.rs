//! Pure data movement: splits, transposes, cache appends, lookups.

use super::{rows_mut, simd::Elem};
use crate::PagedKv;

pub(crate) fn split_qkv(
    qkv: &[f32],
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
    tokens: usize,
    q_dim: usize,
    kv_dim: usize,
) {
    let row = q_dim + 2 * kv_dim;
    for t in 0..tokens {
        let src = &qkv[t * row..(t + 1) * row];
        q[t * q_dim..(t + 1) * q_dim].copy_from_slice(&src[..q_dim]);
        k[t * kv_dim..(t + 1) * kv_dim].copy_from_slice(&src[q_dim..q_dim + kv_dim]);
        v[t * kv_dim..(t + 1) * kv_dim].copy_from_slice(&src[q_dim + kv_dim..]);
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn kv_cache_append_head_major(
    cache_k: &mut [f32],
    cache_v: &mut [f32],
    cache_len: usize,
    capacity: usize,
    new_k: &[f32],
    new_v: &[f32],
    new_tokens: usize,
    nkv: usize,
    hd: usize,
) {
    assert!(
        cache_len + new_tokens <= capacity,
        "kv_cache_append_head_major: {cache_len} + {new_tokens} positions exceed capacity {capacity}"
    );
    let chunk = new_tokens * hd;
    for h in 0..nkv {
        let dst = (h * capacity + cache_len) * hd;
        cache_k[dst..dst + chunk].copy_from_slice(&new_k[h * chunk..(h + 1) * chunk]);
        cache_v[dst..dst + chunk].copy_from_slice(&new_v[h * chunk..(h + 1) * chunk]);
    }
}

/// Head-major new rows into a paged pool, one copy per token and head (a
/// decode step writes one row per head), rounded to the pool's type.
/// `rows` is `(pages, pos, new_tokens, nkv, hd)`: positions
/// `pos..pos + new_tokens` of each of `nkv` heads of `hd` values.
pub(crate) fn paged_kv_append<T: Elem>(
    k_pool: &mut [T],
    v_pool: &mut [T],
    new_k: &[f32],
    new_v: &[f32],
    (pages, pos, n, nkv, hd): (&PagedKv, usize, usize, usize, usize),
) {
    for h in 0..nkv {
        for t in 0..n {
            let dst = pages.offset(pos + t, h, nkv, hd);
            let src = (h * n + t) * hd;
            T::narrow_from(&mut k_pool[dst..dst + hd], &new_k[src..src + hd]);
            T::narrow_from(&mut v_pool[dst..dst + hd], &new_v[src..src + hd]);
        }
    }
}

pub(crate) fn transpose_head_to_token(
    src: &[f32],
    dst: &mut [f32],
    tokens: usize,
    heads: usize,
    dim: usize,
) {
    let src = &src[..tokens * heads * dim];
    rows_mut(&mut dst[..tokens * heads * dim], heads * dim, |t, row| {
        for h in 0..heads {
            row[h * dim..(h + 1) * dim]
                .copy_from_slice(&src[(h * tokens + t) * dim..(h * tokens + t + 1) * dim]);
        }
    });
}

pub(crate) fn embedding_lookup(table: &[f32], ids: &[u32], out: &mut [f32], dim: usize) {
    let rows = table.len() / dim.max(1);
    for (i, &id) in ids.iter().enumerate() {
        let id = id as usize;
        assert!(
            id < rows,
            "embedding_lookup: token id {id} outside a table of {rows} rows"
        );
        out[i * dim..(i + 1) * dim].copy_from_slice(&table[id * dim..(id + 1) * dim]);
    }
}
