//! `ferrum embed`: one vector per input text.

use std::io::{BufRead, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use ferrum_engine::{EmbedInput, Embedder};

use crate::model_files::{on_device, resolve, Device};

#[derive(Args)]
pub struct EmbedArgs {
    /// Where to run: cpu, cuda or cuda:N (needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Embedding model: a Hugging Face folder (BERT + tokenizer.json) or an alias.
    #[arg(long, default_value = "minilm")]
    model: String,
    /// Print one JSON object per input ({"index","tokens","embedding"}) instead of plain numbers.
    #[arg(long)]
    json: bool,
    /// L2-normalise the vectors even when the model's modules.json does not ask for it.
    #[arg(long)]
    normalize: bool,
    /// Reject inputs longer than the model's limit instead of truncating them.
    #[arg(long)]
    no_truncate: bool,
    /// Texts to embed; without any, one text per line of standard input.
    text: Vec<String>,
}

pub fn run(args: EmbedArgs) -> Result<()> {
    let dir = resolve(&args.model)?;
    if !dir.is_dir() {
        bail!(
            "{}: embedding models are Hugging Face folders (config.json, model.safetensors, tokenizer.json), e.g. --model minilm",
            dir.display()
        );
    }
    args.device.init()?;
    let mut embedder = on_device!(args.device, |B| Embedder::load::<B>(&dir))
        .with_context(|| format!("loading {}", dir.display()))?;
    if args.normalize {
        embedder.set_normalize(true);
    }
    let texts = if args.text.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<std::io::Result<Vec<String>>>()
            .context("reading standard input")?
    } else {
        args.text
    };
    // An empty line is skipped, not an error for the whole batch; the JSON
    // `index` stays the input's position, so the others keep theirs.
    let (kept, empty): (Vec<_>, Vec<_>) = texts
        .into_iter()
        .enumerate()
        .partition(|(_, t)| !t.trim().is_empty());
    if !empty.is_empty() {
        let at: Vec<String> = empty.iter().map(|(i, _)| (i + 1).to_string()).collect();
        eprintln!(
            "warning: skipped {} empty input(s), number {} (counting from 1)",
            empty.len(),
            at.join(", ")
        );
    }
    if kept.is_empty() {
        bail!("nothing to embed: every input is empty");
    }
    let (index, inputs): (Vec<usize>, Vec<EmbedInput>) = kept
        .into_iter()
        .map(|(i, t)| (i, EmbedInput::Text(t)))
        .unzip();
    let start = Instant::now();
    let out = embedder.embed(&inputs, !args.no_truncate)?;
    let secs = start.elapsed().as_secs_f64();
    let tokens: usize = out.iter().map(|e| e.tokens).sum();
    let truncated = out.iter().filter(|e| e.truncated).count();
    if truncated > 0 {
        tracing::warn!(
            "{truncated} of {} inputs were cut to the model's {} tokens (--no-truncate makes that an error)",
            out.len(),
            embedder.max_tokens()
        );
    }
    tracing::info!(
        inputs = out.len(),
        tokens,
        truncated,
        seconds = format!("{secs:.3}"),
        inputs_per_s = format!("{:.1}", out.len() as f64 / secs),
        "embedded"
    );
    let mut stdout = std::io::stdout().lock();
    for (&i, e) in index.iter().zip(&out) {
        if args.json {
            let line = serde_json::json!({"index": i, "tokens": e.tokens, "embedding": e.vector});
            writeln!(stdout, "{line}")?;
        } else {
            let nums: Vec<String> = e.vector.iter().map(|x| format!("{x:.6}")).collect();
            writeln!(stdout, "{}", nums.join(" "))?;
        }
    }
    Ok(())
}
