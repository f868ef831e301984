//! Every `CudaBackend` op against `CpuBackend` (itself checked against f64
//! references in `cpu_ops.rs`) on random inputs. Normalized MSE
//! (Σ(gpu−cpu)² / Σcpu²) must stay under 5e-4 for GEMM-like ops and
//! attention (the bar; f32 cuBLAS and attention land near 1e-12,
//! the GEMVs on 8-bit activations and the bf16 GEMM near 1e-5) and 1e-6
//! for element-wise ops. On a GPU, run with `--test-threads=1` (as
//! `scripts/gpu-check.sh` does): one test switches the device to its f32
//! reference kernels for a while. Without a GPU every test prints why it
//! skips and passes, so CI (no GPU) stays green.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use ferrum_kernels::quant::{dequantize, random_blocks};
use ferrum_kernels::{
    pack_bytes, AttnConfig, AttnSegment, Backend, CpuBackend as C, CudaBackend as G, Dtype,
    ExpertRows, Gemm, GgufQuantType, Heads, Mat, PagedKv, QkMode, QkNorm, QkOp, QkPrep, QuantKind,
    QuantWeights, SeedOps, Span,
};
use ferrum_types::GgmlType;
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};

const MATMUL: f64 = 5e-4;
const ELEMENTWISE: f64 = 1e-6;

/// Skips (with a note) only when there is no GPU; a GPU that fails to
/// initialise (kernel compile error, ...) fails the test.
fn gpu() -> bool {
    if !G::device_present() {
        eprintln!("skipped: no CUDA GPU found");
        return false;
    }
    G::init(0).unwrap();
    true
}

fn rand_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    num / den.max(1e-30)
}

fn assert_nmse(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let e = nmse(got, want);
    eprintln!("{what}: nmse {e:e}");
    assert!(e <= tol, "{what}: normalized MSE {e:e} > {tol:e}");
}

fn up(v: &[f32]) -> (<C as Backend>::Buffer, <G as Backend>::Buffer) {
    (C::from_slice(v), G::from_slice(v))
}

#[test]
fn dense_gemm() {
    if !gpu() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(1);
    for (m, n, k) in [(1, 896, 896), (7, 300, 129), (64, 512, 256)] {
        let a = rand_vec(&mut rng, m * k);
        let b = rand_vec(&mut rng, n * k);
        let (ca, ga) = up(&a);
        let (cb, gb) = up(&b);
        let (mut co, mut go) = (C::alloc(m * n), G::alloc(m * n));
        C::gemm(&mut (), &ca, &cb, &mut co, Gemm { m, n, k });
        let ctx = &mut G::new_context();
        G::gemm(ctx, &ga, &gb, &mut go, Gemm { m, n, k });
        G::sync(ctx);
        assert_nmse(
            &format!("gemm {m}x{n}x{k}"),
            &G::to_vec(&go, m * n),
            &C::to_vec(&co, m * n),
            MATMUL,
        );
    }
}

