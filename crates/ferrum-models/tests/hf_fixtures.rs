//! Every Llama-family fixture in `fixtures/hf-tiny` (and those in
//! `tests/data/hf-tiny` made the same way: YaRN, DeepSeek-V2-Lite and
//! DeepSeek-V3 by `scripts/make_extra_fixtures.py`; configs written as the
//! Hub ships them by `scripts/make_hub_config_fixtures.py`) against the
//! outputs Hugging Face transformers computed for it (`reference.json`):
//! the last prompt position's logits, the top-5 logits of every prompt
//! position, and 16 greedy tokens with the logits that chose each.
//!
//! Tolerance: 1e-4 relative to the largest reference logit with an f32 KV
//! cache. The fixtures are f32 end to end; an f32 engine differs from
//! PyTorch only by summation order, which the README of the fixtures puts
//! at about 1e-4 absolute. With the default f16 cache: 2e-3 (see
//! [`F16_TOLERANCE`]).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::{Path, PathBuf};

use ferrum_kernels::CpuBackend;
use ferrum_models::llama::LlamaModel;
use ferrum_models::{
    BatchItem, DecoderOnlyLLM, KvDtype, KvManaged, KvPoolConfig, LogitsWanted, PagedLlm,
};
use serde_json::Value;

mod common;

const CAUSAL: &[&str] = &[
    "llama",
    "llama-rope-scaling",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "qwen3-moe",
    "mixtral",
    "phi3",
    "gemma2",
    "deepseek-v2",
    "qwen2-yarn",
    "deepseek-v2-lite",
    "deepseek-v3",
    "deepseek-v3-halves",
    // Configs as the Hub ships them (`scripts/make_hub_config_fixtures.py`).
    "phi4-mini-longrope",
    "phi3.5-longrope",
    "gemma3-hub",
    "gemma2-hub",
    "mixtral-swa",
    "llama-attn-bias",
    "llama-mlp-bias",
];

/// A fixture folder: this crate's own (`tests/data/hf-tiny`) or the shared
/// ones.
fn fixture(name: &str) -> Option<(PathBuf, Value)> {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let own = crate_dir.join("tests/data/hf-tiny").join(name);
    let dir = if own.is_dir() {
        own
    } else {
        crate_dir.join("../../fixtures/hf-tiny").join(name)
    };
    if !dir.is_dir() {
        eprintln!("skipping: {} not found", dir.display());
        return None;
    }
    let reference =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    Some((dir, reference))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(x: &[f32]) -> u32 {
    x.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0 as u32
}

/// Tolerance with an f16 KV cache, relative to the largest logit. Each
/// K/V value is rounded by at most 2^-11 of itself (4.9e-4); attention
/// outputs are convex sums of V rows and scores move by the same relative
/// amount, so a layer's output moves by about 5e-4 of its size, and the
/// fixtures' two layers by about twice that.
const F16_TOLERANCE: f32 = 2e-3;

/// Checks `logits` at the reference's top-5 ids.
fn check_top5(name: &str, what: &str, logits: &[f32], top: &Value, tol: f32) {
    let want_ids = ids(&top["ids"]);
    let want = floats(&top["logits"]);
    for (id, w) in want_ids.iter().zip(&want) {
        let got = logits[*id as usize];
        assert!(
            (got - w).abs() <= tol,
            "{name} {what}: logit of {id} is {got}, transformers {w}"
        );
    }
    assert_eq!(argmax(logits), want_ids[0], "{name} {what}: top-1");
}

fn load(dir: &Path, dtype: KvDtype) -> KvManaged<LlamaModel<CpuBackend>> {
    let pool = KvPoolConfig {
        dtype: Some(dtype),
        ..KvPoolConfig::default()
    };
    KvManaged::new(LlamaModel::<CpuBackend>::from_hf_dir_with(dir, &pool).unwrap())
}

#[test]
fn logits_and_greedy_tokens_match_transformers() {
    check_fixtures(KvDtype::F32, 1e-4);
}

#[test]
fn an_f16_kv_cache_stays_close_to_transformers() {
    check_fixtures(KvDtype::F16, F16_TOLERANCE);
}

/// Every causal fixture's logits and greedy tokens against the reference,
/// within `rel` of the largest reference logit.
fn check_fixtures(dtype: KvDtype, rel: f32) {
    for &name in CAUSAL {
        let Some((dir, r)) = fixture(name) else {
            continue;
        };
        let mut m = load(&dir, dtype);
        let prompt = ids(&r["input_ids"]);
        let want_last = floats(&r["logits_last"]);
        let scale = want_last.iter().fold(0f32, |a, v| a.max(v.abs()));
        let tol = rel * scale;

        let last = m.prefill("a", &prompt);
        let worst = last
            .iter()
            .zip(&want_last)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= tol,
            "{name} {dtype}: last-position logits differ by {worst} (scale {scale})"
        );

        // Every prompt position in one pass on a fresh sequence.
        let all = m.forward_verify("b", &prompt);
        let vocab = m.config().vocab_size;
        for (p, top) in r["logits_all_top5"].as_array().unwrap().iter().enumerate() {
            check_top5(
                name,
                &format!("position {p}"),
                &all[p * vocab..(p + 1) * vocab],
                top,
                tol,
            );
        }

        // Greedy decoding through the KV cache.
        let want_greedy = ids(&r["greedy"]);
        let mut logits = last;
        let mut got = Vec::new();
        for (k, top) in r["greedy_top5"].as_array().unwrap().iter().enumerate() {
            check_top5(name, &format!("greedy step {k}"), &logits, top, tol);
            let t = argmax(&logits);
            got.push(t);
            logits = m.decode("a", t, (prompt.len() + k) as u32);
        }
        assert_eq!(got, want_greedy, "{name} {dtype}: greedy tokens");
    }
}

