//! Quantized Hugging Face checkpoints (GPTQ, AWQ, FP8, compressed-tensors)
//! against the f32 weights they mean.
//!
//! `scripts/make_quant_fixtures.py` (run by `.ci/run`) quantizes the
//! hf-tiny llama and qwen3 checkpoints into `target/fixtures/quant/NAME`,
//! with the dequantized weights in `NAME/dequantized`. Checked here:
//! - the unpacked weights equal the dequantized ones bit for bit (every
//!   format's packing, zeros, scales and act-order groups; `.ci/run` also
//!   checks the GPTQ and compressed-tensors folders against llama.cpp's own
//!   dequantizers with `scripts/check_quant_fixtures.py`);
//! - logits on the quantized folder equal those on the dequantized one
//!   within [`INT_TOL`] (integer formats are converted exactly, so only the
//!   block kernels' 16-bit activations differ from the f32 GEMM), the 16
//!   greedy tokens are the same, and a batch gives what each sequence gives
//!   alone. FP8 becomes Q8_0 on the CPU: the same holds against its weights
//!   rounded to Q8_0 by llama.cpp's quantizer (`NAME/q8_0`), and against
//!   FP8's own weights the logits stay within [`FP8_TOL`];
//! - malformed checkpoints are errors that name the problem.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::{Path, PathBuf};

use ferrum_formats::hf_config::HfConfig;
use ferrum_formats::hf_quant::{load_linear, HfLinear};
use ferrum_formats::safetensors::SafeTensors;
use ferrum_kernels::CpuBackend;
use ferrum_models::llama::LlamaModel;
use ferrum_models::{DecoderOnlyLLM, KvDtype, KvManaged, KvPoolConfig};
use serde_json::Value;

/// Relative to the largest logit. The weights are exact; the block kernels
/// round each 32 activations to 16 bits (2^-16 of the block's largest
/// value), and these random two-layer models, whose weights are O(1)
/// rather than O(1/√k), amplify that to 2e-4..5e-4 (measured; the same
/// weights dequantized to f32 at load give 0 difference). Above the 1e-4
/// the issue asked for, for that reason alone.
const INT_TOL: f32 = 1e-3;

/// FP8 against its Q8_0 rounding: Q8_0 moves each weight by up to half a
/// step of its block's `max / 127`, 0.55% of the weights' norm here, which
/// these models amplify to 3..6% of the logits' scale (measured).
const FP8_TOL: f32 = 0.1;

fn fixtures() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures/quant");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!(
            "skipping: {} not found (run scripts/make_quant_fixtures.py, as .ci/run does)",
            dir.display()
        );
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

fn reference_ids(dir: &Path) -> Vec<u32> {
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    r["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn load(dir: &Path) -> KvManaged<LlamaModel<CpuBackend>> {
    let pool = KvPoolConfig {
        dtype: Some(KvDtype::F32),
        ..KvPoolConfig::default()
    };
    KvManaged::new(LlamaModel::<CpuBackend>::from_hf_dir_with(dir, &pool).unwrap())
}

fn argmax(x: &[f32]) -> u32 {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b }) as u32
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn unpacked_weights_equal_the_dequantized_checkpoint() {
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let cfg = HfConfig::load(dir.join("config.json")).unwrap();
        let scheme = cfg.quant().unwrap().unwrap();
        let st = SafeTensors::open_dir(&dir).unwrap();
        let deq = SafeTensors::open_dir(dir.join("dequantized")).unwrap();
        let mut checked = 0;
        for t in deq.names() {
            let (want, shape) = deq.to_f32(t).unwrap();
            let Some(w) = load_linear(&st, &scheme, t, want.len()).unwrap() else {
                continue;
            };
            let got = match w {
                HfLinear::Ints(g) => {
                    assert_eq!([g.n, g.k], shape[..], "{name} {t}");
                    g.dequantize()
                }
                HfLinear::Floats { values, .. } => values,
            };
            assert!(
                got == want,
                "{name} {t}: differs by {}",
                max_diff(&got, &want)
            );
            checked += 1;
        }
        let layers = cfg.num_hidden_layers;
        assert_eq!(checked, 7 * layers, "{name}: every projection is quantized");
    }
}

