//! A vocabulary read from GGUF metadata (`tokenizer.ggml.*`).

use std::collections::HashMap;

use ferrum_formats::gguf::{GgufFile, MetaValue};
use ferrum_types::Result;

/// GGUF token types (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_i64(v: i64) -> Self {
        match v {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// Which algorithm the vocabulary is for (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE (`gpt2`), or BPE over raw UTF-8 with `▁` for spaces
    /// (`gemma4`).
    Bpe,
    /// SentencePiece, score-driven merges with byte fallback (`llama`).
    Spm,
    /// WordPiece (`bert`).
    Wpm,
}

pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub model_name: String,
    pub pre: String,
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub types: Vec<TokenType>,
    pub token_to_id: HashMap<String, u32>,
    /// Merge ranks keyed by the two parts' token ids.
    pub merges: HashMap<(u32, u32), u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub lowercase: bool,
    pub max_token_len: usize,
}

fn strings(g: &GgufFile, key: &str) -> Result<Option<Vec<String>>> {
    let Some(v) = g.get(key) else { return Ok(None) };
    let arr = v
        .as_array()
        .ok_or_else(|| g.error(format!("{key} is not an array")))?;
    arr.iter()
        .map(|x| {
            x.as_str()
                .map(str::to_owned)
                .ok_or_else(|| g.error(format!("{key} holds a non-string")))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn id(g: &GgufFile, key: &str, n: usize) -> Option<u32> {
    g.get(key)
        .and_then(MetaValue::as_u64)
        .filter(|&v| (v as usize) < n)
        .map(|v| v as u32)
}

fn flag(g: &GgufFile, key: &str) -> Option<bool> {
    g.get(key).and_then(MetaValue::as_bool)
}

impl Vocab {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model_name = g.get_str("tokenizer.ggml.model")?.to_string();
        let kind = match model_name.as_str() {
            "gpt2" | "gemma4" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            "bert" => VocabKind::Wpm,
            other => {
                return Err(g.error(format!(
                    "tokenizer model '{other}' is not supported (gpt2, gemma4, llama and bert are)"
                )))
            }
        };
        let tokens = strings(g, "tokenizer.ggml.tokens")?
            .ok_or_else(|| g.error("tokenizer.ggml.tokens is missing"))?;
        let n = tokens.len();
        let scores = match g.get("tokenizer.ggml.scores").and_then(MetaValue::as_array) {
            Some(a) if a.len() == n => a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
            Some(_) => {
                return Err(
                    g.error("tokenizer.ggml.scores and tokenizer.ggml.tokens differ in length")
                )
            }
            None => vec![0.0; n],
        };
        let types = match g
            .get("tokenizer.ggml.token_type")
            .and_then(MetaValue::as_array)
        {
            Some(a) if a.len() == n => a
                .iter()
                .map(|v| TokenType::from_i64(v.as_i64().unwrap_or(1)))
                .collect(),
            Some(_) => {
                return Err(
                    g.error("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")
                )
            }
            None => vec![TokenType::Normal; n],
        };
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            // The first id wins when a vocabulary repeats a string.
            token_to_id.entry(t.clone()).or_insert(i as u32);
        }
        let mut merges = HashMap::new();
        if kind == VocabKind::Bpe {
            let list = strings(g, "tokenizer.ggml.merges")?
                .ok_or_else(|| g.error("BPE vocabulary without tokenizer.ggml.merges"))?;
            for (rank, m) in list.iter().enumerate() {
                // Parts are separated by the first space after the first
                // character (a part may itself start with a space).
                let split = m
                    .char_indices()
                    .skip(1)
                    .find(|&(_, c)| c == ' ')
                    .map(|(i, _)| i);
                let Some(i) = split else { continue };
                if let (Some(&a), Some(&b)) =
                    (token_to_id.get(&m[..i]), token_to_id.get(&m[i + 1..]))
                {
                    merges.entry((a, b)).or_insert(rank as u32);
                }
            }
        }
        // gemma4 vocabularies imply their own pre-tokenizer (llama.cpp does
        // the same); elsewhere a missing value means llama.cpp's default.
        let pre = match g.get("tokenizer.ggml.pre").and_then(MetaValue::as_str) {
            Some(p) => p.to_string(),
            None if model_name == "gemma4" => "gemma4".to_string(),
            None => "default".to_string(),
        };
        // Defaults by algorithm (as llama.cpp sets them), then file overrides.
        let (mut add_bos, add_space_default) = match kind {
            VocabKind::Spm => (true, true),
            VocabKind::Wpm => (true, false),
            VocabKind::Bpe => (
                matches!(pre.as_str(), "llama3" | "llama-v3" | "llama-bpe" | "tekken"),
                false,
            ),
        };
        add_bos = flag(g, "tokenizer.ggml.add_bos_token").unwrap_or(add_bos);
        let add_eos = flag(g, "tokenizer.ggml.add_eos_token").unwrap_or(false);
        let add_space_prefix =
            flag(g, "tokenizer.ggml.add_space_prefix").unwrap_or(add_space_default);
        let lowercase =
            flag(g, "tokenizer.ggml.normalizer.lowercase").unwrap_or(kind == VocabKind::Wpm);
        let max_token_len = tokens.iter().map(String::len).max().unwrap_or(0);
        let (bos_default, eos_default, unk_default, sep_default) = match kind {
            VocabKind::Spm => (Some(1), Some(2), Some(0), None),
            VocabKind::Wpm => (Some(101), None, Some(100), Some(102)),
            VocabKind::Bpe => (None, None, None, None),
        };
        let in_range = |v: Option<u32>| v.filter(|&v| (v as usize) < n);
        Ok(Self {
            kind,
            model_name,
            bos: id(g, "tokenizer.ggml.bos_token_id", n).or(in_range(bos_default)),
            eos: id(g, "tokenizer.ggml.eos_token_id", n).or(in_range(eos_default)),
            eot: id(g, "tokenizer.ggml.eot_token_id", n),
            eom: id(g, "tokenizer.ggml.eom_token_id", n),
            unk: id(g, "tokenizer.ggml.unknown_token_id", n).or(in_range(unk_default)),
            sep: id(g, "tokenizer.ggml.seperator_token_id", n)
                .or(id(g, "tokenizer.ggml.separator_token_id", n))
                .or(in_range(sep_default)),
            pad: id(g, "tokenizer.ggml.padding_token_id", n),
            pre,
            tokens,
            scores,
            types,
            token_to_id,
            merges,
            add_bos,
            add_eos,
            add_space_prefix,
            lowercase,
            max_token_len,
        })
    }

    pub fn id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The `<0xXX>` byte-fallback token for `b`.
    pub fn byte_token(&self, b: u8) -> Option<u32> {
        self.id(&format!("<0x{b:02X}>"))
    }
}
