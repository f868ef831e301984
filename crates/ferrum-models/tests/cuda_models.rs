//! Llama-family models on the GPU against the same models on the CPU, on
//! every causal fixture in `hf-tiny` (transformers' tiny checkpoints): the
//! prompt's last logits within normalized MSE 5e-4 of the CPU's, and the
//! 16 greedy tokens transformers produced. Skips where no GPU is found.
//! `FERRUM_HF_TINY` points at the fixtures where the checkout is not (the GPU machine).
//! Run with `--test-threads=1` on a GPU (as `scripts/gpu-check.sh` does):
//! tests share the device's one stream, and a step being captured into a
//! graph would take in another test's launches.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_kernels::{CpuBackend, CudaBackend, GgufQuantType};
use ferrum_models::llama::{preset, LlamaModel};
use ferrum_models::{DecoderOnlyLLM, KvDtype, KvManaged, KvPoolConfig};
use serde_json::Value;

mod common;

fn fixtures() -> PathBuf {
    std::env::var_os("FERRUM_HF_TINY").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny"),
        PathBuf::from,
    )
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Σ(got − want)² / Σwant².
fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    num / want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>()
}

/// Skips (with a note) only when there is no GPU; a GPU that fails to
/// initialise fails the test.
fn gpu() -> bool {
    if !CudaBackend::device_present() {
        eprintln!("skipped: no CUDA GPU found");
        return false;
    }
    CudaBackend::init(0).unwrap();
    true
}

#[test]
fn gpu_models_match_cpu_and_transformers() {
    if !gpu() {
        return;
    }
    for name in [
        "llama",
        "llama-rope-scaling",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma3",
        "gemma2",
        "phi3",
        "qwen3-moe",
        "mixtral",
        "deepseek-v2",
        "qwen2-yarn",
        "deepseek-v2-lite",
        "deepseek-v3",
    ] {
        // The shared fixtures, then this crate's own (tests/data/hf-tiny).
        let own = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/hf-tiny");
        let dir = [fixtures().join(name), own.join(name)]
            .into_iter()
            .find(|d| d.is_dir())
            .unwrap_or_else(|| fixtures().join(name));
        if !dir.is_dir() {
            eprintln!("skipping {name}: {} not found", dir.display());
            continue;
        }
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let ids: Vec<u32> = r["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let greedy: Vec<u32> = r["greedy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        // The CPU with an f32 KV cache, as CUDA keeps.
        let f32_kv = KvPoolConfig {
            dtype: Some(KvDtype::F32),
            ..KvPoolConfig::default()
        };
        let mut cpu =
            KvManaged::new(LlamaModel::<CpuBackend>::from_hf_dir_with(&dir, &f32_kv).unwrap());
        let mut gpu = KvManaged::new(LlamaModel::<CudaBackend>::from_hf_dir(&dir).unwrap());
        let c = cpu.prefill("s", &ids);
        let mut g = gpu.prefill("s", &ids);
        let nmse = nmse(&g, &c);
        eprintln!("{name}: prompt logits nmse {nmse:e}");
        assert!(nmse <= 5e-4, "{name}: nmse {nmse}");
        let mut got = Vec::new();
        for pos in ids.len()..ids.len() + greedy.len() {
            let t = argmax(&g);
            got.push(t);
            g = gpu.decode("s", t, pos as u32);
        }
        assert_eq!(got, greedy, "{name}: greedy tokens on the GPU");
    }
}

/// `target/fixtures/quant` (from `scripts/make_quant_fixtures.py`), or
/// where `FERRUM_QUANT_FIXTURES` points (the GPU check carries them).
fn quant_fixtures() -> PathBuf {
    std::env::var_os("FERRUM_QUANT_FIXTURES").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/fixtures/quant"),
        PathBuf::from,
    )
}

/// The GPU's greedy pick is the CPU's, or ties with it within `tol` of the
/// largest logit: the GPU's block GEMVs take 8-bit activations (q8_1), so
/// near-ties of random models may break the other way (8-bit inputs move
/// logits by up to ~1e-2 of the largest on the CPU too, see
/// `real_models.rs`).
fn assert_same_pick(what: &str, cpu: &[f32], gpu: &[f32], tol: f32) {
    let t = argmax(cpu);
    let scale = cpu.iter().fold(0f32, |m, v| m.max(v.abs()));
    let g = argmax(gpu);
    assert!(
        cpu[t as usize] - cpu[g as usize] <= tol * scale,
        "{what}: the GPU picks {g} ({}), the CPU {t} ({})",
        cpu[g as usize],
        cpu[t as usize]
    );
}