/// Families whose batched paths are checked against single sequences: a
/// dense one, and the two mixtures of experts (their routing is per token,
/// their expert GEMMs per batch).
const BATCHED: &[&str] = &[
    "qwen2",
    "qwen3-moe",
    "mixtral",
    "deepseek-v2",
    "deepseek-v2-lite",
    "deepseek-v3",
];

#[test]
fn batched_paths_agree_with_single_sequences() {
    for name in BATCHED {
        batched_paths_agree(name);
    }
}

fn batched_paths_agree(name: &str) {
    let Some((dir, r)) = fixture(name) else {
        return;
    };
    let prompt = ids(&r["input_ids"]);
    // An f32 cache: with f16 a chunk re-reads its earlier chunk's K/V
    // rounded, which a whole prefill does not (up to 4e-4 on mixtral).
    let mut m = load(&dir, KvDtype::F32);
    // Reference: each sequence alone.
    let a = m.prefill("a", &prompt);
    let b = m.prefill("b", &prompt[..5]);
    let a2 = m.decode("a", 7, prompt.len() as u32);
    let b2 = m.decode("b", 9, 5);
    m.reset();
    // Same work through unified_forward (mixed prefills) and decode_batch.
    let out = m
        .unified_forward(&[
            ("a".into(), prompt.clone(), 0, true),
            ("b".into(), prompt[..5].to_vec(), 0, true),
        ])
        .unwrap();
    let close = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .all(|(p, q)| (p - q).abs() <= 1e-4 * (1.0 + q.abs()))
    };
    assert!(close(out[0].as_ref().unwrap(), &a) && close(out[1].as_ref().unwrap(), &b));
    let dec = m.decode_batch(&[("b".into(), 9, 5), ("a".into(), 7, prompt.len() as u32)]);
    assert!(close(&dec[0], &b2) && close(&dec[1], &a2));
    assert_eq!((m.kv_len("a"), m.kv_len("b")), (prompt.len() + 1, 6));

    // An intermediate chunk returns no logits; the final one continues it.
    m.reset();
    let out = m
        .unified_forward(&[("c".into(), prompt[..4].to_vec(), 0, false)])
        .unwrap();
    assert!(out[0].is_none());
    let out = m
        .unified_forward(&[("c".into(), prompt[4..].to_vec(), 4, true)])
        .unwrap();
    let diff = out[0]
        .as_ref()
        .unwrap()
        .iter()
        .zip(&a)
        .map(|(p, q)| (p - q).abs())
        .fold(0f32, f32::max);
    assert!(
        close(out[0].as_ref().unwrap(), &a),
        "{name}: chunked prefill differs by {diff}"
    );

    // Rolling back and re-decoding gives the same logits.
    m.truncate_kv("c", prompt.len() - 1);
    let again = m.decode("c", prompt[prompt.len() - 1], prompt.len() as u32 - 1);
    assert!(close(&again, &a));
}

