//! `gemm_quant` on GGUF blocks against dequantize-then-GEMM in f64, for every
//! block type, on random blocks, across the streaming (m ≤ 8) and tiled
//! paths and a tile boundary (n > 128).
//!
//! Tolerance: both sides use identical dequantized values, so only the f32
//! summation differs: `(k + 2) · u · Σ|a·w|` per output (u = 2⁻²⁴).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use ferrum_kernels::quant::dequantize;
use ferrum_kernels::{pack_bytes, Backend, CpuBackend, GgufQuantType, QuantKind, QuantWeights};
use rand::{rngs::StdRng, Rng, SeedableRng};

type B = CpuBackend;

/// Byte offsets of the f16 scales in each block (set to finite values so
/// random blocks decode to finite numbers).
fn scale_offsets(t: GgufQuantType) -> &'static [usize] {
    use GgufQuantType::*;
    match t {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
    }
}

fn random_blocks(rng: &mut StdRng, t: GgufQuantType, rows: usize, k: usize) -> Vec<u8> {
    let ty = t.ggml();
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    let mut bytes: Vec<u8> = (0..rows * k / bs * bb).map(|_| rng.random()).collect();
    for block in bytes.chunks_mut(bb) {
        for &o in scale_offsets(t) {
            let v = half::f16::from_f32(rng.random_range(-0.05f32..0.05));
            block[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

#[test]
fn every_block_type_matches_dequantized_gemm() {
    use GgufQuantType::*;
    let mut rng = StdRng::seed_from_u64(5);
    for t in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K] {
        let k = 2 * t.ggml().block_size();
        for &(m, n) in &[(1, 17), (3, 5), (8, 33), (9, 130), (40, 7)] {
            let bytes = random_blocks(&mut rng, t, n, k);
            let mut w = vec![0f32; n * k];
            dequantize(t.ggml(), &bytes, &mut w).unwrap();
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let qw = B::from_slice(&pack_bytes(&bytes));
            let mut out = B::from_slice(&vec![f32::NAN; m * n]);
            let weights = QuantWeights::<B> {
                qweight: &qw,
                scales: None,
                zeros: None,
                g_idx: None,
            };
            B::gemm_quant(
                &mut (),
                &B::from_slice(&a),
                &weights,
                &mut out,
                m,
                n,
                k,
                &QuantKind::Gguf { quant_type: t },
            )
            .unwrap();
            for i in 0..m {
                for j in 0..n {
                    let (mut want, mut bound) = (0f64, 0f64);
                    for c in 0..k {
                        let p = a[i * k + c] as f64 * w[j * k + c] as f64;
                        want += p;
                        bound += p.abs();
                    }
                    let got = out[i * n + j] as f64;
                    let tol = (k as f64 + 2.0) * 2f64.powi(-24) * bound + 1e-30;
                    assert!(
                        (got - want).abs() <= tol,
                        "{t:?} m{m} n{n} [{i},{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn short_buffers_and_ragged_k_are_errors() {
    let t = GgufQuantType::Q8_0;
    let qw = B::from_slice(&pack_bytes(&[0u8; 34 * 4]));
    let w = QuantWeights::<B> {
        qweight: &qw,
        scales: None,
        zeros: None,
        g_idx: None,
    };
    let kind = QuantKind::Gguf { quant_type: t };
    let a = B::alloc(64);
    let mut out = B::alloc(8);
    assert!(B::gemm_quant(&mut (), &a, &w, &mut out, 1, 2, 64, &kind).is_ok());
    assert!(
        B::gemm_quant(&mut (), &a, &w, &mut out, 1, 3, 64, &kind).is_err(),
        "weight too short"
    );
    assert!(
        B::gemm_quant(&mut (), &a, &w, &mut out, 1, 2, 48, &kind).is_err(),
        "k not whole blocks"
    );
}
