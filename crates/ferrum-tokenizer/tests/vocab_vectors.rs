//! llama.cpp's tokenizer test vectors: every text of every
//! `vocab/ggml-vocab-*.gguf.inp` must give exactly the ids in the matching
//! `.out` (add_special = false, parse_special = false), and decoding must
//! give the text back where the vocabulary allows.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::path::PathBuf;

use ferrum_formats::gguf::GgufFile;
use ferrum_tokenizer::Tokenizer;

fn vocab_dir() -> Option<PathBuf> {
    let base = ferrum_formats::model_cache_dir();
    let dir = base.join("vocab");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipping: {} not found (run scripts/fetch-models.sh vocab)",
            dir.display()
        );
        None
    }
}

/// `(text, expected ids)` pairs of one vocabulary.
fn cases(dir: &std::path::Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(dir.join(format!("{name}.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    // The file ends with a separator: the last split is empty.
    let texts = &texts[..ids.len()];
    texts.iter().map(|t| t.to_string()).zip(ids).collect()
}

#[test]
fn every_vector_of_every_vocabulary() {
    let Some(dir) = vocab_dir() else { return };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".inp").map(str::to_owned))
        .collect();
    names.sort();
    assert!(
        names.len() >= 15,
        "expected the fetched vocab set, found {names:?}"
    );
    let mut failures = Vec::new();
    let mut total = 0;
    for name in &names {
        let g = GgufFile::open(dir.join(name)).unwrap();
        let tok = match Tokenizer::from_gguf(&g) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        for (text, want) in cases(&dir, name) {
            total += 1;
            let got = tok.encode(&text, false, false).unwrap();
            if got != want {
                failures.push(format!("{name}: {text:?}\n  got  {got:?}\n  want {want:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{total} texts across {} vocabularies match", names.len());
}

#[test]
fn decode_inverts_encode_where_the_vocabulary_allows() {
    let Some(dir) = vocab_dir() else { return };
    // WordPiece lowercases and drops whitespace, so it cannot round-trip.
    for name in [
        "ggml-vocab-llama-bpe.gguf",
        "ggml-vocab-qwen2.gguf",
        "ggml-vocab-gpt-2.gguf",
        "ggml-vocab-command-r.gguf",
        "ggml-vocab-llama-spm.gguf",
        "ggml-vocab-phi-3.gguf",
        "ggml-vocab-gemma-4.gguf",
    ] {
        let tok = Tokenizer::from_gguf(&GgufFile::open(dir.join(name)).unwrap()).unwrap();
        for (text, _) in cases(&dir, name) {
            let ids = tok.encode(&text, false, false).unwrap();
            assert_eq!(tok.decode(&ids, false), text, "{name}");
            // Streaming gives the same text in pieces that are whole chars.
            let mut dec = tok.incremental_decoder();
            let mut streamed: String = ids.iter().map(|&id| dec.push(id)).collect();
            streamed.push_str(&dec.finish());
            // SentencePiece prepends a space to the input; the stream keeps
            // it (generated text is never at the start of a prompt).
            let spm_prefix = name.contains("spm") || name.contains("phi-3");
            let want = if spm_prefix && !text.is_empty() {
                format!(" {text}")
            } else {
                text.clone()
            };
            assert_eq!(streamed, want, "{name}: streamed");
        }
    }
}