#[test]
fn quantized_logits_match_the_dequantized_weights() {
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let prompt = reference_ids(&dir);
        let mut q = load(&dir);
        // FP8 runs as Q8_0 on the CPU: its exact reference is the weights
        // rounded that way (by llama.cpp's quantizer); how far that moves
        // the logits from FP8's own weights is bounded below.
        let fp8 = dir.join("q8_0").is_dir();
        if fp8 {
            let want = load(&dir.join("dequantized")).forward_verify("a", &reference_ids(&dir));
            let got = q.forward_verify("a", &prompt);
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let worst = max_diff(&got, &want);
            eprintln!(
                "{name}: FP8 as Q8_0 moves the logits by {:.2e} of their scale",
                worst / scale
            );
            assert!(
                worst <= FP8_TOL * scale,
                "{name}: FP8 as Q8_0 moves the logits by {worst}"
            );
            q.reset();
        }
        let mut f = load(&dir.join(if fp8 { "q8_0" } else { "dequantized" }));

        let want = f.forward_verify("a", &prompt);
        let got = q.forward_verify("a", &prompt);
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let worst = max_diff(&got, &want);
        eprintln!(
            "{name}: logits differ by {:.2e} of their scale",
            worst / scale
        );
        assert!(
            worst <= INT_TOL * scale,
            "{name}: logits differ by {worst} (scale {scale})"
        );

        // 16 greedy tokens through the KV cache.
        let (mut lq, mut lf) = (q.prefill("g", &prompt), f.prefill("g", &prompt));
        for step in 0..16 {
            let t = argmax(&lf);
            assert_eq!(argmax(&lq), t, "{name}: greedy step {step}");
            let pos = (prompt.len() + step) as u32;
            lq = q.decode("g", t, pos);
            lf = f.decode("g", t, pos);
        }

        // Batched: two prefills and a decode batch equal each sequence alone
        // (the same kernels for any batch size).
        q.reset();
        let a = q.prefill("a", &prompt);
        let b = q.prefill("b", &prompt[..5]);
        let a2 = q.decode("a", 7, prompt.len() as u32);
        let b2 = q.decode("b", 9, 5);
        q.reset();
        let out = q
            .unified_forward(&[
                ("a".into(), prompt.clone(), 0, true),
                ("b".into(), prompt[..5].to_vec(), 0, true),
            ])
            .unwrap();
        assert_eq!(out[0].as_deref(), Some(&a[..]), "{name}: batched prefill");
        assert_eq!(out[1].as_deref(), Some(&b[..]), "{name}: batched prefill");
        let dec = q.decode_batch(&[("b".into(), 9, 5), ("a".into(), 7, prompt.len() as u32)]);
        assert_eq!((&dec[0], &dec[1]), (&b2, &a2), "{name}: decode batch");
    }
}

fn load_error(dir: &Path) -> String {
    match LlamaModel::<CpuBackend>::from_hf_dir(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn malformed_checkpoints_are_clear_errors() {
    let Some(good) = fixtures()
        .into_iter()
        .find(|d| d.ends_with("llama-gptq-int4-asym-actorder"))
    else {
        return;
    };
    let bad = good.parent().unwrap().with_file_name("quant-bad");
    let e = load_error(&bad.join("qweight-shape"));
    assert!(e.contains("q_proj") && e.contains("expected"), "{e}");
    let e = load_error(&bad.join("g_idx-range"));
    assert!(
        e.contains("q_proj.g_idx") && e.contains("out of range"),
        "{e}"
    );

    // Unsupported configurations name the field and value.
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(good.join("config.json")).unwrap()).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("quant-config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        good.join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    for (key, value, want) in [
        ("bits", serde_json::json!(3), "bits = 3"),
        (
            "quant_method",
            serde_json::json!("hqq"),
            "quant_method = \"hqq\"",
        ),
        ("group_size", serde_json::json!(48), "group_size = 48"),
    ] {
        let mut c = config.clone();
        c["quantization_config"][key] = value;
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
        let e = load_error(&dir);
        assert!(e.contains(want) && e.contains("config.json"), "{e}");
    }
}
