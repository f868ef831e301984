//! `ferrum bench`: llama-bench's prompt-processing (pp) and text-generation
//! (tg) throughput, plus batched decoding through `decode_batch`.
//!
//! Prompts are random token ids (as in llama-bench), so the numbers do not
//! depend on a text. Each test runs once untimed to warm caches and scratch
//! buffers, then `-r` timed repetitions on a fresh KV cache. tg times `-n`
//! single-token decodes after a one-token prefill.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use ferrum_models::{DecoderOnlyLLM, KvManaged, KvPoolConfig, PagedLlm};

use ferrum_kernels::cpu::profile::{self, Profile};
use ferrum_kernels::GgufQuantType;
use ferrum_models::llama::LlamaModel;

use crate::model_files::{on_device, resolve, Device, KvDtypeArg, ModelFiles, DEFAULT_MODEL};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    serve: Option<BenchCommand>,
    /// Where to run: cpu, cuda or cuda:N (needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// A .gguf file, a Hugging Face folder, or an alias (no positional
    /// MODEL here: `bench serve` is a subcommand).
    #[arg(long, short = 'm', default_value = DEFAULT_MODEL)]
    model: String,
    /// Instead of --model, random weights of a known model's shapes:
    /// llama3-8b, qwen2.5-7b, qwen2.5-1.5b, qwen2.5-0.5b or qwen3-30b-a3b
    /// (a mixture of experts).
    #[arg(long, value_name = "PRESET")]
    random_weights: Option<String>,
    /// Block format of the random weights: any format with a kernel (q4_0,
    /// q8_0, q4_k, q6_k, iq4_xs, ...; an unknown name lists them all).
    #[arg(long, default_value = "q4_k")]
    random_type: String,
    /// Give the random weights shuffled input orders, as act-order GPTQ
    /// checkpoints load (measures the activation reorder per GEMM).
    #[arg(long, requires = "random_weights")]
    random_act_order: bool,
    /// Prompt tokens for the pp test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens for the tg test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Tokens already in the context when tg starts (llama-bench's -d).
    #[arg(short = 'd', long, default_value_t = 0)]
    depth: usize,
    /// Context size per sequence, for tests longer than the default 4096
    /// positions (default: FERRUM_KV_CAPACITY, else 4096).
    #[arg(short = 'c', long, value_name = "N", value_parser = super::at_least_one)]
    ctx: Option<usize>,
    /// CPU threads (default: one per core).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Timed repetitions per test.
    #[arg(short = 'r', long, default_value_t = 3)]
    repetitions: usize,
    /// Also measure B sequences decoding together (tokens/s over all of them).
    #[arg(long)]
    batch: Option<usize>,
    /// After the results, where each test's time went: per backend op, the
    /// rest of the driving thread, and the pool's idle threads (CPU only;
    /// the clock reads slow the run a little).
    #[arg(long)]
    profile: bool,
    /// Print {"pp_tok_s","tg_tok_s","pp_std","tg_std"[,"batch","batch_tok_s","batch_std"]} as the last line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    kv: KvDtypeArg,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Load-test a running OpenAI-compatible server (like `vllm bench serve`):
    /// TTFT, TPOT, ITL percentiles and throughput.
    Serve(super::bench_serve::BenchServeArgs),
}

/// Mean and sample standard deviation.
fn stats(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Deterministic pseudo-random token ids below `vocab` (64-bit LCG).
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// One timed run: `tokens` over `steps` forward passes in `took`, and
/// where the time went (empty unless `--profile`).
struct Timed {
    tokens: usize,
    steps: usize,
    took: Duration,
    profile: Profile,
}

/// Times `run` (which does `steps` forward passes for `tokens` tokens).
fn timed(tokens: usize, steps: usize, run: impl FnOnce()) -> Timed {
    profile::take();
    let t = Instant::now();
    run();
    let took = t.elapsed();
    Timed {
        tokens,
        steps,
        took,
        profile: profile::take(),
    }
}

fn pp(model: &mut dyn DecoderOnlyLLM, prompt: &[u32]) -> Timed {
    model.reset();
    model.prepare("bench", prompt.len());
    timed(prompt.len(), 1, || {
        model.prefill("bench", prompt);
    })
}

fn tg(model: &mut dyn DecoderOnlyLLM, n: usize, depth: usize, vocab: usize) -> Timed {
    model.reset();
    let ctx = depth.max(1);
    model.prepare("bench", ctx + n);
    let toks = random_tokens(ctx + n, vocab, 7);
    model.prefill("bench", &toks[..ctx]);
    timed(n, n, || {
        for (i, &tok) in toks[ctx..].iter().enumerate() {
            model.decode("bench", tok, (ctx + i) as u32);
        }
    })
}

fn batched(model: &mut dyn DecoderOnlyLLM, b: usize, n: usize, vocab: usize) -> Timed {
    model.reset();
    let ids: Vec<String> = (0..b).map(|i| format!("bench{i}")).collect();
    let toks = random_tokens((n + 1) * b, vocab, 11);
    for (i, id) in ids.iter().enumerate() {
        model.prepare(id, n + 1);
        model.prefill(id, &toks[i..i + 1]);
    }
    timed(b * n, n, || {
        for step in 0..n {
            let batch: Vec<(String, u32, u32)> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| (id.clone(), toks[(step + 1) * b + i], (step + 1) as u32))
                .collect();
            model.decode_batch(&batch);
        }
    })
}