#[test]
fn quantized_gemm_every_block_type() {
    if !gpu() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(2);
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    // k = 1280: five superblocks, so the Q4_K kernel's four lane groups
    // get unequal shares.
    for (ty, (n, k)) in types
        .into_iter()
        .flat_map(|t| [(t, (96, 512)), (t, (40, 1280))])
    {
        let bytes = random_blocks(ty, n * k / ty.block_size(), 2).unwrap();
        let mut w = vec![0f32; n * k];
        dequantize(ty, &bytes, &mut w).unwrap();
        let (cw, _) = up(&w);
        let gw = G::from_slice(&pack_bytes(&bytes));
        let kind = QuantKind::Gguf {
            quant_type: GgufQuantType::from_ggml(ty).unwrap(),
            int8_activations: false,
        };
        // One row (the one-row GEMV), one and three tiles of eight rows,
        // and past the GEMV (the bf16 tensor-core GEMM); then the f32
        // reference kernels (`set_f32_activations`), near f32 rounding.
        for (m, f32_activations) in [1, 5, 8, 20, 33]
            .into_iter()
            .flat_map(|m| [(m, false), (m, true)])
        {
            G::set_f32_activations(f32_activations).unwrap();
            let tol = if f32_activations { 1e-10 } else { MATMUL };
            let a = rand_vec(&mut rng, m * k);
            let (ca, ga) = up(&a);
            let (mut co, mut go) = (C::alloc(m * n), G::alloc(m * n));
            C::gemm(&mut (), &ca, &cw, &mut co, Gemm { m, n, k });
            let ctx = &mut G::new_context();
            let qw = QuantWeights::<G> {
                qweight: &gw,
                scales: None,
                zeros: None,
                g_idx: None,
            };
            G::gemm_quant(ctx, &ga, &qw, &mut go, Gemm { m, n, k }, &kind).unwrap();
            G::sync(ctx);
            assert_nmse(
                &format!("gemm_quant {ty:?} m={m} k={k} f32 {f32_activations}"),
                &G::to_vec(&go, m * n),
                &C::to_vec(&co, m * n),
                tol,
            );
        }
    }
    G::set_f32_activations(false).unwrap();
}

#[test]
fn attention_matches_cpu() {
    if !gpu() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(3);
    // (batch, heads, kv heads, hd, q_len, kv_len, stride, pos, causal, window)
    for (b, nh, nkv, hd, ql, kvl, stride, pos, causal, win) in [
        (1, 4, 2, 64, 1, 300, 512, 299, true, 0),
        (2, 6, 2, 32, 17, 17, 0, 0, true, 0),
        (1, 8, 8, 128, 9, 40, 64, 31, true, 8),
        (3, 4, 4, 16, 12, 12, 0, 0, false, 0),
        (1, 2, 1, 256, 5, 5, 0, 0, true, 0),
        // Decode over long caches: split-K (flash-decoding) paths, one with
        // a window smaller than the number of splits (empty splits).
        (1, 32, 8, 128, 1, 3000, 4096, 2999, true, 0),
        (2, 14, 2, 64, 1, 2000, 2048, 1999, true, 1000),
        (1, 4, 1, 64, 1, 2000, 2000, 1999, true, 5),
    ] {
        let s = if stride == 0 { kvl } else { stride };
        let q = rand_vec(&mut rng, b * nh * ql * hd);
        let k = rand_vec(&mut rng, b * nkv * s * hd);
        let v = rand_vec(&mut rng, b * nkv * s * hd);
        let cfg = AttnConfig {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            causal,
            scale: 1.0 / (hd as f32).sqrt(),
            kv_seq_stride: stride,
            sliding_window: win,
            // Gemma 2's logit soft-capping on the windowed cases.
            softcap: if win > 0 { 0.5 } else { 0.0 },
        };
        let ((cq, gq), (ck, gk), (cv, gv)) = (up(&q), up(&k), up(&v));
        let (mut co, mut go) = (C::alloc(q.len()), G::alloc(q.len()));
        C::flash_attention(
            &mut (),
            &cq,
            [&ck, &cv],
            &mut co,
            b,
            Span { q_len: ql, kv_len: kvl, pos_offset: pos },
            &cfg,
        );
        let ctx = &mut G::new_context();
        G::flash_attention(
            ctx,
            &gq,
            [&gk, &gv],
            &mut go,
            b,
            Span { q_len: ql, kv_len: kvl, pos_offset: pos },
            &cfg,
        );
        G::sync(ctx);
        assert_nmse(
            &format!("attention b{b} h{nh}/{nkv} hd{hd} q{ql} kv{kvl}"),
            &G::to_vec(&go, q.len()),
            &C::to_vec(&co, q.len()),
            MATMUL,
        );
    }
}

