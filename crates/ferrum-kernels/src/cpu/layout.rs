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

thread_local! {
    /// The reordered activation of [`with_reordered`], kept per thread so a
    /// decode step allocates nothing.
    static REORDERED: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Calls `f` with `a[m, k]`'s columns in `order` (u32 bits in f32 words:
/// column `j` of the result is column `order[j]` of `a`). An order with an
/// index past `k` is an error, not a panic: orders come from checkpoints.
pub(crate) fn with_reordered<R>(
    a: &[f32],
    order: &[f32],
    m: usize,
    k: usize,
    f: impl FnOnce(&[f32]) -> ferrum_types::Result<R>,
) -> ferrum_types::Result<R> {
    if order.len() < k || a.len() < m * k {
        return Err(ferrum_types::FerrumError::invalid(format!(
            "input order of {} entries or activation of {} values too short for m = {m}, k = {k}",
            order.len(),
            a.len()
        )));
    }
    let order = &order[..k];
    if order.iter().any(|o| o.to_bits() as usize >= k) {
        return Err(ferrum_types::FerrumError::invalid(format!(
            "input order refers to a column past k = {k}"
        )));
    }
    // Taken out for the call rather than borrowed: a rayon thread waiting
    // inside `f` may steal another GEMM's task that reorders too.
    let mut buf = REORDERED.take();
    buf.resize(m * k, 0.0);
    let gather = |(dst, src): (&mut [f32], &[f32])| {
        for (d, o) in dst.iter_mut().zip(order) {
            *d = src[o.to_bits() as usize];
        }
    };
    // A prompt's rows in parallel; a decode step's few rows are not worth it.
    if m > 8 {
        use rayon::prelude::*;
        buf.par_chunks_exact_mut(k)
            .zip(a.par_chunks_exact(k))
            .for_each(gather);
    } else {
        buf.chunks_exact_mut(k)
            .zip(a.chunks_exact(k))
            .for_each(gather);
    }
    let r = f(&buf);
    REORDERED.set(buf);
    r
}

#[cfg(test)]
mod tests {
    use super::with_reordered;

    #[test]
    fn reordering_gathers_columns_and_refuses_bad_orders() {
        let a: Vec<f32> = (0..8).map(|x| x as f32).collect(); // [2, 4]
        let order = crate::backend::input_order(&[2, 0, 3, 1]);
        let got = with_reordered(&a, &order, 2, 4, |x| Ok(x.to_vec())).unwrap();
        assert_eq!(got, [2.0, 0.0, 3.0, 1.0, 6.0, 4.0, 7.0, 5.0]);
        let bad = crate::backend::input_order(&[0, 1, 2, 4]);
        assert!(with_reordered(&a, &bad, 2, 4, |_| Ok(())).is_err());
        assert!(with_reordered(&a, &order[..3], 2, 4, |_| Ok(())).is_err());
    }
}
