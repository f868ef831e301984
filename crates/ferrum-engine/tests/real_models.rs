//! Real GGUF models from `scripts/fetch-models.sh`, text in and text out
//! (tokenizer, model, greedy loop): continuations of a factual prompt.
//! Skipped (with a note) when the models have not been fetched. Here rather
//! than in ferrum-models, whose tests then need no tokenizer (the Arm
//! cross-build compiles that crate's dev-dependencies).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_formats::gguf::GgufFile;
use ferrum_kernels::CpuBackend;
use ferrum_models::llama::LlamaModel;
use ferrum_models::{DecoderOnlyLLM, KvManaged};
use ferrum_tokenizer::Tokenizer;

fn fetched(name: &str) -> Option<PathBuf> {
    let base = ferrum_formats::model_cache_dir();
    let p = base.join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} not found (run scripts/fetch-models.sh)",
            p.display()
        );
        None
    }
}

fn greedy(file: &str, prompt: &str, n: usize) -> Option<String> {
    let g = GgufFile::open(fetched(file)?).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let mut m = KvManaged::new(LlamaModel::<CpuBackend>::from_gguf(&g).unwrap());
    let ids = tok.encode(prompt, true, false).unwrap();
    let mut logits = m.prefill("s", &ids);
    let mut out = Vec::new();
    for i in 0..n {
        let t = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (j, &v)| if v > b.1 { (j, v) } else { b },
            )
            .0 as u32;
        out.push(t);
        logits = m.decode("s", t, (ids.len() + i) as u32);
    }
    let text = tok.decode(&out, true);
    eprintln!("{file}: {prompt:?} -> {text:?}");
    Some(text)
}

#[test]
fn smollm2_knows_the_capital_of_france() {
    if let Some(text) = greedy(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "The capital of France is",
        6,
    ) {
        assert!(text.starts_with(" Paris"), "{text:?}");
    }
}

#[test]
fn qwen_knows_it_too() {
    if let Some(text) = greedy(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "The capital of France is",
        6,
    ) {
        assert!(text.contains("Paris"), "{text:?}");
    }
}

#[test]
fn gemma3_matches_llama_cpp_greedy() {
    // Reference: llama.cpp's `llama-simple -n 6 "The capital of France is"`
    // on the same GGUF (this base model does not name Paris).
    if let Some(text) = greedy("gemma-3-270m-q4_k_m.gguf", "The capital of France is", 6) {
        assert_eq!(text, " the capital of the country of");
    }
}

/// A decode step at long context, whose keys are split over tasks and
/// merged, gives the logits that a prefill of the same tokens gives at its
/// last position, where attention runs unsplit. Gemma 3 adds its 512-key
/// sliding window on five layers of six. Unsplit, the two agree bitwise;
/// the merge sums in another order (~1e-7 relative), which the 16-bit
/// activation rounding of later layers carries to 1.6e-4 (SmolLM2) and
/// 2.7e-4 (Gemma) of the largest logit, as measured; a merge that weighs
/// one chunk 1% wrong moves SmolLM2's by 1.1e-3. That is with 16-bit
/// activations throughout (`set_int8_activations(false)`): 8-bit inputs turn
/// an ulp of difference into a whole rounding step now and then (1.0e-2 of
/// SmolLM2's largest logit), which would hide a wrong merge.
#[test]
fn long_context_decode_matches_prefill() {
    for file in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        let Some(path) = fetched(file) else {
            continue;
        };
        let g = GgufFile::open(path).unwrap();
        let tok = Tokenizer::from_gguf(&g).unwrap();
        let mut m = KvManaged::new(LlamaModel::<CpuBackend>::from_gguf(&g).unwrap());
        m.model_mut().set_int8_activations(false);
        let text: String = (0..400)
            .map(|i| format!("Item {i} costs {} dollars. ", i * 7 % 13))
            .collect();
        let ids = tok.encode(&text, true, false).unwrap();
        let n = 900;
        assert!(ids.len() > n, "{file}: only {} tokens", ids.len());
        let want = m.prefill("whole", &ids[..n]);
        m.prefill("stepped", &ids[..n - 1]);
        let got = m.decode("stepped", ids[n - 1], (n - 1) as u32);
        let scale = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        eprintln!("{file}: worst difference {worst} of logits up to {scale}");
        assert!(
            worst <= 5e-4 * scale,
            "{file}: {worst} (logits up to {scale})"
        );
    }
}