/// Experts of one mixture step in one grouped GEMM: each group's rows
/// against that expert's dense weights on the CPU. Groups of 1 to 8 rows
/// (one tile), 9 and 64 (several tiles of one expert) and 70 (past the
/// grouped GEMV: cuBLAS on a slice), in no expert order, with rows between
/// them that no group covers and that must stay as they were.
#[test]
fn grouped_expert_gemm_and_gather_add() {
    if !gpu() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(7);
    let (n, k) = (96, 512);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
    ] {
        let experts: Vec<(Vec<f32>, <G as Backend>::Buffer)> = (0..5)
            .map(|e| {
                let bytes = random_blocks(ty, n * k / ty.block_size(), 10 + e).unwrap();
                let mut w = vec![0f32; n * k];
                dequantize(ty, &bytes, &mut w).unwrap();
                (w, G::from_slice(&pack_bytes(&bytes)))
            })
            .collect();
        // (expert, first row, rows); rows 1, 12..14 and 155.. stay untouched.
        let plan = [
            (3, 0, 1),
            (0, 2, 9),
            (4, 11, 1),
            (1, 15, 70),
            (2, 85, 64),
            (3, 149, 6),
        ];
        let total = 160;
        let a = rand_vec(&mut rng, total * k);
        let before = rand_vec(&mut rng, total * n);
        let mut want = before.clone();
        for &(e, start, rows) in &plan {
            let (ca, cw) = (
                C::from_slice(&a[start * k..(start + rows) * k]),
                C::from_slice(&experts[e].0),
            );
            let mut co = C::alloc(rows * n);
            C::gemm(&mut (), &ca, &cw, &mut co, Gemm { m: rows, n, k });
            want[start * n..(start + rows) * n].copy_from_slice(&C::to_vec(&co, rows * n));
        }
        let ga = G::from_slice(&a);
        let mut go = G::from_slice(&before);
        let groups: Vec<ExpertRows<'_, G>> = plan
            .iter()
            .map(|&(e, start, rows)| ExpertRows { weights: &experts[e].1, start, rows })
            .collect();
        let ctx = &mut G::new_context();
        let qt = GgufQuantType::from_ggml(ty).unwrap();
        G::gemm_quant_experts(ctx, &ga, &groups, &mut go, n, k, qt).unwrap();
        G::sync(ctx);
        G::take_error(ctx).unwrap();
        let got = G::to_vec(&go, total * n);
        for (r, (g, w)) in got.chunks(n).zip(want.chunks(n)).enumerate() {
            let covered = plan.iter().any(|&(_, s, rows)| (s..s + rows).contains(&r));
            if !covered {
                assert_eq!(g, w, "{ty:?}: row {r} outside every group changed");
            }
        }
        assert_nmse(&format!("gemm_quant_experts {ty:?}"), &got, &want, MATMUL);
    }

    // Three tokens, two experts each, added to what dst holds, in order.
    let dim = 200;
    let src = rand_vec(&mut rng, 6 * dim);
    let dst = rand_vec(&mut rng, 3 * dim);
    let rows = [4u32, 0, 1, 5, 3, 2];
    let weights = [0.5f32, 1.5, -0.25, 2.0, 1.0, 0.75];
    let mut want = dst.clone();
    for t in 0..3 {
        for j in 0..2 {
            let (r, w) = (rows[t * 2 + j] as usize, weights[t * 2 + j]);
            for c in 0..dim {
                want[t * dim + c] += w * src[r * dim + c];
            }
        }
    }
    let (gs, mut gd) = (G::from_slice(&src), G::from_slice(&dst));
    let ctx = &mut G::new_context();
    G::gather_add_rows(ctx, &gs, &rows, &weights, &mut gd, 2, dim).unwrap();
    G::sync(ctx);
    assert_nmse(
        "gather_add_rows",
        &G::to_vec(&gd, 3 * dim),
        &want,
        ELEMENTWISE,
    );
}

