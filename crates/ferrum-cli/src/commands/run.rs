//! `ferrum run`: chat with a model, or complete one prompt.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use ferrum_engine::{generate, GenerateOutput, GenerateRequest, SamplingParams};
use ferrum_models::DecoderOnlyLLM;
use ferrum_tokenizer::chat::{ChatOptions, ChatTemplate, Message};
use ferrum_tokenizer::Tokenizer;

use crate::model_files::{resolve, Device, ModelFiles, DEFAULT_MODEL};

#[derive(Args)]
pub struct RunArgs {
    /// Where to run: cpu, cuda or cuda:N (needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// A .gguf file, a Hugging Face folder, or an alias.
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,
    /// Complete this prompt and exit (raw text, no chat template unless --chat).
    #[arg(long)]
    prompt: Option<String>,
    /// Wrap --prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// System message for chat mode.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens to generate per answer.
    #[arg(long, short = 'n', default_value_t = 512)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// 0 disables top-k.
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
}

impl RunArgs {
    fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    args.sampling().validate()?;
    let files = ModelFiles::open(&resolve(&args.model)?)?;
    let tok = files.tokenizer()?;
    let template = match tok.chat_template() {
        Some(t) => Some(ChatTemplate::new(t)?),
        None => None,
    };
    let needs_template = args.prompt.is_none() || args.chat;
    if needs_template && template.is_none() {
        bail!(
            "{} has no chat template, so it cannot chat; use --prompt TEXT for a plain completion",
            args.model
        );
    }
    let mut model = files.load_llm(args.device)?;
    // Ctrl-C stops the answer being generated; at the input prompt it exits.
    let generating = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (g, i) = (generating.clone(), interrupted.clone());
        ctrlc::set_handler(move || {
            if g.load(Ordering::SeqCst) {
                i.store(true, Ordering::SeqCst);
            } else {
                std::process::exit(130);
            }
        })
        .context("cannot install the Ctrl-C handler")?;
    }
    let session = Session {
        args: &args,
        tok: &tok,
        template: template.as_ref(),
        generating,
        interrupted,
    };
    match &args.prompt {
        Some(p) if !args.chat => session.one_shot(model.as_mut(), p),
        Some(p) => {
            let mut conv = session.start();
            conv.push(Message::new("user", p.clone()));
            session
                .answer(model.as_mut(), &mut conv, &mut Vec::new())
                .map(|_| ())
        }
        None => session.repl(model.as_mut()),
    }
}

struct Session<'a> {
    args: &'a RunArgs,
    tok: &'a Tokenizer,
    template: Option<&'a ChatTemplate>,
    generating: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
}

const CACHE_ID: &str = "chat";

impl Session<'_> {
    fn start(&self) -> Vec<Message> {
        self.args
            .system
            .iter()
            .map(|s| Message::new("system", s.clone()))
            .collect()
    }

    fn generate(
        &self,
        model: &mut dyn DecoderOnlyLLM,
        prompt: Vec<u32>,
        cached: usize,
    ) -> Result<GenerateOutput> {
        let req = GenerateRequest {
            prompt,
            max_tokens: self.args.max_tokens,
            sampling: self.args.sampling(),
            stop_strings: self.args.stop.clone(),
            stop_tokens: Vec::new(),
        };
        self.interrupted.store(false, Ordering::SeqCst);
        self.generating.store(true, Ordering::SeqCst);
        let mut stdout = std::io::stdout();
        let out = generate(model, self.tok, CACHE_ID, cached, &req, |text| {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            !self.interrupted.load(Ordering::SeqCst)
        });
        self.generating.store(false, Ordering::SeqCst);
        let out = out?;
        let n = out.tokens.len();
        let tps = |k: usize, d: std::time::Duration| k as f64 / d.as_secs_f64().max(1e-9);
        tracing::info!(
            prompt_tokens = out.prompt_tokens,
            prefill_tok_s = format!("{:.1}", tps(out.prompt_tokens - cached, out.prefill_time)),
            generated = n,
            decode_tok_s = format!("{:.1}", tps(n.saturating_sub(1), out.decode_time)),
            finish = out.finish_reason.as_str(),
        );
        Ok(out)
    }

    fn one_shot(&self, model: &mut dyn DecoderOnlyLLM, prompt: &str) -> Result<()> {
        let ids = self.tok.encode(prompt, true, false)?;
        self.generate(model, ids, 0)?;
        println!();
        Ok(())
    }

    /// Renders the conversation, reuses the cached prefix, generates and
    /// appends the answer. `cached` holds the tokens now in the KV cache.
    fn answer(
        &self,
        model: &mut dyn DecoderOnlyLLM,
        conv: &mut Vec<Message>,
        cached: &mut Vec<u32>,
    ) -> Result<()> {
        let Some(template) = self.template else {
            bail!("no chat template")
        };
        let special = self.tok.special();
        let text_of = |id: Option<u32>| {
            id.and_then(|i| self.tok.token_text(i))
                .unwrap_or("")
                .to_string()
        };
        let (bos, eos) = (text_of(special.bos), text_of(special.eos));
        let opts = ChatOptions {
            add_generation_prompt: true,
            tools: None,
            bos_token: &bos,
            eos_token: &eos,
        };
        let prompt = self
            .tok
            .encode(&template.render(conv, &opts)?, false, true)?;
        // Keep the longest cached prefix the new prompt still starts with
        // (and at least one new token to prefill).
        let common = cached
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        let out = self.generate(model, prompt.clone(), common)?;
        println!();
        let kv = model.kv_len(CACHE_ID);
        *cached = prompt
            .into_iter()
            .chain(out.tokens.iter().copied())
            .take(kv)
            .collect();
        conv.push(Message::new("assistant", out.text));
        Ok(())
    }

    fn repl(&self, model: &mut dyn DecoderOnlyLLM) -> Result<()> {
        eprintln!(
            "Chatting with {}. /clear starts over, /bye (or Ctrl-D) quits, Ctrl-C stops an answer.",
            self.args.model
        );
        let mut conv = self.start();
        let mut cached = Vec::new();
        let stdin = std::io::stdin();
        loop {
            eprint!(">>> ");
            let mut line = String::new();
            if stdin.lock().read_line(&mut line)? == 0 {
                break;
            }
            match line.trim() {
                "" => continue,
                "/bye" | "/exit" | "/quit" => break,
                "/clear" => {
                    conv = self.start();
                    cached.clear();
                    model.release(CACHE_ID);
                    eprintln!("(conversation cleared)");
                    continue;
                }
                text => conv.push(Message::new("user", text)),
            }
            if let Err(e) = self.answer(model, &mut conv, &mut cached) {
                // Keep the session alive: drop the turn that failed.
                conv.pop();
                eprintln!("error: {e:#}");
            }
        }
        Ok(())
    }
}
