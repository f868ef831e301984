//! Llama-family models on the GPU against the same models on the CPU, on
//! every causal fixture in `hf-tiny` (transformers' tiny checkpoints): the
//! prompt's last logits within normalized MSE 5e-4 of the CPU's, and the
//! 16 greedy tokens transformers produced. Skips where no GPU is found.
//! `FERRUM_HF_TINY` points at the fixtures when `../shared` is elsewhere.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_kernels::{CpuBackend, CudaBackend};
use ferrum_models::llama::LlamaModel;
use ferrum_models::{DecoderOnlyLLM, KvDtype, KvManaged, KvPoolConfig};
use serde_json::Value;

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

#[test]
fn gpu_models_match_cpu_and_transformers() {
    if !CudaBackend::device_present() {
        eprintln!("skipped: no CUDA GPU found");
        return;
    }
    CudaBackend::init(0).unwrap();
    for name in [
        "llama",
        "llama-rope-scaling",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma3",
    ] {
        let dir = fixtures().join(name);
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
        let num: f64 = c
            .iter()
            .zip(&g)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum();
        let den: f64 = c.iter().map(|a| (*a as f64).powi(2)).sum();
        let nmse = num / den;
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