#[test]
fn elementwise_and_layout_ops() {
    if !gpu() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(4);
    let (t, d) = (7, 200);
    let x = rand_vec(&mut rng, t * d);
    let y = rand_vec(&mut rng, t * d);
    let w = rand_vec(&mut rng, d);
    let bias = rand_vec(&mut rng, d);
    let ((cx, gx), (cw, gw), (cb, gb)) = (up(&x), up(&w), up(&bias));
    let ctx = &mut G::new_context();
    let n = t * d;
    let check = |what: &str, g: &<G as Backend>::Buffer, c: &<C as Backend>::Buffer, len: usize| {
        assert_nmse(what, &G::to_vec(g, len), &C::to_vec(c, len), ELEMENTWISE);
    };

    let (mut co, mut go) = (C::alloc(n), G::alloc(n));
    C::rms_norm(&mut (), &cx, &cw, 1e-6, &mut co, Mat { rows: t, cols: d });
    G::rms_norm(ctx, &gx, &gw, 1e-6, &mut go, Mat { rows: t, cols: d });
    check("rms_norm", &go, &co, n);

    let (mut cr, mut gr) = up(&y);
    C::fused_add_rms_norm(
        &mut (),
        &mut cr,
        &cx,
        &cw,
        1e-5,
        &mut co,
        Mat { rows: t, cols: d },
    );
    G::fused_add_rms_norm(
        ctx,
        &mut gr,
        &gx,
        &gw,
        1e-5,
        &mut go,
        Mat { rows: t, cols: d },
    );
    check("fused_add_rms_norm out", &go, &co, n);
    check("fused_add_rms_norm residual", &gr, &cr, n);

    C::layer_norm(
        &mut (),
        &cx,
        &cw,
        &cb,
        1e-12,
        &mut co,
        Mat { rows: t, cols: d },
    );
    G::layer_norm(ctx, &gx, &gw, &gb, 1e-12, &mut go, Mat { rows: t, cols: d });
    check("layer_norm", &go, &co, n);

    C::gelu(&mut (), &cx, &mut co, n);
    G::gelu(ctx, &gx, &mut go, n);
    check("gelu", &go, &co, n);

    let (mut cr, mut gr) = up(&y);
    C::add_inplace(&mut (), &mut cr, &cx, n);
    G::add_inplace(ctx, &mut gr, &gx, n);
    check("add_inplace", &gr, &cr, n);
    let rows: Vec<u32> = (0..t as u32).rev().step_by(2).collect();
    let w: Vec<f32> = (0..rows.len()).map(|r| 0.25 + r as f32).collect();
    C::scale_add_rows(&mut (), &cx, &rows, &w, &mut cr, d);
    G::scale_add_rows(ctx, &gx, &rows, &w, &mut gr, d);
    check("scale_add_rows", &gr, &cr, n);
    C::add_bias(&mut (), &mut cr, &cb, Mat { rows: t, cols: d });
    G::add_bias(ctx, &mut gr, &gb, Mat { rows: t, cols: d });
    check("add_bias", &gr, &cr, n);

    let im = d / 2;
    let (mut ca, mut ga) = (C::alloc(t * im), G::alloc(t * im));
    C::fused_silu_mul_split(&mut (), &cx, &mut ca, Mat { rows: t, cols: im });
    G::fused_silu_mul_split(ctx, &gx, &mut ga, Mat { rows: t, cols: im });
    check("silu_mul", &ga, &ca, t * im);
    C::fused_gelu_tanh_mul_split(&mut (), &cx, &mut ca, Mat { rows: t, cols: im });
    G::fused_gelu_tanh_mul_split(ctx, &gx, &mut ga, Mat { rows: t, cols: im });
    check("gelu_tanh_mul", &ga, &ca, t * im);

    // split_qkv with q 100, k/v 50 columns.
    let (qd, kvd) = (100, 50);
    let (mut cq, mut ck, mut cv) = (C::alloc(t * qd), C::alloc(t * kvd), C::alloc(t * kvd));
    let (mut gq, mut gk, mut gv) = (G::alloc(t * qd), G::alloc(t * kvd), G::alloc(t * kvd));
    C::split_qkv(&mut (), &cx, [&mut cq, &mut ck, &mut cv], t, qd, kvd);
    G::split_qkv(ctx, &gx, [&mut gq, &mut gk, &mut gv], t, qd, kvd);
    check("split q", &gq, &cq, t * qd);
    check("split k", &gk, &ck, t * kvd);
    check("split v", &gv, &cv, t * kvd);

    // Embedding rows.
    let ids = [3u32, 0, 6, 6, 1];
    let (mut ce, mut ge) = (C::alloc(ids.len() * d), G::alloc(ids.len() * d));
    C::embedding_lookup(&mut (), &cx, &ids, &mut ce, d);
    G::embedding_lookup(ctx, &gx, &ids, &mut ge, d);
    check("embedding", &ge, &ce, ids.len() * d);

    // copy_slice.
    let (mut cd, mut gd) = up(&y);
    C::copy_slice(&mut (), &cx, 13, &mut cd, 101, 300);
    G::copy_slice(ctx, &gx, 13, &mut gd, 101, 300);
    check("copy_slice", &gd, &cd, n);

    // qk_norm_rope in all three modes, then head->token, then KV append.
    let (heads, hd, pos) = (5, 40, 9);
    let half = hd / 2;
    let tables = (pos + t) * half;
    let cos: Vec<f32> = (0..tables).map(|i| (i as f32 * 0.37).cos()).collect();
    let sin: Vec<f32> = (0..tables).map(|i| (i as f32 * 0.37).sin()).collect();
    let nw = rand_vec(&mut rng, hd);
    let inp = rand_vec(&mut rng, t * heads * hd);
    let ((ccos, gcos), (csin, gsin), (cnw, gnw), (ci, gi)) =
        (up(&cos), up(&sin), up(&nw), up(&inp));
    let len = t * heads * hd;
    let (mut ch, mut gh) = (C::alloc(len), G::alloc(len));
    let shape = Heads { tokens: t, heads, head_dim: hd };
    for mode in [QkMode::Transpose, QkMode::NormRope, QkMode::Rope] {
        C::qk_norm_rope(
            &mut (),
            &ci,
            qk_op::<C>(mode, &cnw, [&ccos, &csin]),
            &mut ch,
            shape,
            pos,
        );
        G::qk_norm_rope(
            ctx,
            &gi,
            qk_op::<G>(mode, &gnw, [&gcos, &gsin]),
            &mut gh,
            shape,
            pos,
        );
        check(&format!("qk_norm_rope {mode:?}"), &gh, &ch, len);
    }
    let (mut ct, mut gt) = (C::alloc(len), G::alloc(len));
    C::transpose_head_to_token(
        &mut (),
        &ch,
        &mut ct,
        Heads { tokens: t, heads, head_dim: hd },
    );
    G::transpose_head_to_token(ctx, &gh, &mut gt, Heads { tokens: t, heads, head_dim: hd });
    check("transpose_head_to_token", &gt, &ct, len);
    let cap = 20;
    let (mut ckc, mut cvc) = (C::alloc(heads * cap * hd), C::alloc(heads * cap * hd));
    let (mut gkc, mut gvc) = (G::alloc(heads * cap * hd), G::alloc(heads * cap * hd));
    C::kv_cache_append_head_major(&mut (), &mut ckc, &mut cvc, 4, cap, &ch, &ct, t, heads, hd);
    G::kv_cache_append_head_major(ctx, &mut gkc, &mut gvc, 4, cap, &gh, &gt, t, heads, hd);
    check("kv append k", &gkc, &ckc, heads * cap * hd);
    check("kv append v", &gvc, &cvc, heads * cap * hd);
}