/// A decode batch larger than one attention call's chunk of sequences
/// (16) gives each sequence what decoding it alone gives (to the f32
/// GEMM's rounding, which depends on the batch's row count).
#[test]
fn a_large_decode_batch_equals_its_sequences_alone() {
    for name in BATCHED {
        large_decode_batch(name);
    }
}

fn large_decode_batch(name: &str) {
    let Some((dir, r)) = fixture(name) else {
        return;
    };
    let prompt = ids(&r["input_ids"]);
    let mut m = KvManaged::new(LlamaModel::<CpuBackend>::from_hf_dir(&dir).unwrap());
    let (alone, together) = common::decode_alone_and_batched(&mut m, &prompt, 20);
    for (i, (x, y)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(x.len(), y.len());
        let worst = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs() / (1.0 + q.abs()))
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "sequence {i}: relative difference {worst}");
    }
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let Some((dir, _)) = fixture("llama") else {
        return;
    };
    let mut m = KvManaged::new(LlamaModel::<CpuBackend>::from_hf_dir(&dir).unwrap());
    assert!(m.try_prefill("x", &[]).is_err());
    assert!(m
        .try_prefill("x", &[100_000])
        .unwrap_err()
        .to_string()
        .contains("vocabulary"));
    assert!(m
        .try_decode("x", 1, 5)
        .unwrap_err()
        .to_string()
        .contains("holds only 0"));
    let cap = m.kv_capacity();
    let long = vec![1u32; cap + 1];
    let err = m.try_prefill("x", &long).unwrap_err();
    assert!(
        matches!(err, ferrum_types::FerrumError::ContextOverflow { .. }),
        "{err}"
    );
    assert_eq!(m.kv_len("x"), 0, "nothing written on error");
    // The engine's path: block tables come from outside and are checked.
    let pool = m.model().kv_pool();
    let mut logits = Vec::new();
    let item = |table: &'static [u32]| BatchItem {
        tokens: &[1, 2, 3],
        pos: 0,
        block_table: table,
        logits: LogitsWanted::Last,
    };
    let model = m.model_mut();
    let short = model.forward_paged(&[item(&[])], &mut logits).unwrap_err();
    assert!(short.to_string().contains("cannot hold 3"), "{short}");
    let outside: &'static [u32] = Box::leak(vec![pool.blocks as u32].into_boxed_slice());
    let err = model
        .forward_paged(&[item(outside)], &mut logits)
        .unwrap_err();
    assert!(err.to_string().contains("outside a pool"), "{err}");
    model.forward_paged(&[item(&[0])], &mut logits).unwrap();
    assert_eq!(logits.len(), model.config().vocab_size);
    let moe = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf-tiny/bert");
    let err = LlamaModel::<CpuBackend>::from_hf_dir(&moe)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not supported"), "{err}");
}

#[test]
fn loading_reports_each_layer_then_the_rest() {
    let Some((dir, _)) = fixture("llama") else {
        return;
    };
    let layers = ferrum_formats::hf_config::HfConfig::load(dir.join("config.json"))
        .unwrap()
        .num_hidden_layers;
    let seen = std::cell::RefCell::new(Vec::new());
    LlamaModel::<CpuBackend>::from_hf_dir_reporting(&dir, &KvPoolConfig::default(), &|d, t| {
        seen.borrow_mut().push((d, t))
    })
    .unwrap();
    let want: Vec<(usize, usize)> = (1..=layers + 1).map(|d| (d, layers + 1)).collect();
    assert_eq!(seen.into_inner(), want);
}

