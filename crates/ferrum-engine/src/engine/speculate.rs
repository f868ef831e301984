//! Speculative decoding: cheap guesses of the next few tokens, checked by
//! the model in one `forward_verify` pass and rolled back with
//! `truncate_kv` where they were wrong.
//!
//! Both drafters propose deterministically (a point-mass proposal), so
//! [`crate::Sampler::verify`]'s accept/reject rule keeps every request's
//! output distribution unchanged, and greedy output identical.

use std::collections::HashMap;

use ferrum_models::{DecoderOnlyLLM, KvManaged, PagedLlm};
use ferrum_types::{FerrumError, Result};

use crate::sampler::argmax;

/// Where draft tokens come from.
pub enum Drafter {
    /// Prompt lookup: the tokens that followed the latest earlier occurrence
    /// of the sequence's last `max_ngram` (then fewer) tokens. Free, and good
    /// wherever output repeats its input (code edits, summaries, RAG).
    Ngram { max_ngram: usize },
    /// A smaller model with the same vocabulary, run greedily on its own KV
    /// cache; `cached` mirrors the tokens that cache holds per sequence.
    Model {
        model: Box<KvManaged<Box<dyn PagedLlm>>>,
        cached: HashMap<String, Vec<u32>>,
    },
}

/// Speculative decoding settings of an engine.
pub struct Speculation {
    pub drafter: Drafter,
    /// Draft tokens per step (`--spec-tokens`).
    pub tokens: usize,
}

impl Speculation {
    /// Prompt-lookup speculation with n-grams of up to `max_ngram` tokens.
    pub fn ngram(max_ngram: usize, tokens: usize) -> Self {
        Self {
            drafter: Drafter::Ngram { max_ngram: max_ngram.max(1) },
            tokens,
        }
    }

    /// Draft-model speculation; the draft must share the target's vocabulary.
    pub fn draft_model(model: Box<dyn PagedLlm>, tokens: usize) -> Self {
        Self {
            drafter: Drafter::Model {
                model: Box::new(KvManaged::new(model)),
                cached: HashMap::new(),
            },
            tokens,
        }
    }

    pub(super) fn check_vocab(&self, target: usize) -> Result<()> {
        if let Drafter::Model { model, .. } = &self.drafter {
            let v = model.config().vocab_size;
            if v != target {
                return Err(FerrumError::invalid(format!(
                    "the draft model's vocabulary has {v} tokens, the model's {target}: a draft model must share the tokenizer"
                )));
            }
        }
        Ok(())
    }

    /// Up to `k` tokens expected after `tokens`.
    pub(super) fn propose(&mut self, seq: &str, tokens: &[u32], k: usize) -> Result<Vec<u32>> {
        match &mut self.drafter {
            Drafter::Ngram { max_ngram } => Ok(ngram_lookup(tokens, *max_ngram, k)),
            Drafter::Model { model, cached } => {
                let room = model.kv_capacity().saturating_sub(tokens.len());
                let k = k.min(room);
                if k == 0 {
                    return Ok(Vec::new());
                }
                let held = cached.entry(seq.to_string()).or_default();
                // Keep what the draft cache shares with the sequence (at
                // least one token must be fed to get logits).
                let common = held
                    .iter()
                    .zip(tokens)
                    .take_while(|(a, b)| a == b)
                    .count()
                    .min(tokens.len() - 1);
                model.truncate_kv(seq, common);
                held.truncate(common);
                let mut logits = match model.try_prefill(seq, &tokens[common..]) {
                    Ok(l) => l,
                    Err(e) => {
                        // Start the draft cache afresh next time.
                        model.release(seq);
                        held.clear();
                        return Err(e);
                    }
                };
                held.extend_from_slice(&tokens[common..]);
                let mut out = Vec::with_capacity(k);
                for i in 0..k {
                    let d = argmax(&logits);
                    out.push(d);
                    if i + 1 < k {
                        logits = model.try_decode(seq, d, held.len())?;
                        held.push(d);
                    }
                }
                Ok(out)
            }
        }
    }

    /// Forgets `seq`'s draft state.
    pub(super) fn release(&mut self, seq: &str) {
        if let Drafter::Model { model, cached } = &mut self.drafter {
            if cached.remove(seq).is_some() {
                model.release(seq);
            }
        }
    }
}

/// Shortest n-gram worth a lookup: a single repeated token predicts the
/// next one too rarely to pay for verifying it.
const MIN_NGRAM: usize = 2;

/// Prompt lookup: for n from `max_n` down to [`MIN_NGRAM`], the `k` tokens after the
/// latest earlier occurrence of the last n tokens.
fn ngram_lookup(tokens: &[u32], max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    for n in (MIN_NGRAM..=max_n.min(len.saturating_sub(1))).rev() {
        let pat = &tokens[len - n..];
        if let Some(i) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == pat) {
            let start = i + n;
            let end = (start + k).min(len);
            if start < end {
                return tokens[start..end].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::ngram_lookup;

    #[test]
    fn ngram_lookup_continues_the_latest_longest_match() {
        // "... 1 2 3 9 ... 1 2 3 7 8 ... 2 3" -> after the latest "2 3": 7 8.
        let t = [5, 1, 2, 3, 9, 4, 1, 2, 3, 7, 8, 6, 2, 3];
        assert_eq!(ngram_lookup(&t, 3, 2), vec![7, 8]);
        // The 3-gram "6 2 3" never occurred before; falls back to 2-grams.
        assert_eq!(ngram_lookup(&t, 3, 5), vec![7, 8, 6, 2, 3]);
        // No earlier occurrence of the last token at all.
        assert!(ngram_lookup(&[1, 2, 3], 2, 4).is_empty());
        assert!(ngram_lookup(&[4], 2, 4).is_empty());
        // A run: the proposal may run up to the end of the sequence.
        assert_eq!(ngram_lookup(&[7, 7, 7], 2, 4), vec![7]);
        // Single-token matches are not used.
        assert!(ngram_lookup(&[7, 1, 7], 3, 4).is_empty());
    }
}
