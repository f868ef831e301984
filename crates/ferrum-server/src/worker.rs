//! The thread that owns the language model. Requests queue up in a
//! channel and run one after another, each choice on its own KV cache that
//! is released as soon as the choice ends, so a request that is cancelled
//! (its client went away) or fails leaves nothing behind.
//!
//! One sequence at a time is the simple, exact baseline: a request's output
//! does not depend on what else is queued. Continuous batching replaces this
//! loop with the engine's scheduler (issue 6).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferrum_engine::{generate, FinishReason, GenerateRequest, Sampled, SamplingParams};
use ferrum_models::DecoderOnlyLLM;
use ferrum_tokenizer::Tokenizer;
use tokio::sync::mpsc;

/// One request: `n` choices continuing `prompt`.
pub struct Job {
    pub prompt: Vec<u32>,
    pub n: usize,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub events: mpsc::UnboundedSender<Event>,
}

/// What the worker reports for a job, in order per choice.
pub enum Event {
    Text { index: usize, text: String },
    Done { index: usize, done: ChoiceDone },
    Failed(String),
}

pub struct ChoiceDone {
    pub finish: FinishReason,
    pub tokens: usize,
    pub logprobs: Vec<Sampled>,
}

/// Shared counters the HTTP side reads.
#[derive(Default)]
pub struct Load {
    /// Jobs accepted and not yet finished (queued + running).
    pub pending: AtomicUsize,
    /// KV caches currently held (0 when idle: nothing leaks).
    pub live_caches: AtomicUsize,
}

pub fn spawn(
    mut model: Box<dyn DecoderOnlyLLM>,
    tok: Arc<Tokenizer>,
    load: Arc<Load>,
) -> std::io::Result<mpsc::UnboundedSender<Job>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
    std::thread::Builder::new()
        .name("ferrum-model".into())
        .spawn(move || {
            let serve = move || {
                let mut serial = 0u64;
                while let Some(job) = rx.blocking_recv() {
                    serial += 1;
                    run_job(model.as_mut(), &tok, &load, &job, serial);
                    load.pending.fetch_sub(1, Ordering::SeqCst);
                    metrics::gauge!("ferrum_requests_pending")
                        .set(load.pending.load(Ordering::SeqCst) as f64);
                }
            };
            // Drive the model from a CPU pool worker (see `on_pool`). Without
            // a pool the channel closes and requests get 503, not a hang.
            if let Err(e) = ferrum_kernels::cpu::on_pool(None, serve) {
                tracing::error!("cannot start the model's CPU threads: {e}");
            }
        })?;
    Ok(tx)
}

fn run_job(model: &mut dyn DecoderOnlyLLM, tok: &Tokenizer, load: &Load, job: &Job, serial: u64) {
    metrics::gauge!("ferrum_requests_running").set(1.0);
    for index in 0..job.n {
        if job.events.is_closed() {
            metrics::counter!("ferrum_requests_cancelled_total").increment(1);
            break;
        }
        let cache_id = format!("req{serial}-{index}");
        let mut sampling = job.sampling.clone();
        // Distinct but reproducible choices when seeded.
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(index as u64));
        let req = GenerateRequest {
            prompt: job.prompt.clone(),
            max_tokens: job.max_tokens,
            sampling,
            stop_strings: job.stop.clone(),
            stop_tokens: Vec::new(),
        };
        let start = Instant::now();
        let mut first = true;
        load.live_caches.fetch_add(1, Ordering::SeqCst);
        // A panic inside the model is a bug, but it must cost only this
        // request, not the server.
        let result = catch_unwind(AssertUnwindSafe(|| {
            generate(model, tok, &cache_id, 0, &req, |text| {
                if first {
                    metrics::histogram!("ferrum_time_to_first_token_seconds")
                        .record(start.elapsed().as_secs_f64());
                    first = false;
                }
                job.events
                    .send(Event::Text {
                        index,
                        text: text.to_string(),
                    })
                    .is_ok()
            })
        }));
        model.release(&cache_id);
        load.live_caches.fetch_sub(1, Ordering::SeqCst);
        match result {
            Ok(Ok(out)) => {
                metrics::counter!("ferrum_prompt_tokens_total").increment(out.prompt_tokens as u64);
                metrics::counter!("ferrum_generation_tokens_total")
                    .increment(out.tokens.len() as u64);
                if out.tokens.len() > 1 {
                    metrics::histogram!("ferrum_time_per_output_token_seconds")
                        .record(out.decode_time.as_secs_f64() / (out.tokens.len() - 1) as f64);
                }
                if out.finish_reason == FinishReason::Cancelled {
                    metrics::counter!("ferrum_requests_cancelled_total").increment(1);
                    break;
                }
                let done = ChoiceDone {
                    finish: out.finish_reason,
                    tokens: out.tokens.len(),
                    logprobs: out.logprobs,
                };
                let _ = job.events.send(Event::Done { index, done });
            }
            Ok(Err(e)) => {
                let _ = job.events.send(Event::Failed(e.to_string()));
                break;
            }
            Err(_) => {
                tracing::error!("the model panicked while serving a request; the request failed, the server goes on");
                model.reset();
                let _ = job
                    .events
                    .send(Event::Failed("internal error while generating".into()));
                break;
            }
        }
    }
    metrics::gauge!("ferrum_requests_running").set(0.0);
}
