//! One request inside the engine: its tokens, how many of them are in the
//! KV cache, and its sampling and detokenization state.

use std::time::Instant;

use ferrum_structured::Constraint;
use ferrum_tokenizer::{IncrementalDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::{Completion, Event, Request};
use crate::budget::BudgetState;
use crate::finish::FinishReason;
use crate::sampler::{score, Sampled, Sampler};
use crate::stop::StopStrings;

pub(super) struct Seq<'t> {
    /// KV cache id, unique for the engine's lifetime.
    pub id: String,
    /// Arrival order: scheduling is first-come-first-served and preemption
    /// takes the newest.
    pub arrival: u64,
    /// Prompt then generated tokens; the last one may not be in the cache yet.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Leading tokens whose K/V are in the cache.
    pub computed: usize,
    /// Whether the model holds a cache for this sequence.
    pub has_cache: bool,
    pub cached_tokens: usize,
    max_tokens: usize,
    capacity: usize,
    sampler: Sampler,
    /// The grammar the output follows, if any. Taken out while its masks
    /// are prepared beside the forward pass (see the scheduler).
    pub constraint: Option<Constraint>,
    /// The reasoning budget's progress, when the request has one.
    budget: Option<BudgetState>,
    tok: &'t Tokenizer,
    decoder: IncrementalDecoder<'t>,
    stops: StopStrings,
    stop_tokens: Vec<u32>,
    want_logprobs: bool,
    /// While the prompt is being scored: top alternatives per position.
    prompt_top: Option<usize>,
    prompt_logprobs: Vec<Sampled>,
    pub events: UnboundedSender<Event>,
    pub submitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

impl<'t> Seq<'t> {
    pub fn new(
        tok: &'t Tokenizer,
        req: Request,
        events: UnboundedSender<Event>,
        arrival: u64,
        capacity: usize,
    ) -> Self {
        let mut stop_tokens = req.stop_tokens;
        if !req.ignore_eos {
            stop_tokens.extend(tok.special().stop.iter().copied());
        }
        Self {
            id: format!("seq{arrival}"),
            arrival,
            prompt_len: req.prompt.len(),
            sampler: Sampler::new(req.sampling.clone(), &req.prompt),
            want_logprobs: req.sampling.top_logprobs > 0,
            prompt_top: req.prompt_logprobs.filter(|_| req.prompt.len() > 1),
            prompt_logprobs: Vec::new(),
            tokens: req.prompt,
            computed: 0,
            has_cache: false,
            cached_tokens: 0,
            max_tokens: req.max_tokens,
            capacity,
            constraint: req.constraint,
            budget: req.reasoning_budget.map(BudgetState::new),
            tok,
            decoder: tok.incremental_decoder(),
            stops: StopStrings::new(req.stop_strings),
            stop_tokens,
            events,
            submitted: Instant::now(),
            first_token: None,
            last_token: None,
        }
    }

    pub fn max_tokens_is_zero(&self) -> bool {
        self.max_tokens == 0
    }

    /// Whether the prompt is still being scored: its prefill then needs
    /// logits at every position, not only the last.
    pub fn scores_prompt(&self) -> bool {
        self.prompt_top.is_some()
    }

    /// Records the prompt tokens predicted by `logits`, rows for positions
    /// `from..` (row j scores token `from + j + 1`); once every prompt token
    /// after the first is scored, sends them. Positions scored before (a
    /// preempted request computes them again) are skipped.
    pub fn on_prompt_logits(&mut self, from: usize, logits: &[f32], vocab: usize) {
        let Some(top) = self.prompt_top else {
            return;
        };
        for (j, row) in logits.chunks_exact(vocab).enumerate() {
            let next = from + j + 1;
            if next < self.prompt_len && next == self.prompt_logprobs.len() + 1 {
                self.prompt_logprobs
                    .push(score(row, self.tokens[next], top));
            }
        }
        if self.prompt_logprobs.len() + 1 == self.prompt_len {
            self.prompt_top = None;
            let scored = std::mem::take(&mut self.prompt_logprobs);
            let _ = self.events.send(Event::PromptLogprobs(scored));
        }
    }

    /// Tokens not yet in the cache.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Whether the client is gone.
    pub fn cancelled(&self) -> bool {
        self.events.is_closed()
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Samples the next token from the logits after the last token and
    /// reports it. Returns the finish reason when the request has ended
    /// (its final events are sent).
    pub fn on_logits(&mut self, logits: &mut [f32]) -> Option<FinishReason> {
        self.record_timing();
        if let Err(e) = self.constrain(logits) {
            return Some(self.abort(&e));
        }
        let s = self.sampler.sample(logits);
        self.emit(s)
    }

    /// Masks what the grammar does not allow here (before any other
    /// sampling setting looks at the logits).
    fn constrain(&mut self, logits: &mut [f32]) -> ferrum_types::Result<()> {
        if let Some(c) = &mut self.constraint {
            c.apply(logits, &self.stop_tokens)?;
        }
        // A spent reasoning budget: only the token that closes it.
        if let Some(forced) = self.budget.as_ref().and_then(BudgetState::forced) {
            for (id, l) in logits.iter_mut().enumerate() {
                if id != forced as usize {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// Ends the request with an error event (nothing follows it).
    fn abort(&mut self, e: &ferrum_types::FerrumError) -> FinishReason {
        metrics::counter!("ferrum_requests_finished_total", "finished_reason" => "abort")
            .increment(1);
        let _ = self.events.send(Event::Error(e.to_string()));
        FinishReason::Stop
    }

    /// Drops grammar masks prepared for positions this step did not reach.
    pub fn end_step(&mut self) {
        if let Some(c) = &mut self.constraint {
            c.end_step();
        }
    }

    /// Like [`Seq::on_logits`] for a position whose next token was drafted:
    /// also says whether the draft was accepted.
    pub fn on_draft(&mut self, logits: &mut [f32], draft: u32) -> (Option<FinishReason>, bool) {
        self.record_timing();
        if let Err(e) = self.constrain(logits) {
            return (Some(self.abort(&e)), false);
        }
        let (s, accepted) = self.sampler.verify(logits, draft);
        (self.emit(s), accepted)
    }

    fn record_timing(&mut self) {
        let now = Instant::now();
        match self.last_token {
            None => metrics::histogram!("ferrum_time_to_first_token_seconds")
                .record((now - self.submitted).as_secs_f64()),
            Some(t) => metrics::histogram!("ferrum_inter_token_latency_seconds")
                .record((now - t).as_secs_f64()),
        }
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
    }

    fn emit(&mut self, s: Sampled) -> Option<FinishReason> {
        let token = s.token;
        self.sampler.accept(token);
        if self.stop_tokens.contains(&token) {
            return Some(self.finish(FinishReason::Stop, None));
        }
        if let Some(c) = &mut self.constraint {
            let tok = self.tok;
            if let Err(e) = c.commit(token, || tok.token_bytes(token)) {
                return Some(self.abort(&e));
            }
        }
        self.tokens.push(token);
        metrics::counter!("ferrum_generation_tokens_total").increment(1);
        let piece = self.decoder.push(token);
        if let Some(b) = &mut self.budget {
            b.observe(&piece);
        }
        let (text, stopped) = self.stops.push(&piece);
        let logprob = self.want_logprobs.then_some(s);
        let _ = self.events.send(Event::Token { token, text, logprob });
        if stopped.is_some() {
            return Some(self.finish(FinishReason::Stop, stopped));
        }
        // A complete grammar allows nothing more (it would only allow EOS).
        if self
            .constraint
            .as_ref()
            .is_some_and(Constraint::is_finished)
        {
            return Some(self.finish(FinishReason::Stop, None));
        }
        if self.generated() >= self.max_tokens || self.tokens.len() >= self.capacity {
            return Some(self.finish(FinishReason::Length, None));
        }
        None
    }

    /// Tokens this request may still generate.
    pub fn remaining(&self) -> usize {
        self.max_tokens
            .saturating_sub(self.generated())
            .min(self.capacity.saturating_sub(self.tokens.len()))
    }

    /// Ends the sequence; `stop_string` is the stop string that ended it.
    fn finish(&mut self, reason: FinishReason, stop_string: Option<String>) -> FinishReason {
        // Text held back as a possible stop-string prefix is real output
        // unless a stop string actually matched.
        if stop_string.is_none() {
            let rest = self.stops.push(&self.decoder.finish()).0 + &self.stops.finish();
            if !rest.is_empty() {
                let _ = self.events.send(Event::Text(rest));
            }
        }
        let n = self.generated();
        if let (Some(first), Some(last)) = (self.first_token, self.last_token) {
            if n > 1 {
                metrics::histogram!("ferrum_time_per_output_token_seconds")
                    .record((last - first).as_secs_f64() / (n - 1) as f64);
            }
        }
        metrics::histogram!("ferrum_e2e_request_latency_seconds")
            .record(self.submitted.elapsed().as_secs_f64());
        metrics::histogram!("ferrum_request_prompt_tokens").record(self.prompt_len as f64);
        metrics::histogram!("ferrum_request_generation_tokens").record(n as f64);
        metrics::counter!("ferrum_requests_finished_total", "finished_reason" => reason.as_str())
            .increment(1);
        let _ = self.events.send(Event::Done(Completion {
            finish: reason,
            prompt_tokens: self.prompt_len,
            completion_tokens: n,
            cached_tokens: self.cached_tokens,
            stop_string,
        }));
        reason
    }
}
