//! The engine loop: each step takes in new requests, drops cancelled ones,
//! plans a batch under the token, sequence and KV-block budgets, runs it as
//! one forward pass and samples where a sequence's input is complete.
//!
//! The scheduler owns the KV block manager over the model's pool (as vLLM's
//! scheduler owns its KV cache manager): it reserves blocks while planning
//! and hands the model each item's block table; the model only stores K/V.
//!
//! Policy (vLLM's, simplified): running decodes first; then the rest of
//! partially prefilled prompts; then waiting requests in arrival order,
//! each after attaching whatever prefix the KV cache already holds. A
//! waiting request that does not fit stops admission (no overtaking). When
//! decodes need more blocks than are free, the newest running request is
//! preempted: its blocks are released and it waits again with its generated
//! tokens, to be recomputed (mostly from the prefix cache) when it returns.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use ferrum_models::{with_items, BatchItem, BlockCopy, BlockManager, LogitsWanted, PagedLlm};
use ferrum_structured::Constraint;
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FerrumError, Result};

use super::sequence::Seq;
use super::speculate::Speculation;
use super::{Completion, EngineConfig, EngineStats, Event, KvEventBatch, Submission};
use crate::finish::FinishReason;

/// Most prompt positions scored in one step: each needs a row of
/// vocabulary-sized logits (a 512-token chunk of a 150K vocabulary would be
/// 300 MB of them).
const SCORE_CHUNK: usize = 64;

/// Most decoding sequences in a step that still speculates. Measured with
/// `ferrum bench serve` on 2 cores (SmolLM2, n-gram drafts, 90% accepted):
/// verifying every decode's drafts gave +42% output tokens/s alone, +5% at
/// 4 concurrent requests, and nothing or a loss at 16.
const SPEC_MAX_DECODES: usize = 4;

/// One sequence's share of a step: `tokens` new positions, and for a
/// decode that speculates, the draft tokens verified after its pending one.
#[derive(Clone)]
struct Planned {
    /// Index into `running`.
    seq: usize,
    tokens: usize,
    draft: Vec<u32>,
}

pub(super) struct Loop<'t> {
    model: Box<dyn PagedLlm>,
    /// Which pool blocks each sequence holds, and the prefix cache.
    kv: BlockManager,
    /// Copy-on-write copies reserved while planning, done before the step.
    copies: Vec<BlockCopy>,
    tok: &'t Tokenizer,
    cfg: EngineConfig,
    stats: Arc<EngineStats>,
    capacity: usize,
    waiting: VecDeque<Seq<'t>>,
    running: Vec<Seq<'t>>,
    arrivals: u64,
    spec: Option<Speculation>,
    /// Reused every step: the logits of the wanted rows (a step allocates
    /// nothing for them once they have grown).
    logits: Vec<f32>,
}

impl<'t> Loop<'t> {
    pub fn new(
        model: Box<dyn PagedLlm>,
        tok: &'t Tokenizer,
        mut cfg: EngineConfig,
        stats: Arc<EngineStats>,
        spec: Option<Speculation>,
    ) -> Self {
        cfg.max_num_seqs = cfg.max_num_seqs.max(1);
        // Every running decode must fit in a step.
        cfg.max_num_batched_tokens = cfg.max_num_batched_tokens.max(cfg.max_num_seqs);
        let capacity = model.kv_capacity();
        let mut kv = model.kv_pool().manager();
        if cfg.kv_events.is_some() {
            kv.record_events();
        }
        Self {
            model,
            kv,
            copies: Vec::new(),
            tok,
            cfg,
            stats,
            capacity,
            waiting: VecDeque::new(),
            running: Vec::new(),
            arrivals: 0,
            spec,
            logits: Vec::new(),
        }
    }

