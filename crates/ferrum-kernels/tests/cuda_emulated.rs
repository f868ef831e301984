//! The CUDA kernels' own source (`src/cuda/kernels`), built for the CPU
//! against an emulation of the CUDA built-ins (`tests/cuda_emu`) and run
//! on random inputs: so their indexing and bit decoding are tested on every
//! machine, GPU or not. `tests/cuda_ops.rs` runs the same comparisons
//! through the real backend on a GPU.
//!
//! References: the q8_1 activation quantizer restated here; the quantized
//! GEMV against the exact dot product of the dequantized weights
//! (`quant::dequantize`) with the q8_1 values, in f64: float rounding of the
//! kernel's per-block partial sums is all that may differ (nmse <= 1e-9,
//! where one wrong nibble gives > 1e-4); the paged ops against
//! `CpuBackend`.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use ferrum_kernels::quant::{dequantize, random_blocks};
use ferrum_kernels::{
    encode_segments, AttnConfig, AttnSegment, Backend, CpuBackend as C, GgufQuantType, Heads,
    PagedKv, QkMode, QkNorm, QkPrep, Span,
};
use ferrum_types::GgmlType;
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};

/// The harness compiled with `defines` (a kernel variant), once per test
/// binary run.
fn harness(defines: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    let key = defines.join(" ");
    let built = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut built = built.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cuda_emu");
    let name = format!("cuda-emu-{}", key.replace(['-', '=', ' '], "_"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let status = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-w", "-o"])
        .arg(&out)
        .arg(dir.join("harness.cpp"))
        .args(defines)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C++ compiler `{cxx}` (set CXX): {e}"));
    assert!(status.success(), "the emulation harness did not compile");
    built.push((key, out.clone()));
    out
}

/// A fresh scratch folder for one harness run's files.
fn scratch() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "emu-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn put<T: Copy>(dir: &Path, name: &str, v: &[T]) -> String {
    let p = dir.join(name);
    // SAFETY: plain-old-data slices (f32, u32, u64, u8) as bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) };
    std::fs::write(&p, bytes).unwrap();
    p.to_string_lossy().into_owned()
}

fn get_f32(p: &str) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn run(bin: &Path, args: &[String]) {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "harness {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn rand_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - b).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| b.powi(2)).sum();
    num / den.max(1e-30)
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
    let e = nmse(got, &want);
    assert!(e <= tol, "{what}: nmse {e:e} > {tol:e}");
}

/// q8_1 as the kernel makes it: per 32 values, d = max|x| / 127 and
/// q = round-half-even(x / d).
fn quantize_ref(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.len());
    let mut d = Vec::new();
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = amax / 127.0;
        let qs: Vec<i8> = b
            .iter()
            .map(|&v| {
                if amax > 0.0 {
                    (v / s).round_ties_even() as i8
                } else {
                    0
                }
            })
            .collect();
        let sum: i32 = qs.iter().map(|&v| v as i32).sum();
        d.extend([s, s * sum as f32]);
        q.extend(qs);
    }
    (q, d)
}

/// Every block format with kernels and its name in kernel names, from the
/// one quant-format table (`GgufQuantType`).
fn types() -> Vec<(GgmlType, &'static str)> {
    GgufQuantType::all().map(|t| (t.ggml(), t.name())).collect()
}

/// The type named `name`.
fn ty(name: &str) -> (GgmlType, &'static str) {
    let t = GgufQuantType::from_name(name).unwrap();
    (t.ggml(), t.name())
}

#[test]
fn q8_1_quantization_matches_the_reference() {
    let bin = harness(&[]);
    let mut rng = StdRng::seed_from_u64(1);
    let (m, k) = (3, 256);
    let mut x = rand_vec(&mut rng, m * k);
    x[32..64].fill(0.0); // a block of zeros: scale 0, values 0
    x[70] = 5.0; // an outlier: its block's scale
    let dir = scratch();
    let xs = put(&dir, "x", &x);
    let (oq, od) = (dir.join("q"), dir.join("d"));
    let (oq, od) = (
        oq.to_string_lossy().into_owned(),
        od.to_string_lossy().into_owned(),
    );
    run(
        &bin,
        &[
            "quantize".into(),
            xs,
            m.to_string(),
            k.to_string(),
            oq.clone(),
            od.clone(),
        ],
    );
    let (wq, wd) = quantize_ref(&x);
    let got_q: Vec<i8> = std::fs::read(&oq)
        .unwrap()
        .iter()
        .map(|&b| b as i8)
        .collect();
    assert_eq!(got_q, wq);
    assert_eq!(get_f32(&od), wd);
}

