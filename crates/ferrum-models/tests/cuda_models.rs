//! Llama-family models on the GPU against the same models on the CPU, on
//! every causal fixture in `hf-tiny` (transformers' tiny checkpoints): the
//! prompt's last logits within normalized MSE 5e-4 of the CPU's, and the
//! 16 greedy tokens transformers produced. Skips where no GPU is found.
//! `FERRUM_HF_TINY` points at the fixtures when `../shared` is elsewhere.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_kernels::{CpuBackend, CudaBackend, GgufQuantType};
use ferrum_models::llama::LlamaModel;
use ferrum_models::{DecoderOnlyLLM, KvDtype, KvManaged, KvPoolConfig};
use serde_json::Value;

mod common;

fn fixtures() -> PathBuf {
    std::env::var_os("FERRUM_HF_TINY").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/hf-tiny"),
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
            dtype: KvDtype::F32,
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

/// GPTQ / AWQ / FP8 / compressed-tensors folders on the GPU (their blocks on
/// the GGUF kernels, act-order through `gather_columns`) against their
/// dequantized weights on the CPU in f32 (FP8: the Q8_0-rounded weights it
/// runs as): the prompt's last logits within 1e-4 of the largest, as the
/// CUDA kernels keep activations in f32, and the same 16 greedy tokens.
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
        dtype: KvDtype::F32,
        ..KvPoolConfig::default()
    };
    let mut dirs: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
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
        let mut gpu = KvManaged::new(LlamaModel::<CudaBackend>::from_hf_dir(&dir).unwrap());
        let mut c = cpu.prefill("s", &ids);
        let mut g = gpu.prefill("s", &ids);
        let scale = c.iter().fold(0f32, |a, v| a.max(v.abs()));
        let worst = c
            .iter()
            .zip(&g)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{name}: GPU logits differ by {:.2e} of their scale",
            worst / scale
        );
        assert!(
            worst <= 1e-4 * scale,
            "{name}: GPU logits differ by {worst}"
        );
        for pos in ids.len()..ids.len() + 16 {
            let t = argmax(&c);
            assert_eq!(argmax(&g), t, "{name}: greedy token at {pos}");
            c = cpu.decode("s", t, pos as u32);
            g = gpu.decode("s", t, pos as u32);
        }
    }
}

/// A mixture of experts on Q4_K experts, which the GPU runs as grouped
/// GEMMs (`gemm_quant_experts`, `gather_add_rows`), against the CPU running
/// the experts one by one with f32 activations: the prompt's last logits
/// within normalized MSE 5e-4 and the same greedy picks for 8 steps. Then a
/// 40-sequence decode batch on the GPU (tiles of several tokens per
/// expert) equals each sequence alone (one row per expert) within 1e-4 of
/// the largest logit, as `moe_steps.rs` asks of the CPU. With a shared
/// expert and DeepSeek V3's sigmoid groups too.
#[test]
fn gpu_moe_matches_cpu_and_batches_equal_alone() {
    if !gpu() {
        return;
    }
    // Room for the 40 sequences at once (CUDA gives each a whole block).
    let forty = KvPoolConfig {
        sequences: 40,
        ..KvPoolConfig::default()
    };
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
            // The GPU's pick is the CPU's, or ties with it within 1e-4 of
            // the largest logit (random weights give flat logits).
            let t = argmax(&c);
            let scale = c.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                c[t as usize] - c[argmax(&g) as usize] <= 1e-4 * scale,
                "{what}: greedy token at {pos}"
            );
            c = cpu.decode("s", t, pos as u32);
            g = gpu.decode("s", t, pos as u32);
        }
        gpu.reset();
        let (alone, together) = common::decode_alone_and_batched(&mut gpu, &prompt, 40);
        common::assert_batch_equals_alone(what, &alone, &together);
    }
}
