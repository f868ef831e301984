//! `gemm_quant` on GGUF blocks against dequantize-then-GEMM in f64, for every
//! block type, on random blocks, across row counts that take every path
//! (one group of eight rows, several, a 64-row activation chunk boundary,
//! the f32 tiled path) and a tile boundary (n > 128).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use ferrum_kernels::cpu::{integer_activation_group, takes_int8_activations};
use ferrum_kernels::quant::act::quantize_act;
use ferrum_kernels::quant::dequantize;
use ferrum_kernels::{
    pack_bytes, Backend, CpuBackend, Dtype, Gemm, GgufQuantType, KvDtype, QuantKind, QuantWeights,
};
use ferrum_types::GgmlType;
use rand::{rngs::StdRng, Rng, SeedableRng};

type B = CpuBackend;

/// Byte offsets of the f16 scales in each block (set to finite values so
/// random blocks decode to finite numbers).
fn scale_offsets(t: GgufQuantType) -> &'static [usize] {
    use GgufQuantType::*;
    match t {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | IQ4XS => &[0],
        MXFP4 | F16 | BF16 => &[],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
    }
}

fn random_blocks(rng: &mut StdRng, t: GgufQuantType, rows: usize, k: usize) -> Vec<u8> {
    let ty = t.ggml();
    if ty.block_size() == 1 {
        // F16, BF16: random bits would hold NaNs.
        return ferrum_kernels::quant::random_blocks(ty, rows * k, rng.random()).unwrap();
    }
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let mut bytes: Vec<u8> = (0..rows * k / bs * bb).map(|_| rng.random()).collect();
    for block in bytes.chunks_mut(bb) {
        if t == GgufQuantType::MXFP4 {
            // Its power-of-two scale: 2^-10 .. 2^-3.
            block[0] = rng.random_range(118..126);
        }
        for &o in scale_offsets(t) {
            let v = half::f16::from_f32(rng.random_range(-0.05f32..0.05));
            block[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

/// `gemm_quant` of `m` random rows against `bytes` (`n` rows of type `t`),
/// loaded as a model loads them.
fn run_gemm(t: GgufQuantType, bytes: &[u8], a: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    run_gemm_on(&B::load_gguf(bytes, t, n, k).unwrap(), t, a, m, n, k, false)
}

fn run_gemm_on(
    qw: &<B as Backend>::Buffer,
    t: GgufQuantType,
    a: &[f32],
    m: usize,
    n: usize,
    k: usize,
    int8_activations: bool,
) -> Vec<f32> {
    let mut out = B::from_slice(&vec![f32::NAN; m * n]);
    let weights = QuantWeights::<B> {
        qweight: qw,
        scales: None,
        zeros: None,
        g_idx: None,
    };
    let kind = QuantKind::Gguf { quant_type: t, int8_activations };
    B::gemm_quant(
        &mut (),
        &B::from_slice(a),
        &weights,
        &mut out,
        Gemm { m, n, k },
        &kind,
    )
    .unwrap();
    out.to_vec()
}

/// Types with an integer kernel: the activations are quantized to 15 bits
/// per `group` values, so the reference uses those dequantized activations
/// `â`. Error sources: the f32 products of the scales and the f32 sums over
/// blocks, minimums and lanes (at most `3B + 16` roundings for `B` 32-value
/// blocks: a scale product and one or two FMAs per block; the integer sums
/// are exact, and their conversion rounds once), on terms bounded by `|â|`
/// times three times the row's largest `|w|` (a block's offset and `d·q` are
/// each bounded by it). Against the unquantized `a`, the rounding of each
/// activation (at most `d/2`) adds `Σ d_g/2 · Σ|w_g|`. IQ4_XS's kernels
/// hold its scales rounded to f16 (`cpu/interleaved.rs`): each weight
/// within 2^-12 of itself, so `2^-12 · Σ|â·w|` more.
#[allow(clippy::too_many_arguments)]
fn check_integer(
    t: GgufQuantType,
    group: usize,
    w: &[f32],
    a: &[f32],
    got: &[f32],
    m: usize,
    n: usize,
    k: usize,
) {
    let groups = k / group;
    let mut qs = vec![0i16; m * k];
    let mut d = vec![0f32; m * groups];
    for i in 0..m {
        let rows = i * k..(i + 1) * k;
        let dr = i * groups..(i + 1) * groups;
        quantize_act(&a[rows.clone()], group, &mut qs[rows], &mut d[dr]);
    }
    let step = |c: usize| d[c / group] as f64;
    let ahat: Vec<f64> = (0..m * k).map(|c| qs[c] as f64 * step(c)).collect();
    let steps: Vec<f64> = (0..m * k).map(step).collect();
    check_quantized(t, w, a, &ahat, &steps, got, (m, n, k));
}

/// The bounds of [`check_integer`] for activations `ahat`, each the
/// rounding of `a` to a multiple of its own `steps`.
#[allow(clippy::too_many_arguments)]
fn check_quantized(
    t: GgufQuantType,
    w: &[f32],
    a: &[f32],
    ahat: &[f64],
    steps: &[f64],
    got: &[f32],
    (m, n, k): (usize, usize, usize),
) {
    let blocks = k / 32;
    for i in 0..m {
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            let wmax = wr.iter().fold(0f64, |x, v| x.max(v.abs() as f64));
            let (mut want, mut exact, mut mag, mut quant_err) = (0f64, 0f64, 0f64, 0f64);
            let mut scaled = 0f64;
            for c in 0..k {
                let ahat = ahat[i * k + c];
                want += ahat * wr[c] as f64;
                scaled += (ahat * wr[c] as f64).abs();
                exact += a[i * k + c] as f64 * wr[c] as f64;
                mag += ahat.abs() * 3.0 * wmax;
                quant_err += steps[i * k + c] / 2.0 * (wr[c] as f64).abs();
            }
            let got = got[i * n + j] as f64;
            let rounded_scales = if t == GgufQuantType::IQ4XS {
                2f64.powi(-12) * scaled
            } else {
                0.0
            };
            let tol = (3.0 * blocks as f64 + 16.0) * 2f64.powi(-24) * mag + rounded_scales + 1e-30;
            assert!(
                (got - want).abs() <= tol,
                "{t:?} m{m} n{n} [{i},{j}]: {got} vs {want} (tol {tol})"
            );
            assert!(
                (got - exact).abs() <= quant_err + tol,
                "{t:?} m{m} n{n} [{i},{j}]: {got} vs f32 activations {exact}"
            );
        }
    }
}

/// 8-bit activations as `QuantKind::Gguf::int8_activations` documents them:
/// per 32 values, the largest is kept exact if its square is over 25/32 of
/// the block's sum of squares (`|x| > 5 · rms`); of the others,
/// `d = max|x| / 127`, `q = round_half_even(x · (1/d))`. Returns the
/// dequantized values and each one's step (`d`, or 0 for an exact one).
/// `None` for data with a block too near the threshold for the kernel's
/// f32 sum of squares to be sure to decide it the same way.
fn int8_reference(a: &[f32]) -> Option<(Vec<f64>, Vec<f64>)> {
    let (mut ahat, mut steps) = (Vec::new(), Vec::new());
    for g in a.chunks_exact(32) {
        let sum_sq: f64 = g.iter().map(|&v| v as f64 * v as f64).sum();
        let max = g.iter().fold(0f32, |m, v| m.max(v.abs()));
        let share = max as f64 * max as f64 / sum_sq.max(1e-300);
        if (share - 25.0 / 32.0).abs() <= 1e-3 {
            return None;
        }
        let spike = (share > 25.0 / 32.0).then(|| g.iter().position(|v| v.abs() == max).unwrap());
        let rest = g
            .iter()
            .enumerate()
            .filter(|&(i, _)| Some(i) != spike)
            .fold(0f32, |m, (_, v)| m.max(v.abs()));
        let d = rest / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (i, &x) in g.iter().enumerate() {
            if Some(i) == spike {
                ahat.push(x as f64);
                steps.push(0.0);
                continue;
            }
            let q = (x * inv).round_ties_even();
            assert!(q.abs() <= 127.0);
            ahat.push(q as f64 * d as f64);
            steps.push(d as f64);
        }
    }
    Some((ahat, steps))
}

/// Activations in -1..1 with a spike of 2..20 (either sign) in one value
/// of about every third 32-value block: outliers for 8-bit activations
/// where over ~6.
fn spiky_activations(rng: &mut StdRng, len: usize) -> Vec<f32> {
    let mut a: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    for _ in 0..len / 96 {
        let i = rng.random_range(0..len);
        a[i] = rng.random_range(2.0f32..20.0) * if rng.random() { 1.0 } else { -1.0 };
    }
    a
}

/// Other types compute in f32 from identical dequantized values, so only
/// the summation differs: `(k + 2) · u · Σ|a·w|` per output (u = 2⁻²⁴).
fn check_f32(t: GgufQuantType, w: &[f32], a: &[f32], got: &[f32], m: usize, n: usize, k: usize) {
    for i in 0..m {
        for j in 0..n {
            let (mut want, mut bound) = (0f64, 0f64);
            for c in 0..k {
                let p = a[i * k + c] as f64 * w[j * k + c] as f64;
                want += p;
                bound += p.abs();
            }
            let got = got[i * n + j] as f64;
            let tol = (k as f64 + 2.0) * 2f64.powi(-24) * bound + 1e-30;
            assert!(
                (got - want).abs() <= tol,
                "{t:?} m{m} n{n} [{i},{j}]: {got} vs {want}"
            );
        }
    }
}

#[test]
fn every_block_type_matches_dequantized_gemm() {
    let mut rng = StdRng::seed_from_u64(5);
    for t in GgufQuantType::all() {
        let k = 2 * t.ggml().block_size();
        for &(m, n) in &[(1, 17), (3, 5), (8, 33), (9, 130), (40, 7), (70, 19)] {
            let bytes = random_blocks(&mut rng, t, n, k);
            let mut w = vec![0f32; n * k];
            dequantize(t.ggml(), &bytes, &mut w).unwrap();
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let got = run_gemm(t, &bytes, &a, m, n, k);
            if let Some(group) = integer_activation_group(t) {
                check_integer(t, group, &w, &a, &got, m, n, k);
            } else {
                check_f32(t, &w, &a, &got, m, n, k);
            }
        }
    }
}

/// With `int8_activations`, the types whose kernel takes 8-bit activations
/// here match dequantize-then-GEMM on the 8-bit reference activations with
/// the 16-bit kernels' bounds (so the test fails if the flag were ignored:
/// 15-bit activations differ from 8-bit ones by far more), and the other
/// types give exactly what they give without the flag.
#[test]
fn int8_activations_match_their_reference() {
    use GgufQuantType::*;
    let mut rng = StdRng::seed_from_u64(6);
    for t in [Q4_0, Q4_1, Q5_0, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4XS] {
        let k = 3 * t.ggml().block_size();
        for &(m, n) in &[(1, 17), (3, 5), (5, 16), (8, 33), (9, 130), (70, 19)] {
            let bytes = random_blocks(&mut rng, t, n, k);
            let qw = B::load_gguf(&bytes, t, n, k).unwrap();
            // Data whose blocks the reference can decide.
            let (a, (ahat, steps)) = loop {
                let a = spiky_activations(&mut rng, m * k);
                if let Some(r) = int8_reference(&a) {
                    break (a, r);
                }
            };
            let got = run_gemm_on(&qw, t, &a, m, n, k, true);
            if takes_int8_activations(t) {
                let mut w = vec![0f32; n * k];
                dequantize(t.ggml(), &bytes, &mut w).unwrap();
                check_quantized(t, &w, &a, &ahat, &steps, &got, (m, n, k));
            } else {
                let without = run_gemm_on(&qw, t, &a, m, n, k, false);
                assert_eq!(got, without, "{t:?} m{m} n{n}");
            }
        }
    }
}

/// A row's result is the same bits whether it is computed alone or among
/// other rows (in any position): the engine relies on it for batched ==
/// alone at temperature 0.
#[test]
fn rows_do_not_depend_on_their_batch() {
    use GgufQuantType::*;
    let mut rng = StdRng::seed_from_u64(9);
    for t in [
        Q4_0, Q4_1, Q5_0, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS, MXFP4,
    ] {
        if integer_activation_group(t).is_none() {
            continue;
        }
        let (n, k) = (25, 2 * t.ggml().block_size());
        let bytes = random_blocks(&mut rng, t, n, k);
        // 75 rows end in a group of three, 66 in a group of two: the
        // kernels take different shapes for one, two and more rows.
        let qw = B::load_gguf(&bytes, t, n, k).unwrap();
        for (m, int8) in [(75, false), (66, false), (75, true), (66, true)] {
            let a = spiky_activations(&mut rng, m * k);
            let all = run_gemm_on(&qw, t, &a, m, n, k, int8);
            for i in [0, 5, 8, 63, 64, m - 1] {
                let alone = run_gemm_on(&qw, t, &a[i * k..(i + 1) * k], 1, n, k, int8);
                assert_eq!(
                    alone,
                    all[i * n..(i + 1) * n],
                    "{t:?} m {m} row {i} int8 {int8}"
                );
            }
        }
    }
}

/// Blocks uploaded as plain words (not through `load_gguf`) keep the file's
/// layout and are read as such, by the f32 path.
#[test]
fn blocks_in_the_file_layout_still_compute() {
    let mut rng = StdRng::seed_from_u64(12);
    for t in [
        GgufQuantType::Q4_1,
        GgufQuantType::Q5_0,
        GgufQuantType::Q8_0,
        GgufQuantType::MXFP4,
    ] {
        let (m, n, k) = (3, 19, 64);
        let bytes = random_blocks(&mut rng, t, n, k);
        let mut w = vec![0f32; n * k];
        dequantize(t.ggml(), &bytes, &mut w).unwrap();
        let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let got = run_gemm_on(&B::from_slice(&pack_bytes(&bytes)), t, &a, m, n, k, false);
        check_f32(t, &w, &a, &got, m, n, k);
    }
}

#[test]
fn short_buffers_and_ragged_k_are_errors() {
    let t = GgufQuantType::Q8_0;
    let kind = QuantKind::Gguf { quant_type: t, int8_activations: false };
    let a = B::alloc(64);
    let mut out = B::alloc(8);
    // The file's layout, and the one load_gguf chose (interleaved where the
    // CPU has the kernel: two rows fill a group of eight, so nine are short).
    let raw = B::from_slice(&pack_bytes(&[0u8; 34 * 4]));
    let loaded = B::load_gguf(&[0u8; 34 * 4], t, 2, 64).unwrap();
    for (qw, too_many) in [(&raw, 3), (&loaded, 9)] {
        let w = QuantWeights::<B> {
            qweight: qw,
            scales: None,
            zeros: None,
            g_idx: None,
        };
        assert!(
            B::gemm_quant(&mut (), &a, &w, &mut out, Gemm { m: 1, n: 2, k: 64 }, &kind).is_ok()
        );
        assert!(
            B::gemm_quant(
                &mut (),
                &a,
                &w,
                &mut out,
                Gemm { m: 1, n: too_many, k: 64 },
                &kind
            )
            .is_err(),
            "weight too short"
        );
        assert!(
            B::gemm_quant(&mut (), &a, &w, &mut out, Gemm { m: 1, n: 2, k: 48 }, &kind).is_err(),
            "k not whole blocks"
        );
    }
    let w = QuantWeights::<B> {
        qweight: &loaded,
        scales: None,
        zeros: None,
        g_idx: None,
    };
    if integer_activation_group(t) == Some(32) {
        let other = QuantKind::Gguf {
            quant_type: GgufQuantType::Q4_0,
            int8_activations: false,
        };
        assert!(
            B::gemm_quant(
                &mut (),
                &a,
                &w,
                &mut out,
                Gemm { m: 1, n: 2, k: 64 },
                &other
            )
            .is_err(),
            "interleaved Q8_0 read as Q4_0"
        );
    }
    // Every buffer names what it holds: blocks are never read as another
    // type, a KV pool never as a weight.
    let q4k = B::load_gguf(&[0u8; 144 * 2], GgufQuantType::Q4K, 2, 256).unwrap();
    let want = match integer_activation_group(GgufQuantType::Q4K) {
        Some(_) => Dtype::Repacked(GgmlType::Q4_K),
        None => Dtype::Blocks(GgmlType::Q4_K),
    };
    assert_eq!(B::dtype(&q4k), want);
    let f16_pool = B::alloc_kv(512, KvDtype::F16);
    assert_eq!(B::dtype(&f16_pool), Dtype::F16);
    assert_eq!(B::dtype(&B::alloc(4)), Dtype::F32);
    assert_eq!(B::dtype(&B::from_slice(&[1.0])), Dtype::F32);
    let a256 = B::alloc(256);
    // A [2, 256] product with `qweight` read as `ty`, in `order` if given.
    let mut run = |qweight, g_idx, ty| {
        let w = QuantWeights::<B> {
            qweight,
            scales: None,
            zeros: None,
            g_idx,
        };
        let kind = QuantKind::Gguf { quant_type: ty, int8_activations: false };
        let shape = Gemm { m: 1, n: 2, k: 256 };
        B::gemm_quant(&mut (), &a256, &w, &mut out, shape, &kind)
    };
    for (qw, ty, ok) in [
        (&q4k, GgufQuantType::Q4K, true),
        (&q4k, GgufQuantType::Q6K, false),
        (&f16_pool, GgufQuantType::Q4K, false),
    ] {
        let r = run(qw, None, ty);
        assert_eq!(r.is_ok(), ok, "{:?} read as {ty:?}", B::dtype(qw));
    }
    // An input order is u32 (from_u32): the same numbers as f32 values
    // are refused rather than read as garbage column indices.
    let identity: Vec<u32> = (0..256).collect();
    let as_u32 = B::from_u32(&identity);
    assert_eq!(B::dtype(&as_u32), Dtype::U32);
    let as_values = B::from_slice(&identity.iter().map(|&i| i as f32).collect::<Vec<_>>());
    for (order, ok) in [(&as_u32, true), (&as_values, false)] {
        let r = run(&q4k, Some(order), GgufQuantType::Q4K);
        assert_eq!(r.is_ok(), ok, "order of {:?}", B::dtype(order));
    }
    assert!(B::load_gguf(&[0u8; 34 * 3], t, 2, 64).is_err(), "short");
    assert!(B::load_gguf(&[0u8; 34 * 4], t, 2, 48).is_err(), "ragged k");
}
