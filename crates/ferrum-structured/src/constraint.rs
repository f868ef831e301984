//! One sequence's grammar state while it decodes: which tokens may come
//! next (a mask over the vocabulary), advanced by every token emitted.
//!
//! Masks can be computed ahead ([`Constraint::prepare`]) on another thread
//! while the model runs the step's forward pass, for the next position and
//! for each draft token of speculative decoding; sampling then only applies
//! them.

use std::collections::VecDeque;

use ferrum_types::{FerrumError, Result};
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::Matcher;

/// Where the grammar applies from.
#[derive(Clone)]
enum Start {
    /// From the first generated token.
    Now,
    /// Once the output contains `trigger`; `seen` is the output so far (only
    /// its last `trigger.len()` bytes are kept).
    After {
        trigger: Vec<u8>,
        seen: Vec<u8>,
        env: TokEnv,
    },
}

/// A grammar enforced on one generated sequence.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    start: Start,
    eos: u32,
    /// Masks computed ahead, for the next positions in order.
    ready: VecDeque<SimpleVob>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("active", &self.active())
            .field("finished", &self.is_finished())
            .finish()
    }
}

fn grammar_err(e: impl std::fmt::Display) -> FerrumError {
    FerrumError::invalid(format!("the output grammar failed: {e}"))
}

impl Constraint {
    pub(crate) fn new(matcher: Matcher, eos: u32) -> Self {
        Self {
            matcher,
            start: Start::Now,
            eos,
            ready: VecDeque::new(),
        }
    }

    pub(crate) fn after(trigger: &str, matcher: Matcher, eos: u32, env: TokEnv) -> Self {
        Self {
            start: Start::After {
                trigger: trigger.as_bytes().to_vec(),
                seen: Vec::new(),
                env,
            },
            ..Self::new(matcher, eos)
        }
    }

    /// Whether the grammar constrains the next token (a triggered one does
    /// not until its trigger appeared).
    pub fn active(&self) -> bool {
        matches!(self.start, Start::Now)
    }

    /// The grammar is complete and allows nothing more: generation ends.
    pub fn is_finished(&self) -> bool {
        self.active() && self.matcher.is_stopped()
    }

    /// How many leading `drafts` the grammar accepts (speculative decoding
    /// verifies only those).
    pub fn valid_prefix(&mut self, drafts: &[u32]) -> usize {
        if !self.active() {
            return drafts.len();
        }
        self.matcher.validate_tokens(drafts).unwrap_or(0)
    }

    /// Computes the masks for the next position and, where `drafts` are
    /// fed after it, for each following position (assuming the drafts are
    /// accepted). Drafts must be a [`Constraint::valid_prefix`].
    pub fn prepare(&mut self, drafts: &[u32]) -> Result<()> {
        self.ready.clear();
        if !self.active() {
            return Ok(());
        }
        let mut fed = 0;
        let out = (|| {
            for (j, &d) in std::iter::once(&0).chain(drafts).enumerate() {
                if j > 0 {
                    self.matcher.consume_token(d).map_err(grammar_err)?;
                    fed += 1;
                }
                let mask = self.matcher.compute_mask_or_eos().map_err(grammar_err)?;
                self.ready.push_back(mask);
            }
            Ok(())
        })();
        if fed > 0 {
            self.matcher.rollback(fed).map_err(grammar_err)?;
        }
        out
    }

    /// Bans (sets to -inf) every logit the grammar does not allow at the
    /// next position. `stops` are the tokens that end generation: allowed
    /// exactly where the grammar may end.
    pub fn apply(&mut self, logits: &mut [f32], stops: &[u32]) -> Result<()> {
        if !self.active() {
            return Ok(());
        }
        let mask = match self.ready.pop_front() {
            Some(m) => m,
            None => self.matcher.compute_mask_or_eos().map_err(grammar_err)?,
        };
        let may_end = mask.is_allowed(self.eos);
        // Stop tokens other than the grammar's EOS follow it.
        let stop_logits: Vec<f32> = stops
            .iter()
            .map(|&s| logits.get(s as usize).copied().unwrap_or(f32::NEG_INFINITY))
            .collect();
        let words = mask.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            match words.get(w).copied().unwrap_or(0) {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                // Branch-free so the compiler can blend 8 lanes at a time:
                // inside a JSON string most words are mixed.
                bits => {
                    for (b, l) in chunk.iter_mut().enumerate() {
                        let keep = (bits >> b) & 1 != 0;
                        *l = if keep { *l } else { f32::NEG_INFINITY };
                    }
                }
            }
        }
        for (&s, l) in stops.iter().zip(stop_logits) {
            if let Some(x) = logits.get_mut(s as usize) {
                *x = if may_end { l } else { f32::NEG_INFINITY };
            }
        }
        if !may_end && mask.is_zero() {
            return Err(FerrumError::invalid(
                "the output grammar allows no next token",
            ));
        }
        Ok(())
    }

    /// Advances past `token`, emitted at the next position (a stop token is
    /// not fed: generation ends there).
    /// `token_bytes` gives its text, needed only while waiting for a trigger.
    pub fn commit(&mut self, token: u32, token_bytes: impl FnOnce() -> Vec<u8>) -> Result<()> {
        match &mut self.start {
            Start::Now => self.matcher.consume_token(token).map_err(grammar_err),
            Start::After { trigger, seen, env } => {
                seen.extend_from_slice(&token_bytes());
                let Some(at) = find(seen, trigger) else {
                    let keep = seen.len().saturating_sub(trigger.len());
                    seen.drain(..keep);
                    return Ok(());
                };
                // The grammar starts right after the trigger; what this
                // token had past it is its first text.
                let tail = seen[at + trigger.len()..].to_vec();
                let toks = if tail.is_empty() {
                    Vec::new()
                } else {
                    env.tokenize_bytes(&tail)
                };
                self.start = Start::Now;
                self.ready.clear();
                self.matcher.consume_tokens(&toks).map_err(grammar_err)
            }
        }
    }

    /// Forgets masks prepared for positions that were not reached (a draft
    /// was rejected).
    pub fn end_step(&mut self) {
        self.ready.clear();
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}
