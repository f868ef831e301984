//! Between the HTTP handlers and the [`Engine`]: a [`Job`] is one request
//! with `n` choices; each choice is an engine request, and its events are
//! forwarded tagged with the choice index. A client that goes away closes
//! the job's channel; the forwarder then drops the engine streams, which
//! cancels the choices and frees their KV blocks at the engine's next step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferrum_engine::{Engine, FinishReason, ReasoningBudget, Request, Sampled, SamplingParams};
use ferrum_structured::Constraint;
use tokio::sync::mpsc;

use crate::access_log::Tokens;

/// One request: `n` choices continuing `prompt`.
pub struct Job {
    pub prompt: Vec<u32>,
    pub n: usize,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Score the prompt's tokens too (`echo` with `logprobs`), with this
    /// many alternatives each.
    pub prompt_logprobs: Option<usize>,
    /// The grammar every choice's output follows (each gets its own copy).
    pub constraint: Option<Constraint>,
    pub reasoning_budget: Option<ReasoningBudget>,
    pub events: mpsc::UnboundedSender<Event>,
    /// The request's counts for its log line (the prompt once, every
    /// choice's answer).
    pub tokens: Option<Arc<Tokens>>,
}

/// What the server reports for a job, in order per choice.
pub enum Event {
    /// New text, with the log-probabilities of the tokens that produced it
    /// (those since the previous text; empty unless asked for).
    Text {
        index: usize,
        text: String,
        logprobs: Vec<Sampled>,
    },
    Done {
        index: usize,
        done: ChoiceDone,
    },
    Failed(String),
}

pub struct ChoiceDone {
    pub finish: FinishReason,
    pub tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached: usize,
    pub logprobs: Vec<Sampled>,
    /// How many of `logprobs` went out with `Text` events already.
    pub streamed: usize,
    /// The prompt's tokens after the first, when asked for.
    pub prompt_logprobs: Vec<Sampled>,
    /// The stop string that ended this choice, if one did.
    pub stop_string: Option<String>,
}

/// Shared counters the HTTP side reads.
#[derive(Default)]
pub struct Load {
    /// Jobs accepted and not yet finished (queued + running).
    pub pending: AtomicUsize,
}

/// Starts the dispatcher; jobs sent to the returned channel run on `engine`.
/// Must be called inside a tokio runtime.
pub fn spawn(engine: Engine, load: Arc<Load>) -> mpsc::UnboundedSender<Job> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            let (engine, load) = (engine.clone(), load.clone());
            tokio::spawn(async move {
                run_job(&engine, job).await;
                load.pending.fetch_sub(1, Ordering::SeqCst);
                metrics::gauge!("ferrum_requests_pending")
                    .set(load.pending.load(Ordering::SeqCst) as f64);
            });
        }
    });
    tx
}

async fn run_job(engine: &Engine, job: Job) {
    let mut streams = Vec::with_capacity(job.n);
    for index in 0..job.n {
        let mut sampling = job.sampling.clone();
        // Distinct but reproducible choices when seeded.
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(index as u64));
        let req = Request {
            prompt: job.prompt.clone(),
            max_tokens: job.max_tokens,
            sampling,
            stop_strings: job.stop.clone(),
            stop_tokens: Vec::new(),
            ignore_eos: job.ignore_eos,
            prompt_logprobs: job.prompt_logprobs,
            constraint: job.constraint.clone(),
            reasoning_budget: job.reasoning_budget.clone(),
        };
        match engine.submit(req) {
            Ok(rx) => streams.push(rx),
            Err(e) => {
                let _ = job.events.send(Event::Failed(e.to_string()));
                return;
            }
        }
    }
    let mut set = tokio::task::JoinSet::new();
    for (index, rx) in streams.into_iter().enumerate() {
        set.spawn(forward(index, rx, job.events.clone(), job.tokens.clone()));
    }
    while set.join_next().await.is_some() {}
}

/// Relays one choice's engine events until it ends or the client leaves.
async fn forward(
    index: usize,
    mut rx: mpsc::UnboundedReceiver<ferrum_engine::Event>,
    out: mpsc::UnboundedSender<Event>,
    tokens: Option<Arc<Tokens>>,
) {
    use ferrum_engine::Event as E;
    let (mut logprobs, mut prompt_logprobs) = (Vec::new(), Vec::new());
    // Entries of `logprobs` already sent with a text.
    let mut streamed = 0;
    let mut text_event = |text: String, logprobs: &[Sampled]| {
        let ev = Event::Text {
            index,
            text,
            logprobs: logprobs[streamed..].to_vec(),
        };
        streamed = logprobs.len();
        ev
    };
    loop {
        let ev = tokio::select! {
            _ = out.closed() => return,
            ev = rx.recv() => ev,
        };
        let sent = match ev {
            Some(E::Token { text, logprob, .. }) => {
                logprobs.extend(logprob);
                text.is_empty() || out.send(text_event(text, &logprobs)).is_ok()
            }
            Some(E::Text(text)) => out.send(text_event(text, &logprobs)).is_ok(),
            Some(E::PromptLogprobs(p)) => {
                prompt_logprobs = p;
                true
            }
            Some(E::Done(c)) => {
                if let Some(t) = &tokens {
                    t.add(
                        if index == 0 { c.prompt_tokens } else { 0 },
                        c.completion_tokens,
                    );
                }
                let done = ChoiceDone {
                    finish: c.finish,
                    tokens: c.completion_tokens,
                    cached: c.cached_tokens,
                    logprobs: std::mem::take(&mut logprobs),
                    streamed,
                    prompt_logprobs: std::mem::take(&mut prompt_logprobs),
                    stop_string: c.stop_string,
                };
                let _ = out.send(Event::Done { index, done });
                return;
            }
            Some(E::Error(m)) => {
                let _ = out.send(Event::Failed(m));
                return;
            }
            None => {
                let _ = out.send(Event::Failed("the engine stopped".into()));
                return;
            }
        };
        if !sent {
            return;
        }
    }
}