/// GPTQ / AWQ / FP8 / compressed-tensors folders on the GPU (their blocks on
/// the GGUF kernels, act-order through `gather_columns`, decode steps
/// captured into graphs) against their dequantized weights on the CPU in
/// f32 (FP8: the Q8_0-rounded weights it runs as), 16 greedy steps:
/// - with f32 activations (`set_f32_activations`), logits within 1e-4 of
///   the largest and the same tokens: everything but the 8-bit activations
///   held tight (on an H200, 2026-11-28: within 1.0e-6 at every step);
/// - as they run, with 8-bit activations (q8_1) in the GEMVs and bf16 in
///   the prompt's GEMMs: normalized MSE <= 2e-2. These tiny random models'
///   activations have outliers that leave few levels to the rest of a
///   32-value block: up to 7.2e-3 there (FP8 per-tensor, step 21), single
///   logits off by up to 10% of the largest, so greedy picks of near-ties
///   differ (a 3.8% tie did); a wrong nibble or scale gives 1e-1 and more,
///   and the kernels' own tests hold them to the exact products.
#[test]
fn gpu_runs_quantized_checkpoints_as_their_dequantized_weights() {
    if !gpu() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(quant_fixtures()) else {
        eprintln!(
            "skipping quantized checkpoints: {} not found",
            quant_fixtures().display()
        );
        return;
    };
    let f32_kv = KvPoolConfig {
        dtype: Some(KvDtype::F32),
        ..KvPoolConfig::default()
    };
    let mut dirs: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    dirs.sort();
    for (f32_activations, dir) in [true, false]
        .into_iter()
        .flat_map(|f| dirs.iter().map(move |d| (f, d)))
    {
        CudaBackend::set_f32_activations(f32_activations).unwrap();
        let mode = if f32_activations { "f32" } else { "q8_1" };
        let name = format!("{} ({mode})", dir.file_name().unwrap().to_string_lossy());
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let ids: Vec<u32> = r["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let reference = dir.join(if dir.join("q8_0").is_dir() {
            "q8_0"
        } else {
            "dequantized"
        });
        let mut cpu = KvManaged::new(
            LlamaModel::<CpuBackend>::from_hf_dir_with(&reference, &f32_kv).unwrap(),
        );
        let mut gpu = KvManaged::new(LlamaModel::<CudaBackend>::from_hf_dir(dir).unwrap());
        let mut c = cpu.prefill("s", &ids);
        let mut g = gpu.prefill("s", &ids);
        for pos in ids.len()..ids.len() + 16 {
            let e = nmse(&g, &c);
            let scale = c.iter().fold(0f32, |a, v| a.max(v.abs()));
            let worst = c
                .iter()
                .zip(&g)
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            eprintln!(
                "{name}: logits at {pos} nmse {e:e}, worst {:.2e} of the largest",
                worst / scale
            );
            let t = argmax(&c);
            if f32_activations {
                assert!(
                    worst <= 1e-4 * scale,
                    "{name}: logits differ by {worst} at {pos}"
                );
                assert_eq!(argmax(&g), t, "{name}: greedy token at {pos}");
            } else {
                assert!(e <= 2e-2, "{name}: nmse {e} at {pos}");
            }
            c = cpu.decode("s", t, pos as u32);
            g = gpu.decode("s", t, pos as u32);
        }
    }
    CudaBackend::set_f32_activations(false).unwrap();
}

/// A mixture of experts on Q4_K experts, which the GPU runs as grouped
/// GEMMs (`gemm_quant_experts`, `gather_add_rows`), against the CPU running
/// the experts one by one with f32 activations: the prompt's last logits
/// within normalized MSE 5e-4 and the same greedy picks (or near-ties,
/// `assert_same_pick`) for 8 steps. Then a decode batch on the GPU (tiles
/// of several tokens per expert) against each sequence alone (one row per
/// expert): with f32 activations, 40 sequences within 1e-4 of the largest
/// logit, as `moe_steps.rs` asks of the CPU; as they run (8-bit
/// activations), 24 sequences (every projection on the q8_1 GEMV) picking
/// the same token or a near-tie: an ulp the router rounds differently per
/// row count can move an 8-bit rounding step, and a near-tie of routing
/// scores then picks another expert (2% of the largest logit on an H200).
/// With a shared expert and DeepSeek V3's sigmoid groups too.
#[test]
fn gpu_moe_matches_cpu_and_batches_equal_alone() {
    if !gpu() {
        return;
    }
    // Room for the 40 sequences at once.
    let forty = KvPoolConfig { sequences: 40, ..KvPoolConfig::default() };
    for (what, cfg) in [
        ("qwen3-moe", common::small_moe()),
        ("shared+groups", common::small_moe_shared_groups()),
    ] {
        let mut c = LlamaModel::<CpuBackend>::random(
            cfg.clone(),
            GgufQuantType::Q4K,
            false,
            5,
            &KvPoolConfig::default(),
        )
        .unwrap();
        c.set_int8_activations(false);
        let mut cpu = KvManaged::new(c);
        let mut gpu = KvManaged::new(
            LlamaModel::<CudaBackend>::random(cfg, GgufQuantType::Q4K, false, 5, &forty).unwrap(),
        );
        let prompt = common::moe_prompt();
        let mut c = cpu.prefill("s", &prompt);
        let mut g = gpu.prefill("s", &prompt);
        for pos in prompt.len()..prompt.len() + 8 {
            let e = nmse(&g, &c);
            eprintln!("{what}: logits at {pos} nmse {e:e}");
            assert!(e <= 5e-4, "{what}: nmse {e} at {pos}");
            assert_same_pick(&format!("{what} at {pos}"), &c, &g, 2e-2);
            let t = argmax(&c);
            c = cpu.decode("s", t, pos as u32);
            g = gpu.decode("s", t, pos as u32);
        }
        gpu.reset();
        let (alone, together) = common::decode_alone_and_batched(&mut gpu, &prompt, 24);
        common::report_batch_difference(what, &alone, &together);
        for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
            assert_same_pick(&format!("{what}: sequence {i} batched"), a, b, 2e-2);
        }
        CudaBackend::set_f32_activations(true).unwrap();
        gpu.reset();
        let (alone, together) = common::decode_alone_and_batched(&mut gpu, &prompt, 40);
        CudaBackend::set_f32_activations(false).unwrap();
        common::assert_batch_equals_alone(&format!("{what} (f32)"), &alone, &together);
    }
}