/// DeepSeek V2's cache holds the latent and the shared rope key only:
/// `kv_lora_rank + qk_rope_head_dim` values per token and layer (16 + 8 in
/// the fixture), where full K/V would be `2 · heads · head_dim` (2·4·24).
#[test]
fn latent_attention_caches_the_latent_only() {
    let Some((dir, _)) = fixture("deepseek-v2") else {
        return;
    };
    let m = LlamaModel::<CpuBackend>::from_hf_dir(&dir).unwrap();
    let c = m.config();
    assert_eq!((c.num_kv_heads, c.head_dim), (1, 16 + 8));
}

/// A copy of fixture `name` in a fresh folder with its config.json's keys
/// replaced by `over`'s (and the weights linked, not copied).
fn with_config(name: &str, over: &str) -> Option<PathBuf> {
    let (dir, _) = fixture(name)?;
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "cfg-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&out).unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let o: Value = serde_json::from_str(over).unwrap();
    for (k, v) in o.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(out.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(dir.join("model.safetensors"), out.join("model.safetensors")).unwrap();
    Some(out)
}

fn load_error(dir: &Path) -> String {
    match LlamaModel::<CpuBackend>::from_hf_dir(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// What changes the maths is read or refused, never dropped: a tensor no
/// step reads (biases a config turns off), an untied config without its
/// head, an activation without a kernel, a class of another family.
#[test]
fn checkpoints_that_would_compute_something_else_are_refused() {
    let Some(dir) = with_config("llama-mlp-bias", r#"{"mlp_bias": false}"#) else {
        return;
    };
    let err = load_error(&dir);
    assert!(err.contains("mlp.down_proj.bias"), "{err}");
    let Some(dir) = with_config("llama-attn-bias", r#"{"attention_bias": false}"#) else {
        return;
    };
    let err = load_error(&dir);
    assert!(err.contains("o_proj.bias"), "{err}");
    let Some(dir) = with_config("llama", r#"{"tie_word_embeddings": false}"#) else {
        return;
    };
    let err = load_error(&dir);
    assert!(err.contains("lm_head.weight is missing"), "{err}");
    let Some(dir) = with_config("llama", r#"{"hidden_act": "relu"}"#) else {
        return;
    };
    let err = load_error(&dir);
    assert!(err.contains("hidden_act \"relu\""), "{err}");
    let Some(dir) = with_config("llama", r#"{"architectures": ["FalconForCausalLM"]}"#) else {
        return;
    };
    let err = load_error(&dir);
    assert!(err.contains("FalconForCausalLM"), "{err}");
    // Another spelling of an accepted activation: swish is SiLU.
    let Some(dir) = with_config("llama", r#"{"hidden_act": "swish"}"#) else {
        return;
    };
    LlamaModel::<CpuBackend>::from_hf_dir(&dir).unwrap();
}

/// A weight stored transposed (shape `[64, 32]` where `[32, 64]` is meant:
/// the same element count) is an error naming it, not garbage; the
/// checkpoint's header is patched in place (the shape text keeps its
/// length).
#[test]
fn transposed_weights_are_refused() {
    let Some(dir) = with_config("llama-mlp-bias", "{}") else {
        return;
    };
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let key = br#"model.layers.0.self_attn.k_proj.weight":{"dtype":"F32","shape":[32,64]"#;
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("k_proj in the header");
    let shape = at + key.len() - b"[32,64]".len();
    bytes[shape..shape + 7].copy_from_slice(b"[64,32]");
    std::fs::write(&path, bytes).unwrap();
    let err = load_error(&dir);
    assert!(
        err.contains("k_proj.weight has shape [64, 32]") && err.contains("expected [32, 64]"),
        "{err}"
    );
}
