//! The batching engine on SmolLM2-135M (skipped when not fetched): greedy
//! output must not depend on batching, chunking, preemption or the prefix
//! cache, and no KV block may outlive its request.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrum_engine::{
    Completion, Engine, EngineConfig, Event, FinishReason, Request, SamplingParams,
};
use ferrum_formats::gguf::GgufFile;
use ferrum_kernels::CpuBackend;
use ferrum_models::llama::LlamaModel;
use ferrum_models::KvPoolConfig;
use ferrum_tokenizer::Tokenizer;

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn load(pool: KvPoolConfig) -> Option<(LlamaModel<CpuBackend>, Arc<Tokenizer>)> {
    let path = ferrum_formats::cached_model(MODEL)?;
    let g = GgufFile::open(&path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&g).unwrap());
    let model = LlamaModel::<CpuBackend>::from_gguf_with(&g, &pool).unwrap();
    Some((model, tok))
}

fn engine(pool: KvPoolConfig, cfg: EngineConfig) -> Option<Engine> {
    let (model, tok) = load(pool)?;
    Some(Engine::start(Box::new(model), tok, cfg).unwrap())
}

fn request(tok: &Tokenizer, text: &str, max_tokens: usize) -> Request {
    Request {
        prompt: tok.encode(text, true, false).unwrap(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop_strings: Vec::new(),
        stop_tokens: Vec::new(),
        ignore_eos: false,
        prompt_logprobs: None,
        constraint: None,
        reasoning_budget: None,
    }
}

#[derive(Debug, PartialEq)]
struct Output {
    tokens: Vec<u32>,
    text: String,
    done: Completion,
}

fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Output {
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        match rx.blocking_recv().expect("the stream ended without Done") {
            Event::Token { token, text: t, .. } => {
                tokens.push(token);
                text.push_str(&t);
            }
            Event::Text(t) => text.push_str(&t),
            Event::PromptLogprobs(_) => {}
            Event::Done(done) => return Output { tokens, text, done },
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

/// Waits until the engine is idle and holds no KV cache.
fn wait_idle(e: &Engine) {
    let s = e.stats();
    let t0 = Instant::now();
    while s.get(&s.running) + s.get(&s.waiting) + s.get(&s.live_caches) > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "engine never went idle"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

const PROMPTS: [&str; 16] = [
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "To make a cup of tea, you first",
    "The largest planet in our solar system is",
    "def fibonacci(n):",
    "My favourite book is",
    "In 1969, the first humans",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "A good way to learn a new language is",
    "The Pythagorean theorem states that",
    "Rust is a programming language that",
    "The recipe calls for two cups of flour and",
    "When the sun sets over the mountains,",
];

fn serial_config() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 1,
        ..EngineConfig::default()
    }
}

#[test]
fn batched_greedy_output_equals_running_alone() {
    let Some(alone) = engine(KvPoolConfig::default(), serial_config()) else {
        return;
    };
    let tok = alone.tokenizer().clone();
    let want: Vec<Output> = PROMPTS
        .iter()
        .map(|p| collect(alone.submit(request(&tok, p, 32)).unwrap()))
        .collect();
    let batched = engine(KvPoolConfig::default(), EngineConfig::default()).unwrap();
    // Submit all before reading any, so they run together.
    let rxs: Vec<_> = PROMPTS
        .iter()
        .map(|p| batched.submit(request(&tok, p, 32)).unwrap())
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        let got = collect(rx);
        assert_eq!(
            got, want[i],
            "prompt {i} ({:?}) differs when batched",
            PROMPTS[i]
        );
    }
    wait_idle(&batched);
}

#[test]
fn preemption_under_a_small_pool_keeps_outputs_and_frees_every_block() {
    let Some(roomy) = engine(KvPoolConfig::default(), serial_config()) else {
        return;
    };
    let tok = roomy.tokenizer().clone();
    let want: Vec<Output> = PROMPTS[..6]
        .iter()
        .map(|p| collect(roomy.submit(request(&tok, p, 40)).unwrap()))
        .collect();
    // 12 blocks of 16 positions: six requests of ~50 positions need 24.
    let small = KvPoolConfig { tokens: 192, ..KvPoolConfig::default() };
    let tight = engine(small, EngineConfig::default()).unwrap();
    let rxs: Vec<_> = PROMPTS[..6]
        .iter()
        .map(|p| tight.submit(request(&tok, p, 40)).unwrap())
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        assert_eq!(collect(rx), want[i], "prompt {i} after preemption");
    }
    let s = tight.stats();
    assert!(s.get(&s.preemptions) > 0, "the pool was never short");
    wait_idle(&tight);
}

