//! `ferrum bench`: llama-bench's prompt-processing (pp) and text-generation
//! (tg) throughput, plus batched decoding through `decode_batch`.
//!
//! Prompts are random token ids (as in llama-bench), so the numbers do not
//! depend on a text. Each test runs once untimed to warm caches and scratch
//! buffers, then `-r` timed repetitions on a fresh KV cache. tg times `-n`
//! single-token decodes after a one-token prefill.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use ferrum_models::{DecoderOnlyLLM, KvManaged, KvPoolConfig, PagedLlm};

use ferrum_kernels::GgufQuantType;
use ferrum_models::llama::LlamaModel;
use ferrum_types::GgmlType;

use crate::model_files::{on_device, resolve, Device, KvDtypeArg, ModelFiles, DEFAULT_MODEL};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    serve: Option<BenchCommand>,
    /// Where to run: cpu, cuda or cuda:N (needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// A .gguf file, a Hugging Face folder, or an alias.
    #[arg(long, short = 'm', default_value = DEFAULT_MODEL)]
    model: String,
    /// Instead of --model, random weights of a known model's shapes:
    /// llama3-8b, qwen2.5-7b, qwen2.5-1.5b, qwen2.5-0.5b or qwen3-30b-a3b
    /// (a mixture of experts).
    #[arg(long, value_name = "PRESET")]
    random_weights: Option<String>,
    /// Block format of the random weights (q4_0, q4_1, q5_0, q5_1, q8_0, q2_k .. q6_k).
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
    /// CPU threads (default: one per core).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Timed repetitions per test.
    #[arg(short = 'r', long, default_value_t = 3)]
    repetitions: usize,
    /// Also measure B sequences decoding together (tokens/s over all of them).
    #[arg(long)]
    batch: Option<usize>,
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

fn pp(model: &mut dyn DecoderOnlyLLM, prompt: &[u32]) -> f64 {
    model.reset();
    model.prepare("bench", prompt.len());
    let t = Instant::now();
    model.prefill("bench", prompt);
    prompt.len() as f64 / t.elapsed().as_secs_f64()
}

fn tg(model: &mut dyn DecoderOnlyLLM, n: usize, depth: usize, vocab: usize) -> f64 {
    model.reset();
    let ctx = depth.max(1);
    model.prepare("bench", ctx + n);
    let toks = random_tokens(ctx + n, vocab, 7);
    model.prefill("bench", &toks[..ctx]);
    let t = Instant::now();
    for (i, &tok) in toks[ctx..].iter().enumerate() {
        model.decode("bench", tok, (ctx + i) as u32);
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn batched(model: &mut dyn DecoderOnlyLLM, b: usize, n: usize, vocab: usize) -> f64 {
    model.reset();
    let ids: Vec<String> = (0..b).map(|i| format!("bench{i}")).collect();
    let toks = random_tokens((n + 1) * b, vocab, 11);
    for (i, id) in ids.iter().enumerate() {
        model.prepare(id, n + 1);
        model.prefill(id, &toks[i..i + 1]);
    }
    let t = Instant::now();
    for step in 0..n {
        let batch: Vec<(String, u32, u32)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.clone(), toks[(step + 1) * b + i], (step + 1) as u32))
            .collect();
        model.decode_batch(&batch);
    }
    (b * n) as f64 / t.elapsed().as_secs_f64()
}

fn measure(reps: usize, mut f: impl FnMut() -> f64) -> (f64, f64) {
    f(); // warm-up
    let xs: Vec<f64> = (0..reps).map(|_| f()).collect();
    stats(&xs)
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
    let Some(qt) = GgmlType::all()
        .find(|t| t.to_string().eq_ignore_ascii_case(ty))
        .and_then(GgufQuantType::from_ggml)
    else {
        bail!(
            "--random-type {ty:?} is not a block format with a kernel (try q4_k, q6_k, q8_0, q4_0)"
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
    // Room for the batch beside the single sequence.
    let mut pool = args.kv.pool(args.device)?;
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
        bail!("a test needs {longest} positions but the KV capacity is {capacity} (set FERRUM_KV_CAPACITY)");
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
    if args.n_prompt > 0 {
        let prompt = random_tokens(args.n_prompt, vocab, 1);
        let r = measure(args.repetitions, || pp(&mut model, &prompt));
        row(format!("pp{}", args.n_prompt), r);
        json.insert("pp_tok_s".into(), r.0.into());
        json.insert("pp_std".into(), r.1.into());
    }
    if args.n_gen > 0 {
        let r = measure(args.repetitions, || {
            tg(&mut model, args.n_gen, args.depth, vocab)
        });
        let at = if args.depth > 0 {
            format!(" @ d{}", args.depth)
        } else {
            String::new()
        };
        row(format!("tg{}{at}", args.n_gen), r);
        json.insert("tg_tok_s".into(), r.0.into());
        json.insert("tg_std".into(), r.1.into());
    }
    if let Some(b) = args.batch.filter(|&b| b > 0) {
        let n = args.n_gen.max(1);
        let r = measure(args.repetitions, || batched(&mut model, b, n, vocab));
        row(format!("tg{n} batch {b}"), r);
        json.insert("batch".into(), b.into());
        json.insert("batch_tok_s".into(), r.0.into());
        json.insert("batch_std".into(), r.1.into());
    }
    model.reset();
    if args.json {
        println!("{}", serde_json::Value::Object(json));
    }
    Ok(())
}