    pub fn run(mut self, rx: mpsc::Receiver<Submission>) {
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
                self.publish();
                match rx.recv() {
                    Ok(s) => self.admit_new(s),
                    Err(_) => return,
                }
            }
            while let Ok(s) = rx.try_recv() {
                self.admit_new(s);
            }
            self.drop_cancelled();
            let plan = self.plan();
            if plan.is_empty() {
                continue;
            }
            let plan = self.draft(plan);
            self.execute(&plan);
            self.publish();
        }
    }

    fn admit_new(&mut self, s: Submission) {
        self.arrivals += 1;
        let seq = Seq::new(self.tok, s.req, s.events, self.arrivals, self.capacity);
        metrics::counter!("ferrum_prompt_tokens_total").increment(seq.prompt_len as u64);
        if seq.max_tokens_is_zero() {
            let _ = seq.events.send(Event::Done(Completion {
                finish: FinishReason::Length,
                prompt_tokens: seq.prompt_len,
                completion_tokens: 0,
                cached_tokens: 0,
                stop_string: None,
            }));
            return;
        }
        self.waiting.push_back(seq);
    }

    fn drop_cancelled(&mut self) {
        if !self
            .running
            .iter()
            .chain(&self.waiting)
            .any(|s| s.cancelled())
        {
            return;
        }
        let before = self.running.len() + self.waiting.len();
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| s.cancelled());
        self.running = kept;
        for mut s in gone {
            self.release(&mut s);
        }
        self.waiting.retain(|s| !s.cancelled());
        let gone = before - self.running.len() - self.waiting.len();
        if gone > 0 {
            metrics::counter!("ferrum_requests_cancelled_total").increment(gone as u64);
            metrics::counter!("ferrum_requests_finished_total", "finished_reason" => "abort")
                .increment(gone as u64);
        }
    }

    /// Blocks a reservation can take: free plus evictable.
    fn available_blocks(&self) -> usize {
        self.kv.usage().available_blocks()
    }

    /// Decides this step's batch; may preempt and admit.
    fn plan(&mut self) -> Vec<Planned> {
        // Decodes (one pending token) need their blocks first; preempt the
        // newest requests until they fit.
        loop {
            let need: usize = self
                .running
                .iter()
                .filter(|s| s.pending() == 1)
                .map(|s| self.kv.blocks_needed(&s.id, s.computed + 1))
                .sum();
            if need <= self.available_blocks() || self.running.len() <= 1 {
                break;
            }
            self.preempt_newest();
        }
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut plan = Vec::new();
        // Running sequences: decodes, then continuing prefills, in arrival
        // order (running is kept sorted by arrival).
        for decode_pass in [true, false] {
            for i in 0..self.running.len() {
                let s = &self.running[i];
                if (s.pending() == 1) != decode_pass || budget == 0 {
                    continue;
                }
                let n = fit(&mut self.kv, &mut self.copies, s, budget.min(chunk(s)));
                if n > 0 {
                    budget -= n;
                    plan.push(Planned { seq: i, tokens: n, draft: Vec::new() });
                }
            }
        }
        // Waiting requests, first come first served.
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            if !s.has_cache {
                let reusable = if s.scores_prompt() {
                    &[][..]
                } else {
                    &s.tokens[..s.tokens.len().min(self.capacity)]
                };
                let hit = self.kv.match_prefix(&s.id, reusable);
                s.has_cache = true;
                s.computed = hit;
                if s.cached_tokens == 0 && s.generated() == 0 {
                    s.cached_tokens = hit;
                }
                self.stats.live_caches.fetch_add(1, Ordering::SeqCst);
            }
            let n = fit(&mut self.kv, &mut self.copies, &s, budget.min(chunk(&s)));
            if n == 0 {
                // Not even one token fits: give the prefix blocks back and
                // wait for running requests to finish.
                self.release(&mut s);
                self.waiting.push_front(s);
                break;
            }
            budget -= n;
            let i = self.insert_running(s);
            for p in &mut plan {
                if p.seq >= i {
                    p.seq += 1;
                }
            }
            plan.push(Planned { seq: i, tokens: n, draft: Vec::new() });
        }
        if plan.is_empty() && !self.running.is_empty() {
            // Nothing fits although requests are running: only possible when
            // the one running request's own growth exceeds the pool.
            let s = self.running.remove(0);
            self.fail(
                s,
                "the KV cache pool is too small for this request; raise --kv-cache-tokens",
            );
        }
        plan
    }

    fn insert_running(&mut self, s: Seq<'t>) -> usize {
        let i = self.running.partition_point(|r| r.arrival < s.arrival);
        self.running.insert(i, s);
        i
    }

    fn preempt_newest(&mut self) {
        let Some(mut s) = self.running.pop() else {
            return;
        };
        tracing::debug!(seq = %s.id, "preempted: KV blocks are short; it will be recomputed");
        self.release(&mut s);
        self.stats.preemptions.fetch_add(1, Ordering::SeqCst);
        metrics::counter!("ferrum_preemptions_total").increment(1);
        let i = self.waiting.partition_point(|w| w.arrival < s.arrival);
        self.waiting.insert(i, s);
    }

    fn release(&mut self, s: &mut Seq) {
        if let Some(spec) = &mut self.spec {
            spec.release(&s.id);
        }
        if s.has_cache {
            self.kv.release(&s.id);
            s.has_cache = false;
            s.computed = 0;
            self.stats.live_caches.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn fail(&mut self, mut s: Seq, msg: &str) {
        self.release(&mut s);
        let _ = s.events.send(Event::Error(msg.to_string()));
    }

    /// Runs one step: sequences scoring their prompt one by one (they need
    /// logits at every position), the rest as one batch; then retires the
    /// sequences that finished or failed.
    fn execute(&mut self, plan: &[Planned]) {
        // (index into running, the error it failed with)
        let mut ended: Vec<(usize, Option<String>)> = Vec::new();
        if let Err(e) = self.copy_reserved() {
            ended.extend(plan.iter().map(|p| (p.seq, Some(e.to_string()))));
        } else {
            let (scoring, batched): (Vec<Planned>, Vec<Planned>) = plan
                .iter()
                .cloned()
                .partition(|p| self.running[p.seq].scores_prompt());
            for p in &scoring {
                ended.extend(self.score_chunk(p));
            }
            if !batched.is_empty() {
                self.run_batch(&batched, &mut ended);
            }
        }
        ended.sort_unstable_by_key(|e| e.0);
        for (i, error) in ended.into_iter().rev() {
            let mut s = self.running.remove(i);
            match error {
                Some(m) => self.fail(s, &m),
                None => self.release(&mut s),
            }
        }
    }

    /// Performs the copy-on-write copies reserved while planning.
    fn copy_reserved(&mut self) -> Result<()> {
        if self.copies.is_empty() {
            return Ok(());
        }
        let done = self.model.copy_blocks(&self.copies);
        self.copies.clear();
        done
    }

    /// Prefills one chunk of a prompt that is being scored; `Some` when the
    /// sequence ended (finished at once, or failed).
    fn score_chunk(&mut self, p: &Planned) -> Option<(usize, Option<String>)> {
        let vocab = self.model.config().vocab_size;
        let s = &mut self.running[p.seq];
        let (from, end) = (s.computed, s.computed + p.tokens);
        let item = BatchItem {
            tokens: &s.tokens[from..end],
            pos: from,
            block_table: self.kv.table(&s.id),
            logits: LogitsWanted::All,
        };
        if let Err(e) = guarded(self.model.as_mut(), &[item], &mut self.logits) {
            tracing::error!("scoring a prompt failed: {e}");
            return Some((p.seq, Some(e.to_string())));
        }
        self.kv.commit(&s.id, &s.tokens[from..end]);
        s.computed = end;
        s.on_prompt_logits(from, &self.logits, vocab);
        if end < s.tokens.len() {
            return None;
        }
        let last = &mut self.logits[(p.tokens - 1) * vocab..];
        s.on_logits(last).map(|_| (p.seq, None))
    }

    /// One forward pass over `plan`'s chunks and decodes (with their drafts,
    /// where they speculate); samples where a sequence's input is complete.
    fn run_batch(&mut self, plan: &[Planned], ended: &mut Vec<(usize, Option<String>)>) {
        let fail_all = |ended: &mut Vec<_>, msg: &str| {
            ended.extend(plan.iter().map(|p| (p.seq, Some(msg.to_string()))));
        };
        metrics::histogram!("ferrum_batch_tokens")
            .record(plan.iter().map(|p| p.tokens + p.draft.len()).sum::<usize>() as f64);
        // A speculating decode feeds its pending token and its drafts.
        let fed: Vec<Vec<u32>> = plan
            .iter()
            .map(|p| match p.draft.is_empty() {
                true => Vec::new(),
                false => {
                    let s = &self.running[p.seq];
                    std::iter::once(s.tokens[s.computed])
                        .chain(p.draft.iter().copied())
                        .collect()
                }
            })
            .collect();
        // The constraints of sequences that sample this step, taken out
        // (with their drafts) so a worker can prepare their masks.
        let mut grammar_jobs: Vec<(usize, Constraint, Vec<u32>)> = plan
            .iter()
            .filter_map(|p| {
                let s = &mut self.running[p.seq];
                let samples = s.computed + p.tokens == s.tokens.len() || !p.draft.is_empty();
                let c = s.constraint.take_if(|_| samples)?;
                Some((p.seq, c, p.draft.clone()))
            })
            .collect();
        let (kv, running) = (&self.kv, &self.running);
        let items = plan.iter().zip(&fed).map(|(p, fed)| {
            let s = &running[p.seq];
            let end = s.computed + p.tokens;
            let (tokens, logits) = match (fed.is_empty(), end == s.tokens.len()) {
                (false, _) => (&fed[..], LogitsWanted::All),
                (true, true) => (&s.tokens[s.computed..end], LogitsWanted::Last),
                (true, false) => (&s.tokens[s.computed..end], LogitsWanted::None),
            };
            BatchItem {
                tokens,
                pos: s.computed,
                block_table: kv.table(&s.id),
                logits,
            }
        });
        let (model, logits) = (self.model.as_mut(), &mut self.logits);
        // Grammar masks for the positions this step samples are computed on
        // another thread while the forward pass runs.
        let masks = &mut grammar_jobs;
        let done = std::thread::scope(|sc| {
            let worker = (!masks.is_empty()).then(|| {
                sc.spawn(move || {
                    for (_, c, drafts) in masks.iter_mut() {
                        // An error here comes back when the mask is applied.
                        let _ = c.prepare(drafts);
                    }
                })
            });
            let done = with_items(items, |items| guarded(model, items, logits));
            if let Some(w) = worker {
                let _ = w.join();
            }
            done
        });
        for (i, c, _) in grammar_jobs {
            self.running[i].constraint = Some(c);
        }
        if let Err(e) = done {
            tracing::error!("a batch failed: {e}");
            return fail_all(ended, &e.to_string());
        }
        let vocab = self.model.config().vocab_size;
        let mut row = 0;
        for (p, fed) in plan.iter().zip(&fed) {
            let s = &mut self.running[p.seq];
            if !fed.is_empty() {
                // Each fed position has a row; the drafts are accepted up to
                // the first rejection, and the token emitted last (the
                // correction or the bonus) stays pending.
                if (row + fed.len()) * vocab > self.logits.len() {
                    ended.push((p.seq, Some("internal error: logits missing".into())));
                    continue;
                }
                self.kv.commit(&s.id, fed);
                let (mut accepted, mut finished) = (0, None);
                for (j, l) in self.logits[row * vocab..(row + fed.len()) * vocab]
                    .chunks_exact_mut(vocab)
                    .enumerate()
                {
                    let Some(&d) = p.draft.get(j) else {
                        finished = s.on_logits(l);
                        break;
                    };
                    let (fin, ok) = s.on_draft(l, d);
                    accepted += usize::from(ok);
                    finished = fin;
                    if fin.is_some() || !ok {
                        break;
                    }
                }
                row += fed.len();
                s.end_step();
                s.computed += 1 + accepted;
                self.kv.truncate(&s.id, s.computed);
                self.stats
                    .drafted
                    .fetch_add(p.draft.len(), Ordering::SeqCst);
                self.stats.accepted.fetch_add(accepted, Ordering::SeqCst);
                metrics::counter!("ferrum_spec_draft_tokens_total").increment(p.draft.len() as u64);
                metrics::counter!("ferrum_spec_accepted_tokens_total").increment(accepted as u64);
                if finished.is_some() {
                    ended.push((p.seq, None));
                }
                continue;
            }
            let end = s.computed + p.tokens;
            self.kv.commit(&s.id, &s.tokens[s.computed..end]);
            s.computed = end;
            if end < s.tokens.len() {
                continue;
            }
            // The model returns exactly one row per final chunk.
            let Some(l) = self.logits.get_mut(row * vocab..(row + 1) * vocab) else {
                ended.push((p.seq, Some("internal error: logits missing".into())));
                continue;
            };
            row += 1;
            if s.on_logits(l).is_some() {
                ended.push((p.seq, None));
            }
        }
    }

    /// Gives each decode of `plan` its draft tokens where the step
    /// speculates (their blocks reserved): every decoding sequence of a
    /// batch of up to [`SPEC_MAX_DECODES`] decodes, its pending token and
    /// drafts verified in the one forward pass with the rest of the batch.
    /// Decoding a few sequences is memory-bound (the weights are read once
    /// per step whatever the rows), so verified drafts cost little; a larger
    /// batch already uses the cores, and its drafts' rows would cost more
    /// than they save.
    fn draft(&mut self, mut plan: Vec<Planned>) -> Vec<Planned> {
        let Some(spec) = self.spec.as_mut() else {
            return plan;
        };
        let decodes = plan
            .iter()
            .filter(|p| self.running[p.seq].pending() == 1)
            .count();
        if decodes > SPEC_MAX_DECODES {
            return plan;
        }
        for p in &mut plan {
            let s = &mut self.running[p.seq];
            if s.pending() != 1 || s.scores_prompt() {
                continue;
            }
            // The last drafted position still needs room for its own logits.
            let k = spec.tokens.min(s.remaining().saturating_sub(1));
            if k == 0 {
                continue;
            }
            let mut draft = match spec.propose(&s.id, &s.tokens, k) {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!("the draft model failed ({e}); this step does not speculate");
                    continue;
                }
            };
            // Only drafts the grammar allows are worth verifying.
            if let Some(c) = &mut s.constraint {
                draft.truncate(c.valid_prefix(&draft));
            }
            if draft.is_empty() {
                continue;
            }
            if let Ok(copies) = self.kv.reserve(&s.id, s.computed + 1 + draft.len()) {
                self.copies.extend(copies);
                p.draft = draft;
            }
        }
        plan
    }

    fn publish(&mut self) {
        let (w, r) = (self.waiting.len(), self.running.len());
        self.stats.waiting.store(w, Ordering::SeqCst);
        self.stats.running.store(r, Ordering::SeqCst);
        metrics::gauge!("ferrum_requests_waiting").set(w as f64);
        metrics::gauge!("ferrum_requests_running").set(r as f64);
        {
            let u = self.kv.usage();
            metrics::gauge!("ferrum_kv_blocks_used").set(u.used_blocks as f64);
            metrics::gauge!("ferrum_kv_blocks_free").set(u.available_blocks() as f64);
            metrics::gauge!("ferrum_kv_blocks_cached").set(u.cached_blocks as f64);
            // vLLM's measure: blocks held by requests over all blocks
            // (cached blocks no request holds count as free).
            if u.total_blocks > 0 {
                metrics::gauge!("ferrum_kv_cache_usage")
                    .set(u.used_blocks as f64 / u.total_blocks as f64);
            }
            metrics::counter!("ferrum_prefix_cache_queries_total").absolute(u.prefix_query_tokens);
            metrics::counter!("ferrum_prefix_cache_hits_total").absolute(u.prefix_hit_tokens);
            if let Some(tx) = &self.cfg.kv_events {
                let events = self.kv.take_events();
                if !events.is_empty() {
                    let _ = tx.send(KvEventBatch { block_size: u.block_size, events });
                }
            }
            if u.prefix_query_tokens > 0 {
                metrics::gauge!("ferrum_prefix_cache_hit_rate")
                    .set(u.prefix_hit_tokens as f64 / u.prefix_query_tokens as f64);
            }
        }
    }
}

/// The most tokens of `s` one step may take.
fn chunk(s: &Seq) -> usize {
    if s.scores_prompt() {
        s.pending().min(SCORE_CHUNK)
    } else {
        s.pending()
    }
}

/// The largest chunk `<= want` of `s` whose blocks the pool has, reserved
/// now (its copy-on-write copies queued in `copies`); 0 if not one token
/// fits.
fn fit(kv: &mut BlockManager, copies: &mut Vec<BlockCopy>, s: &Seq, want: usize) -> usize {
    let mut n = want;
    while n > 0 {
        if let Ok(c) = kv.reserve(&s.id, s.computed + n) {
            copies.extend(c);
            return n;
        }
        n /= 2;
    }
    0
}

/// [`PagedLlm::forward_paged`], with a panic inside the model turned into
/// an error: a panic there is a bug, and it must cost only the requests of
/// the step, not the engine. Errors themselves come back as `Result`.
fn guarded(model: &mut dyn PagedLlm, items: &[BatchItem], logits: &mut Vec<f32>) -> Result<()> {
    catch_unwind(AssertUnwindSafe(|| model.forward_paged(items, logits))).unwrap_or_else(|_| {
        Err(FerrumError::Device(
            "internal error: the model panicked".into(),
        ))
    })
}