#[test]
fn chunked_prefill_and_prefix_cache_give_the_same_tokens() {
    let no_cache = KvPoolConfig {
        prefix_caching: false,
        ..KvPoolConfig::default()
    };
    let Some(plain) = engine(no_cache, serial_config()) else {
        return;
    };
    let tok = plain.tokenizer().clone();
    let system = "You are a helpful assistant. ".repeat(12);
    let a = format!("{system}Question: what is the capital of Italy? Answer:");
    let b = format!("{system}Question: name a large river in Africa. Answer:");
    let want_a = collect(plain.submit(request(&tok, &a, 16)).unwrap());
    let want_b = collect(plain.submit(request(&tok, &b, 16)).unwrap());
    assert_eq!(want_b.done.cached_tokens, 0);

    // Chunks of 16 tokens, with the prefix cache on.
    let chunked = EngineConfig {
        max_num_batched_tokens: 16,
        ..EngineConfig::default()
    };
    let e = engine(KvPoolConfig::default(), chunked).unwrap();
    let got_a = collect(e.submit(request(&tok, &a, 16)).unwrap());
    assert_eq!(got_a, want_a);
    let got_b = collect(e.submit(request(&tok, &b, 16)).unwrap());
    let shared = tok.encode(&system, true, false).unwrap().len();
    assert!(
        got_b.done.cached_tokens >= shared / 16 * 16 - 16,
        "only {} of ~{shared} shared prompt tokens came from the cache",
        got_b.done.cached_tokens
    );
    assert_eq!(got_b.tokens, want_b.tokens);
    assert_eq!(got_b.text, want_b.text);
    wait_idle(&e);
}

#[test]
fn cancelled_requests_free_their_blocks() {
    let Some(e) = engine(KvPoolConfig::default(), EngineConfig::default()) else {
        return;
    };
    let tok = e.tokenizer().clone();
    let mut keep = Vec::new();
    for (i, p) in PROMPTS[..8].iter().enumerate() {
        let mut rx = e.submit(request(&tok, p, 200)).unwrap();
        if i % 2 == 0 {
            // Read a couple of tokens, then hang up.
            for _ in 0..2 {
                rx.blocking_recv().unwrap();
            }
            drop(rx);
        } else {
            keep.push(rx);
        }
    }
    for rx in keep {
        let out = collect(rx);
        assert!(matches!(
            out.done.finish,
            FinishReason::Length | FinishReason::Stop
        ));
    }
    wait_idle(&e);
}

#[test]
fn invalid_requests_are_refused_before_queueing() {
    let Some(e) = engine(KvPoolConfig::default(), EngineConfig::default()) else {
        return;
    };
    let tok = e.tokenizer().clone();
    let mut r = request(&tok, "hello", 4);
    r.prompt.clear();
    assert!(e.submit(r).is_err());
    let mut r = request(&tok, "hello", 4);
    r.prompt.push(10_000_000);
    assert!(e.submit(r).is_err());
    let mut r = request(&tok, "hello", 4);
    r.prompt = vec![1; e.capacity()];
    assert!(e.submit(r).is_err());
    let mut r = request(&tok, "hello", 4);
    r.sampling.temperature = -1.0;
    assert!(e.submit(r).is_err());
    // max_tokens 0 finishes at once with usage.
    let out = collect(e.submit(request(&tok, "hello", 0)).unwrap());
    assert_eq!(out.done.completion_tokens, 0);
    assert_eq!(out.done.finish, FinishReason::Length);
}

fn engine_with(spec: ferrum_engine::Speculation) -> Option<Engine> {
    let (model, tok) = load(KvPoolConfig::default())?;
    let e = Engine::start_with(Box::new(model), tok, EngineConfig::default(), Some(spec));
    Some(e.unwrap())
}

#[test]
fn speculative_decoding_keeps_greedy_output() {
    let Some(plain) = engine(KvPoolConfig::default(), EngineConfig::default()) else {
        return;
    };
    let tok = plain.tokenizer().clone();
    let prompts = [
        "Copy this list exactly: apple, banana, cherry, apple, banana, cherry, apple, banana,",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
        "The capital of France is",
    ];
    let want: Vec<Output> = prompts
        .iter()
        .map(|p| collect(plain.submit(request(&tok, p, 48)).unwrap()))
        .collect();
    let (draft, _) = load(KvPoolConfig::default()).unwrap();
    for spec in [
        ferrum_engine::Speculation::ngram(3, 4),
        ferrum_engine::Speculation::draft_model(Box::new(draft), 4),
    ] {
        let e = engine_with(spec).unwrap();
        for (p, w) in prompts.iter().zip(&want) {
            let got = collect(e.submit(request(&tok, p, 48)).unwrap());
            assert_eq!(&got, w, "{p:?} with speculation");
        }
        let s = e.stats();
        let (drafted, accepted) = (s.get(&s.drafted), s.get(&s.accepted));
        eprintln!("drafted {drafted}, accepted {accepted}");
        assert!(
            accepted > 0 && accepted <= drafted,
            "{accepted} of {drafted}"
        );
        // All at once: every decoding sequence of the batch speculates, and
        // each still gets exactly its greedy tokens.
        let rxs: Vec<_> = prompts
            .iter()
            .map(|p| e.submit(request(&tok, p, 48)).unwrap())
            .collect();
        for ((rx, w), p) in rxs.into_iter().zip(&want).zip(&prompts) {
            // (Their prompts are in the prefix cache by now.)
            let got = collect(rx);
            assert_eq!(
                (&got.tokens, got.done.finish),
                (&w.tokens, w.done.finish),
                "{p:?} batched with speculation"
            );
        }
        assert!(s.get(&s.drafted) > drafted, "the batch speculated");
        // Sampled requests take the accept/reject path; they must finish.
        let mut r = request(&tok, prompts[0], 24);
        r.sampling = SamplingParams {
            seed: Some(1),
            ..SamplingParams::default()
        };
        let out = collect(e.submit(r).unwrap());
        assert!(out.done.completion_tokens > 0);
        wait_idle(&e);
    }
}

