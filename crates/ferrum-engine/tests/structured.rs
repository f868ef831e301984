//! Constrained sampling: output that must parse, whatever the logits say
//! (SmolLM2's vocabulary and model; skipped when not fetched).
//!
//! - 200 random JSON schemas, sampled at temperature 1.5 from random logits
//!   through the real sampler: every output is JSON, and valid under its
//!   schema by a validator written here (not llguidance's).
//! - The engine on the real model: a schema-constrained request gives the
//!   same tokens with and without speculative decoding, alone and batched.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::sync::Arc;

use ferrum_engine::{Engine, EngineConfig, Event, Request, Sampler, SamplingParams, Speculation};
use ferrum_formats::gguf::GgufFile;
use ferrum_kernels::CpuBackend;
use ferrum_models::llama::LlamaModel;
use ferrum_models::KvPoolConfig;
use ferrum_structured::{GrammarSpec, Grammars};
use ferrum_tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn gguf() -> Option<GgufFile> {
    let path = ferrum_formats::cached_model(MODEL)?;
    Some(GgufFile::open(&path).unwrap())
}

/// A random schema of the kinds structured output is used with; every
/// sentence of it is bounded (strings, arrays and integers have limits).
fn schema(rng: &mut StdRng, depth: usize) -> Value {
    let kinds = if depth >= 3 { 4 } else { 6 };
    match rng.random_range(0..kinds) {
        0 => {
            json!({"type": "string", "minLength": rng.random_range(0..2), "maxLength": rng.random_range(2..8)})
        }
        1 => {
            let lo = rng.random_range(-50..50);
            json!({"type": "integer", "minimum": lo, "maximum": lo + rng.random_range(0..1000)})
        }
        2 => json!({"type": "boolean"}),
        3 => json!({"enum": ["alpha", "beta gamma", 7, null, true]}),
        4 => json!({"type": "array", "items": schema(rng, depth + 1),
                    "minItems": rng.random_range(0..2), "maxItems": rng.random_range(2..4)}),
        _ => {
            let n = rng.random_range(1..4);
            let mut props = Map::new();
            let mut required = Vec::new();
            for i in 0..n {
                let name = format!("field_{i}");
                props.insert(name.clone(), schema(rng, depth + 1));
                if rng.random_bool(0.6) {
                    required.push(name);
                }
            }
            json!({"type": "object", "properties": props, "required": required,
                   "additionalProperties": false})
        }
    }
}

/// Validates `v` against the keywords [`schema`] uses.
fn valid(v: &Value, s: &Value) -> bool {
    if let Some(options) = s.get("enum").and_then(Value::as_array) {
        return options.contains(v);
    }
    let num = |k: &str| s.get(k).and_then(Value::as_i64);
    match s["type"].as_str().unwrap() {
        "string" => v.as_str().is_some_and(|t| {
            let n = t.chars().count() as i64;
            n >= num("minLength").unwrap() && n <= num("maxLength").unwrap()
        }),
        // JSON's `-0` is an integer too (serde_json reads it as a float).
        "integer" => v.as_f64().is_some_and(|x| {
            x.fract() == 0.0
                && x >= num("minimum").unwrap() as f64
                && x <= num("maximum").unwrap() as f64
        }),
        "boolean" => v.is_boolean(),
        "array" => v.as_array().is_some_and(|a| {
            let n = a.len() as i64;
            n >= num("minItems").unwrap()
                && n <= num("maxItems").unwrap()
                && a.iter().all(|x| valid(x, &s["items"]))
        }),
        "object" => v.as_object().is_some_and(|o| {
            let props = s["properties"].as_object().unwrap();
            let required = s["required"].as_array().unwrap();
            o.iter()
                .all(|(k, x)| props.get(k).is_some_and(|p| valid(x, p)))
                && required.iter().all(|r| o.contains_key(r.as_str().unwrap()))
        }),
        other => panic!("unexpected type {other}"),
    }
}

