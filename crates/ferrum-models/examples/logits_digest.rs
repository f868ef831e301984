//! Prints a digest of the bits of every logit a GGUF model gives for a
//! text's first tokens, as one JSON line. The text comes tokenized (`ferrum
//! tokenize --json --add-special`), so this needs no tokenizer.
//!
//! `scripts/arm-check.sh` runs it natively and on AArch64 under qemu: the
//! CPU kernels promise x86's bits on Arm, so the two digests must be equal.
//! It needs only this crate (no tokenizer, server or CLI), so the Arm build
//! that CI emulates stays small. The tokens are evaluated as one
//! `ferrum perplexity` chunk: the first half as context (batched prefill),
//! then the second half in one verify pass whose logits are all kept.
//!
//! Usage: `logits_digest MODEL.gguf IDS.json [TOKENS]`: IDS.json holds the
//! text's token ids as one JSON array; the first TOKENS (64 by default) are
//! used.

use std::process::ExitCode;

use ferrum_formats::gguf::GgufFile;
use ferrum_kernels::CpuBackend;
use ferrum_models::{registry, DecoderOnlyLLM, KvManaged, KvPoolConfig};

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, ids, rest @ ..] = args.as_slice() else {
        return Err("usage: logits_digest MODEL.gguf IDS.json [TOKENS]".into());
    };
    let n: usize = match rest.first() {
        Some(s) => s
            .parse()
            .map_err(|_| format!("TOKENS: '{s}' is not a count"))?,
        None => 64,
    };
    let gguf = GgufFile::open(std::path::Path::new(model))?;
    let tokens: Vec<u32> = serde_json::from_str(&std::fs::read_to_string(ids)?)
        .map_err(|e| format!("{ids}: not a JSON array of token ids: {e}"))?;
    if n < 4 || tokens.len() < n {
        return Err(format!(
            "TOKENS must be at least 4 and at most the text's {}",
            tokens.len()
        )
        .into());
    }
    let llm = registry::load_gguf::<CpuBackend>(&gguf, &KvPoolConfig::default(), &|_, _| {})?;
    let mut model = KvManaged::new(llm);
    let half = n / 2;
    model.unified_forward(&[("d".to_string(), tokens[..half].to_vec(), 0, false)])?;
    let logits = model.forward_verify("d", &tokens[half..n]);
    // FNV-1a over the logits' bits: any one bit that moves changes it.
    let digest = logits.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        v.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    });
    Ok(format!(
        "{{\"tokens\":{n},\"logits\":{},\"digest\":\"{digest:016x}\"}}",
        logits.len()
    ))
}
