//! The generation loop for one sequence: prefill, then sample and decode
//! until a stop token, a stop string or the token budget.

use std::time::{Duration, Instant};

use ferrum_models::DecoderOnlyLLM;
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FerrumError, Result};

use crate::sampler::{Sampled, Sampler, SamplingParams};
use crate::stop::StopStrings;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string (OpenAI's `stop`).
    Stop,
    /// `max_tokens` or the KV capacity was reached (OpenAI's `length`).
    Length,
    /// The caller's callback asked to stop (e.g. Ctrl-C).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
        }
    }
}

pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    /// Tokens that end generation in addition to the tokenizer's own.
    pub stop_tokens: Vec<u32>,
}

pub struct GenerateOutput {
    pub text: String,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<Sampled>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Time to the first token, and the decode time after it.
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

/// Generates a continuation of `req.prompt` on `cache_id`, whose cache must
/// already hold `cached` tokens of that prompt (0 for a fresh sequence: the
/// chat loop reuses the cache of earlier turns). `on_text` receives text as
/// it becomes final and returns `false` to cancel.
pub fn generate(
    model: &mut dyn DecoderOnlyLLM,
    tok: &Tokenizer,
    cache_id: &str,
    cached: usize,
    req: &GenerateRequest,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerateOutput> {
    req.sampling.validate()?;
    tok.check_ids(&req.prompt)?;
    let capacity = model.kv_capacity();
    if req.prompt.len() >= capacity {
        return Err(FerrumError::ContextOverflow {
            needed: req.prompt.len() + 1,
            capacity,
        });
    }
    if req.prompt.len() <= cached || model.kv_len(cache_id) < cached {
        return Err(FerrumError::invalid(
            "the cached prefix must be shorter than the prompt",
        ));
    }
    model.truncate_kv(cache_id, cached);
    let budget = req.max_tokens.min(capacity - req.prompt.len());

    let mut sampler = Sampler::new(req.sampling.clone(), &req.prompt);
    let mut stops = StopStrings::new(req.stop_strings.iter().cloned());
    let mut decoder = tok.incremental_decoder();
    let is_stop = |t: u32| tok.special().stop.contains(&t) || req.stop_tokens.contains(&t);

    let start = Instant::now();
    let mut logits = model.prefill(cache_id, &req.prompt[cached..]);
    let prefill_time = start.elapsed();
    let decode_start = Instant::now();
    let mut out = GenerateOutput {
        text: String::new(),
        tokens: Vec::new(),
        logprobs: Vec::new(),
        finish_reason: FinishReason::Length,
        prompt_tokens: req.prompt.len(),
        prefill_time,
        decode_time: Duration::ZERO,
    };
    let mut pos = req.prompt.len();
    let mut stop_string_hit = false;
    while out.tokens.len() < budget {
        let s = sampler.sample(&mut logits);
        let token = s.token;
        sampler.accept(token);
        if req.sampling.top_logprobs > 0 {
            out.logprobs.push(s);
        }
        if is_stop(token) {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        out.tokens.push(token);
        let (text, stopped) = stops.push(&decoder.push(token));
        out.text.push_str(&text);
        if !text.is_empty() && !on_text(&text) {
            out.finish_reason = FinishReason::Cancelled;
            break;
        }
        if stopped {
            out.finish_reason = FinishReason::Stop;
            stop_string_hit = true;
            break;
        }
        if out.tokens.len() == budget {
            break;
        }
        logits = model.decode(cache_id, token, pos as u32);
        pos += 1;
    }
    // Text held back as a possible stop-string prefix is real output unless
    // a stop string actually matched.
    if !stop_string_hit {
        let rest = stops.push(&decoder.finish()).0 + &stops.finish();
        if !rest.is_empty() {
            on_text(&rest);
            out.text.push_str(&rest);
        }
    }
    out.decode_time = decode_start.elapsed();
    Ok(out)
}
