//! The model's vocabulary as llguidance sees it: a token trie over every
//! token's bytes, built once per tokenizer, and the parser factory that
//! compiles grammars against it.

use std::sync::Arc;

use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FerrumError, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::constraint::Constraint;
use crate::gbnf::lark_string;
use crate::grammar::GrammarSpec;

/// [`TokenizerEnv`] over a Ferrum tokenizer.
struct VocabEnv {
    tok: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text with the real tokenizer; bytes that are not UTF-8 greedily by
    /// the trie (only grammar literals are tokenized, never model output).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tok
                .encode(text, false, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }

    /// SentencePiece vocabularies prepend a space to what they encode, so a
    /// fragment's tokens are not those of the same text inside a sequence:
    /// claim nothing, and llguidance never forces tokens (it still masks).
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Grammar compilation for one model: the token trie (every token's bytes;
/// control tokens behind llguidance's special-token marker, so grammar text
/// never matches them by accident) and the compiled lexer slices. Building
/// it walks the whole vocabulary (about 0.1-0.5 s for 150K-260K tokens), so
/// a server builds it once at load.
pub struct Grammars {
    factory: ParserFactory,
    tok: Arc<Tokenizer>,
}

impl Grammars {
    /// `vocab_size` is the model's (its logits' length), which may exceed
    /// the tokenizer's when embeddings are padded; padding ids are never
    /// allowed.
    pub fn new(tok: Arc<Tokenizer>, vocab_size: usize) -> Result<Self> {
        let special = tok.special();
        let eos = special
            .eos
            .or_else(|| special.stop.first().copied())
            .ok_or_else(|| {
                FerrumError::invalid(
                    "the tokenizer has no end-of-sequence token, which constrained decoding needs",
                )
            })?;
        let n = vocab_size.max(tok.vocab_size());
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                if id as usize >= tok.vocab_size() {
                    Vec::new()
                } else if tok.is_control(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_text(id).unwrap_or("").as_bytes());
                    w
                } else {
                    tok.token_bytes(id)
                }
            })
            .collect();
        let info = TokRxInfo {
            tok_bos: special.bos,
            tok_pad: special.pad,
            tok_unk: special.unk,
            tok_end_of_turn: special.eot,
            ..TokRxInfo::new(n as u32, eos)
        };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(VocabEnv { tok: tok.clone(), trie });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| FerrumError::invalid(format!("cannot index the vocabulary: {e}")))?;
        // Errors come back to the caller; nothing goes to stderr.
        factory.quiet();
        Ok(Self { factory, tok })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// The token every mask uses for "the grammar may end here".
    pub fn eos(&self) -> u32 {
        self.factory.tok_env().tok_trie().eos_token()
    }

    /// Compiles `spec` into a fresh constraint (one per generated sequence;
    /// clone it for more). A schema or grammar llguidance cannot enforce is
    /// an error naming what it refused.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint> {
        let grammar = spec.to_llguidance(|t| self.lark_literal(t))?;
        Ok(Constraint::new(self.matcher(grammar)?, self.eos()))
    }

    /// Like [`Grammars::compile`], but free text is allowed until the output
    /// contains `trigger`; from there on `spec` constrains what follows it
    /// (a tool call that the model chose to start).
    pub fn compile_after(&self, trigger: &str, spec: &GrammarSpec) -> Result<Constraint> {
        let grammar = spec.to_llguidance(|t| self.lark_literal(t))?;
        let m = self.matcher(grammar)?;
        Ok(Constraint::after(
            trigger,
            m,
            self.eos(),
            self.factory.tok_env().clone(),
        ))
    }

    /// `c`, but the output may first hold a reasoning block from `open` to
    /// `close`, which the grammar does not see: for a model that opens its
    /// reasoning itself where its prompt does not (Qwen3's default mode).
    pub fn reasoning_first(&self, c: Constraint, open: &str, close: &str) -> Constraint {
        let env = self.factory.tok_env().clone();
        let trie = env.tok_trie();
        let openers: Arc<[(u32, Vec<u8>)]> = (0..trie.vocab_size() as u32)
            .filter_map(|t| {
                let b = trie.token(t);
                let b = b
                    .strip_prefix(&[TokTrie::SPECIAL_TOKEN_MARKER])
                    .unwrap_or(b);
                // Whatever part of `open` is out already, `b` continues it.
                let o = open.as_bytes();
                let fits = !b.is_empty()
                    && (0..o.len()).any(|k| o[k..].starts_with(b) || b.starts_with(&o[k..]));
                fits.then(|| (t, b.to_vec()))
            })
            .collect();
        c.reasoning_first(open, close, openers, env)
    }

    fn matcher(&self, grammar: TopLevelGrammar) -> Result<Matcher> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| FerrumError::invalid(format!("invalid grammar: {e}")))?;
        Ok(Matcher::new(Ok(parser)))
    }

    /// Lark text for `text` as a literal: a control token with exactly this
    /// text becomes a reference to that token (`<[id]>`), since its bytes
    /// are not plain text in the trie; anything else a quoted string.
    pub(crate) fn lark_literal(&self, text: &str) -> String {
        match self.tok.token_id(text) {
            Some(id) if self.tok.is_control(id) => format!("<[{id}]>"),
            _ => lark_string(text),
        }
    }
}
