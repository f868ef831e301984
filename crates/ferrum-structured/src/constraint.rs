//! One sequence's grammar state while it decodes: which tokens may come
//! next (a mask over the vocabulary), advanced by every token emitted.
//!
//! Masks can be computed ahead ([`Constraint::prepare`]) on another thread
//! while the model runs the step's forward pass, for the next position and
//! for each draft token of speculative decoding; sampling then only applies
//! them.

use std::collections::VecDeque;
use std::sync::Arc;

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
    /// The model may open a reasoning block first (Qwen3 thinks unless told
    /// not to, and its prompt does not open the block for it): at the start
    /// the grammar's first tokens and the tokens that begin `open` are
    /// allowed; while the output is a proper prefix of `open` only its
    /// continuations are; once it contains `open`, this becomes
    /// [`Start::After`] `close`. A first token the grammar allows starts
    /// the grammar.
    Open {
        open: Vec<u8>,
        close: Vec<u8>,
        seen: Vec<u8>,
        /// Every token whose text may continue `open` from some point in it.
        openers: Arc<[(u32, Vec<u8>)]>,
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

    /// `self`, but the output may first hold a reasoning block from `open`
    /// to `close` (see [`Start::Open`]); `openers` are the vocabulary's
    /// tokens that may continue `open` from some point in it. Only a constraint that starts now changes.
    pub(crate) fn reasoning_first(
        self,
        open: &str,
        close: &str,
        openers: Arc<[(u32, Vec<u8>)]>,
        env: TokEnv,
    ) -> Self {
        if !matches!(self.start, Start::Now) || openers.is_empty() {
            return self;
        }
        Self {
            start: Start::Open {
                open: open.as_bytes().to_vec(),
                close: close.as_bytes().to_vec(),
                seen: Vec::new(),
                openers,
                env,
            },
            ..self
        }
    }

    /// Whether the grammar constrains the next token (a triggered one does
    /// not until its trigger appeared; one that waits on a possible
    /// reasoning block does, to the grammar or that block).
    pub fn active(&self) -> bool {
        !matches!(self.start, Start::After { .. })
    }

    /// The grammar is complete and allows nothing more: generation ends.
    pub fn is_finished(&self) -> bool {
        matches!(self.start, Start::Now) && self.matcher.is_stopped()
    }

    /// How many leading `drafts` the grammar accepts (speculative decoding
    /// verifies only those).
    pub fn valid_prefix(&mut self, drafts: &[u32]) -> usize {
        match &self.start {
            Start::Now => self.matcher.validate_tokens(drafts).unwrap_or(0),
            Start::After { .. } => drafts.len(),
            // Drafts wait until the block opened or the grammar started.
            Start::Open { .. } => 0,
        }
    }

    /// Computes the masks for the next position and, where `drafts` are
    /// fed after it, for each following position (assuming the drafts are
    /// accepted). Drafts must be a [`Constraint::valid_prefix`].
    pub fn prepare(&mut self, drafts: &[u32]) -> Result<()> {
        self.ready.clear();
        match &self.start {
            Start::Now => {}
            Start::After { .. } => return Ok(()),
            Start::Open { seen, .. } => {
                // The grammar's own mask matters only at the very start.
                if seen.is_empty() {
                    let mask = self.matcher.compute_mask_or_eos().map_err(grammar_err)?;
                    self.ready.push_back(mask);
                }
                return Ok(());
            }
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
        let opening = match &self.start {
            Start::Now => None,
            Start::After { .. } => return Ok(()),
            Start::Open { open, seen, openers, .. } => {
                let kept: Vec<(usize, f32)> = openers
                    .iter()
                    .filter(|(_, b)| continues(seen, b, open))
                    .filter_map(|&(t, _)| Some((t as usize, *logits.get(t as usize)?)))
                    .collect();
                if !seen.is_empty() {
                    // Part of `open` is out: only its continuations.
                    logits.fill(f32::NEG_INFINITY);
                    for (i, l) in kept {
                        logits[i] = l;
                    }
                    return Ok(());
                }
                Some(kept)
            }
        };
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
        let opening = opening.unwrap_or_default();
        for &(i, l) in &opening {
            logits[i] = l;
        }
        if !may_end && mask.is_zero() && opening.is_empty() {
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
            Start::After { .. } => {
                let bytes = token_bytes();
                self.feed_after(&bytes)
            }
            Start::Open { open, close, seen, openers, env } => {
                // A first token the grammar takes is the grammar's, even
                // where it could begin `open` (a grammar may write the
                // reasoning block itself).
                let opener = openers.iter().any(|(t, _)| *t == token);
                if seen.is_empty()
                    && (!opener || self.matcher.validate_tokens(&[token]).unwrap_or(0) == 1)
                {
                    self.start = Start::Now;
                    self.ready.clear();
                    return self.matcher.consume_token(token).map_err(grammar_err);
                }
                seen.extend_from_slice(&token_bytes());
                if !seen.starts_with(open) {
                    return Ok(());
                }
                let tail = seen.split_off(open.len());
                self.start = Start::After {
                    trigger: std::mem::take(close),
                    seen: Vec::new(),
                    env: env.clone(),
                };
                self.ready.clear();
                self.feed_after(&tail)
            }
        }
    }

    /// Output text while waiting for the trigger: past it, the grammar
    /// starts, and what followed the trigger is its first text.
    fn feed_after(&mut self, bytes: &[u8]) -> Result<()> {
        let Start::After { trigger, seen, env } = &mut self.start else {
            return Ok(());
        };
        seen.extend_from_slice(bytes);
        let Some(at) = find(seen, trigger) else {
            let keep = seen.len().saturating_sub(trigger.len());
            seen.drain(..keep);
            return Ok(());
        };
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

/// Whether a token with text `bytes`, after `seen`, keeps the output on its
/// way to `open` (a prefix of it) or completes it.
fn continues(seen: &[u8], bytes: &[u8], open: &[u8]) -> bool {
    let mut text = seen.to_vec();
    text.extend_from_slice(bytes);
    open.starts_with(&text) || text.starts_with(open)
}
