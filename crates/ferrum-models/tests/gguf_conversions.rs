//! GGUF files of every family the hf-tiny fixtures exercise beyond plain
//! Llama: Llama 3.1+ RoPE scaling (the `rope_freqs.weight` factors
//! llama.cpp's converter writes in place of the `llama3` parameters),
//! Qwen3-MoE and Mixtral (stacked `ffn_*_exps` experts), Phi-3 (fused
//! `attn_qkv` and `ffn_up`, partial rotary), Gemma 2 (soft-capping,
//! `1 + w` norms), DeepSeek V2 (latent attention with llama.cpp's split
//! `attn_k_b` / `attn_v_b`, shared experts), and, from this crate's own
//! fixtures, YaRN (`rope.scaling.*` keys), DeepSeek-V2-Lite (a plain
//! `attn_q`) and DeepSeek V3 (sigmoid gating, expert groups, `exp_probs_b`).
//!
//! `scripts/hf_llama_to_gguf.py` (run by `.ci/run`) converts each fixture
//! into `target/fixtures/NAME.gguf` the way llama.cpp's converter does.
//! Ferrum on that file must give the logits llama.cpp computed on it
//! (`data/NAME.llama-cpp.json`, from `scripts/llama_cpp_logits.py`), and
//! Ferrum's on the safetensors folder and transformers' (`reference.json`),
//! except for Gemma 2: llama.cpp derives its attention scale from the head
//! size (`1/√head_dim`) where transformers reads `query_pre_attn_scalar`,
//! which the fixture sets to another value; the GGUF path follows llama.cpp.
//!
//! Tolerance: 1e-4 of the largest logit, as in `hf_fixtures.rs` (f32
//! weights and K/V everywhere; the references differ from us only in the
//! order of f32 sums).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::{Path, PathBuf};

use ferrum_formats::gguf::GgufFile;
use ferrum_kernels::CpuBackend;
use ferrum_models::llama::LlamaModel;
use ferrum_models::{KvDtype, KvManaged, KvPoolConfig, PagedLlm};
use serde_json::Value;

const REL_TOL: f32 = 1e-4;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// Logits of every prompt position, `[len, vocab]` row-major.
fn all_logits<M: PagedLlm>(m: M, ids: &[u32]) -> Vec<f32> {
    KvManaged::new(m).try_verify("p", ids).unwrap()
}

/// `got` (all positions) against a reference's last row and top-5 per
/// position, within `rel` of the reference's largest logit.
fn check(name: &str, got: &[f32], r: &Value, rel: f32) {
    let last = floats(&r["logits_last"]);
    let vocab = last.len();
    let scale = last.iter().fold(0f32, |m, v| m.max(v.abs()));
    let tol = rel * scale;
    let rows: Vec<&[f32]> = got.chunks_exact(vocab).collect();
    let worst = rows[rows.len() - 1]
        .iter()
        .zip(&last)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= tol,
        "{name}: last logits differ by {worst} (tol {tol})"
    );
    for (p, top) in r["logits_all_top5"].as_array().unwrap().iter().enumerate() {
        let ids = top["ids"].as_array().unwrap();
        for (id, want) in ids.iter().zip(floats(&top["logits"])) {
            let g = rows[p][id.as_u64().unwrap() as usize];
            assert!(
                (g - want).abs() <= tol,
                "{name}: position {p}, token {id}: {g} vs {want}"
            );
        }
    }
}

/// The converted fixtures: whether their GGUF means the same model as the
/// safetensors folder (see the module note on Gemma 2), and the tolerance
/// against llama.cpp. Gemma's GeGLU makes it 1.5e-3: ggml's CPU GELU rounds
/// its input to f16 and reads the result from an f16 table
/// (`GGML_GELU_FP16` in `ggml-cpu/vec.h`), about 1e-3 relative per
/// activation; we measured 6e-4 of the largest logit. `None`: llama.cpp
/// cannot load the file: it tells DeepSeek-V2-Lite (no q LoRA) apart by
/// its 27 layers, so a 2-layer one asks for a `q_lora_rank` it lacks.
const CONVERTED: &[(&str, bool, Option<f32>)] = &[
    ("llama-rope-scaling", true, Some(REL_TOL)),
    ("qwen3-moe", true, Some(REL_TOL)),
    ("mixtral", true, Some(REL_TOL)),
    ("phi3", true, Some(REL_TOL)),
    ("gemma2", false, Some(1.5e-3)),
    ("deepseek-v2", true, Some(REL_TOL)),
    ("qwen2-yarn", true, Some(REL_TOL)),
    ("deepseek-v2-lite", true, None),
    ("deepseek-v3", true, Some(REL_TOL)),
];

