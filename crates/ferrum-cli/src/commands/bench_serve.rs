//! `ferrum bench serve`: a load generator for any OpenAI-compatible server
//! (ours, llama-server, vLLM), in the spirit of `vllm bench serve`.
//!
//! Each request streams (`stream: true` with usage) and is timed from the
//! moment it is sent: TTFT is the first content chunk, ITL the gaps between
//! content chunks, TPOT `(end - first) / (output tokens - 1)`. Requests run
//! on `--concurrency` threads; with `--request-rate` their start times follow
//! a Poisson process, otherwise each thread sends the next one at once.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dataset {
    /// Independent prompts of random words.
    Random,
    /// A common prefix of --input-len words (one of --num-prefixes, drawn
    /// at random), then a short unique question.
    SharedPrefix,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Endpoint {
    Completions,
    Chat,
}

#[derive(Args)]
pub struct BenchServeArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Model id to request (default: the first one /v1/models lists).
    #[arg(long)]
    model: Option<String>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Requests in all.
    #[arg(long, default_value_t = 64)]
    num_prompts: usize,
    /// Mean requests per second (Poisson arrivals); unlimited when absent.
    #[arg(long)]
    request_rate: Option<f64>,
    #[arg(long, value_enum, default_value = "random")]
    dataset: Dataset,
    #[arg(long, value_enum, default_value = "completions")]
    endpoint: Endpoint,
    /// Prompt length in words (about one token each).
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// How many prefixes `shared-prefix` draws from. Several show what a
    /// cache-aware router gains: replicas that each keep some prefixes
    /// cached, where round-robin makes every replica compute every prefix.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    num_prefixes: u64,
    /// max_tokens of each request.
    #[arg(long, default_value_t = 64)]
    output_len: usize,
    /// Fraction of requests that hang up after a few tokens (a stress test
    /// of cancellation).
    #[arg(long, default_value_t = 0.0)]
    cancel_fraction: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Ask the server to ignore end-of-sequence tokens (vLLM's `ignore_eos`),
    /// so every request generates --output-len tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Constrain every request to the JSON schema in FILE (`response_format`
    /// json_schema): measures what structured output costs.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<std::path::PathBuf>,
    /// Print the summary as JSON on the last line.
    #[arg(long)]
    json: bool,
}

const WORDS: &[&str] = &[
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
];

/// One request's timings.
#[derive(Default)]
struct Sample {
    ok: bool,
    cancelled: bool,
    ttft: Option<f64>,
    itls: Vec<f64>,
    e2e: f64,
    prompt_tokens: usize,
    output_tokens: usize,
}

fn words(rng: &mut StdRng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

fn prompts(a: &BenchServeArgs) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(a.seed);
    let prefixes: Vec<String> = (0..a.num_prefixes)
        .map(|_| words(&mut rng, a.input_len))
        .collect();
    (0..a.num_prompts)
        .map(|i| match a.dataset {
            Dataset::Random => words(&mut rng, a.input_len),
            Dataset::SharedPrefix => {
                let prefix = &prefixes[rng.random_range(0..prefixes.len())];
                format!(
                    "{prefix}\nQuestion {i}: what comes after {}?",
                    words(&mut rng, 8)
                )
            }
        })
        .collect()
}

fn first_model(base: &str) -> Result<String> {
    let v: Value = ureq::get(&format!("{base}/v1/models"))
        .call()
        .with_context(|| format!("GET {base}/v1/models: is the server running?"))?
        .into_json()?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .context("the server lists no models")
}

/// Sends one streamed request; hangs up after `cancel_after` content chunks.
fn one(
    a: &BenchServeArgs,
    model: &str,
    prompt: &str,
    cancel_after: Option<usize>,
    response_format: Option<&Value>,
) -> Sample {
    let (path, mut body) = match a.endpoint {
        Endpoint::Completions => ("/v1/completions", json!({"prompt": prompt})),
        Endpoint::Chat => (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": prompt}]}),
        ),
    };
    body["model"] = json!(model);
    body["max_tokens"] = json!(a.output_len);
    body["temperature"] = json!(0.0);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    if a.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if let Some(rf) = response_format {
        body["response_format"] = rf.clone();
    }
    let start = Instant::now();
    let mut s = Sample::default();
    let resp = match ureq::post(&format!("{}{path}", a.url))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("request failed: {e}");
            return s;
        }
    };
    let mut last: Option<Instant> = None;
    let mut chunks = 0;
    for line in BufReader::new(resp.into_reader()).lines() {
        let Ok(line) = line else {
            break;
        };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            s.ok = true;
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            s.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0) as usize;
            s.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
        }
        let c = &v["choices"][0];
        let text = c["delta"]["content"].as_str().or(c["text"].as_str());
        if text.is_some_and(|t| !t.is_empty()) {
            let now = Instant::now();
            match last {
                None => s.ttft = Some((now - start).as_secs_f64()),
                Some(l) => s.itls.push((now - l).as_secs_f64()),
            }
            last = Some(now);
            chunks += 1;
            if cancel_after.is_some_and(|k| chunks >= k) {
                s.cancelled = true;
                break;
            }
        }
    }
    if s.output_tokens == 0 {
        s.output_tokens = chunks;
    }
    s.e2e = start.elapsed().as_secs_f64();
    s
}

