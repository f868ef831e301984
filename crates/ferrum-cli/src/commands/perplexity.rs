//! `ferrum perplexity`: llama.cpp's `llama-perplexity` measurement.
//!
//! The file is tokenized whole; consecutive chunks of `--ctx` tokens are
//! evaluated independently (BOS replaces the first token of every chunk when
//! the model uses one), and only the second half of each chunk is scored, so
//! every scored token has at least `ctx / 2` tokens of context.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use ferrum_models::{DecoderOnlyLLM, KvManaged};

use crate::model_files::{resolve, Device, KvDtypeArg, ModelArg, ModelFiles};

#[derive(Args)]
pub struct PerplexityArgs {
    /// Where to run: cpu, cuda or cuda:N (needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: Device,
    #[command(flatten)]
    model: ModelArg,
    /// Text file to score.
    #[arg(long)]
    file: PathBuf,
    /// Tokens per chunk, which is also the context size (llama-perplexity's -c).
    #[arg(long, short = 'c', default_value_t = 512)]
    ctx: usize,
    /// Score at most this many chunks (default: all).
    #[arg(long)]
    chunks: Option<usize>,
    /// Print {"ppl":..,"chunks":..,"tokens":..} as the last line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    kv: KvDtypeArg,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    if args.ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let files = ModelFiles::open(&resolve(args.model.name())?)?;
    let tok = files.tokenizer()?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let tokens = tok.encode(&text, true, false)?;
    let mut pool = args.kv.pool(args.device)?;
    pool.context = Some(args.ctx);
    let mut model = KvManaged::new(files.load_llm(args.device, &pool)?);
    if args.ctx > model.kv_capacity() {
        bail!(
            "--ctx {} is longer than the model's context ({} tokens)",
            args.ctx,
            model.kv_capacity()
        );
    }
    let available = tokens.len() / args.ctx;
    let n_chunks = args.chunks.map_or(available, |c| c.min(available));
    if n_chunks == 0 {
        bail!(
            "{} has {} tokens, fewer than one chunk of {}",
            args.file.display(),
            tokens.len(),
            args.ctx
        );
    }
    let bos = tok
        .special()
        .bos
        .filter(|_| tokens.first() == tok.special().bos.as_ref());
    let first = args.ctx / 2;
    let vocab = model.config().vocab_size;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    eprintln!(
        "{} tokens, {} chunks of {}",
        tokens.len(),
        n_chunks,
        args.ctx
    );
    let start = std::time::Instant::now();
    for c in 0..n_chunks {
        let mut chunk = tokens[c * args.ctx..(c + 1) * args.ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        model.reset();
        // First half: context only; second half: logits of every position.
        model.unified_forward(&[("ppl".to_string(), chunk[..first].to_vec(), 0, false)])?;
        let logits = model.forward_verify("ppl", &chunk[first..]);
        for (j, row) in logits
            .chunks_exact(vocab)
            .enumerate()
            .take(args.ctx - 1 - first)
        {
            let target = chunk[first + j + 1] as usize;
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            let v = lse - row[target] as f64;
            nll += v;
            nll2 += v * v;
            count += 1;
        }
        eprint!("[{}] {:.4} ", c + 1, (nll / count as f64).exp());
    }
    eprintln!();
    model.reset();
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let err = ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt();
    println!("Final estimate: PPL = {ppl:.4} +/- {err:.5}");
    eprintln!(
        "{:.1} tokens/s",
        (n_chunks * args.ctx) as f64 / start.elapsed().as_secs_f64()
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({"ppl": ppl, "ppl_err": err, "chunks": n_chunks, "tokens": n_chunks * args.ctx})
        );
    }
    Ok(())
}
