//! Every CPU op against a plain f64 reference written here, on random inputs.
//!
//! Tolerances come from error bounds, not from observed output:
//! - sums of `k` products in f32 are within `k · u · Σ|aᵢbᵢ|` of the exact
//!   value (u = 2⁻²⁴, the worst-case bound for recursive summation), which
//!   catches any indexing mistake (those give errors of order Σ|aᵢbᵢ|);
//! - attention outputs are convex combinations of V rows: with dot products
//!   and `exp` each accurate to ~1e-6 relative, the output is within 1e-5 of
//!   the reference relative to max|V|;
//! - element-wise ops on O(1) values are within a few ulp (≤ 1e-6 relative).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use ferrum_kernels::{
    copy_append, gather_attention, rows_by_parts, AttnConfig, AttnSegment, Backend, CpuBackend,
    Gemm, Heads, KvCache, KvDtype, Mat, PagedKv, QkMode, QkNorm, QkOp, QkPrep, QuantKind,
    QuantWeights, ReduceOp, SeedOps, Span,
};
use half::f16;
use proptest::prelude::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

type B = CpuBackend;

const U: f64 = 1.0 / (1u64 << 24) as f64;

fn rand_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn buf(v: &[f32]) -> <B as Backend>::Buffer {
    B::from_slice(v)
}

/// Asserts `|got - want| <= tol_i` element-wise with a useful message.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for i in 0..got.len() {
        let err = (got[i] as f64 - want[i]).abs();
        assert!(
            err <= tol(i),
            "{what}[{i}]: got {} want {} (err {err:e} > tol {:e})",
            got[i],
            want[i],
            tol(i)
        );
    }
}

// ── GEMM ────────────────────────────────────────────────────────────────────

fn check_gemm(m: usize, n: usize, k: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let a = rand_vec(&mut rng, m * k);
    let b = rand_vec(&mut rng, n * k);
    let mut want = vec![0f64; m * n];
    let mut bound = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                let p = a[i * k + kk] as f64 * b[j * k + kk] as f64;
                want[i * n + j] += p;
                bound[i * n + j] += p.abs();
            }
        }
    }
    // Poison the output: every element must be written.
    let mut out = B::from_slice(&vec![f32::NAN; m * n]);
    B::gemm(&mut (), &buf(&a), &buf(&b), &mut out, Gemm { m, n, k });
    assert_close(
        &format!("gemm {m}x{n}x{k}"),
        &B::to_vec(&out, m * n),
        &want,
        |i| (k as f64 + 2.0) * U * bound[i] + 1e-30,
    );
}

#[test]
fn gemm_llm_shapes() {
    // Decode (m = 1), small batch (m = 4, 8), prefill-like (m = 16, 33, 64),
    // with k and n both odd and multiples of the SIMD width.
    for (i, &(m, n, k)) in [
        (1, 896, 896),
        (1, 37, 129),
        (3, 64, 200),
        (4, 130, 96),
        (8, 256, 576),
        (9, 31, 17),
        (16, 200, 896),
        (33, 77, 1),
        (64, 96, 300),
    ]
    .iter()
    .enumerate()
    {
        check_gemm(m, n, k, i as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn gemm_random_shapes(m in 1usize..40, n in 1usize..70, k in 1usize..150, seed in 0u64..1000) {
        check_gemm(m, n, k, seed);
    }
}

// ── Attention ───────────────────────────────────────────────────────────────

#[allow(clippy::too_many_arguments)]
fn ref_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    batch: usize,
    q_len: usize,
    kv_len: usize,
    pos_offset: usize,
    cfg: &AttnConfig,
) -> Vec<f64> {
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let stride = if cfg.kv_seq_stride == 0 {
        kv_len
    } else {
        cfg.kv_seq_stride
    };
    let mut out = vec![0f64; batch * nh * q_len * hd];
    for b in 0..batch {
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            for i in 0..q_len {
                let p = pos_offset + i;
                let visible = |j: usize| {
                    (!cfg.causal || j <= p)
                        && (cfg.sliding_window == 0 || p < j + cfg.sliding_window)
                };
                let qrow = &q[((b * nh + h) * q_len + i) * hd..][..hd];
                let mut scores = vec![f64::NEG_INFINITY; kv_len];
                for (j, s) in scores.iter_mut().enumerate().filter(|(j, _)| visible(*j)) {
                    let krow = &k[((b * nkv + kvh) * stride + j) * hd..][..hd];
                    *s = cfg.scale as f64
                        * qrow
                            .iter()
                            .zip(krow)
                            .map(|(&x, &y)| x as f64 * y as f64)
                            .sum::<f64>();
                    if cfg.softcap > 0.0 {
                        let c = cfg.softcap as f64;
                        *s = c * (*s / c).tanh();
                    }
                }
                let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if mx == f64::NEG_INFINITY {
                    continue;
                }
                let w: Vec<f64> = scores.iter().map(|&s| (s - mx).exp()).collect();
                let z: f64 = w.iter().sum();
                let o = &mut out[((b * nh + h) * q_len + i) * hd..][..hd];
                for (j, &wj) in w.iter().enumerate().filter(|(_, &wj)| wj > 0.0) {
                    let vrow = &v[((b * nkv + kvh) * stride + j) * hd..][..hd];
                    for d in 0..hd {
                        o[d] += wj / z * vrow[d] as f64;
                    }
                }
            }
        }
    }
    out
}