/// Tokens per second over `reps` timed runs after an untimed one: mean,
/// sample standard deviation, and the timed runs' total for the profile.
fn measure(reps: usize, mut f: impl FnMut() -> Timed) -> ((f64, f64), Timed) {
    f(); // warm-up
    let runs: Vec<Timed> = (0..reps).map(|_| f()).collect();
    let rates: Vec<f64> = runs
        .iter()
        .map(|r| r.tokens as f64 / r.took.as_secs_f64())
        .collect();
    let mut total = Timed {
        tokens: 0,
        steps: 0,
        took: Duration::ZERO,
        profile: Profile::default(),
    };
    for r in &runs {
        total.tokens += r.tokens;
        total.steps += r.steps;
        total.took += r.took;
        total.profile.add(&r.profile);
    }
    (stats(&rates), total)
}

/// `--profile`'s table for one test: each op's time per forward pass on
/// the thread that drives the model, the rest of that thread's time, and
/// how long the pool's other threads waited for work.
fn print_profile(test: &str, t: &Timed, threads: usize) {
    let p = &t.profile;
    let steps = t.steps.max(1) as f64;
    let wall = t.took.as_secs_f64();
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / steps;
    let share = |d: Duration| 100.0 * d.as_secs_f64() / wall;
    println!();
    println!(
        "{test}: {:.3} ms per forward pass, by op",
        wall * 1e3 / steps
    );
    println!("| op | ms per pass | share | calls per pass |");
    println!("|---|---|---|---|");
    let mut ops = p.ops.clone();
    ops.sort_by_key(|o| std::cmp::Reverse(o.1));
    for (name, d, calls) in ops {
        let c = calls as f64 / steps;
        println!(
            "| {name} | {:.3} | {:.1}% | {c:.1} |",
            per_step(d),
            share(d)
        );
    }
    let rest = t.took.saturating_sub(p.in_ops());
    println!(
        "| outside backend ops | {:.3} | {:.1}% | |",
        per_step(rest),
        share(rest)
    );
    if threads > 1 {
        let others = wall * (threads - 1) as f64;
        let idle = |d: Duration| 100.0 * d.as_secs_f64() / others;
        println!(
            "The other {} pool thread(s) waited for work {:.1}% of the time while a parallel kernel ran (uneven splits) and {:.1}% between kernels (serial code).",
            threads - 1,
            idle(p.idle_in_ops),
            idle(p.idle_between),
        );
    }
}

/// A model of a preset's shapes with random weights in `ty` blocks.
fn random_model(
    preset: &str,
    ty: &str,
    act_order: bool,
    device: Device,
    pool: &KvPoolConfig,
) -> Result<Box<dyn PagedLlm>> {
    let Some(cfg) = ferrum_models::llama::preset(preset) else {
        bail!(
            "unknown preset {preset:?}; choose one of {}",
            ferrum_models::llama::PRESETS.join(", ")
        );
    };
    let Some(qt) = GgufQuantType::from_name(ty) else {
        let names: Vec<&str> = GgufQuantType::all().map(|t| t.name()).collect();
        bail!(
            "--random-type {ty:?} is not a block format with a kernel; choose one of {}",
            names.join(", ")
        );
    };
    device.init()?;
    on_device!(device, |B| Ok(Box::new(LlamaModel::<B>::random(
        cfg, qt, act_order, 1, pool
    )?)))
}