#[test]
fn random_schemas_at_high_temperature_always_validate() {
    let Some(g) = gguf() else {
        return;
    };
    let tok = Arc::new(Tokenizer::from_gguf(&g).unwrap());
    let vocab = tok.vocab_size();
    let grammars = Grammars::new(tok.clone(), vocab).unwrap();
    let stops = tok.special().stop.clone();
    let mut rng = StdRng::seed_from_u64(2026);
    let mut logits = vec![0f32; vocab];
    for i in 0..200 {
        let s = schema(&mut rng, 0);
        let mut c = grammars
            .compile(&GrammarSpec::JsonSchema(s.clone()))
            .unwrap();
        let params = SamplingParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(i),
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params, &[]);
        let mut out = Vec::new();
        let mut ended = false;
        for _ in 0..600 {
            for l in logits.iter_mut() {
                *l = rng.random_range(-4.0..4.0);
            }
            c.apply(&mut logits, &stops).unwrap();
            let t = sampler.sample(&mut logits).token;
            if stops.contains(&t) {
                ended = true;
                break;
            }
            c.commit(t, || tok.token_bytes(t)).unwrap();
            out.extend(tok.token_bytes(t));
            if c.is_finished() {
                ended = true;
                break;
            }
        }
        let text = String::from_utf8_lossy(&out);
        assert!(ended, "schema {i} {s}: no end after 600 tokens: {text}");
        let v: Value = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("schema {i} {s}: not JSON ({e}): {text}"));
        assert!(valid(&v, &s), "schema {i} {s}: {text} does not validate");
    }
}

fn run(engine: &Engine, reqs: Vec<Request>) -> Vec<(Vec<u32>, String)> {
    let rxs: Vec<_> = reqs
        .into_iter()
        .map(|r| engine.submit(r).unwrap())
        .collect();
    rxs.into_iter()
        .map(|mut rx| {
            let (mut toks, mut text) = (Vec::new(), String::new());
            loop {
                match rx.blocking_recv().unwrap() {
                    Event::Token { token, text: t, .. } => {
                        toks.push(token);
                        text.push_str(&t);
                    }
                    Event::Text(t) => text.push_str(&t),
                    Event::PromptLogprobs(_) => {}
                    Event::Done(_) => return (toks, text),
                    Event::Error(e) => panic!("{e}"),
                }
            }
        })
        .collect()
}

#[test]
fn constrained_requests_batch_and_speculate_without_changing_output() {
    let Some(g) = gguf() else {
        return;
    };
    let tok = Arc::new(Tokenizer::from_gguf(&g).unwrap());
    let grammars = Grammars::new(tok.clone(), tok.vocab_size()).unwrap();
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "count": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "tags", "count"], "additionalProperties": false});
    let c = grammars.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let prompts = [
        "<|im_start|>user\nDescribe a fruit as JSON.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nA JSON record of a city, please.<|im_end|>\n<|im_start|>assistant\n",
        "The colors red, green, blue, red, green, blue, red, green in JSON:",
    ];
    let reqs = || {
        prompts
            .iter()
            .map(|p| Request {
                prompt: tok.encode(p, true, true).unwrap(),
                max_tokens: 80,
                sampling: SamplingParams::greedy(),
                stop_strings: Vec::new(),
                stop_tokens: Vec::new(),
                ignore_eos: false,
                prompt_logprobs: None,
                constraint: Some(c.clone()),
                reasoning_budget: None,
            })
            .collect::<Vec<_>>()
    };
    let start = |spec: Option<Speculation>| {
        let model = LlamaModel::<CpuBackend>::from_gguf_with(&g, &KvPoolConfig::default()).unwrap();
        Engine::start_with(Box::new(model), tok.clone(), EngineConfig::default(), spec).unwrap()
    };
    let plain = start(None);
    let alone: Vec<_> = reqs()
        .into_iter()
        .map(|r| run(&plain, vec![r]).remove(0))
        .collect();
    for (toks, text) in &alone {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v["tags"].is_array() && v["count"].is_i64(), "{text}");
        assert!(!toks.is_empty());
    }
    assert_eq!(run(&plain, reqs()), alone, "batched differs from alone");
    let spec = start(Some(Speculation::ngram(3, 4)));
    assert_eq!(run(&spec, reqs()), alone, "speculative differs");
    let drafted = spec.stats().get(&spec.stats().drafted);
    assert!(
        drafted > 0,
        "nothing was drafted: the test did not speculate"
    );
}