#[test]
fn init_reports_missing_devices_as_errors() {
    // An ordinal past the last device is an error, never a panic.
    if G::init(0).is_ok() {
        // Already open on device 0: asking again returns the same device.
        assert!(G::init(0).is_ok());
    } else {
        assert!(G::init(1000).is_err());
    }
}

#[test]
fn failed_ops_are_reported_by_take_error_and_later_ops_skipped() {
    if !gpu() {
        return;
    }
    let ctx = &mut G::new_context();
    let (heads, hd, cap) = (2, 8, 4);
    let (mut k, mut v) = (G::alloc(heads * cap * hd), G::alloc(heads * cap * hd));
    let new = G::from_slice(&vec![1.0; heads * 2 * hd]);
    // Four positions held, two more written: past the capacity.
    G::kv_cache_append_head_major(ctx, &mut k, &mut v, 3, cap, &new, &new, 2, heads, hd);
    // Skipped: the context already failed.
    let (src, mut dst) = (G::from_slice(&[7.0; 4]), G::alloc(4));
    G::copy_slice(ctx, &src, 0, &mut dst, 0, 4);
    G::sync(ctx);
    let err = G::take_error(ctx).unwrap_err().to_string();
    assert!(err.contains("overflow"), "{err}");
    assert_eq!(G::to_vec(&dst, 4), vec![0.0; 4], "later ops were skipped");
    assert!(G::take_error(ctx).is_ok(), "the error was taken");
    G::copy_slice(ctx, &src, 0, &mut dst, 0, 4);
    G::sync(ctx);
    assert!(G::take_error(ctx).is_ok());
    assert_eq!(G::to_vec(&dst, 4), vec![7.0; 4]);
}

