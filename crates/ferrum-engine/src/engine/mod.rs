//! The serving engine: one loop that owns the model and runs every
//! request's prefill chunks and decode steps together (continuous
//! batching), admitting and preempting on free KV blocks.
//!
//! Callers [`Engine::submit`] a [`Request`] and read its [`Event`]s from a
//! tokio channel; dropping the receiver cancels the request, and its KV
//! blocks are freed at the next step. The loop runs on its own thread inside
//! a CPU pool (see `ferrum_kernels::cpu::on_pool`).

mod scheduler;
mod sequence;
mod speculate;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use ferrum_models::KvEvent;
use ferrum_models::PagedLlm;
use ferrum_structured::Constraint;
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FerrumError, Result};
use tokio::sync::mpsc as tmpsc;

use crate::budget::ReasoningBudget;
use crate::finish::FinishReason;
use crate::sampler::{Sampled, SamplingParams};
pub use speculate::{Drafter, Speculation};

/// Scheduling limits (vLLM's names and meanings).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences decoding or prefilling in one step.
    pub max_num_seqs: usize,
    /// Tokens (prefill chunks + one per decode) in one step. A long prompt
    /// is split into chunks of at most this size, so running decodes keep
    /// their pace while it is prefilled.
    pub max_num_batched_tokens: usize,
    /// CPU threads for the model (None: all cores).
    pub threads: Option<usize>,
    /// Where each step sends the prefix cache's changes (vLLM's KV events,
    /// for routers that place requests where their prefix is cached);
    /// `None`: they are not recorded.
    pub kv_events: Option<tmpsc::UnboundedSender<KvEventBatch>>,
}

/// The prefix cache's changes in one engine step.
#[derive(Clone, Debug)]
pub struct KvEventBatch {
    /// Tokens per block.
    pub block_size: usize,
    pub events: Vec<KvEvent>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            threads: None,
            kv_events: None,
        }
    }
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Clamped to what the model's context leaves after the prompt.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    /// Tokens that end generation in addition to the tokenizer's own.
    pub stop_tokens: Vec<u32>,
    /// Generate past the tokenizer's end-of-sequence tokens (vLLM's
    /// `ignore_eos`: benchmarks that need every request at full length).
    pub ignore_eos: bool,
    /// Score the prompt too: the log-probability of each prompt token after
    /// the first, with this many top alternatives ([`Event::PromptLogprobs`]).
    /// Such a prompt skips the prefix cache: cached positions have no logits.
    pub prompt_logprobs: Option<usize>,
    /// A grammar the output must follow (structured output, tool calls):
    /// tokens it does not allow are masked before sampling.
    pub constraint: Option<Constraint>,
    /// How long a thinking model may reason before its reasoning is closed.
    pub reasoning_budget: Option<ReasoningBudget>,
}

/// What a request's stream carries, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A generated token and the text it completes: never half a UTF-8
    /// character, never part of a stop string (that text is held back until
    /// it is known not to be one). `logprob` is set when `top_logprobs > 0`.
    Token {
        token: u32,
        text: String,
        logprob: Option<Sampled>,
    },
    /// Held-back text released at the end (no stop string matched).
    Text(String),
    /// With `prompt_logprobs`: the prompt's tokens after the first, scored
    /// given those before them; comes before the first token.
    PromptLogprobs(Vec<Sampled>),
    /// The last event of a request that ran to its end.
    Done(Completion),
    /// The request failed; nothing follows.
    Error(String),
}

/// How a request ended, with OpenAI-style usage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
    /// The stop string that ended generation, if one did.
    pub stop_string: Option<String>,
}

/// Live counters the HTTP side and tests read.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    /// Sequences holding KV blocks (0 when idle: nothing leaks).
    pub live_caches: AtomicUsize,
    pub preemptions: AtomicUsize,
    /// Speculative decoding: draft tokens proposed, and accepted.
    pub drafted: AtomicUsize,
    pub accepted: AtomicUsize,
}

impl EngineStats {
    pub fn get(&self, counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

struct Submission {
    req: Request,
    events: tmpsc::UnboundedSender<Event>,
}

/// A handle to the engine loop; cheap to clone and share.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Submission>,
    stats: Arc<EngineStats>,
    tok: Arc<Tokenizer>,
    capacity: usize,
}

impl Engine {
    /// Starts the loop on its own thread. It ends when every handle is
    /// dropped and the running requests are done.
    pub fn start(model: Box<dyn PagedLlm>, tok: Arc<Tokenizer>, cfg: EngineConfig) -> Result<Self> {
        Self::start_with(model, tok, cfg, None)
    }

    /// [`Engine::start`] with speculative decoding.
    pub fn start_with(
        model: Box<dyn PagedLlm>,
        tok: Arc<Tokenizer>,
        cfg: EngineConfig,
        spec: Option<Speculation>,
    ) -> Result<Self> {
        if let Some(s) = &spec {
            s.check_vocab(model.config().vocab_size)?;
        }
        let capacity = model.kv_capacity();
        let stats = Arc::new(EngineStats::default());
        let (tx, rx) = mpsc::channel();
        let (st, tk) = (stats.clone(), tok.clone());
        std::thread::Builder::new()
            .name("ferrum-engine".into())
            .spawn(move || {
                let threads = cfg.threads;
                let run = move || scheduler::Loop::new(model, &tk, cfg, st, spec).run(rx);
                if let Err(e) = ferrum_kernels::cpu::on_pool(threads, run) {
                    tracing::error!("cannot start the model's CPU threads: {e}");
                }
            })
            .map_err(|e| FerrumError::Device(format!("cannot start the engine thread: {e}")))?;
        Ok(Self { tx, stats, tok, capacity })
    }

    /// Queues `req` and returns its event stream. Invalid requests (empty
    /// prompt, unknown token ids, bad sampling values, a prompt that leaves
    /// no room in the context) are refused here, before they are queued.
    pub fn submit(&self, mut req: Request) -> Result<tmpsc::UnboundedReceiver<Event>> {
        req.sampling.validate()?;
        if req.prompt.is_empty() {
            return Err(FerrumError::invalid("the prompt is empty"));
        }
        self.tok.check_ids(&req.prompt)?;
        let biased: Vec<u32> = req.sampling.logit_bias.iter().map(|b| b.0).collect();
        self.tok.check_ids(&biased)?;
        if req.prompt.len() >= self.capacity {
            return Err(FerrumError::ContextOverflow {
                needed: req.prompt.len() + 1,
                capacity: self.capacity,
            });
        }
        req.max_tokens = req.max_tokens.min(self.capacity - req.prompt.len());
        let (events, rx) = tmpsc::unbounded_channel();
        self.tx
            .send(Submission { req, events })
            .map_err(|_| FerrumError::Device("the engine is not running".into()))?;
        Ok(rx)
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// The most positions one sequence can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }
}