#[test]
fn converted_gguf_files_match_llama_cpp_transformers_and_safetensors() {
    for &(name, same_model, tol) in CONVERTED {
        check_conversion(name, same_model, tol);
    }
}

/// A fixture folder: this crate's own (`tests/data/hf-tiny`, from
/// `scripts/make_extra_fixtures.py`) or the shared ones.
fn hf_fixture(name: &str) -> PathBuf {
    let own = root()
        .join("crates/ferrum-models/tests/data/hf-tiny")
        .join(name);
    if own.is_dir() {
        own
    } else {
        root().join("fixtures/hf-tiny").join(name)
    }
}

fn check_conversion(name: &str, same_model: bool, llama_cpp_tol: Option<f32>) {
    let gguf = root().join(format!("target/fixtures/{name}.gguf"));
    let hf = hf_fixture(name);
    if !hf.is_dir() {
        eprintln!("skipping: {} not found", hf.display());
        return;
    }
    if !gguf.is_file() {
        // CI generates the file first; anywhere else, say how to.
        assert!(
            std::env::var_os("CI").is_none(),
            "{} is missing in CI",
            gguf.display()
        );
        eprintln!(
            "skipping: run `python scripts/hf_llama_to_gguf.py {} {}` first",
            hf.display(),
            gguf.display()
        );
        return;
    }
    let pool = KvPoolConfig {
        dtype: Some(KvDtype::F32),
        ..KvPoolConfig::default()
    };
    let transformers = json(&hf.join("reference.json"));
    let ids: Vec<u32> = transformers["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let file = GgufFile::open(&gguf).unwrap();
    let from_gguf = all_logits(
        LlamaModel::<CpuBackend>::from_gguf_with(&file, &pool).unwrap(),
        &ids,
    );
    if let Some(tol) = llama_cpp_tol {
        let llama_cpp = json(&root().join(format!(
            "crates/ferrum-models/tests/data/{name}.llama-cpp.json"
        )));
        assert_eq!(llama_cpp["input_ids"], transformers["input_ids"]);
        check(
            &format!("{name}: GGUF vs llama.cpp"),
            &from_gguf,
            &llama_cpp,
            tol,
        );
    }
    if !same_model {
        return;
    }
    let from_hf = all_logits(
        LlamaModel::<CpuBackend>::from_hf_dir_with(&hf, &pool).unwrap(),
        &ids,
    );
    check(
        &format!("{name}: GGUF vs transformers"),
        &from_gguf,
        &transformers,
        REL_TOL,
    );
    let scale = from_hf.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = from_gguf
        .iter()
        .zip(&from_hf)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= REL_TOL * scale,
        "{name}: GGUF vs safetensors: logits differ by {worst} (scale {scale})"
    );
}

/// A GGUF whose `block_count` is four billion (a corrupt or hostile file)
/// is an error naming the field, found before anything is sized from it
/// (it used to grow the process to 3.7 GB and hang); a count past the
/// layers the file holds, and a NaN RoPE base, likewise.
#[test]
fn corrupt_sizes_are_errors_before_any_allocation() {
    let path = root().join("target/fixtures/llama-rope-scaling.gguf");
    if !path.exists() {
        eprintln!("skipping: {} not found", path.display());
        return;
    }
    let bytes = std::fs::read(&path).unwrap();
    // A u32 or f32 value right after its key and type word.
    let patched = |key: &str, value: [u8; 4]| {
        let at = bytes
            .windows(key.len())
            .position(|w| w == key.as_bytes())
            .unwrap()
            + key.len()
            + 4;
        let mut b = bytes.clone();
        b[at..at + 4].copy_from_slice(&value);
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("corrupt-{}-{key}.gguf", std::process::id()));
        std::fs::write(&out, b).unwrap();
        out
    };
    for (key, value, want) in [
        (
            "llama.block_count",
            u32::MAX.to_le_bytes(),
            "block_count 4294967295",
        ),
        (
            "llama.block_count",
            3u32.to_le_bytes(),
            "more layers than the file holds",
        ),
        (
            "llama.rope.freq_base",
            f32::NAN.to_le_bytes(),
            "rope.freq_base NaN",
        ),
    ] {
        let file = patched(key, value);
        let g = GgufFile::open(&file).unwrap();
        let err = match LlamaModel::<CpuBackend>::from_gguf(&g) {
            Ok(_) => panic!("{key}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "{key}: {err}");
    }
}