/// Decode steps replayed from CUDA graphs give, bit for bit, the logits the
/// same steps give run eagerly (`FERRUM_CUDA_GRAPHS=0`): one sequence for
/// 12 steps, then a batch of four for 6, on a small Llama of Q4_K blocks;
/// and steps were in fact captured.
#[test]
fn gpu_graphs_replay_bit_for_bit() {
    if !gpu() {
        return;
    }
    let mut cfg = preset("llama3-8b").unwrap();
    (cfg.hidden, cfg.intermediate, cfg.layers, cfg.vocab) = (256, 512, 2, 1000);
    (cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.rotary_dims) = (4, 2, 64, 64);
    cfg.sliding = vec![false; 2];
    let prompt = common::moe_prompt();
    let run = |graphs: bool| {
        CudaBackend::set_graphs(graphs).unwrap();
        let model = LlamaModel::<CudaBackend>::random(
            cfg.clone(),
            GgufQuantType::Q4K,
            false,
            7,
            &KvPoolConfig::default(),
        )
        .unwrap();
        let mut m = KvManaged::new(model);
        let mut out = Vec::new();
        let mut g = m.prefill("a", &prompt);
        for pos in prompt.len()..prompt.len() + 12 {
            g = m.decode("a", argmax(&g), pos as u32);
            out.push(g.clone());
        }
        let alone = CudaBackend::captured_graphs();
        let ids: Vec<String> = (0..4).map(|i| format!("b{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            m.prefill(id, &prompt[..3 + i]);
        }
        for step in 0..6u32 {
            let batch: Vec<(String, u32, u32)> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| (id.clone(), 5 + step + i as u32, 3 + i as u32 + step))
                .collect();
            out.extend(m.decode_batch(&batch));
        }
        (out, [alone, CudaBackend::captured_graphs()])
    };
    let (with, captured) = run(true);
    let (without, none) = run(false);
    CudaBackend::set_graphs(true).unwrap();
    eprintln!("graphs: {captured:?} captured (alone, batched), {none:?} with capture off");
    assert!(
        captured.iter().all(|&c| c >= 1),
        "decode steps were not captured ({captured:?})"
    );
    assert_eq!(none, [0, 0]);
    assert_eq!(with.len(), without.len());
    for (i, (a, b)) in with.iter().zip(&without).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "step {i}: replayed logits differ from eager ones"
        );
    }
}

/// Embeddings take a backend like generation: the BERT fixture's encoder
/// on the GPU against the same encoder on the CPU (f32 end to end, so
/// only summation order differs: 1e-4 absolute on O(1) LayerNorm outputs;
/// the CPU encoder is held to transformers in `bert_fixture.rs`).
#[test]
fn gpu_encoder_matches_cpu() {
    use ferrum_models::registry::load_encoder;
    use ferrum_models::EncoderInput;
    let dir = fixtures().join("bert");
    if !gpu() || !dir.is_dir() {
        return;
    }
    let cpu = load_encoder::<CpuBackend>(&dir).unwrap();
    let gpu = load_encoder::<CudaBackend>(&dir).unwrap();
    let (a, b) = ([1u32, 7, 42, 99, 5, 2], [1u32, 3, 2]);
    let inputs = [
        EncoderInput { ids: &a, type_ids: None },
        EncoderInput { ids: &b, type_ids: Some(&[0, 1, 1]) },
    ];
    let (want, got) = (cpu.encode(&inputs).unwrap(), gpu.encode(&inputs).unwrap());
    for (w, g) in want.iter().zip(&got) {
        let d = w
            .iter()
            .zip(g)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        eprintln!("encoder: max |gpu - cpu| = {d:e}");
        assert!(d <= 1e-4, "{d}");
    }
}