fn percentiles(mut xs: Vec<f64>) -> Value {
    if xs.is_empty() {
        return json!(null);
    }
    xs.sort_by(f64::total_cmp);
    let at = |p: f64| xs[((p / 100.0) * (xs.len() - 1) as f64).round() as usize] * 1e3;
    let mean = xs.iter().sum::<f64>() / xs.len() as f64 * 1e3;
    json!({"mean_ms": mean, "p50_ms": at(50.0), "p90_ms": at(90.0), "p99_ms": at(99.0)})
}

pub fn run(a: BenchServeArgs) -> Result<()> {
    if a.concurrency == 0 || a.num_prompts == 0 {
        bail!("--concurrency and --num-prompts must be at least 1");
    }
    if !(0.0..=1.0).contains(&a.cancel_fraction) {
        bail!("--cancel-fraction must be between 0 and 1");
    }
    let base = a.url.trim_end_matches('/').to_string();
    let a = BenchServeArgs { url: base, ..a };
    let model = match &a.model {
        Some(m) => m.clone(),
        None => first_model(&a.url)?,
    };
    let prompts = prompts(&a);
    let response_format = match &a.json_schema {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            let schema: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", p.display()))?;
            Some(json!({"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}))
        }
        None => None,
    };
    let mut rng = StdRng::seed_from_u64(a.seed ^ 0x5eed);
    // Start offsets (Poisson arrivals) and which requests hang up early.
    let mut t = 0.0;
    let plan: Vec<(f64, Option<usize>)> = (0..a.num_prompts)
        .map(|_| {
            let start = t;
            if let Some(r) = a.request_rate.filter(|r| *r > 0.0) {
                t += -(1.0 - rng.random::<f64>()).ln() / r;
            }
            let cancel = (rng.random::<f64>() < a.cancel_fraction).then(|| rng.random_range(1..6));
            (start, cancel)
        })
        .collect();
    eprintln!(
        "{} requests to {} ({model}), concurrency {}, {:?} dataset, {} words in, {} tokens out",
        a.num_prompts, a.url, a.concurrency, a.dataset, a.input_len, a.output_len
    );
    let next = AtomicUsize::new(0);
    let samples = Mutex::new(Vec::with_capacity(a.num_prompts));
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..a.concurrency.min(a.num_prompts) {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(start, cancel)) = plan.get(i) else {
                    break;
                };
                let wait = Duration::from_secs_f64(start).saturating_sub(t0.elapsed());
                std::thread::sleep(wait);
                let s = one(&a, &model, &prompts[i], cancel, response_format.as_ref());
                if let Ok(mut v) = samples.lock() {
                    v.push(s);
                }
            });
        }
    });
    let dur = t0.elapsed().as_secs_f64();
    let samples = samples.into_inner().unwrap_or_default();
    report(&a, &samples, dur);
    Ok(())
}

fn report(a: &BenchServeArgs, samples: &[Sample], dur: f64) {
    let done: Vec<&Sample> = samples.iter().filter(|s| s.ok && !s.cancelled).collect();
    let cancelled = samples.iter().filter(|s| s.cancelled).count();
    let errors = samples.len() - done.len() - cancelled;
    let out: usize = samples.iter().map(|s| s.output_tokens).sum();
    let inp: usize = done.iter().map(|s| s.prompt_tokens).sum();
    let ttft = percentiles(done.iter().filter_map(|s| s.ttft).collect());
    let tpot = percentiles(
        done.iter()
            .filter(|s| s.output_tokens > 1)
            .filter_map(|s| Some((s.e2e - s.ttft?) / (s.output_tokens - 1) as f64))
            .collect(),
    );
    let itl = percentiles(done.iter().flat_map(|s| s.itls.iter().copied()).collect());
    let summary = json!({
        "completed": done.len(),
        "cancelled": cancelled,
        "errors": errors,
        "duration_s": dur,
        "requests_per_s": done.len() as f64 / dur,
        "output_tok_s": out as f64 / dur,
        "total_tok_s": (inp + out) as f64 / dur,
        "prompt_tokens": inp,
        "output_tokens": out,
        "concurrency": a.concurrency,
        "ttft": ttft,
        "tpot": tpot,
        "itl": itl,
    });
    let ms = |v: &Value, k: &str| v[k].as_f64().map_or("-".into(), |x| format!("{x:.1}"));
    println!(
        "completed {} | cancelled {cancelled} | errors {errors} | {dur:.2} s",
        done.len()
    );
    println!(
        "requests/s {:.2} | output tok/s {:.1} | total tok/s {:.1}",
        done.len() as f64 / dur,
        out as f64 / dur,
        (inp + out) as f64 / dur
    );
    for (name, v) in [
        ("TTFT", &summary["ttft"]),
        ("TPOT", &summary["tpot"]),
        ("ITL", &summary["itl"]),
    ] {
        println!(
            "{name:<5} ms: mean {} p50 {} p90 {} p99 {}",
            ms(v, "mean_ms"),
            ms(v, "p50_ms"),
            ms(v, "p90_ms"),
            ms(v, "p99_ms")
        );
    }
    if a.json {
        println!("{summary}");
    }
}