/// Quantized GEMV (`quantize_q8_1` then `mmvq_<type>`) for every block type,
/// in the default variant and two others (columns a block, threads a
/// block), with a column count no variant divides, one row (`mmvq1_`) and
/// one and two tiles of rows.
#[test]
fn mmvq_matches_the_exact_dot_products_for_every_type_and_variant() {
    let variants: [&[&str]; 3] = [
        &[],
        &["-DMMVQ_COLS=2", "-DMMVQ_THREADS=64"],
        &["-DMMVQ_COLS=1", "-DMMVQ_THREADS=32"],
    ];
    let mut rng = StdRng::seed_from_u64(2);
    for (v, defines) in variants.into_iter().enumerate() {
        let bin = harness(defines);
        // Every type in the default; one of each layout in the others.
        let types = types()
            .into_iter()
            .filter(|(_, n)| v == 0 || ["q4_0", "q4_k", "q6_k"].contains(n));
        for (ty, name) in types {
            for (n, k, m) in [(7, 512, 1), (5, 1280, 3), (3, 512, 10)] {
                let bytes = random_blocks(ty, n * k / ty.block_size(), n as u64).unwrap();
                let mut w = vec![0f32; n * k];
                dequantize(ty, &bytes, &mut w).unwrap();
                let x = rand_vec(&mut rng, m * k);
                let (q, d) = quantize_ref(&x);
                let want: Vec<f64> = (0..m * n)
                    .map(|o| {
                        let (r, c) = (o / n, o % n);
                        (0..k)
                            .map(|i| {
                                let xv = q[r * k + i] as f64 * d[2 * ((r * k + i) / 32)] as f64;
                                w[c * k + i] as f64 * xv
                            })
                            .sum()
                    })
                    .collect();
                let dir = scratch();
                let out = dir.join("out").to_string_lossy().into_owned();
                run(
                    &bin,
                    &[
                        "mmvq".into(),
                        name.into(),
                        put(&dir, "w", &bytes),
                        put(&dir, "x", &x),
                        m.to_string(),
                        n.to_string(),
                        k.to_string(),
                        out.clone(),
                    ],
                );
                let e = nmse(&get_f32(&out), &want);
                assert!(
                    e <= 1e-9,
                    "mmvq {name} {defines:?} m={m} n={n} k={k}: nmse {e:e}"
                );
            }
        }
    }
}

/// Every expert of a mixture step in one launch: tiles of up to eight rows
/// of three experts in no order; a row no tile covers keeps its value.
#[test]
fn mmvq_experts_match_each_expert_alone() {
    let bin = harness(&[]);
    let mut rng = StdRng::seed_from_u64(3);
    let (n, k, experts) = (6, 512, 3);
    for (ty, name) in [ty("q4_0"), ty("q4_k"), ty("q6_k"), ty("q8_0")] {
        let per = n * k / ty.block_size() * ty.block_bytes();
        let mut bytes = Vec::new();
        let mut w = Vec::new();
        for e in 0..experts {
            let b = random_blocks(ty, n * k / ty.block_size(), 20 + e as u64).unwrap();
            let mut d = vec![0f32; n * k];
            dequantize(ty, &b, &mut d).unwrap();
            bytes.extend(b);
            w.push(d);
        }
        // (expert, first row, rows); row 12 is left out. Then one token's
        // experts: tiles of one row (the one-row kernel).
        for plan in [
            &[(2usize, 0usize, 1usize), (0, 1, 8), (1, 9, 3), (0, 13, 2)][..],
            &[(1, 3, 1), (2, 0, 1), (0, 7, 1)],
        ] {
            check_experts(&bin, &mut rng, name, &bytes, &w, per, plan, n, k);
        }
    }
}

