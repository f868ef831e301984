//! Turning logits into the next token.
//!
//! Order of operations (as llama.cpp and vLLM apply them): a grammar's mask
//! (applied by the sequence before the sampler sees the logits); penalties and
//! `logit_bias` on the raw logits; log-probabilities for reporting; then temperature, top-k,
//! top-p and min-p; then a draw from a per-request RNG, so the same seed
//! gives the same text.

use std::collections::HashMap;

use ferrum_types::{FerrumError, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Per-request sampling settings, with OpenAI / llama.cpp meanings.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens already in
    /// the prompt or output; 1 disables it.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of generated tokens.
    pub frequency_penalty: f32,
    /// Makes sampling reproducible; `None` draws a random seed.
    pub seed: Option<u64>,
    /// Also report the log-probabilities of this many most likely tokens.
    pub top_logprobs: usize,
    /// Added to these tokens' logits before anything else looks at them
    /// (OpenAI's `logit_bias`: -100 bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            top_logprobs: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Self::default()
        }
    }

    /// Rejects values outside their meaningful ranges, naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, why: &str| Err(FerrumError::invalid(format!("{field} {why}")));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", "must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be in [0, 1]");
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad("repetition_penalty", "must be a finite number > 0");
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, "must be in [-2, 2]");
            }
        }
        if self.top_logprobs > 20 {
            return bad("top_logprobs", "must be at most 20");
        }
        if let Some((t, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return Err(FerrumError::invalid(format!(
                "logit_bias of token {t} is {b}; it must be between -100 and 100"
            )));
        }
        Ok(())
    }
}

/// One sampled token with its log-probability and the top alternatives
/// (`top_logprobs` of them, most likely first). Tokens that could not be
/// drawn (a grammar masked them: their logit is -inf) are not
/// alternatives, so `top` may be shorter: OpenAI's clients do arithmetic on
/// every entry, and -inf has no JSON form.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// `token`'s log-probability under `logits` (raw, no sampling settings)
/// and the `top` most likely tokens': how a prompt's own tokens are scored.
pub fn score(logits: &[f32], token: u32, top: usize) -> Sampled {
    scored(logits, token, log_sum_exp(logits).1, top)
}

fn scored(logits: &[f32], token: u32, lse: f32, top: usize) -> Sampled {
    let logprob = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |l| l - lse);
    let top = top_n(logits, top)
        .into_iter()
        .filter(|&(_, l)| l > f32::NEG_INFINITY)
        .map(|(t, l)| (t, l - lse))
        .collect();
    Sampled { token, logprob, top }
}