/// Buffers say what they hold: `load_gguf` tags blocks, `from_u32` an
/// input order. An act-order GEMM (its activation gathered by a u32
/// order) matches the CPU; a weight read as another type, an order made
/// of f32 values, and a launch handed blocks where it reads floats are
/// errors, not garbage.
#[test]
fn typed_buffers_run_act_order_and_refuse_other_layouts() {
    if !gpu() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(9);
    let (m, n, k) = (3, 64, 512);
    let ty = GgufQuantType::Q4K;
    let bytes = random_blocks(ty.ggml(), n * k / 256, 3).unwrap();
    let (cw, gw) = (
        C::load_gguf(&bytes, ty, n, k).unwrap(),
        G::load_gguf(&bytes, ty, n, k).unwrap(),
    );
    assert_eq!(G::dtype(&gw), Dtype::Blocks(GgmlType::Q4_K));
    let mut order: Vec<u32> = (0..k as u32).collect();
    order.shuffle(&mut rng);
    let (co_, go_) = (C::from_u32(&order), G::from_u32(&order));
    assert_eq!(G::dtype(&go_), Dtype::U32);
    let a = rand_vec(&mut rng, m * k);
    let (ca, ga) = up(&a);
    let kind = QuantKind::Gguf { quant_type: ty, int8_activations: false };
    let shape = Gemm { m, n, k };
    let (mut co, mut go) = (C::alloc(m * n), G::alloc(m * n));
    let cq = QuantWeights::<C> {
        qweight: &cw,
        scales: None,
        zeros: None,
        g_idx: Some(&co_),
    };
    C::gemm_quant(&mut (), &ca, &cq, &mut co, shape, &kind).unwrap();
    let ctx = &mut G::new_context();
    let gq = QuantWeights::<G> {
        qweight: &gw,
        scales: None,
        zeros: None,
        g_idx: Some(&go_),
    };
    G::gemm_quant(ctx, &ga, &gq, &mut go, shape, &kind).unwrap();
    G::sync(ctx);
    G::take_error(ctx).unwrap();
    let want = C::to_vec(&co, m * n);
    assert_nmse(
        "act-order gemm_quant Q4_K",
        &G::to_vec(&go, m * n),
        &want,
        MATMUL,
    );

    let q6k = QuantKind::Gguf {
        quant_type: GgufQuantType::Q6K,
        int8_activations: false,
    };
    assert!(G::gemm_quant(ctx, &ga, &gq, &mut go, shape, &q6k).is_err());
    let values = G::from_slice(&order.iter().map(|&o| o as f32).collect::<Vec<_>>());
    let bad = QuantWeights::<G> {
        qweight: &gw,
        scales: None,
        zeros: None,
        g_idx: Some(&values),
    };
    assert!(G::gemm_quant(ctx, &ga, &bad, &mut go, shape, &kind).is_err());
    // Blocks handed to a kernel that reads floats: the launch refuses.
    let mut out = G::alloc(k);
    G::rms_norm(ctx, &gw, &ga, 1e-6, &mut out, Mat { rows: 1, cols: k });
    G::sync(ctx);
    let err = G::take_error(ctx).unwrap_err().to_string();
    assert!(err.contains("rms_norm") && err.contains("Q4_K"), "{err}");
}