/// Runs one grouped launch for `plan` ((expert, first row, rows)) and
/// checks it: covered rows against the exact products, the others as they
/// were.
#[allow(clippy::too_many_arguments)]
fn check_experts(
    bin: &Path,
    rng: &mut StdRng,
    name: &str,
    bytes: &[u8],
    w: &[Vec<f32>],
    per: usize,
    plan: &[(usize, usize, usize)],
    n: usize,
    k: usize,
) {
    let total = 15;
    let x = rand_vec(rng, total * k);
    let before = rand_vec(rng, total * n);
    let (q, d) = quantize_ref(&x);
    let mut want: Vec<f64> = before.iter().map(|&v| v as f64).collect();
    for &(e, r0, rows) in plan {
        for r in r0..r0 + rows {
            for c in 0..n {
                want[r * n + c] = (0..k)
                    .map(|i| {
                        w[e][c * k + i] as f64
                            * q[r * k + i] as f64
                            * d[2 * ((r * k + i) / 32)] as f64
                    })
                    .sum();
            }
        }
    }
    let tiles: Vec<u64> = plan
        .iter()
        .flat_map(|&(e, r0, rows)| [e as u64, r0 as u64 | (rows as u64) << 32])
        .collect();
    let dir = scratch();
    let out = put(&dir, "out", &before);
    run(
        bin,
        &[
            "experts".into(),
            name.into(),
            put(&dir, "w", bytes),
            put(&dir, "x", &x),
            put(&dir, "tiles", &tiles),
            n.to_string(),
            k.to_string(),
            out.clone(),
            per.to_string(),
        ],
    );
    let got = get_f32(&out);
    for r in 0..total {
        if !plan
            .iter()
            .any(|&(_, r0, rows)| (r0..r0 + rows).contains(&r))
        {
            assert_eq!(
                got[r * n..(r + 1) * n],
                before[r * n..(r + 1) * n],
                "{name}: row {r}"
            );
        }
    }
    let e = nmse(&got, &want);
    assert!(e <= 1e-9, "mmvq_experts {name} {plan:?}: nmse {e:e}");
}

/// Weights to bf16 for the tensor-core GEMM: the dequantized value rounded
/// to nearest even, exactly.
#[test]
fn bf16_dequantization_rounds_each_value() {
    let bin = harness(&[]);
    for (ty, name) in types() {
        let (n, k) = (3, 512);
        let bytes = random_blocks(ty, n * k / ty.block_size(), 5).unwrap();
        let mut w = vec![0f32; n * k];
        dequantize(ty, &bytes, &mut w).unwrap();
        let dir = scratch();
        let out = dir.join("out").to_string_lossy().into_owned();
        run(
            &bin,
            &[
                "dequant_bf16".into(),
                name.into(),
                put(&dir, "w", &bytes),
                n.to_string(),
                k.to_string(),
                out.clone(),
            ],
        );
        let got: Vec<u16> = std::fs::read(&out)
            .unwrap()
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let want: Vec<u16> = w
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        assert_eq!(got, want, "dequant_bf16 {name}");
    }
}

/// A pool of `blocks` blocks with random contents and, per sequence, a
/// shuffled block table.
struct Pools {
    k: Vec<f32>,
    v: Vec<f32>,
    tables: Vec<Vec<u32>>,
}

fn pools(rng: &mut StdRng, lens: &[usize], bs: usize, nkv: usize, hd: usize) -> Pools {
    let need: Vec<usize> = lens.iter().map(|l| l.div_ceil(bs)).collect();
    let blocks: usize = need.iter().sum::<usize>() + 2;
    let mut ids: Vec<u32> = (0..blocks as u32).collect();
    ids.shuffle(rng);
    let mut at = 0;
    let tables = need
        .iter()
        .map(|&n| {
            at += n;
            ids[at - n..at].to_vec()
        })
        .collect();
    let len = blocks * nkv * bs * hd;
    Pools {
        k: rand_vec(rng, len),
        v: rand_vec(rng, len),
        tables,
    }
}

