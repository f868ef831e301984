//! Hugging Face `tokenizer.json` folders, through the `tokenizers` crate.

use std::collections::HashSet;
use std::path::Path;

use ferrum_types::{FerrumError, Result};
use serde_json::Value;

use crate::{PieceStyle, SpecialTokens, END_OF_TURN_TEXTS};

pub(crate) struct HfTokenizer {
    /// Recognises special-token text in the input.
    parsing: tokenizers::Tokenizer,
    /// Treats special-token text as plain text (`parse_special = false`).
    literal: tokenizers::Tokenizer,
    json: Value,
    config: Value,
    generation: Value,
    special_ids: HashSet<u32>,
    pub chat_template: Option<String>,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s)
            .map(Some)
            .map_err(|e| FerrumError::bad_file(path, format!("invalid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FerrumError::io(path, e)),
    }
}

/// A token given as `"<s>"` or `{"content": "<s>", ...}`.
fn token_string(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}

impl HfTokenizer {
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let json = read_json(&path)?
            .ok_or_else(|| FerrumError::bad_file(&path, "tokenizer.json not found"))?;
        let mut parsing = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| FerrumError::bad_file(&path, format!("cannot load tokenizer: {e}")))?;
        // Some tokenizer.json files (sentence-transformers' among them) pad
        // every input to a fixed length and truncate it: `encode` returns
        // exactly the text's tokens, and callers that limit length (the
        // embedder, the context check) do it themselves with a clear count.
        parsing.with_padding(None);
        parsing
            .with_truncation(None)
            .map_err(|e| FerrumError::bad_file(&path, format!("cannot load tokenizer: {e}")))?;
        let mut literal = parsing.clone();
        literal.set_encode_special_tokens(true);
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        let chat_template = match config.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: take "default" or the first.
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or(list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            _ => None,
        };
        let special_ids = parsing
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        Ok(Self {
            parsing,
            literal,
            json,
            config,
            generation,
            special_ids,
            chat_template,
        })
    }

    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let tok = if parse_special {
            &self.parsing
        } else {
            &self.literal
        };
        tok.encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| FerrumError::invalid(format!("tokenization failed: {e}")))
    }

    pub fn token_text(&self, id: u32) -> Option<&str> {
        // `id_to_token` returns an owned String; look the borrowed form up
        // in the vocabulary JSON instead (added tokens first).
        self.added_token_text(id)
            .or_else(|| self.model_token_text(id))
    }

    fn added_token_text(&self, id: u32) -> Option<&str> {
        self.json
            .get("added_tokens")?
            .as_array()?
            .iter()
            .find(|t| t.get("id").and_then(Value::as_u64) == Some(id as u64))?
            .get("content")?
            .as_str()
    }

    fn model_token_text(&self, id: u32) -> Option<&str> {
        let vocab = self.json.get("model")?.get("vocab")?;
        match vocab {
            // BPE / WordPiece: {"token": id}
            Value::Object(map) => map
                .iter()
                .find(|(_, v)| v.as_u64() == Some(id as u64))
                .map(|(k, _)| k.as_str()),
            // Unigram: [["piece", score], ...]
            Value::Array(list) => list.get(id as usize)?.get(0)?.as_str(),
            _ => None,
        }
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.parsing.token_to_id(text)
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    pub fn vocab_size(&self) -> usize {
        self.parsing.get_vocab_size(true)
    }

    pub fn model_type(&self) -> &str {
        self.json
            .get("model")
            .and_then(|m| m.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("unknown")
    }

    /// Decoder types anywhere in `decoder` (it may be a Sequence).
    fn decoder_types(&self) -> Vec<&str> {
        fn walk<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
            if let Some(t) = v.get("type").and_then(Value::as_str) {
                out.push(t);
            }
            if let Some(list) = v.get("decoders").and_then(Value::as_array) {
                list.iter().for_each(|d| walk(d, out));
            }
        }
        let mut out = Vec::new();
        if let Some(d) = self.json.get("decoder") {
            walk(d, &mut out);
        }
        out
    }

    pub fn piece_style(&self) -> PieceStyle {
        let types = self.decoder_types();
        if types.contains(&"ByteLevel") {
            PieceStyle::ByteLevel
        } else if types.contains(&"WordPiece") || self.model_type() == "WordPiece" {
            PieceStyle::WordPiece
        } else {
            PieceStyle::Metaspace
        }
    }

    /// SentencePiece-converted tokenizers that prepend `▁` to the input.
    pub fn strips_leading_space(&self) -> bool {
        let text = |k: &str| self.json.get(k).map(Value::to_string).unwrap_or_default();
        let (norm, pre) = (text("normalizer"), text("pre_tokenizer"));
        norm.contains("\"Prepend\"") && norm.contains('\u{2581}')
            || pre.contains("\"Metaspace\"") && !pre.contains("\"never\"")
    }

    fn config_token(&self, key: &str) -> Option<u32> {
        self.config
            .get(key)
            .and_then(token_string)
            .and_then(|t| self.token_id(t))
    }

    pub fn special_tokens(&self) -> SpecialTokens {
        let mut stop = Vec::new();
        let eos = self.config_token("eos_token");
        stop.extend(eos);
        match self.generation.get("eos_token_id") {
            Some(Value::Number(n)) => stop.extend(n.as_u64().map(|v| v as u32)),
            Some(Value::Array(list)) => {
                stop.extend(list.iter().filter_map(Value::as_u64).map(|v| v as u32))
            }
            _ => {}
        }
        for text in END_OF_TURN_TEXTS {
            if let Some(id) = self.token_id(text).filter(|&id| self.is_special(id)) {
                stop.push(id);
            }
        }
        stop.sort_unstable();
        stop.dedup();
        SpecialTokens {
            bos: self.config_token("bos_token"),
            eos,
            eot: None,
            unk: self.config_token("unk_token"),
            sep: self.config_token("sep_token"),
            pad: self.config_token("pad_token"),
            stop,
        }
    }
}