/// The paged ops over shuffled block tables of 16 positions against the
/// CPU: a decode batch's rows (`decode_rows_qkv`) and attention over all
/// its sequences in one call (`paged_attention_segments`, lengths up to
/// 3000 so the keys split), GQA 1, 4 and 8, a sliding window; then a
/// prefill chunk appended (`paged_kv_append`) and attended
/// (`paged_attention`) from position 37.
#[test]
fn paged_ops_match_cpu() {
    if !gpu() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(8);
    let bs = 16;
    for (nh, nkv, hd, window) in [
        (8, 8, 64, 0),
        (8, 2, 128, 0),
        (16, 2, 64, 100),
        (4, 1, 256, 0),
    ] {
        let lens = [3000usize, 1, 17, 600, 40];
        let need: Vec<usize> = lens.iter().map(|l| l.div_ceil(bs)).collect();
        let blocks = need.iter().sum::<usize>() + 3;
        let mut ids: Vec<u32> = (0..blocks as u32).collect();
        ids.shuffle(&mut rng);
        let mut at = 0;
        let tables: Vec<Vec<u32>> = need
            .iter()
            .map(|&n| {
                at += n;
                ids[at - n..at].to_vec()
            })
            .collect();
        let pool = blocks * nkv * bs * hd;
        let (kp, vp) = (rand_vec(&mut rng, pool), rand_vec(&mut rng, pool));
        let cfg = AttnConfig {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            causal: true,
            scale: 1.0 / (hd as f32).sqrt(),
            kv_seq_stride: 0,
            sliding_window: window,
            softcap: 0.0,
        };
        let segs: Vec<AttnSegment> = lens
            .iter()
            .zip(&tables)
            .enumerate()
            .map(|(r, (&len, t))| AttnSegment {
                pages: PagedKv { block_table: t, block_size: bs },
                offset: r * nh * hd,
                q_len: 1,
                kv_len: len,
                pos_offset: len - 1,
            })
            .collect();
        let rows = lens.len();
        let half = hd / 2;
        let cos = rand_vec(&mut rng, 3000 * half);
        let sin = rand_vec(&mut rng, 3000 * half);
        let (q, k, v) = (
            rand_vec(&mut rng, rows * nh * hd),
            rand_vec(&mut rng, rows * nkv * hd),
            rand_vec(&mut rng, rows * nkv * hd),
        );
        let (qn, kn) = (rand_vec(&mut rng, hd), rand_vec(&mut rng, hd));
        let (ckp, gkp) = up(&kp);
        let (cvp, gvp) = up(&vp);
        let (mut ckp, mut gkp, mut cvp, mut gvp) = (ckp, gkp, cvp, gvp);
        let ((cq, gq), (ck, gk), (cv, gv)) = (up(&q), up(&k), up(&v));
        let ((cqn, gqn), (ckn, gkn), (ccos, gcos), (csin, gsin)) =
            (up(&qn), up(&kn), up(&cos), up(&sin));
        let (mut cqo, mut gqo) = (C::alloc(q.len()), G::alloc(q.len()));
        let ctx = &mut G::new_context();
        let what = format!("h{nh}/{nkv} hd{hd} window {window}");
        let norm = Some(QkNorm { q: &cqn, k: &ckn, eps: 1e-6 });
        let prep = QkPrep { norm, cos: &ccos, sin: &csin };
        let (qkv, pools) = ([&cq, &ck, &cv], [&mut ckp, &mut cvp]);
        C::decode_rows_qkv(&mut (), qkv, prep, &mut cqo, pools, &segs, &cfg);
        let norm = Some(QkNorm { q: &gqn, k: &gkn, eps: 1e-6 });
        let prep = QkPrep { norm, cos: &gcos, sin: &gsin };
        let (qkv, pools) = ([&gq, &gk, &gv], [&mut gkp, &mut gvp]);
        G::decode_rows_qkv(ctx, qkv, prep, &mut gqo, pools, &segs, &cfg);
        G::sync(ctx);
        G::take_error(ctx).unwrap();
        assert_nmse(
            &format!("rows q {what}"),
            &G::to_vec(&gqo, q.len()),
            &C::to_vec(&cqo, q.len()),
            ELEMENTWISE,
        );
        assert_nmse(
            &format!("rows k {what}"),
            &G::to_vec(&gkp, pool),
            &C::to_vec(&ckp, pool),
            ELEMENTWISE,
        );
        assert_nmse(
            &format!("rows v {what}"),
            &G::to_vec(&gvp, pool),
            &C::to_vec(&cvp, pool),
            ELEMENTWISE,
        );
        let (mut co, mut go) = (C::alloc(q.len()), G::alloc(q.len()));
        C::paged_attention_segments(&mut (), &cqo, [&ckp, &cvp], &segs, &mut co, &cfg);
        G::paged_attention_segments(ctx, &gqo, [&gkp, &gvp], &segs, &mut go, &cfg);
        G::sync(ctx);
        G::take_error(ctx).unwrap();
        assert_nmse(
            &format!("paged_attention_segments {what}"),
            &G::to_vec(&go, q.len()),
            &C::to_vec(&co, q.len()),
            MATMUL,
        );

        // Six new positions of the fifth sequence from 37, across blocks.
        let (pos, n) = (37, 6);
        let pages = PagedKv { block_table: &tables[4], block_size: bs };
        let (nk, nv) = (
            rand_vec(&mut rng, nkv * n * hd),
            rand_vec(&mut rng, nkv * n * hd),
        );
        let ((cnk, gnk), (cnv, gnv)) = (up(&nk), up(&nv));
        C::paged_kv_append(
            &mut (),
            [&mut ckp, &mut cvp],
            &pages,
            pos,
            [&cnk, &cnv],
            Heads { tokens: n, heads: nkv, head_dim: hd },
        );
        G::paged_kv_append(
            ctx,
            [&mut gkp, &mut gvp],
            &pages,
            pos,
            [&gnk, &gnv],
            Heads { tokens: n, heads: nkv, head_dim: hd },
        );
        let pq = rand_vec(&mut rng, nh * n * hd);
        let (cpq, gpq) = up(&pq);
        let (mut co, mut go) = (C::alloc(pq.len()), G::alloc(pq.len()));
        C::paged_attention(
            &mut (),
            &cpq,
            [&ckp, &cvp],
            &pages,
            &mut co,
            Span {
                q_len: n,
                kv_len: pos + n,
                pos_offset: pos,
            },
            &cfg,
        );
        G::paged_attention(
            ctx,
            &gpq,
            [&gkp, &gvp],
            &pages,
            &mut go,
            Span {
                q_len: n,
                kv_len: pos + n,
                pos_offset: pos,
            },
            &cfg,
        );
        G::sync(ctx);
        G::take_error(ctx).unwrap();
        assert_nmse(
            &format!("append k {what}"),
            &G::to_vec(&gkp, pool),
            &C::to_vec(&ckp, pool),
            ELEMENTWISE,
        );
        assert_nmse(
            &format!("paged_attention {what}"),
            &G::to_vec(&go, pq.len()),
            &C::to_vec(&co, pq.len()),
            MATMUL,
        );
    }
}

/// The op of `mode` over these weights and tables.
fn qk_op<'a, B: Backend>(
    mode: QkMode,
    weight: &'a B::Buffer,
    [cos, sin]: [&'a B::Buffer; 2],
) -> QkOp<'a, B> {
    match mode {
        QkMode::Transpose => QkOp::Transpose,
        QkMode::Rope => QkOp::Rope { cos, sin },
        QkMode::NormRope => QkOp::NormRope { weight, eps: 1e-6, cos, sin },
    }
}