/// Generates greedily with logprobs: (prompt, tokens, their logprobs).
fn greedy_with_logprobs(
    e: &Engine,
    tok: &Tokenizer,
    text: &str,
    n: usize,
) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
    let mut req = request(tok, text, n);
    req.sampling.top_logprobs = 1;
    let prompt = req.prompt.clone();
    let mut rx = e.submit(req).unwrap();
    let (mut tokens, mut lps) = (Vec::new(), Vec::new());
    loop {
        match rx.blocking_recv().expect("the stream ended without Done") {
            Event::Token { token, logprob, .. } => {
                tokens.push(token);
                lps.push(logprob.expect("asked for logprobs").logprob);
            }
            Event::Done(_) => return (prompt, tokens, lps),
            Event::Error(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
}

/// Scoring a prompt (`echo` with `logprobs`) gives each of its tokens the
/// log-probability the decoder gave it when it generated that token: the
/// two paths (chunks through `forward_verify` against prefill + one decode
/// per token) agree exactly. The prompt spans two scoring chunks.
#[test]
fn prompt_logprobs_match_generation_logprobs() {
    let Some((mut model, tok)) = load(KvPoolConfig::default()) else {
        return;
    };
    // 16-bit activations: 8-bit inputs would round a row differently when
    // an ulp moves with the attention's summation order (see the long
    // context test in ferrum-models).
    model.set_int8_activations(false);
    let e = Engine::start(Box::new(model), tok.clone(), EngineConfig::default()).unwrap();
    let text = "Once upon a time, in a small village by the sea,";
    let (prompt, tokens, lps) = greedy_with_logprobs(&e, &tok, text, 100);
    let k = tokens.len() - 1;
    let mut full = prompt.clone();
    full.extend_from_slice(&tokens[..k]);
    // Scoring goes 64 positions a step: make it take more than one.
    assert!(full.len() > 64, "only {} tokens to score", full.len());
    let mut req = request(&tok, "", 1);
    req.prompt = full.clone();
    req.prompt_logprobs = Some(3);
    let mut rx = e.submit(req).unwrap();
    let mut scored = None;
    let mut next = Vec::new();
    loop {
        match rx.blocking_recv().expect("the stream ended without Done") {
            Event::PromptLogprobs(s) => {
                assert!(next.is_empty(), "prompt logprobs came after a token");
                scored = Some(s);
            }
            Event::Token { token, .. } => next.push(token),
            Event::Done(_) => break,
            Event::Error(e) => panic!("request failed: {e}"),
            Event::Text(_) => {}
        }
    }
    let scored = scored.expect("no prompt logprobs");
    assert_eq!(
        scored.iter().map(|s| s.token).collect::<Vec<_>>(),
        full[1..],
        "one entry per prompt token after the first"
    );
    assert!(scored
        .iter()
        .all(|s| s.top.len() == 3 && s.top[0].1 >= s.logprob));
    // Bit for bit: a position's logits do not depend on how positions are
    // batched (measured: identical on SmolLM2 with 16-bit activations).
    let scored_generated: Vec<f32> = scored[prompt.len() - 1..]
        .iter()
        .map(|s| s.logprob)
        .collect();
    assert_eq!(scored_generated, lps[..k]);
    // The token sampled after scoring is the one greedy decoding chose.
    assert_eq!(next, [tokens[k]]);
    wait_idle(&e);
}

/// A spent reasoning budget closes the reasoning: after `tokens` free
/// tokens come exactly the closing tokens, then the model goes on as it
/// would after them. (SmolLM2 never writes `</think>` itself.)
#[test]
fn a_spent_reasoning_budget_forces_the_close() {
    let Some(e) = engine(KvPoolConfig::default(), serial_config()) else {
        return;
    };
    let tok = e.tokenizer().clone();
    let close = tok.encode("\n</think>\n\n", false, true).unwrap();
    let free = collect(e.submit(request(&tok, PROMPTS[0], 12)).unwrap());
    let mut req = request(&tok, PROMPTS[0], 12);
    req.reasoning_budget = Some(ferrum_engine::ReasoningBudget {
        tokens: 4,
        close: close.clone(),
        inside: true,
    });
    let budgeted = collect(e.submit(req).unwrap());
    assert_eq!(
        budgeted.tokens[..4],
        free.tokens[..4],
        "the budget's tokens are free"
    );
    assert_eq!(budgeted.tokens[4..4 + close.len()], close[..]);
    assert!(budgeted.text.contains("</think>"), "{}", budgeted.text);
    assert_eq!(
        budgeted.tokens.len(),
        12,
        "generation goes on after the close"
    );
    wait_idle(&e);
}