/// Paged attention over shuffled block tables: several sequences in one
/// launch (decode and a chunk of prefill), GQA, split keys, a sliding
/// window with soft-capping, shared-memory tiles or none.
#[test]
fn paged_attention_matches_the_cpu() {
    let bin = harness(&[]);
    let mut rng = StdRng::seed_from_u64(4);
    // (q_lens, kv_lens, nh, nkv, hd, bs, window, tile, splits)
    type Case<'a> = (
        &'a [usize],
        &'a [usize],
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
    );
    let cases: [Case; 5] = [
        (&[1, 1, 1], &[37, 5, 64], 8, 2, 64, 4, 0, 32, 1),
        (&[1, 1], &[300, 90], 4, 1, 128, 16, 0, 32, 3),
        (&[1], &[200], 4, 4, 32, 8, 50, 32, 4),
        (&[5, 1], &[21, 9], 6, 2, 64, 4, 0, 0, 1),
        (&[3], &[40], 2, 1, 256, 16, 8, 16, 1),
    ];
    for (q_lens, kv_lens, nh, nkv, hd, bs, window, tile, splits) in cases {
        let p = pools(&mut rng, kv_lens, bs, nkv, hd);
        let cfg = AttnConfig {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            causal: true,
            scale: 1.0 / (hd as f32).sqrt(),
            kv_seq_stride: 0,
            sliding_window: window,
            softcap: if window > 0 { 0.7 } else { 0.0 },
        };
        let mut offset = 0;
        let segs: Vec<AttnSegment> = q_lens
            .iter()
            .zip(kv_lens)
            .zip(&p.tables)
            .map(|((&ql, &kvl), t)| {
                let s = AttnSegment {
                    pages: PagedKv { block_table: t, block_size: bs },
                    offset,
                    q_len: ql,
                    kv_len: kvl,
                    pos_offset: kvl - ql,
                };
                offset += nh * ql * hd;
                s
            })
            .collect();
        let q = rand_vec(&mut rng, offset);
        let before = rand_vec(&mut rng, offset);
        let mut want = before.clone();
        let (ck, cv) = (C::from_slice(&p.k), C::from_slice(&p.v));
        for s in &segs {
            let len = nh * s.q_len * hd;
            let cq = C::from_slice(&q[s.offset..s.offset + len]);
            let mut co = C::alloc(len);
            C::paged_attention(
                &mut (),
                &cq,
                [&ck, &cv],
                &s.pages,
                &mut co,
                Span {
                    q_len: s.q_len,
                    kv_len: s.kv_len,
                    pos_offset: s.pos_offset,
                },
                &cfg,
            );
            want[s.offset..s.offset + len].copy_from_slice(&C::to_vec(&co, len));
        }
        let mut meta = Vec::new();
        encode_segments(&mut meta, &segs);
        let group = nh / nkv;
        let maxq = *q_lens.iter().max().unwrap();
        let qblocks = (maxq * group).div_ceil(4);
        let dir = scratch();
        let out = put(&dir, "out", &before);
        let mut args: Vec<String> = vec![
            "attention".into(),
            put(&dir, "q", &q),
            put(&dir, "k", &p.k),
            put(&dir, "v", &p.v),
            put(&dir, "meta", &meta),
        ];
        args.extend(
            [segs.len(), qblocks, nh, nkv, hd, bs, 1]
                .iter()
                .map(|v| v.to_string()),
        );
        args.push(cfg.scale.to_string());
        args.extend([window, tile].iter().map(|v| v.to_string()));
        args.push(cfg.softcap.to_string());
        args.extend([splits, offset / hd, maxq].iter().map(|v| v.to_string()));
        args.push(out.clone());
        run(&bin, &args);
        assert_close(
            &format!(
                "attention q{q_lens:?} kv{kv_lens:?} h{nh}/{nkv} hd{hd} bs{bs} splits{splits}"
            ),
            &get_f32(&out),
            &want,
            1e-10,
        );
    }
}