/// Attention against the f64 reference; `softcap` > 0 soft-caps the
/// scores as Gemma 2 does.
#[allow(clippy::too_many_arguments)]
fn check_attention(
    batch: usize,
    nkv: usize,
    group: usize,
    hd: usize,
    q_len: usize,
    kv_len: usize,
    pos_offset: usize,
    extra_stride: usize,
    causal: bool,
    window: usize,
    softcap: f32,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let nh = nkv * group;
    let stride = kv_len + extra_stride;
    let cfg = AttnConfig {
        causal,
        kv_seq_stride: if extra_stride == 0 { 0 } else { stride },
        softcap,
        ..causal_cfg(nkv, group, hd, window)
    };
    // Scores of O(3) so the softmax is neither flat nor one-hot.
    let q: Vec<f32> = rand_vec(&mut rng, batch * nh * q_len * hd)
        .iter()
        .map(|x| x * 3.0)
        .collect();
    let k = rand_vec(&mut rng, batch * nkv * stride * hd);
    let v = rand_vec(&mut rng, batch * nkv * stride * hd);
    let want = ref_attention(&q, &k, &v, batch, q_len, kv_len, pos_offset, &cfg);
    let n = batch * nh * q_len * hd;
    let mut out = B::from_slice(&vec![f32::NAN; n]);
    B::flash_attention(
        &mut (),
        &buf(&q),
        [&buf(&k), &buf(&v)],
        &mut out,
        batch,
        Span { q_len, kv_len, pos_offset },
        &cfg,
    );
    let vmax = v.iter().fold(0f32, |a, &x| a.max(x.abs())) as f64;
    assert_close(
        &format!("attention b{batch} kv{nkv}x{group} hd{hd} q{q_len} kv{kv_len} off{pos_offset} causal{causal} w{window}"),
        &B::to_vec(&out, n),
        &want,
        |_| 1e-5 * vmax,
    );
}

