//! Tokenization for Ferrum: one [`Tokenizer`] type over two sources.
//!
//! - A Hugging Face `tokenizer.json`, run by the `tokenizers` crate.
//! - The vocabulary embedded in a GGUF file (`tokenizer.ggml.*`), run by
//!   Ferrum's own implementations of llama.cpp's algorithms: byte-level BPE
//!   with the pre-tokenizer `tokenizer.ggml.pre` names, SentencePiece and
//!   WordPiece. They reproduce llama.cpp's token ids exactly (tested on its
//!   `ggml-vocab-*` vectors).
//!
//! [`chat`] renders chat templates; [`IncrementalDecoder`] turns a stream of
//! token ids into text without ever splitting a UTF-8 character.

mod bpe;
mod bytes;
pub mod chat;
mod decode;
mod hf;
mod spm;
mod vocab;
mod wpm;

use std::path::Path;

use ferrum_formats::gguf::GgufFile;
use ferrum_types::{FerrumError, Result};

pub use decode::IncrementalDecoder;
pub use vocab::VocabKind;

use vocab::{TokenType, Vocab};

/// How token strings map back to bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PieceStyle {
    /// GPT-2 byte-level characters.
    ByteLevel,
    /// `▁` for spaces and `<0xXX>` byte tokens (SentencePiece, Gemma).
    Metaspace,
    /// BERT: `##` marks a continuation, other pieces start a word.
    WordPiece,
}

/// Token ids with special meaning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    /// Every token that ends generation: EOS, EOT and the chat templates'
    /// end-of-turn tokens (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>` ...).
    pub stop: Vec<u32>,
}

/// Control-token texts that end a turn in common chat formats.
pub(crate) const END_OF_TURN_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<|return|>",
];

enum Inner {
    Gguf {
        vocab: Box<Vocab>,
        pre: Option<bpe::PreTokenizer>,
        /// Non-normal tokens, longest text first, for splitting raw text.
        specials: Vec<(String, u32, TokenType)>,
    },
    Hf(Box<hf::HfTokenizer>),
}

/// A tokenizer with its special tokens and (when the model has one) its
/// chat template.
pub struct Tokenizer {
    inner: Inner,
    special: SpecialTokens,
    style: PieceStyle,
    /// SentencePiece-style vocabularies prepend a space to the text.
    strip_leading_space: bool,
    chat_template: Option<String>,
    kind: String,
}

/// A piece of input text: raw text, or an already-recognised special token.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

impl Tokenizer {
    /// The tokenizer embedded in a GGUF file.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let vocab = Vocab::from_gguf(g)?;
        let pre = match vocab.kind {
            VocabKind::Bpe => Some(
                bpe::PreTokenizer::for_pre(&vocab.pre, &vocab.model_name)
                    .map_err(|e| g.error(e.to_string()))?,
            ),
            _ => None,
        };
        let style = match (vocab.kind, &pre) {
            (VocabKind::Bpe, Some(p)) if p.byte_encode => PieceStyle::ByteLevel,
            _ => PieceStyle::Metaspace,
        };
        let mut specials: Vec<(String, u32, TokenType)> = vocab
            .tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .filter_map(|(i, t)| {
                let ty = vocab.types[i];
                matches!(
                    ty,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
                .then(|| (t.clone(), i as u32, ty))
            })
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut stop: Vec<u32> = [vocab.eos, vocab.eot, vocab.eom]
            .into_iter()
            .flatten()
            .collect();
        for (text, id, ty) in &specials {
            if *ty == TokenType::Control
                && END_OF_TURN_TEXTS.contains(&text.as_str())
                && !stop.contains(id)
            {
                stop.push(*id);
            }
        }
        let special = SpecialTokens {
            bos: vocab.bos,
            eos: vocab.eos,
            eot: vocab.eot,
            unk: vocab.unk,
            sep: vocab.sep,
            pad: vocab.pad,
            stop,
        };
        let kind = match vocab.kind {
            VocabKind::Bpe => format!("BPE ({}, pre-tokenizer {})", vocab.model_name, vocab.pre),
            VocabKind::Spm => "SentencePiece (llama)".to_string(),
            VocabKind::Wpm => "WordPiece (bert)".to_string(),
        };
        let chat_template = g
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        Ok(Self {
            strip_leading_space: vocab.kind == VocabKind::Spm && vocab.add_space_prefix
                || vocab.kind == VocabKind::Wpm,
            inner: Inner::Gguf { vocab: Box::new(vocab), pre, specials },
            special,
            style,
            chat_template,
            kind,
        })
    }

