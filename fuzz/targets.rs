//! What each fuzz target does with its input, shared by the libFuzzer
//! targets (`fuzz_targets/`) and the stable run of the corpus in CI
//! (`crates/ferrum-models/tests/fuzz_corpus.rs`, which includes this file).
//! Each returns whether it accepted the input: loaded it and ran it.
//!
//! Input layouts (see `scripts/make_fuzz_corpus.py`):
//! - `gguf_file`: a GGUF file's bytes;
//! - `hf_checkpoint`: config.json, a NUL byte, then model.safetensors;
//! - `chat_template`: a Jinja chat template's text.

use std::path::{Path, PathBuf};

use ferrum_formats::gguf::GgufFile;
use ferrum_kernels::CpuBackend;
use ferrum_models::{registry, DecoderOnlyLLM, KvManaged, KvPoolConfig, PagedLlm};
use ferrum_tokenizer::chat::{ChatOptions, ChatTemplate, Message};
use ferrum_tokenizer::Tokenizer;

/// This process's folder for the files target `name` writes its input to.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrum-fuzz-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

/// A loaded model must also run: one short forward over its first tokens.
fn forward(model: Box<dyn PagedLlm>) -> bool {
    let vocab = model.config().vocab_size.min(4) as u32;
    let mut model = KvManaged::new(model);
    let tokens: Vec<u32> = (0..vocab).collect();
    model
        .unified_forward(&[("f".to_string(), tokens, 0, true)])
        .is_ok()
}

/// A small pool: the inputs' models are tiny, and a pool sized by a
/// mutated context length would only cost time.
fn pool() -> KvPoolConfig {
    KvPoolConfig {
        tokens: 64,
        sequences: 1,
        ..KvPoolConfig::default()
    }
}

/// Writes `input` as `scratch/model.gguf`, then parses, loads and runs it.
pub fn gguf_file(input: &[u8], scratch: &Path) -> bool {
    let path = scratch.join("model.gguf");
    std::fs::write(&path, input).expect("the scratch folder is writable");
    let Ok(g) = GgufFile::open(&path) else {
        return false;
    };
    let tokenizer = Tokenizer::from_gguf(&g).is_ok();
    match registry::load_gguf::<CpuBackend>(&g, &pool(), &|_, _| {}) {
        Ok(model) => forward(model) && tokenizer,
        Err(_) => false,
    }
}

/// Writes `input` as a Hugging Face folder in `scratch`, then loads and
/// runs it.
pub fn hf_checkpoint(input: &[u8], scratch: &Path) -> bool {
    let split = input.iter().position(|&b| b == 0).unwrap_or(input.len());
    let (config, rest) = input.split_at(split);
    let weights = rest.get(1..).unwrap_or_default();
    std::fs::write(scratch.join("config.json"), config).expect("the scratch folder is writable");
    std::fs::write(scratch.join("model.safetensors"), weights)
        .expect("the scratch folder is writable");
    match registry::load_hf_dir::<CpuBackend>(scratch, &pool(), &|_, _| {}) {
        Ok(model) => forward(model),
        Err(_) => false,
    }
}

/// Compiles `input` as a chat template and renders a short conversation.
pub fn chat_template(input: &[u8]) -> bool {
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hello"),
        Message::new("assistant", "Hi!"),
        Message::new("user", "What is 2+2?"),
    ];
    let opts = ChatOptions {
        add_generation_prompt: true,
        tools: None,
        bos_token: "<s>",
        eos_token: "</s>",
        kwargs: None,
    };
    ChatTemplate::new(&String::from_utf8_lossy(input))
        .and_then(|t| t.render(&messages, &opts))
        .is_ok()
}