/// The sampling state of one request.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Generated-token counts (presence / frequency penalties).
    counts: HashMap<u32, u32>,
    /// Tokens seen in prompt or output (repetition penalty).
    seen: HashMap<u32, ()>,
    /// Reused per call: (token, logit) candidates.
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        let seen = if params.repetition_penalty != 1.0 {
            prompt.iter().map(|&t| (t, ())).collect()
        } else {
            HashMap::new()
        };
        Self {
            params,
            rng,
            counts: HashMap::new(),
            seen,
            cand: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token that joined the output (call after each sample).
    pub fn accept(&mut self, token: u32) {
        *self.counts.entry(token).or_default() += 1;
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token, ());
        }
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &t in self.seen.keys() {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &c) in &self.counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * c as f32;
                }
            }
        }
        for &(t, b) in &p.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
    }

    /// Picks the next token from `logits` (modified in place by penalties).
    pub fn sample(&mut self, logits: &mut [f32]) -> Sampled {
        self.choose(logits, None).0
    }

    /// Speculative decoding: checks a `draft` token proposed for these
    /// `logits` by a deterministic drafter (n-gram lookup or a greedy draft
    /// model, i.e. a point-mass proposal). Returns the token to emit and
    /// whether it is the draft. Greedy: the draft is accepted iff it is the
    /// argmax. Otherwise the standard rule for a point-mass proposal: accept
    /// with probability `p(draft)` under this request's sampling
    /// distribution, else draw from `p` with the draft removed and
    /// renormalised; the emitted token is then distributed exactly as
    /// [`Sampler::sample`] would draw it.
    pub fn verify(&mut self, logits: &mut [f32], draft: u32) -> (Sampled, bool) {
        self.choose(logits, Some(draft))
    }

    fn choose(&mut self, logits: &mut [f32], draft: Option<u32>) -> (Sampled, bool) {
        self.apply_penalties(logits);
        let (max, lse) = log_sum_exp(logits);
        let token = if self.params.temperature == 0.0 {
            argmax(logits)
        } else {
            self.filter(logits, max);
            match draft {
                None => self.pick(None).unwrap_or_else(|| argmax(logits)),
                Some(d) => {
                    let total: f32 = self.cand.iter().map(|c| c.1).sum();
                    let p_draft = self
                        .cand
                        .iter()
                        .find(|c| c.0 == d)
                        .map_or(0.0, |c| c.1 / total);
                    if self.rng.random::<f32>() < p_draft {
                        d
                    } else {
                        self.pick(Some(d)).unwrap_or(d)
                    }
                }
            }
        };
        (self.report(logits, token, lse), Some(token) == draft)
    }

    fn report(&self, logits: &[f32], token: u32, lse: f32) -> Sampled {
        scored(logits, token, lse, self.params.top_logprobs)
    }

    /// Fills `cand` with the tokens that survive temperature, top-k, top-p
    /// and min-p, each with an unnormalised weight.
    fn filter(&mut self, logits: &[f32], max: f32) {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, (l - max) * inv_t)),
        );
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        // top-k: keep the k best (unsorted), cheaply.
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            cand.truncate(p.top_k);
        }
        // Probabilities relative to the best candidate (its weight is 1).
        for c in cand.iter_mut() {
            c.1 = c.1.exp();
        }
        // Banned tokens (a grammar's mask, a -inf bias) have weight 0: they
        // must not be drawn even when rounding leaves the draw at the end.
        cand.retain(|c| c.1 > 0.0);
        let total: f32 = cand.iter().map(|c| c.1).sum();
        // top-p: sort only as far as needed, widening the sorted prefix.
        if p.top_p < 1.0 {
            let target = p.top_p * total;
            let mut sorted = 64.min(cand.len());
            loop {
                if sorted < cand.len() {
                    cand.select_nth_unstable_by(sorted - 1, |a, b| {
                        b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
                    });
                }
                cand[..sorted].sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let mut acc = 0.0;
                let cut = cand[..sorted].iter().position(|c| {
                    acc += c.1;
                    acc >= target
                });
                match cut {
                    Some(i) => {
                        cand.truncate(i + 1);
                        break;
                    }
                    None if sorted == cand.len() => break,
                    None => sorted = (sorted * 8).min(cand.len()),
                }
            }
        }
        // min-p: relative to the most likely token, whose weight is 1 after
        // temperature (or the best survivor's, after top-k).
        if p.min_p > 0.0 {
            let best = cand.iter().map(|c| c.1).fold(0.0, f32::max);
            cand.retain(|c| c.1 >= p.min_p * best);
        }
    }

    /// Draws from `cand` in proportion to the weights, skipping `exclude`.
    fn pick(&mut self, exclude: Option<u32>) -> Option<u32> {
        let live = |c: &&(u32, f32)| Some(c.0) != exclude;
        let total: f32 = self.cand.iter().filter(live).map(|c| c.1).sum();
        let mut r = self.rng.random::<f32>() * total;
        let mut last = None;
        for c in self.cand.iter().filter(live) {
            r -= c.1;
            last = Some(c.0);
            if r < 0.0 {
                break;
            }
        }
        last
    }
}

/// `(max, log Σ exp)` of `x`, stable.
fn log_sum_exp(x: &[f32]) -> (f32, f32) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return (max, max);
    }
    let s: f32 = x.iter().map(|&v| (v - max).exp()).sum();
    (max, max + s.ln())
}

/// Index of the largest value (the first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// The `n` largest `(index, value)` pairs, largest first (ties: lower
/// index first). One pass keeping the best `n` in order, in a vector of
/// exactly `n`: what a response keeps per token (with logprobs, every
/// token) is `n` pairs, not a vocabulary's worth of capacity.
fn top_n(x: &[f32], n: usize) -> Vec<(u32, f32)> {
    let n = n.min(x.len());
    let mut v: Vec<(u32, f32)> = Vec::with_capacity(n);
    if n == 0 {
        return v;
    }
    // `a` ranks before `b`.
    let before = |a: (u32, f32), b: (u32, f32)| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)).is_gt();
    for (i, &l) in x.iter().enumerate() {
        let c = (i as u32, l);
        if v.len() == n && !before(c, v[n - 1]) {
            continue;
        }
        if v.len() == n {
            v.pop();
        }
        let at = v.partition_point(|&e| before(e, c));
        v.insert(at, c);
    }
    v
}