/// A decode batch's Q/K/V into rotated queries and pool rows
/// (`rows_qkv`), and a prefill chunk's K/V into the pools
/// (`paged_kv_append`), against the CPU.
#[test]
fn paged_writes_match_the_cpu() {
    let bin = harness(&[]);
    let mut rng = StdRng::seed_from_u64(5);
    let (nh, nkv, hd, bs) = (4, 2, 32, 4);
    let half = hd / 2;
    let lens = [9usize, 3, 17];
    let p = pools(&mut rng, &lens, bs, nkv, hd);
    let cos = rand_vec(&mut rng, 20 * half);
    let sin = rand_vec(&mut rng, 20 * half);
    let (qn, kn) = (rand_vec(&mut rng, hd), rand_vec(&mut rng, hd));
    let rows = lens.len();
    let (q, k, v) = (
        rand_vec(&mut rng, rows * nh * hd),
        rand_vec(&mut rng, rows * nkv * hd),
        rand_vec(&mut rng, rows * nkv * hd),
    );
    let segs: Vec<AttnSegment> = lens
        .iter()
        .zip(&p.tables)
        .enumerate()
        .map(|(r, (&len, t))| AttnSegment {
            pages: PagedKv { block_table: t, block_size: bs },
            offset: r * nh * hd,
            q_len: 1,
            kv_len: len,
            pos_offset: len - 1,
        })
        .collect();
    let cfg = AttnConfig {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        causal: true,
        scale: 1.0,
        kv_seq_stride: 0,
        sliding_window: 0,
        softcap: 0.0,
    };
    for mode in [QkMode::NormRope, QkMode::Rope] {
        let b = C::from_slice;
        let (cq, ck, cv, cqn, ckn, ccos, csin) =
            (b(&q), b(&k), b(&v), b(&qn), b(&kn), b(&cos), b(&sin));
        let (mut cqo, mut ckp, mut cvp) = (C::alloc(q.len()), b(&p.k), b(&p.v));
        let prep = QkPrep {
            norm: (mode == QkMode::NormRope).then_some(QkNorm { q: &cqn, k: &ckn, eps: 1e-6 }),
            cos: &ccos,
            sin: &csin,
        };
        let (qkv, pools) = ([&cq, &ck, &cv], [&mut ckp, &mut cvp]);
        C::decode_rows_qkv(&mut (), qkv, prep, &mut cqo, pools, &segs, &cfg);
        let mut meta = Vec::new();
        encode_segments(&mut meta, &segs);
        let dir = scratch();
        let (qo, kp, vp) = (
            put(&dir, "qo", &vec![0f32; q.len()]),
            put(&dir, "kp", &p.k),
            put(&dir, "vp", &p.v),
        );
        let mut args: Vec<String> = vec!["rows_qkv".into()];
        for (name, data) in [
            ("q", &q),
            ("k", &k),
            ("v", &v),
            ("qn", &qn),
            ("kn", &kn),
            ("cos", &cos),
            ("sin", &sin),
        ] {
            args.push(put(&dir, name, data));
        }
        args.extend([qo.clone(), kp.clone(), vp.clone(), put(&dir, "meta", &meta)]);
        args.extend([segs.len(), nh, nkv, hd, bs].iter().map(|v| v.to_string()));
        args.extend(["1e-6".to_string(), (mode as i32).to_string()]);
        run(&bin, &args);
        let what = format!("rows_qkv {mode:?}");
        assert_close(&what, &get_f32(&qo), &C::to_vec(&cqo, q.len()), 1e-12);
        assert_close(&what, &get_f32(&kp), &C::to_vec(&ckp, p.k.len()), 1e-12);
        assert_close(&what, &get_f32(&vp), &C::to_vec(&cvp, p.v.len()), 1e-12);
    }

    // Five new positions from 6 (crossing blocks) of the third sequence.
    let (pos, nt) = (6, 5);
    let pages = PagedKv {
        block_table: &p.tables[2],
        block_size: bs,
    };
    let (nk, nv) = (
        rand_vec(&mut rng, nkv * nt * hd),
        rand_vec(&mut rng, nkv * nt * hd),
    );
    let (mut ckp, mut cvp) = (C::from_slice(&p.k), C::from_slice(&p.v));
    let (cnk, cnv) = (C::from_slice(&nk), C::from_slice(&nv));
    C::paged_kv_append(
        &mut (),
        [&mut ckp, &mut cvp],
        &pages,
        pos,
        [&cnk, &cnv],
        Heads { tokens: nt, heads: nkv, head_dim: hd },
    );
    let seg = AttnSegment {
        pages,
        offset: 0,
        q_len: nt,
        kv_len: pos + nt,
        pos_offset: pos,
    };
    let mut meta = Vec::new();
    encode_segments(&mut meta, &[seg]);
    let dir = scratch();
    let (kp, vp) = (put(&dir, "kp", &p.k), put(&dir, "vp", &p.v));
    let mut args = vec![
        "kv_append".to_string(),
        kp.clone(),
        vp.clone(),
        put(&dir, "nk", &nk),
        put(&dir, "nv", &nv),
        put(&dir, "meta", &meta),
    ];
    args.extend([nt, nkv, hd, bs].iter().map(|v| v.to_string()));
    run(&bin, &args);
    assert_close(
        "kv append k",
        &get_f32(&kp),
        &C::to_vec(&ckp, p.k.len()),
        0.0,
    );
    assert_close(
        "kv append v",
        &get_f32(&vp),
        &C::to_vec(&cvp, p.v.len()),
        0.0,
    );
}
