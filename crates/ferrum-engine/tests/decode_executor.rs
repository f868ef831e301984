//! Prefill on one model, decode through a `DecodeBackend` built from a
//! second instance: the hand-off must reproduce transformers' greedy tokens.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_engine::{GenericDecodeExecutor, Sampler, SamplingParams};
use ferrum_kernels::CpuBackend;
use ferrum_models::llama::LlamaModel;
use ferrum_models::{DecoderOnlyLLM, KvManaged, PagedDecodeBackend};
use ferrum_types::{DecodeBackend, TensorRef};

#[test]
fn prefill_hand_off_then_decode_matches_transformers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny/qwen3");
    if !dir.is_dir() {
        eprintln!("skipping: {} not found", dir.display());
        return;
    }
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let prompt = ids(&r["input_ids"]);

    let mut prefiller = KvManaged::new(LlamaModel::<CpuBackend>::from_hf_dir(&dir).unwrap());
    let logits = prefiller.prefill("s", &prompt);
    let kv = prefiller.export_kv("s").unwrap();
    prefiller.release("s");

    let backend =
        PagedDecodeBackend::new(LlamaModel::<CpuBackend>::from_hf_dir(&dir).unwrap(), "cpu");
    let mut exec = GenericDecodeExecutor::new(backend);
    let mut sampler = Sampler::new(SamplingParams::greedy(), &prompt);
    let out = exec
        .run("s", kv, prompt.len(), logits, &mut sampler, 16, |_| false)
        .unwrap();
    assert_eq!(out, ids(&r["greedy"]));
    assert!(!exec.backend().has_kv_cache("s"), "released after the run");
}

#[test]
fn bad_hand_offs_are_errors() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny/llama");
    if !dir.is_dir() {
        return;
    }
    let mut b =
        PagedDecodeBackend::new(LlamaModel::<CpuBackend>::from_hf_dir(&dir).unwrap(), "cpu");
    assert!(b.decode_step(1, 0, "nope").is_err());
    let t = TensorRef::new(vec![2, 3, 16], vec![0.0; 96]).unwrap();
    assert!(
        b.init_kv_cache("x", vec![(t.clone(), t.clone())], 3)
            .is_err(),
        "layer count"
    );
    assert!(
        b.init_kv_cache("x", vec![(t.clone(), t.clone()); 2], 4)
            .is_err(),
        "shape"
    );
    assert!(b.init_kv_cache("x", vec![(t.clone(), t); 2], 3).is_ok());
    assert_eq!(b.name(), "cpu");
    assert!(b.decode_step(1, 3, "x").unwrap().shape() == [1, 1, 512]);
}