    /// The tokenizer of a Hugging Face model folder (`tokenizer.json`, plus
    /// `tokenizer_config.json` and `generation_config.json` when present).
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let hf = hf::HfTokenizer::load(dir.as_ref())?;
        let special = hf.special_tokens();
        let style = hf.piece_style();
        Ok(Self {
            strip_leading_space: hf.strips_leading_space(),
            chat_template: hf.chat_template.clone(),
            kind: format!("Hugging Face tokenizer.json ({})", hf.model_type()),
            style,
            special,
            inner: Inner::Hf(Box::new(hf)),
        })
    }

    /// Text → token ids. `add_special` adds the BOS/EOS (or CLS/SEP) the
    /// model expects; `parse_special` lets special-token text in the input
    /// (e.g. `<|im_start|>`) become those tokens instead of plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Hf(hf) => hf.encode(text, add_special, parse_special),
            Inner::Gguf { vocab, pre, specials } => {
                let fragments = partition(text, specials, parse_special);
                let mut out = Vec::with_capacity(text.len() / 3 + 2);
                if add_special && (vocab.add_bos || vocab.kind == VocabKind::Wpm) {
                    out.extend(vocab.bos);
                }
                let mut prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(t) => {
                            match (vocab.kind, pre) {
                                (VocabKind::Bpe, Some(p)) => {
                                    bpe::encode_fragment(vocab, p, t, &mut out)?
                                }
                                (VocabKind::Wpm, _) => wpm::encode(vocab, t, &mut out),
                                _ => {
                                    let prefix = if vocab.add_space_prefix && prev_special {
                                        " "
                                    } else {
                                        ""
                                    };
                                    let text = format!("{prefix}{t}").replace(' ', "\u{2581}");
                                    spm::encode(vocab, &text, &mut out);
                                }
                            }
                            prev_special = false;
                        }
                    }
                }
                if add_special {
                    if vocab.kind == VocabKind::Wpm {
                        out.extend(vocab.sep);
                    } else if vocab.add_eos {
                        out.extend(vocab.eos);
                    }
                }
                Ok(out)
            }
        }
    }

    /// Token ids → text. With `skip_special`, control tokens are left out.
    /// The space a SentencePiece vocabulary prepends to the input is removed
    /// again, so `decode(encode(x)) == x` for text the vocabulary covers.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            if skip_special && self.is_control(id) {
                continue;
            }
            self.append_piece(id, i == 0, &mut bytes);
        }
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if self.strip_leading_space && text.starts_with(' ') {
            text.remove(0);
        }
        text
    }

    /// Appends the bytes of token `id`; `first` marks the start of a word
    /// sequence (matters for WordPiece).
    pub(crate) fn append_piece(&self, id: u32, first: bool, out: &mut Vec<u8>) {
        let Some(piece) = self.token_text(id) else {
            return;
        };
        if self.is_control(id) {
            out.extend_from_slice(piece.as_bytes());
            return;
        }
        match self.style {
            PieceStyle::ByteLevel => bytes::decode_into(piece, out),
            PieceStyle::Metaspace => decode::metaspace_into(piece, out),
            PieceStyle::WordPiece => match piece.strip_prefix("##") {
                Some(rest) => out.extend_from_slice(rest.as_bytes()),
                None => {
                    if !first {
                        out.push(b' ');
                    }
                    out.extend_from_slice(piece.as_bytes());
                }
            },
        }
    }

    /// The bytes token `id` stands for inside generated text (a control
    /// token's are its text), as a grammar engine must see them.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_piece(id, false, &mut out);
        out
    }

    /// The vocabulary string of `id`.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        match &self.inner {
            Inner::Gguf { vocab, .. } => vocab.tokens.get(id as usize).map(String::as_str),
            Inner::Hf(hf) => hf.token_text(id),
        }
    }

    /// The id of a vocabulary string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.inner {
            Inner::Gguf { vocab, .. } => vocab.id(text),
            Inner::Hf(hf) => hf.token_id(text),
        }
    }

    /// Whether `id` is a control (special) token.
    pub fn is_control(&self, id: u32) -> bool {
        match &self.inner {
            Inner::Gguf { vocab, .. } => vocab.types.get(id as usize) == Some(&TokenType::Control),
            Inner::Hf(hf) => hf.is_special(id),
        }
    }

    /// Number of token ids.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Gguf { vocab, .. } => vocab.tokens.len(),
            Inner::Hf(hf) => hf.vocab_size(),
        }
    }

    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// The Jinja chat template shipped with the model (or set in its
    /// place), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The same tokenizer with `template` as its chat template (a model
    /// whose own is missing or wrong; llama-server's `--chat-template-file`).
    pub fn with_chat_template(mut self, template: String) -> Self {
        self.chat_template = Some(template);
        self
    }

    /// A short description, e.g. `BPE (gpt2, pre-tokenizer qwen2)`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// A streaming decoder for generated tokens.
    pub fn incremental_decoder(&self) -> IncrementalDecoder<'_> {
        IncrementalDecoder::new(self)
    }

    /// Checks that every id is inside the vocabulary (for token arrays that
    /// arrive from users).
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let n = self.vocab_size();
        match ids.iter().find(|&&id| id as usize >= n) {
            Some(id) => Err(FerrumError::invalid(format!(
                "token id {id} is outside the vocabulary of {n} tokens"
            ))),
            None => Ok(()),
        }
    }
}

/// Splits `text` on special-token strings. Without `parse_special` only
/// user-defined tokens are recognised (as llama.cpp and HF do).
fn partition<'t>(
    text: &'t str,
    specials: &[(String, u32, TokenType)],
    parse_special: bool,
) -> Vec<Fragment<'t>> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut frags = vec![Fragment::Text(text)];
    for (s, id, ty) in specials {
        if !parse_special && *ty != TokenType::UserDefined {
            continue;
        }
        if !frags
            .iter()
            .any(|f| matches!(f, Fragment::Text(t) if t.contains(s.as_str())))
        {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            match f {
                Fragment::Text(t) => {
                    let mut rest = t;
                    while let Some(pos) = rest.find(s.as_str()) {
                        if pos > 0 {
                            next.push(Fragment::Text(&rest[..pos]));
                        }
                        next.push(Fragment::Token(*id));
                        rest = &rest[pos + s.len()..];
                    }
                    if !rest.is_empty() {
                        next.push(Fragment::Text(rest));
                    }
                }
                tok => next.push(tok),
            }
        }
        frags = next;
    }
    frags
}