pub fn run(args: BenchArgs) -> Result<()> {
    if let Some(BenchCommand::Serve(a)) = args.serve {
        return super::bench_serve::run(a);
    }
    if args.threads == Some(0) {
        bail!("-t must be at least 1");
    }
    if args.n_prompt == 0 && args.n_gen == 0 && args.batch.unwrap_or(0) == 0 {
        bail!(
            "nothing to measure: -p and -n are both 0 (give either a count above 0, or --batch B)"
        );
    }
    // main() already runs on a default pool; -t asks for another size.
    match args.threads {
        Some(t) => ferrum_kernels::cpu::on_pool(Some(t), || measure_all(args))?,
        None => measure_all(args),
    }
}

fn measure_all(args: BenchArgs) -> Result<()> {
    if args.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    if args.profile && args.device != Device::Cpu {
        bail!("--profile times the CPU backend's ops; leave it out with --device cuda");
    }
    // Room for the batch beside the single sequence.
    let mut pool = args.kv.pool(args.device)?;
    pool.context = args.ctx;
    if let Some(b) = args.batch {
        pool.sequences = pool.sequences.max(b + 1);
    }
    let (name, model) = match &args.random_weights {
        Some(p) => (
            format!(
                "{p} random {}{}",
                args.random_type,
                if args.random_act_order {
                    " act-order"
                } else {
                    ""
                }
            ),
            random_model(
                p,
                &args.random_type,
                args.random_act_order,
                args.device,
                &pool,
            )?,
        ),
        None => {
            let path = resolve(&args.model)?;
            let files = ModelFiles::open(&path)?;
            let name = path
                .file_name()
                .map_or_else(|| args.model.clone(), |n| n.to_string_lossy().into_owned());
            (name, files.load_llm(args.device, &pool)?)
        }
    };
    let mut model = KvManaged::new(model);
    let vocab = model.config().vocab_size;
    let capacity = model.kv_capacity();
    let longest = args.n_prompt.max(args.depth.max(1) + args.n_gen);
    if longest > capacity {
        bail!("a test needs {longest} positions but the context holds {capacity} (give --ctx {longest})");
    }
    let threads = match args.device {
        Device::Cpu => ferrum_kernels::cpu::threads().to_string(),
        Device::Cuda(n) => format!("cuda:{n}"),
    };
    println!("| model | threads/device | test | t/s |");
    println!("|---|---|---|---|");
    let row = |test: String, (m, s): (f64, f64)| {
        println!("| {name} | {threads} | {test} | {m:.2} ± {s:.2} |")
    };
    let mut json = serde_json::Map::new();
    let mut profiles = Vec::new();
    profile::set_enabled(args.profile);
    if args.n_prompt > 0 {
        let prompt = random_tokens(args.n_prompt, vocab, 1);
        let (r, t) = measure(args.repetitions, || pp(&mut model, &prompt));
        let test = format!("pp{}", args.n_prompt);
        row(test.clone(), r);
        profiles.push((test, t));
        json.insert("pp_tok_s".into(), r.0.into());
        json.insert("pp_std".into(), r.1.into());
    }
    if args.n_gen > 0 {
        let (r, t) = measure(args.repetitions, || {
            tg(&mut model, args.n_gen, args.depth, vocab)
        });
        let at = if args.depth > 0 {
            format!(" @ d{}", args.depth)
        } else {
            String::new()
        };
        let test = format!("tg{}{at}", args.n_gen);
        row(test.clone(), r);
        profiles.push((test, t));
        json.insert("tg_tok_s".into(), r.0.into());
        json.insert("tg_std".into(), r.1.into());
    }
    if let Some(b) = args.batch.filter(|&b| b > 0) {
        let n = args.n_gen.max(1);
        let (r, t) = measure(args.repetitions, || batched(&mut model, b, n, vocab));
        let test = format!("tg{n} batch {b}");
        row(test.clone(), r);
        profiles.push((test, t));
        json.insert("batch".into(), b.into());
        json.insert("batch_tok_s".into(), r.0.into());
        json.insert("batch_std".into(), r.1.into());
    }
    profile::set_enabled(false);
    if args.profile {
        let threads = ferrum_kernels::cpu::threads();
        for (test, t) in &profiles {
            print_profile(test, t, threads);
        }
    }
    model.reset();
    if args.json {
        println!("{}", serde_json::Value::Object(json));
    }
    Ok(())
}
