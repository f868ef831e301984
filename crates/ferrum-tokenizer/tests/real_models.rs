//! Tokenizers of the fetched models: GGUF-embedded vocabularies against the
//! same families' Hugging Face `tokenizer.json` (run by the `tokenizers`
//! crate, an independent implementation), special tokens and templates.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_formats::gguf::GgufFile;
use ferrum_tokenizer::Tokenizer;

fn models() -> PathBuf {
    ferrum_formats::model_cache_dir()
}

fn fetched(rel: &str) -> Option<PathBuf> {
    let p = models().join(rel);
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

/// Texts of llama.cpp's tokenizer tests plus code and chat-like text.
fn texts() -> Vec<String> {
    let mut t: Vec<String> = fetched("vocab/ggml-vocab-qwen2.gguf.inp")
        .map(|p| std::fs::read_to_string(p).unwrap())
        .unwrap_or_default()
        .split("\n__ggml_vocab_test__\n")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    t.push("fn main() {\n    println!(\"Hello, {}!\", name);\n}\n".into());
    t.push("The capital of France is Paris. Das Wetter in Zürich: 21°C — schön!".into());
    t.push("<|im_start|>user\nliteral special text<|im_end|>".into());
    t
}

fn cross_check(gguf: &str, hf_dir: &str) {
    let (Some(g), Some(h)) = (fetched(gguf), fetched(hf_dir)) else {
        return;
    };
    let ours = Tokenizer::from_gguf(&GgufFile::open(g).unwrap()).unwrap();
    let theirs = Tokenizer::from_hf_dir(h).unwrap();
    for text in texts() {
        let a = ours.encode(&text, false, false).unwrap();
        let b = theirs.encode(&text, false, false).unwrap();
        assert_eq!(a, b, "{gguf} vs {hf_dir} on {text:?}");
        assert_eq!(theirs.decode(&b, false), text, "{hf_dir} round trip");
    }
}

#[test]
fn qwen_gguf_bpe_matches_hf_tokenizers() {
    cross_check(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "tokenizers/qwen3",
    );
}

#[test]
fn llama3_gguf_bpe_matches_hf_tokenizers() {
    cross_check("vocab/ggml-vocab-llama-bpe.gguf", "tokenizers/llama3");
}

#[test]
fn gemma3_gguf_spm_matches_hf_tokenizers() {
    cross_check("gemma-3-270m-q4_k_m.gguf", "tokenizers/gemma3");
}

#[test]
fn smollm2_special_tokens_and_template() {
    let Some(p) = fetched("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&GgufFile::open(p).unwrap()).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    assert!(tok.kind().contains("smollm"), "{}", tok.kind());
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert!(tok.special().stop.contains(&im_end), "{:?}", tok.special());
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    // parse_special decides whether control-token text is one token.
    let text = "<|im_start|>user";
    let parsed = tok.encode(text, false, true).unwrap();
    assert_eq!(parsed[0], tok.token_id("<|im_start|>").unwrap());
    assert!(tok.encode(text, false, false).unwrap().len() > parsed.len());
    let ids = tok
        .encode("The capital of France is", false, false)
        .unwrap();
    assert_eq!(tok.decode(&ids, false), "The capital of France is");
    assert!(tok.check_ids(&[0, 49151]).is_ok());
    assert!(tok.check_ids(&[49152]).is_err());
}