#[test]
fn attention_gqa_ratios_and_masks() {
    let mut seed = 0;
    for group in [1, 2, 4, 8] {
        for &(q_len, kv_len, pos_offset) in &[
            (1, 1, 0),
            (1, 130, 129),
            (7, 7, 0),
            (5, 70, 65),
            (33, 100, 67),
        ] {
            for causal in [true, false] {
                for window in [0, 1, 16] {
                    for extra_stride in [0, 5] {
                        seed += 1;
                        check_attention(
                            1,
                            2,
                            group,
                            32,
                            q_len,
                            kv_len,
                            pos_offset,
                            extra_stride,
                            causal,
                            window,
                            0.0,
                            seed,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn attention_batched_long_context() {
    // Two sequences, head_dim 64 and 128, long prefill and decode over a
    // padded cache (kv_seq_stride > kv_len).
    check_attention(2, 3, 3, 64, 130, 300, 170, 20, true, 0, 0.0, 7);
    check_attention(2, 2, 4, 128, 1, 1000, 999, 24, true, 0, 0.0, 8);
    check_attention(1, 1, 2, 80, 64, 64, 0, 0, true, 48, 0.0, 9);
    // Soft-capped scores (Gemma 2): scores of O(3) capped at 2 and 0.5.
    check_attention(1, 2, 2, 32, 20, 40, 20, 0, true, 8, 2.0, 12);
    check_attention(2, 1, 4, 64, 1, 300, 299, 3, true, 0, 0.5, 13);
    // Single queries whose keys are split over tasks and merged: one KV
    // head, over a window that starts off a tile boundary, and unwindowed
    // at the most chunks.
    check_attention(2, 1, 4, 64, 1, 2000, 1999, 8, true, 700, 0.0, 10);
    check_attention(1, 2, 2, 32, 1, 5000, 4999, 0, true, 0, 0.0, 11);
}

#[test]
fn attention_window_of_one_copies_own_value() {
    // Independent of the softmax: with a window of 1 each query sees only
    // its own position, so the output is exactly that position's V row.
    let mut rng = StdRng::seed_from_u64(10);
    let (nkv, group, hd, q_len, pos) = (2, 2, 16, 4, 6);
    let kv_len = pos + q_len;
    let cfg = AttnConfig {
        num_heads: nkv * group,
        num_kv_heads: nkv,
        head_dim: hd,
        causal: true,
        scale: 0.5,
        kv_seq_stride: 0,
        sliding_window: 1,
        softcap: 0.0,
    };
    let q = rand_vec(&mut rng, nkv * group * q_len * hd);
    let k = rand_vec(&mut rng, nkv * kv_len * hd);
    let v = rand_vec(&mut rng, nkv * kv_len * hd);
    let mut out = B::alloc(q.len());
    B::flash_attention(
        &mut (),
        &buf(&q),
        [&buf(&k), &buf(&v)],
        &mut out,
        1,
        Span { q_len, kv_len, pos_offset: pos },
        &cfg,
    );
    for h in 0..nkv * group {
        for i in 0..q_len {
            let got = &out[(h * q_len + i) * hd..][..hd];
            let want = &v[((h / group) * kv_len + pos + i) * hd..][..hd];
            for d in 0..hd {
                assert!((got[d] - want[d]).abs() <= 1e-6, "head {h} query {i}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn attention_random_shapes(
        batch in 1usize..3,
        nkv in 1usize..4,
        group in prop::sample::select(vec![1usize, 2, 4, 8]),
        hd in prop::sample::select(vec![8usize, 16, 24, 64, 72]),
        q_len in 1usize..40,
        past in 0usize..90,
        extra in 0usize..9,
        causal in any::<bool>(),
        window in prop::sample::select(vec![0usize, 1, 3, 32]),
        seed in 0u64..1000,
    ) {
        check_attention(batch, nkv, group, hd, q_len, past + q_len, past, extra, causal, window, 0.0, seed);
    }
}

/// Causal attention of `nkv · group` query heads on `nkv` KV heads, scaled
/// by `1/√hd`, contiguous K/V.
fn causal_cfg(nkv: usize, group: usize, hd: usize, window: usize) -> AttnConfig {
    AttnConfig {
        num_heads: nkv * group,
        num_kv_heads: nkv,
        head_dim: hd,
        causal: true,
        scale: 1.0 / (hd as f32).sqrt(),
        kv_seq_stride: 0,
        sliding_window: window,
        softcap: 0.0,
    }
}

/// Block ids `0..n` in a random order (a Fisher-Yates shuffle).
fn shuffled_ids(n: usize, rng: &mut StdRng) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..n as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.random_range(0..=i));
    }
    ids
}

/// `x` rounded to f16 and back: what an f16 KV pool holds.
fn to_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

/// Paged attention: K/V appended in uneven chunks into a shuffled block
/// table of `dtype` pools, then attended over; the CPU kernels and the
/// generic gather/copy path (what GPU backends run) must agree with the
/// reference on the values the pools hold (f16 pools: K/V rounded to f16,
/// so the tolerance is the f32 one).
#[allow(clippy::too_many_arguments)]
fn check_paged_attention(
    dtype: KvDtype,
    nkv: usize,
    group: usize,
    hd: usize,
    bs: usize,
    kv_len: usize,
    q_len: usize,
    window: usize,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let nh = nkv * group;
    let cfg = causal_cfg(nkv, group, hd, window);
    let k = rand_vec(&mut rng, nkv * kv_len * hd);
    let v = rand_vec(&mut rng, nkv * kv_len * hd);
    let q: Vec<f32> = rand_vec(&mut rng, nh * q_len * hd)
        .iter()
        .map(|x| x * 3.0)
        .collect();
    // More blocks than needed, handed out in a scrambled order.
    let nblocks = kv_len.div_ceil(bs) + 3;
    let table = shuffled_ids(nblocks, &mut rng);
    let pages = PagedKv { block_table: &table, block_size: bs };
    let pool = nblocks * pages.block_len(nkv, hd);
    let (mut kp, mut vp) = (B::alloc_kv(pool, dtype), B::alloc_kv(pool, dtype));
    let (mut kg, mut vg) = (B::alloc_kv(pool, dtype), B::alloc_kv(pool, dtype));
    let mut pos = 0;
    while pos < kv_len {
        let n = rng.random_range(1..=2 * bs).min(kv_len - pos);
        // Head-major chunk of positions pos..pos + n.
        let chunk = |x: &[f32]| -> Vec<f32> {
            (0..nkv)
                .flat_map(|h| x[(h * kv_len + pos) * hd..(h * kv_len + pos + n) * hd].to_vec())
                .collect()
        };
        let (kc, vc) = (buf(&chunk(&k)), buf(&chunk(&v)));
        B::paged_kv_append(
            &mut (),
            [&mut kp, &mut vp],
            &pages,
            pos,
            [&kc, &vc],
            Heads { tokens: n, heads: nkv, head_dim: hd },
        );
        copy_append::<B>(&mut (), &mut kg, &mut vg, &pages, pos, &kc, &vc, n, nkv, hd);
        pos += n;
    }
    assert_eq!(&kp[..], &kg[..], "paged_kv_append vs copy_append (K)");
    assert_eq!(&vp[..], &vg[..], "paged_kv_append vs copy_append (V)");
    let (k, v) = match dtype {
        KvDtype::F32 => (k, v),
        KvDtype::F16 => (to_f16(&k), to_f16(&v)),
    };
    // What the pool holds, read back through copy_slice (which widens).
    for h in 0..nkv {
        for p in 0..kv_len {
            let mut row = B::alloc(hd);
            B::copy_slice(&mut (), &kp, pages.offset(p, h, nkv, hd), &mut row, 0, hd);
            let want = &k[(h * kv_len + p) * hd..][..hd];
            assert_eq!(&row[..], want, "{dtype} pool row {p} of head {h}");
        }
    }
    let off = kv_len - q_len;
    let want = ref_attention(&q, &k, &v, 1, q_len, kv_len, off, &cfg);
    let n = nh * q_len * hd;
    let vmax = v.iter().fold(0f32, |a, &x| a.max(x.abs())) as f64;
    let mut out = B::from_slice(&vec![f32::NAN; n]);
    B::paged_attention(
        &mut (),
        &buf(&q),
        [&kp, &vp],
        &pages,
        &mut out,
        Span { q_len, kv_len, pos_offset: off },
        &cfg,
    );
    let what = format!(
        "{dtype} paged attention kv{nkv}x{group} hd{hd} bs{bs} kv{kv_len} q{q_len} w{window}"
    );
    assert_close(&what, &B::to_vec(&out, n), &want, |_| 1e-5 * vmax);
    let mut out = B::from_slice(&vec![f32::NAN; n]);
    gather_attention::<B>(
        &mut (),
        &buf(&q),
        [&kp, &vp],
        &pages,
        &mut out,
        Span { q_len, kv_len, pos_offset: off },
        &cfg,
    );
    assert_close(
        &format!("gathered {what}"),
        &B::to_vec(&out, n),
        &want,
        |_| 1e-5 * vmax,
    );
}

#[test]
fn paged_attention_matches_contiguous_reference() {
    let mut seed = 100;
    for &(nkv, group, hd) in &[(1, 1, 16), (2, 3, 32), (4, 2, 64)] {
        for &(bs, kv_len, q_len) in &[
            (16, 1, 1),
            (16, 17, 1),
            (16, 100, 37),
            (4, 70, 70),
            (1, 9, 3),
        ] {
            for window in [0, 5] {
                for dtype in [KvDtype::F32, KvDtype::F16] {
                    seed += 1;
                    check_paged_attention(dtype, nkv, group, hd, bs, kv_len, q_len, window, seed);
                }
            }
        }
    }
    // Decode steps at long context, split into key chunks.
    for (kv_len, window) in [(513, 0), (3000, 0), (3000, 700), (4200, 1)] {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            seed += 1;
            check_paged_attention(dtype, 1, 3, 64, 16, kv_len, 1, window, seed);
        }
    }
}

/// Several sequences in one `paged_attention_segments` call (their own
/// scrambled blocks of one pool, mixed query lengths, one of them empty)
/// give exactly what one `paged_attention` call per sequence gives, which
/// the test above checks against the reference.
#[test]
fn segmented_paged_attention_equals_one_call_per_sequence() {
    check_segmented(KvDtype::F32);
    check_segmented(KvDtype::F16);
}

fn check_segmented(dtype: KvDtype) {
    let mut rng = StdRng::seed_from_u64(77);
    let (nkv, group, hd, bs): (usize, usize, usize, usize) = (3, 2, 32, 4);
    let nh = nkv * group;
    let cfg = causal_cfg(nkv, group, hd, 0);
    // (q_len, kv_len) per sequence.
    let seqs: [(usize, usize); 6] = [(1, 9), (5, 20), (0, 3), (1, 1), (1, 900), (3, 3)];
    let nblocks: usize = seqs.iter().map(|&(_, kv)| kv.div_ceil(bs)).sum();
    let mut ids = shuffled_ids(nblocks, &mut rng);
    let mut tables = Vec::new();
    for &(_, kv) in &seqs {
        let rest = ids.split_off(kv.div_ceil(bs));
        tables.push(std::mem::replace(&mut ids, rest));
    }
    let block_len = nkv * bs * hd;
    let pool = |rng: &mut StdRng| {
        let mut p = B::alloc_kv(nblocks * block_len, dtype);
        let x = buf(&rand_vec(rng, nblocks * block_len));
        B::copy_slice(&mut (), &x, 0, &mut p, 0, x.len());
        p
    };
    let (kp, vp) = (pool(&mut rng), pool(&mut rng));
    let rows: usize = seqs.iter().map(|&(q, _)| q).sum();
    let q = rand_vec(&mut rng, rows * nh * hd);
    let mut segs = Vec::new();
    let mut want = Vec::new();
    let mut offset = 0;
    for (&(q_len, kv_len), table) in seqs.iter().zip(&tables) {
        let pages = PagedKv { block_table: table, block_size: bs };
        let n = nh * q_len * hd;
        let mut out = B::from_slice(&vec![f32::NAN; n]);
        let qs = buf(&q[offset..offset + n]);
        let pos = kv_len - q_len;
        B::paged_attention(
            &mut (),
            &qs,
            [&kp, &vp],
            &pages,
            &mut out,
            Span { q_len, kv_len, pos_offset: pos },
            &cfg,
        );
        want.extend_from_slice(&B::to_vec(&out, n));
        segs.push(AttnSegment {
            pages,
            offset,
            q_len,
            kv_len,
            pos_offset: pos,
        });
        offset += n;
    }
    let mut out = B::from_slice(&vec![f32::NAN; offset]);
    B::paged_attention_segments(&mut (), &buf(&q), [&kp, &vp], &segs, &mut out, &cfg);
    assert_eq!(B::to_vec(&out, offset), want, "{dtype}");
}

// ── Norms ───────────────────────────────────────────────────────────────────

fn ref_rms(x: &[f32], w: &[f32], eps: f32, dim: usize) -> Vec<f64> {
    x.chunks(dim)
        .flat_map(|r| {
            let ms = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            r.iter()
                .zip(w)
                .map(move |(&v, &g)| v as f64 * inv * g as f64)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rms_norm_and_fused_add() {
    let mut rng = StdRng::seed_from_u64(20);
    // Small rows (inline) and a large batch (parallel path).
    for &(tokens, dim) in &[(1, 7), (3, 576), (64, 896), (40, 1003)] {
        let x = rand_vec(&mut rng, tokens * dim);
        let r0 = rand_vec(&mut rng, tokens * dim);
        let w = rand_vec(&mut rng, dim);
        let tol = |want: &[f64]| {
            let want = want.to_vec();
            move |i: usize| 1e-6 * (1.0 + want[i].abs())
        };

        let want = ref_rms(&x, &w, 1e-5, dim);
        let mut out = B::from_slice(&vec![f32::NAN; tokens * dim]);
        B::rms_norm(
            &mut (),
            &buf(&x),
            &buf(&w),
            1e-5,
            &mut out,
            Mat { rows: tokens, cols: dim },
        );
        assert_close("rms_norm", &out, &want, tol(&want));

        let sum: Vec<f32> = x.iter().zip(&r0).map(|(a, b)| a + b).collect();
        let want = ref_rms(&sum, &w, 1e-6, dim);
        let mut residual = buf(&r0);
        let mut out = B::from_slice(&vec![f32::NAN; tokens * dim]);
        B::fused_add_rms_norm(
            &mut (),
            &mut residual,
            &buf(&x),
            &buf(&w),
            1e-6,
            &mut out,
            Mat { rows: tokens, cols: dim },
        );
        assert_eq!(&residual[..], &sum[..], "fused_add_rms_norm residual");
        assert_close("fused_add_rms_norm", &out, &want, tol(&want));
    }
}

#[test]
fn layer_norm_matches_reference() {
    let mut rng = StdRng::seed_from_u64(21);
    for &(tokens, dim) in &[(1, 5), (4, 384), (50, 768)] {
        // An offset mean checks the variance is computed around the mean.
        let x: Vec<f32> = rand_vec(&mut rng, tokens * dim)
            .iter()
            .map(|v| v + 4.0)
            .collect();
        let g = rand_vec(&mut rng, dim);
        let bta = rand_vec(&mut rng, dim);
        let want: Vec<f64> = x
            .chunks(dim)
            .flat_map(|r| {
                let mean = r.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
                let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
                let inv = 1.0 / (var + 1e-12).sqrt();
                r.iter()
                    .enumerate()
                    .map(|(c, &v)| (v as f64 - mean) * inv * g[c] as f64 + bta[c] as f64)
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut out = B::from_slice(&vec![f32::NAN; tokens * dim]);
        B::layer_norm(
            &mut (),
            &buf(&x),
            &buf(&g),
            &buf(&bta),
            1e-12,
            &mut out,
            Mat { rows: tokens, cols: dim },
        );
        assert_close("layer_norm", &out, &want, |i| 2e-6 * (1.0 + want[i].abs()));
    }
}

// ── RoPE / layout ───────────────────────────────────────────────────────────

fn rope_tables(max_pos: usize, hd: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let half = hd / 2;
    let mut cos = vec![0f32; max_pos * half];
    let mut sin = vec![0f32; max_pos * half];
    for p in 0..max_pos {
        for i in 0..half {
            let ang = p as f64 * theta.powf(-((2 * i) as f64) / hd as f64);
            cos[p * half + i] = ang.cos() as f32;
            sin[p * half + i] = ang.sin() as f32;
        }
    }
    (cos, sin)
}

#[test]
fn qk_norm_rope_all_modes() {
    let mut rng = StdRng::seed_from_u64(30);
    for &(tokens, heads, hd, pos_offset) in &[
        (1, 3, 8, 17),
        (5, 9, 64, 0),
        (40, 14, 64, 100),
        (3, 2, 128, 7),
    ] {
        let (cos, sin) = rope_tables(pos_offset + tokens + 3, hd, 10000.0);
        let x = rand_vec(&mut rng, tokens * heads * hd);
        let nw = rand_vec(&mut rng, hd);
        let half = hd / 2;
        for mode in [QkMode::Transpose, QkMode::NormRope, QkMode::Rope] {
            let mut want = vec![0f64; tokens * heads * hd];
            for t in 0..tokens {
                for h in 0..heads {
                    let src = &x[(t * heads + h) * hd..][..hd];
                    let mut r: Vec<f64> = src.iter().map(|&v| v as f64).collect();
                    if mode == QkMode::NormRope {
                        let ms = r.iter().map(|v| v * v).sum::<f64>() / hd as f64;
                        let inv = 1.0 / (ms + 1e-6).sqrt();
                        for (d, v) in r.iter_mut().enumerate() {
                            *v *= inv * nw[d] as f64;
                        }
                    }
                    if mode != QkMode::Transpose {
                        let p = pos_offset + t;
                        let rot: Vec<f64> = (0..hd)
                            .map(|d| {
                                let (i, c, s) = (
                                    d % half,
                                    cos[p * half + d % half] as f64,
                                    sin[p * half + d % half] as f64,
                                );
                                if d < half {
                                    r[i] * c - r[i + half] * s
                                } else {
                                    r[i + half] * c + r[i] * s
                                }
                            })
                            .collect();
                        r = rot;
                    }
                    want[(h * tokens + t) * hd..][..hd].copy_from_slice(&r);
                }
            }
            let mut out = B::from_slice(&vec![f32::NAN; x.len()]);
            let (weight, cos, sin) = (&buf(&nw), &buf(&cos), &buf(&sin));
            let op = match mode {
                QkMode::Transpose => QkOp::Transpose,
                QkMode::Rope => QkOp::Rope { cos, sin },
                QkMode::NormRope => QkOp::NormRope { weight, eps: 1e-6, cos, sin },
            };
            let shape = Heads { tokens, heads, head_dim: hd };
            B::qk_norm_rope(&mut (), &buf(&x), op, &mut out, shape, pos_offset);
            assert_close(&format!("qk_norm_rope {mode:?}"), &out, &want, |i| {
                2e-6 * (1.0 + want[i].abs())
            });
        }
    }
}

/// The CPU's one-call decode-batch preparation writes the same bits as
/// the per-sequence ops it replaces (`rows_by_parts`, the default), into
/// pools of either type: each segment's row found from its offset (given
/// out of order here), its position's RoPE row and its own pages, and
/// nothing else touched.
#[test]
fn decode_rows_qkv_equals_per_sequence_ops() {
    let mut rng = StdRng::seed_from_u64(31);
    for &(nkv, group, hd, bs) in &[(2, 3, 32, 4), (3, 3, 64, 16), (1, 4, 256, 1)] {
        let cfg = causal_cfg(nkv, group, hd, 0);
        let (qd, kvd) = (nkv * group * hd, nkv * hd);
        let rows = 5;
        let positions: Vec<usize> = (0..rows).map(|_| rng.random_range(0..40)).collect();
        let per_seq = 40usize.div_ceil(bs);
        let ids = shuffled_ids(rows * per_seq + 2, &mut rng);
        let tables: Vec<&[u32]> = ids.chunks_exact(per_seq).take(rows).collect();
        let (cos, sin) = rope_tables(41, hd, 10000.0);
        let (q, k, v) = (
            rand_vec(&mut rng, rows * qd),
            rand_vec(&mut rng, rows * kvd),
            rand_vec(&mut rng, rows * kvd),
        );
        let norms = (rand_vec(&mut rng, hd), rand_vec(&mut rng, hd));
        let segs: Vec<AttnSegment> = [3, 0, 4, 1, 2]
            .iter()
            .map(|&r: &usize| AttnSegment {
                pages: PagedKv { block_table: tables[r], block_size: bs },
                offset: r * qd,
                q_len: 1,
                kv_len: positions[r] + 1,
                pos_offset: positions[r],
            })
            .collect();
        let pool = ids.len() * bs * kvd;
        for dtype in [KvDtype::F32, KvDtype::F16] {
            for mode in [QkMode::NormRope, QkMode::Rope] {
                let start = (
                    rand_vec(&mut rng, rows * qd),
                    rand_vec(&mut rng, pool),
                    rand_vec(&mut rng, pool),
                );
                let fresh = || {
                    let (mut kp, mut vp) = (B::alloc_kv(pool, dtype), B::alloc_kv(pool, dtype));
                    B::copy_slice(&mut (), &buf(&start.1), 0, &mut kp, 0, pool);
                    B::copy_slice(&mut (), &buf(&start.2), 0, &mut vp, 0, pool);
                    (buf(&start.0), kp, vp)
                };
                let ((mut qa, mut ka, mut va), (mut qb, mut kb, mut vb)) = (fresh(), fresh());
                let qkv = [&buf(&q), &buf(&k), &buf(&v)];
                let (nq, nk) = (buf(&norms.0), buf(&norms.1));
                let (c, s) = (buf(&cos), buf(&sin));
                let prep = QkPrep {
                    norm: (mode == QkMode::NormRope).then_some(QkNorm {
                        q: &nq,
                        k: &nk,
                        eps: 1e-6,
                    }),
                    cos: &c,
                    sin: &s,
                };
                B::decode_rows_qkv(&mut (), qkv, prep, &mut qa, [&mut ka, &mut va], &segs, &cfg);
                rows_by_parts::<B>(&mut (), qkv, prep, &mut qb, [&mut kb, &mut vb], &segs, &cfg);
                let what = format!("{dtype} {mode:?} kv{nkv}x{group} hd{hd}");
                assert!(qa[..] == qb[..], "{what}: Q");
                // Read back through copy_slice, which widens f16 pools.
                let wide = |p: &<B as Backend>::Buffer| {
                    let mut w = B::alloc(pool);
                    B::copy_slice(&mut (), p, 0, &mut w, 0, pool);
                    B::to_vec(&w, pool)
                };
                let (ka, kb, va, vb) = (wide(&ka), wide(&kb), wide(&va), wide(&vb));
                assert!(ka == kb && va == vb, "{what}: pools");
                // The rows were written (the start held other values).
                let at = segs[0].pages.offset(segs[0].pos_offset, 0, nkv, hd);
                assert_ne!(ka[at..at + hd], start.1[at..at + hd], "{what}: K row");
            }
        }
    }
}

#[test]
fn layout_ops_move_the_right_elements() {
    // Values encode their own source coordinates, so any misplacement shows.
    let (tokens, heads, dim) = (5, 3, 4);
    let token_major: Vec<f32> = (0..tokens * heads * dim).map(|i| i as f32).collect();
    // head-major via qk_norm_rope mode 0, then back via transpose_head_to_token.
    let mut head_major = B::alloc(token_major.len());
    B::qk_norm_rope(
        &mut (),
        &buf(&token_major),
        QkOp::Transpose,
        &mut head_major,
        Heads { tokens, heads, head_dim: dim },
        0,
    );
    for t in 0..tokens {
        for h in 0..heads {
            for d in 0..dim {
                assert_eq!(
                    head_major[(h * tokens + t) * dim + d],
                    token_major[(t * heads + h) * dim + d]
                );
            }
        }
    }
    let mut back = B::alloc(token_major.len());
    B::transpose_head_to_token(
        &mut (),
        &head_major,
        &mut back,
        Heads { tokens, heads, head_dim: dim },
    );
    assert_eq!(&back[..], &token_major[..]);

    // split_qkv
    let (q_dim, kv_dim) = (6, 2);
    let row = q_dim + 2 * kv_dim;
    let qkv: Vec<f32> = (0..tokens * row).map(|i| i as f32).collect();
    let (mut q, mut k, mut v) = (
        B::alloc(tokens * q_dim),
        B::alloc(tokens * kv_dim),
        B::alloc(tokens * kv_dim),
    );
    B::split_qkv(
        &mut (),
        &buf(&qkv),
        [&mut q, &mut k, &mut v],
        tokens,
        q_dim,
        kv_dim,
    );
    for t in 0..tokens {
        assert_eq!(&q[t * q_dim..][..q_dim], &qkv[t * row..][..q_dim]);
        assert_eq!(
            &k[t * kv_dim..][..kv_dim],
            &qkv[t * row + q_dim..][..kv_dim]
        );
        assert_eq!(
            &v[t * kv_dim..][..kv_dim],
            &qkv[t * row + q_dim + kv_dim..][..kv_dim]
        );
    }

    // embedding_lookup and copy_slice
    let table: Vec<f32> = (0..10 * dim).map(|i| i as f32).collect();
    let mut out = B::alloc(3 * dim);
    B::embedding_lookup(&mut (), &buf(&table), &[9, 0, 4], &mut out, dim);
    assert_eq!(&out[..dim], &table[9 * dim..10 * dim]);
    assert_eq!(&out[dim..2 * dim], &table[..dim]);
    assert_eq!(&out[2 * dim..], &table[4 * dim..5 * dim]);
    let mut dst = B::alloc(8);
    B::copy_slice(&mut (), &buf(&table), 5, &mut dst, 2, 3);
    assert_eq!(&dst[..], &[0.0, 0.0, 5.0, 6.0, 7.0, 0.0, 0.0, 0.0]);
}

#[test]
fn kv_cache_append_fills_positions_in_order() {
    let (nkv, cap, hd) = (2, 6, 3);
    let mut cache = KvCache::<B>::new(nkv, cap, hd);
    for step in 0..3usize {
        let new_tokens = step + 1;
        let start = cache.len;
        let k: Vec<f32> = (0..nkv * new_tokens * hd)
            .map(|i| (100 * step + i) as f32)
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        B::kv_cache_append_head_major(
            &mut (),
            &mut cache.k,
            &mut cache.v,
            cache.len,
            cap,
            &buf(&k),
            &buf(&v),
            new_tokens,
            nkv,
            hd,
        );
        cache.len += new_tokens;
        for h in 0..nkv {
            for t in 0..new_tokens {
                for d in 0..hd {
                    let want = k[(h * new_tokens + t) * hd + d];
                    assert_eq!(cache.k[(h * cap + start + t) * hd + d], want);
                    assert_eq!(cache.v[(h * cap + start + t) * hd + d], -want);
                }
            }
        }
    }
    assert_eq!(cache.remaining(), 0);
}

// ── Element-wise ────────────────────────────────────────────────────────────

#[test]
fn activations_and_adds() {
    let mut rng = StdRng::seed_from_u64(40);
    for &(tokens, im) in &[(1, 13), (4, 1536), (20, 4864)] {
        let gu: Vec<f32> = rand_vec(&mut rng, tokens * 2 * im)
            .iter()
            .map(|x| x * 6.0)
            .collect();
        let want: Vec<f64> = (0..tokens * im)
            .map(|i| {
                let (t, c) = (i / im, i % im);
                let g = gu[t * 2 * im + c] as f64;
                g / (1.0 + (-g).exp()) * gu[t * 2 * im + im + c] as f64
            })
            .collect();
        let mut out = B::from_slice(&vec![f32::NAN; tokens * im]);
        B::fused_silu_mul_split(&mut (), &buf(&gu), &mut out, Mat { rows: tokens, cols: im });
        assert_close("silu_mul", &out, &want, |i| 2e-6 * (1.0 + want[i].abs()));

        let want: Vec<f64> = (0..tokens * im)
            .map(|i| {
                let (t, c) = (i / im, i % im);
                let g = gu[t * 2 * im + c] as f64;
                let z = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
                0.5 * g * (1.0 + z.tanh()) * gu[t * 2 * im + im + c] as f64
            })
            .collect();
        let mut out = B::from_slice(&vec![f32::NAN; tokens * im]);
        B::fused_gelu_tanh_mul_split(&mut (), &buf(&gu), &mut out, Mat { rows: tokens, cols: im });
        assert_close("gelu_tanh_mul", &out, &want, |i| {
            2e-6 * (1.0 + want[i].abs())
        });

        let n = tokens * im;
        let x = &gu[..n];
        let mut out = B::from_slice(&vec![f32::NAN; n]);
        B::gelu(&mut (), &buf(x), &mut out, n);
        for i in 0..n {
            // Accuracy against an f64 erf is tested in the simd unit tests;
            // here check the identity gelu(x) - gelu(-x) = x·(Φ(x) + Φ(-x)) = x
            // and that the batched (parallel) path equals the single one.
            let xi = x[i];
            let mut pair = B::alloc(2);
            B::gelu(&mut (), &buf(&[xi, -xi]), &mut pair, 2);
            assert!(
                ((pair[0] - pair[1]) - xi).abs() <= 1e-6 * (1.0 + xi.abs()),
                "gelu odd part at {xi}"
            );
            assert!(
                (out[i] - pair[0]).abs() <= 1e-6 * (1.0 + xi.abs()),
                "gelu batched vs single at {xi}"
            );
        }

        let mut r = buf(&gu[n..2 * n]);
        B::add_inplace(&mut (), &mut r, &buf(x), n);
        for i in 0..n {
            assert_eq!(r[i], gu[n + i] + x[i]);
        }
        // Expert rows scattered back, weighted: rows 2 and 0 of `acc`.
        if tokens >= 3 {
            let mut acc = buf(x);
            B::scale_add_rows(
                &mut (),
                &buf(&gu[..2 * im]),
                &[2, 0],
                &[0.5, -2.0],
                &mut acc,
                im,
            );
            for i in 0..n {
                let (row, c) = (i / im, i % im);
                let want = match row {
                    2 => x[i] + 0.5 * gu[c],
                    0 => x[i] - 2.0 * gu[im + c],
                    _ => x[i],
                };
                assert_eq!(acc[i], want, "scale_add_rows at {i}");
            }
        }
        let bias = rand_vec(&mut rng, im);
        let mut d = buf(x);
        B::add_bias(&mut (), &mut d, &buf(&bias), Mat { rows: tokens, cols: im });
        for i in 0..n {
            assert_eq!(d[i], x[i] + bias[i % im]);
        }
    }
}

// ── GPTQ ────────────────────────────────────────────────────────────────────

/// Packs `q[k][n]` (values < 2^bits) and zero points `z[g][n]` the GPTQ v1 way.
fn pack_gptq(
    q: &[u32],
    z: &[u32],
    k: usize,
    n: usize,
    groups: usize,
    bits: u32,
) -> (Vec<i32>, Vec<i32>) {
    let pack = (32 / bits) as usize;
    let mut qw = vec![0u32; k / pack * n];
    for kk in 0..k {
        for j in 0..n {
            qw[(kk / pack) * n + j] |= q[kk * n + j] << ((kk % pack) as u32 * bits);
        }
    }
    let mut qz = vec![0u32; groups * n / pack];
    for g in 0..groups {
        for j in 0..n {
            qz[g * (n / pack) + j / pack] |= (z[g * n + j] - 1) << ((j % pack) as u32 * bits);
        }
    }
    (
        qw.into_iter().map(|x| x as i32).collect(),
        qz.into_iter().map(|x| x as i32).collect(),
    )
}

#[test]
fn gptq_matches_dequantized_reference() {
    let mut rng = StdRng::seed_from_u64(50);
    for &(bits, k, n, gs, act_order) in &[
        (4u32, 64, 16, 16, false),
        (4, 128, 24, 32, true),
        (8, 32, 8, 8, false),
        (2, 64, 32, 32, true),
    ] {
        let groups = k / gs;
        let maxq = (1u32 << bits) - 1;
        let q: Vec<u32> = (0..k * n).map(|_| rng.random_range(0..=maxq)).collect();
        let z: Vec<u32> = (0..groups * n)
            .map(|_| rng.random_range(1..=maxq))
            .collect();
        let scales: Vec<f32> = (0..groups * n)
            .map(|_| rng.random_range(0.001f32..0.1))
            .collect();
        let g_idx: Vec<i32> = if act_order {
            (0..k).map(|_| rng.random_range(0..groups as i32)).collect()
        } else {
            (0..k).map(|kk| (kk / gs) as i32).collect()
        };
        let (qw, qz) = pack_gptq(&q, &z, k, n, groups, bits);
        let store = B::load_gptq(
            &qw,
            &scales,
            &qz,
            act_order.then_some(&g_idx[..]),
            bits,
            gs,
            k,
            n,
        )
        .unwrap();
        let m = 3;
        let a = rand_vec(&mut rng, m * k);
        let mut want = vec![0f64; m * n];
        let mut bound = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for kk in 0..k {
                    let g = g_idx[kk] as usize;
                    let w = (q[kk * n + j] as f64 - z[g * n + j] as f64) * scales[g * n + j] as f64;
                    want[i * n + j] += a[i * k + kk] as f64 * w;
                    bound[i * n + j] += (a[i * k + kk] as f64 * w).abs();
                }
            }
        }
        let mut out = B::from_slice(&vec![f32::NAN; m * n]);
        B::gemm_gptq(&mut (), &buf(&a), &store, &mut out, m).unwrap();
        assert_close(&format!("gptq {bits}-bit k{k} n{n}"), &out, &want, |i| {
            (k as f64 + 4.0) * 2.0 * U * bound[i] + 1e-30
        });
    }
}

#[test]
fn gptq_rejects_inconsistent_tensors() {
    let qw = vec![0i32; 8 * 16];
    let qz = vec![0i32; 4 * 2];
    let scales = vec![1f32; 4 * 16];
    assert!(B::load_gptq(&qw, &scales, &qz, None, 4, 16, 64, 16).is_ok());
    assert!(
        B::load_gptq(&qw, &scales, &qz, None, 3, 16, 64, 16).is_err(),
        "3-bit"
    );
    assert!(
        B::load_gptq(&qw[1..], &scales, &qz, None, 4, 16, 64, 16).is_err(),
        "short qweight"
    );
    assert!(
        B::load_gptq(&qw, &scales, &qz[1..], None, 4, 16, 64, 16).is_err(),
        "short qzeros"
    );
    assert!(
        B::load_gptq(&qw, &scales, &qz, Some(&[9; 64]), 4, 16, 64, 16).is_err(),
        "g_idx out of range"
    );
    assert!(
        B::load_gptq(&qw, &scales, &qz, None, 4, 0, 64, 16).is_err(),
        "zero group size"
    );
    let store = B::load_gptq(&qw, &scales, &qz, None, 4, 16, 64, 16).unwrap();
    assert!(
        B::gemm_gptq(&mut (), &B::alloc(10), &store, &mut B::alloc(16), 1).is_err(),
        "short activation"
    );
}

// ── Documented defaults ─────────────────────────────────────────────────────

/// The trait's provided methods, for any backend that keeps the defaults.
fn check_documented_defaults<Bk: SeedOps>() {
    let mut ctx = Bk::new_context();
    let a = Bk::alloc(4);
    let mut out = Bk::alloc(4);
    let w = QuantWeights::<Bk> {
        qweight: &a,
        scales: None,
        zeros: None,
        g_idx: None,
    };
    // GGUF kinds have CPU kernels; AWQ has none on any backend yet.
    let kind = QuantKind::Awq { bits: 4, group_size: 128 };
    let err =
        Bk::gemm_quant(&mut ctx, &a, &w, &mut out, Gemm { m: 1, n: 1, k: 4 }, &kind).unwrap_err();
    assert!(
        err.is_unsupported() && err.to_string().contains("Awq"),
        "{err}"
    );
    let cfg = AttnConfig::default();
    assert_eq!(
        (cfg.causal, cfg.scale, cfg.kv_seq_stride, cfg.sliding_window),
        (false, 1.0, 0, 0)
    );
    let mla = Bk::mla_attention(&mut ctx, &a, &a, &a, &mut out, 1, 1, 1, 0, &cfg, 4, 4);
    assert!(mla.unwrap_err().is_unsupported());
    // The CPU reads both KV types (f16 by default) and captures nothing;
    // a type a backend does not read is refused by name.
    let caps = Bk::capabilities();
    assert!(!caps.graphs && !caps.grouped_experts);
    assert_eq!(caps.kv_dtype(None).ok(), Some(KvDtype::F16));
    assert_eq!(caps.kv_dtype(Some(KvDtype::F32)).ok(), Some(KvDtype::F32));
    let f32_only = ferrum_kernels::Capabilities::default();
    assert_eq!(f32_only.kv_dtype(None).ok(), Some(KvDtype::F32));
    let err = f32_only.kv_dtype(Some(KvDtype::F16)).unwrap_err();
    assert!(
        err.is_unsupported() && err.to_string().contains("f16 KV cache"),
        "{err}"
    );
    assert!(Bk::begin_graph_capture(&mut ctx, 1)
        .unwrap_err()
        .is_unsupported());
    assert!(Bk::end_graph_capture(&mut ctx)
        .unwrap_err()
        .is_unsupported());
    assert!(!Bk::replay_graph(&mut ctx, 1).unwrap());
    Bk::set_decode_state(&mut ctx, &[], &AttnConfig::default());
    Bk::reset_graph(&mut ctx);
    Bk::sync(&mut ctx);

    assert_eq!((Bk::world_size(&ctx), Bk::rank(&ctx)), (1, 0));
    let data = [1.0, -2.0, 3.0];
    let mut x = Bk::from_slice(&data);
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        Bk::all_reduce(&mut ctx, &mut x, 3, op);
    }
    Bk::broadcast(&mut ctx, &mut x, 3, 0);
    assert_eq!(Bk::to_vec(&x, 3), data);
    let mut global = Bk::alloc(3);
    Bk::all_gather(&mut ctx, &x, &mut global, 3);
    Bk::sync(&mut ctx);
    assert_eq!(Bk::to_vec(&global, 3), data);
}

#[test]
fn unsupported_ops_report_errors_and_collectives_are_identity() {
    check_documented_defaults::<B>();
}
