//! Sentence embeddings: tokenize, run a BERT encoder over packed batches,
//! pool and normalise the way the checkpoint's sentence-transformers
//! configuration (`modules.json`, `1_Pooling/config.json`,
//! `sentence_bert_config.json`) says.

use std::path::Path;

use ferrum_kernels::Backend;
use ferrum_models::bert::{l2_normalize, Pooling};
use ferrum_models::registry::load_encoder;
use ferrum_models::{Encoder, EncoderInput};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FerrumError, Result};
use serde_json::Value;

/// Inputs per encoder pass: large enough that the projections are real
/// GEMMs, small enough that one pass stays short.
pub const BATCH: usize = 32;

/// One thing to embed.
#[derive(Clone, Debug, PartialEq)]
pub enum EmbedInput {
    /// Text, tokenized with the model's `[CLS]`/`[SEP]`.
    Text(String),
    /// Token ids used exactly as given (OpenAI's token-array input).
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    pub vector: Vec<f32>,
    /// Tokens the encoder saw (after truncation).
    pub tokens: usize,
    pub truncated: bool,
}

/// An input tokenized and checked, ready for the encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    pub ids: Vec<u32>,
    pub truncated: bool,
}

/// An encoder with its tokenizer and the sentence-transformers steps
/// around it, on whichever backend [`Embedder::load`] was given.
pub struct Embedder {
    model: Box<dyn Encoder>,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    max_tokens: usize,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|err| FerrumError::Io { path: path.to_path_buf(), err })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| FerrumError::bad_file(path, format!("invalid JSON: {e}")))
}

/// Pooling and normalisation from the sentence-transformers files; mean
/// pooling without normalisation when the folder has none (a plain BERT).
fn sentence_config(dir: &Path) -> Result<(Pooling, bool)> {
    let modules = read_json(&dir.join("modules.json"))?;
    let modules = modules.as_ref().and_then(Value::as_array);
    let of_type = |suffix: &str| {
        modules.and_then(|m| {
            m.iter().find(|x| {
                x.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.ends_with(suffix))
            })
        })
    };
    let normalize = of_type(".Normalize").is_some();
    let pooling_dir = of_type(".Pooling")
        .and_then(|m| m.get("path"))
        .and_then(Value::as_str)
        .unwrap_or("1_Pooling");
    let pooling = match read_json(&dir.join(pooling_dir).join("config.json"))? {
        None => Pooling::Mean,
        Some(c) => {
            let on = |k: &str| c.get(k).and_then(Value::as_bool).unwrap_or(false);
            if on("pooling_mode_cls_token") {
                Pooling::Cls
            } else if on("pooling_mode_max_tokens") {
                Pooling::Max
            } else if on("pooling_mode_mean_tokens") || c.get("pooling_mode_mean_tokens").is_none()
            {
                Pooling::Mean
            } else {
                return Err(FerrumError::unsupported(format!(
                    "{}: only cls, mean and max pooling are implemented",
                    dir.join(pooling_dir).display()
                )));
            }
        }
    };
    Ok((pooling, normalize))
}

impl Embedder {
    /// Loads a Hugging Face folder holding an encoder (the registry picks
    /// the family) and its tokenizer, the encoder on backend `B`.
    pub fn load<B: Backend>(dir: &Path) -> Result<Self> {
        let model = load_encoder::<B>(dir)?;
        let tokenizer = Tokenizer::from_hf_dir(dir)?;
        let (pooling, normalize) = sentence_config(dir)?;
        let limit = read_json(&dir.join("sentence_bert_config.json"))?
            .and_then(|c| c.get("max_seq_length").and_then(Value::as_u64))
            .map(|n| n as usize);
        let max_positions = model.max_positions();
        let max_tokens = limit.map_or(max_positions, |l| l.clamp(2, max_positions));
        Ok(Self {
            model,
            tokenizer,
            pooling,
            normalize,
            max_tokens,
        })
    }

    /// Forces L2 normalisation on (sentence-transformers' `Normalize`).
    pub fn set_normalize(&mut self, on: bool) {
        self.normalize = on;
    }

    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    pub fn dim(&self) -> usize {
        self.model.hidden()
    }

    /// The longest input, in tokens, the encoder sees.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Token ids for one input, cut to `max_tokens` when `truncate` (text
    /// keeps its final `[SEP]`), an error naming the input otherwise.
    fn tokens(&self, i: usize, input: &EmbedInput, truncate: bool) -> Result<(Vec<u32>, bool)> {
        let mut ids = match input {
            EmbedInput::Text(t) if t.is_empty() => {
                return Err(FerrumError::invalid(format!(
                    "input {i} is an empty string"
                )))
            }
            EmbedInput::Text(t) => self.tokenizer.encode(t, true, false)?,
            EmbedInput::Tokens(ids) if ids.is_empty() => {
                return Err(FerrumError::invalid(format!("input {i} has no tokens")))
            }
            EmbedInput::Tokens(ids) => {
                self.tokenizer.check_ids(ids)?;
                ids.clone()
            }
        };
        if ids.len() <= self.max_tokens {
            return Ok((ids, false));
        }
        if !truncate {
            return Err(FerrumError::invalid(format!(
                "input {i} is {} tokens; this model takes at most {}",
                ids.len(),
                self.max_tokens
            )));
        }
        let last = ids[ids.len() - 1];
        ids.truncate(self.max_tokens);
        if matches!(input, EmbedInput::Text(_)) {
            ids[self.max_tokens - 1] = last;
        }
        Ok((ids, true))
    }

    /// Tokenizes and checks every input; a bad one fails the whole call,
    /// naming its index, before anything is computed.
    pub fn prepare(&self, inputs: &[EmbedInput], truncate: bool) -> Result<Vec<Prepared>> {
        if inputs.is_empty() {
            return Err(FerrumError::invalid("no input to embed"));
        }
        inputs
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let (ids, truncated) = self.tokens(i, x, truncate)?;
                Ok(Prepared { ids, truncated })
            })
            .collect()
    }

    /// Embeds prepared inputs, [`BATCH`] per encoder pass. The server
    /// concatenates several requests' inputs into one call.
    pub fn embed_prepared(&self, inputs: &[Prepared]) -> Result<Vec<Embedding>> {
        let dim = self.dim();
        let mut out = Vec::with_capacity(inputs.len());
        for chunk in inputs.chunks(BATCH) {
            let batch: Vec<EncoderInput> = chunk
                .iter()
                .map(|p| EncoderInput { ids: &p.ids, type_ids: None })
                .collect();
            for (hidden, p) in self.model.encode(&batch)?.iter().zip(chunk) {
                let mut vector = self.pooling.pool(hidden, dim)?;
                if self.normalize {
                    l2_normalize(&mut vector);
                }
                out.push(Embedding {
                    vector,
                    tokens: p.ids.len(),
                    truncated: p.truncated,
                });
            }
        }
        Ok(out)
    }

    /// [`Self::prepare`] then [`Self::embed_prepared`].
    pub fn embed(&self, inputs: &[EmbedInput], truncate: bool) -> Result<Vec<Embedding>> {
        self.embed_prepared(&self.prepare(inputs, truncate)?)
    }
}
