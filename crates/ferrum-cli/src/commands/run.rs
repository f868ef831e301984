//! `ferrum run`: chat with a model, or complete one prompt.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use ferrum_engine::{
    Completion, Engine, EngineConfig, Event, FinishReason, Request, SamplingParams,
};
use ferrum_structured::{Constraint, GrammarSpec, Grammars};
use ferrum_tokenizer::chat::{ChatOptions, ChatTemplate, Message};
use ferrum_tokenizer::Tokenizer;

use super::thinking::ThinkingView;
use crate::model_files::{resolve, Device, KvArgs, ModelArg, ModelFiles, SpecArgs};
use ferrum_formats::sampling::RecommendedSampling as Recommended;

#[derive(Args)]
pub struct RunArgs {
    /// Where to run: cpu, cuda or cuda:N (needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: Device,
    #[command(flatten)]
    pub(super) model: ModelArg,
    /// Complete this prompt and exit (raw text, no chat template unless --chat).
    #[arg(long)]
    prompt: Option<String>,
    /// Wrap --prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Use the Jinja chat template in FILE instead of the model's (one
    /// that is missing or wrong; llama-server's --chat-template-file).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// System message for chat mode.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens to generate per answer.
    #[arg(long, short = 'n', default_value_t = 512, value_parser = super::at_least_one)]
    max_tokens: usize,
    /// 0 is greedy. [default: the model's recommendation (GGUF
    /// `general.sampling.*` or generation_config.json), else 0.8; the same
    /// for the four below]
    #[arg(long)]
    temperature: Option<f32>,
    /// 0 disables top-k. [default: the model's, else 40]
    #[arg(long)]
    top_k: Option<usize>,
    /// [default: the model's, else 0.95]
    #[arg(long)]
    top_p: Option<f32>,
    /// [default: the model's, else 0.05]
    #[arg(long)]
    min_p: Option<f32>,
    /// [default: the model's, else 1 (off)]
    #[arg(long)]
    repeat_penalty: Option<f32>,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Constrain every answer to JSON valid under the schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    json_schema: Option<PathBuf>,
    /// Constrain every answer to the grammar in FILE: GBNF as llama.cpp
    /// takes it (a `.lark` file: llguidance's Lark syntax).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
    /// Leave a thinking model's reasoning (`<think>...</think>`) out of
    /// the answers; it is shown dimmed otherwise.
    #[arg(long)]
    hide_thinking: bool,
    /// After each answer, print its token counts and speeds to stderr.
    #[arg(long, short = 'v')]
    verbose: bool,
    #[command(flatten)]
    kv: KvArgs,
    #[command(flatten)]
    spec: SpecArgs,
}

impl RunArgs {
    /// The output grammar from --json-schema / --grammar, if any.
    fn output_spec(&self) -> Result<Option<GrammarSpec>> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
        };
        if let Some(p) = &self.json_schema {
            let schema = serde_json::from_str(&read(p)?)
                .with_context(|| format!("{} is not JSON", p.display()))?;
            return Ok(Some(GrammarSpec::JsonSchema(schema)));
        }
        if let Some(p) = &self.grammar {
            let src = read(p)?;
            return Ok(Some(match p.extension().and_then(|e| e.to_str()) {
                Some("lark") => GrammarSpec::Lark(src),
                _ => GrammarSpec::Gbnf(src),
            }));
        }
        Ok(None)
    }

    /// The settings given on the command line, then the model's `rec`
    /// (already in range: [`Recommended::sanitized`]), then Ferrum's
    /// defaults.
    fn sampling(&self, rec: &Recommended) -> SamplingParams {
        let d = SamplingParams::default();
        let pick = |asked: Option<f32>, model: Option<f32>, default: f32| {
            asked.or(model).unwrap_or(default)
        };
        SamplingParams {
            temperature: pick(self.temperature, rec.temperature, d.temperature),
            top_k: self.top_k.or(rec.top_k).unwrap_or(d.top_k),
            top_p: pick(self.top_p, rec.top_p, d.top_p),
            min_p: pick(self.min_p, rec.min_p, d.min_p),
            repetition_penalty: pick(
                self.repeat_penalty,
                rec.repeat_penalty,
                d.repetition_penalty,
            ),
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    args.sampling(&Recommended::default()).validate()?;
    let files = ModelFiles::open(&resolve(args.model.name())?)?;
    let sampling = args.sampling(&files.recommended_sampling());
    if args.verbose {
        eprintln!("{}", describe_sampling(&sampling));
    }
    let tok = files.tokenizer_with(args.chat_template.as_deref())?;
    let template = match tok.chat_template() {
        Some(t) => Some(ChatTemplate::new(t)?),
        None => None,
    };
    let needs_template = args.prompt.is_none() || args.chat;
    if needs_template && template.is_none() {
        bail!(
            "{} has no chat template, so it cannot chat; use --prompt TEXT for a plain completion",
            args.model.name()
        );
    }
    let pool = args.kv.pool(args.device)?;
    let model = files.load_llm(args.device, &pool)?;
    let tok = Arc::new(tok);
    let constraint = match args.output_spec()? {
        Some(spec) => {
            let grammars = Grammars::new(tok.clone(), model.config().vocab_size)?;
            Some(grammars.compile(&spec)?)
        }
        None => None,
    };
    let spec = args.spec.load(args.device, &pool)?;
    let engine = Engine::start_with(model, tok.clone(), EngineConfig::default(), spec)?;
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
    let mut session = Session {
        args: &args,
        tok: &tok,
        engine,
        template: template.as_ref(),
        sampling,
        max_tokens: args.max_tokens,
        system: args.system.clone(),
        constraint,
        generating,
        interrupted,
    };
    match &args.prompt {
        Some(p) if !args.chat => session.one_shot(p),
        Some(p) => {
            let mut conv = session.start();
            conv.push(Message::new("user", p.clone()));
            session.answer(&mut conv)
        }
        None => super::repl::chat(&mut session),
    }
}

/// The settings in use, for `--verbose`.
fn describe_sampling(p: &SamplingParams) -> String {
    format!(
        "sampling: temperature {}, top_k {}, top_p {}, min_p {}, repeat_penalty {}",
        p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty
    )
}

/// A chat or a one-shot completion with one loaded model. The interactive
/// chat (`super::repl`) changes the settings as it goes (`/set`).
pub(super) struct Session<'a> {
    pub(super) args: &'a RunArgs,
    tok: &'a Tokenizer,
    engine: Engine,
    template: Option<&'a ChatTemplate>,
    /// The command line's settings over the model's recommendations.
    pub(super) sampling: SamplingParams,
    /// Most tokens per answer (`-n`).
    pub(super) max_tokens: usize,
    /// The system message each conversation starts with.
    pub(super) system: Option<String>,
    /// Every answer's grammar (a fresh copy each).
    constraint: Option<Constraint>,
    generating: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
}

impl Session<'_> {
    pub(super) fn start(&self) -> Vec<Message> {
        self.system
            .iter()
            .map(|s| Message::new("system", s.clone()))
            .collect()
    }

    /// Streams one answer to stdout (through `view`) and returns its text.
    /// Earlier turns of a chat are not recomputed: the engine's prefix
    /// cache holds them. An answer held to a grammar and cut by `-n` (or
    /// the context) is incomplete: that is an error, after the text.
    fn generate(&self, prompt: Vec<u32>, view: ThinkingView) -> Result<String> {
        let req = Request {
            prompt,
            max_tokens: self.max_tokens,
            sampling: self.sampling.clone(),
            stop_strings: self.args.stop.clone(),
            stop_tokens: Vec::new(),
            ignore_eos: false,
            prompt_logprobs: None,
            constraint: self.constraint.clone(),
            reasoning_budget: None,
        };
        self.interrupted.store(false, Ordering::SeqCst);
        self.generating.store(true, Ordering::SeqCst);
        let result = self.stream(req, view);
        self.generating.store(false, Ordering::SeqCst);
        let (text, done) = result?;
        let cut = done.is_some_and(|c| c.finish == FinishReason::Length);
        if cut && self.constraint.is_some() {
            let what = match self.args.json_schema {
                Some(_) => "the JSON is incomplete",
                None => "it is incomplete under the grammar",
            };
            bail!(
                "the answer was cut at {} tokens, so {what}; raise -n",
                self.max_tokens
            );
        }
        Ok(text)
    }

    /// The answer's text, and how it finished (`None`: stopped by Ctrl-C).
    fn stream(&self, req: Request, mut view: ThinkingView) -> Result<(String, Option<Completion>)> {
        let start = Instant::now();
        let mut rx = self.engine.submit(req)?;
        let mut stdout = std::io::stdout();
        let mut text = String::new();
        let (mut first, mut n) = (None, 0usize);
        let mut print = |t: &str, text: &mut String| {
            let _ = stdout.write_all(view.push(t).as_bytes());
            let _ = stdout.flush();
            text.push_str(t);
        };
        let done = loop {
            if self.interrupted.load(Ordering::SeqCst) {
                // Dropping the stream cancels the request in the engine.
                break None;
            }
            // Poll so Ctrl-C is noticed while the engine is busy.
            let ev = match rx.try_recv() {
                Ok(ev) => ev,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(_) => return Err(anyhow!("the engine stopped")),
            };
            match ev {
                Event::Token { text: t, .. } => {
                    first.get_or_insert_with(Instant::now);
                    n += 1;
                    print(&t, &mut text);
                }
                Event::Text(t) => print(&t, &mut text),
                Event::PromptLogprobs(_) => {}
                Event::Done(c) => break Some(c),
                Event::Error(e) => return Err(anyhow!(e)),
            }
        };
        // The answer's line ends before anything else is printed.
        println!("{}", view.finish());
        if self.args.verbose {
            let timing = Timing {
                ttft: first.map_or(Duration::ZERO, |f| f - start),
                decode: first.map_or(Duration::ZERO, |f| f.elapsed()),
                tokens: n,
            };
            let st = self.engine.stats();
            eprintln!(
                "{}",
                timing.line(done.as_ref(), st.get(&st.drafted), st.get(&st.accepted))
            );
        }
        Ok((text, done))
    }

    fn one_shot(&self, prompt: &str) -> Result<()> {
        let ids = self.tok.encode(prompt, true, false)?;
        self.generate(ids, ThinkingView::new(false, prompt, false, false))?;
        Ok(())
    }

    /// Renders `conv` with `render`, first dropping its oldest exchanges
    /// (never the system message or the newest message) while the prompt
    /// and room for an answer would overflow the context, as Ollama does,
    /// and saying so in one dim line. The room kept is `-n`, at most half
    /// the context, so a long `-n` cannot empty a chat. A newest message
    /// that alone does not fit is left for the engine to refuse by name.
    fn fit<T>(
        &self,
        conv: &mut Vec<Message>,
        render: impl Fn(&[Message]) -> Result<(T, Vec<u32>)>,
    ) -> Result<(T, Vec<u32>)> {
        let capacity = self.engine.capacity();
        let room = self.max_tokens.min(capacity / 2);
        let mut dropped = 0;
        loop {
            let (rendered, prompt) = render(conv)?;
            let Some(n) = oldest_exchange(conv).filter(|_| prompt.len() + room > capacity) else {
                if dropped > 0 {
                    let line = format!(
                        "(dropped the {dropped} oldest messages to fit the {capacity}-token context; --ctx sets it)"
                    );
                    let dim =
                        std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
                    if dim {
                        eprintln!("\x1b[2m{line}\x1b[0m");
                    } else {
                        eprintln!("{line}");
                    }
                }
                return Ok((rendered, prompt));
            };
            let first = conv.iter().position(|m| m.role != "system").unwrap_or(0);
            conv.drain(first..first + n);
            dropped += n;
        }
    }

    /// Renders the conversation, generates and appends the answer.
    pub(super) fn answer(&self, conv: &mut Vec<Message>) -> Result<()> {
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
            kwargs: None,
        };
        let (rendered, prompt) = self.fit(conv, |c| {
            let rendered = template.render(c, &opts)?;
            let prompt = self.tok.encode(&rendered, false, true)?;
            Ok((rendered, prompt))
        })?;
        let thinks = self
            .tok
            .chat_template()
            .is_some_and(|t| t.contains("<think>"));
        let dim = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        let view = ThinkingView::new(thinks, &rendered, self.args.hide_thinking, dim);
        let text = self.generate(prompt, view)?;
        conv.push(Message::new("assistant", text));
        Ok(())
    }
}

/// How many messages the oldest exchange after the system message holds
/// (a user message and the answers up to the next user message); `None`
/// when only the newest message is left to drop.
fn oldest_exchange(conv: &[Message]) -> Option<usize> {
    let first = conv.iter().position(|m| m.role != "system")?;
    let next_user = conv[first + 1..]
        .iter()
        .position(|m| m.role == "user")
        .map_or(conv.len(), |i| first + 1 + i);
    let n = next_user - first;
    (first + n < conv.len()).then_some(n)
}

/// When an answer's tokens came, for `--verbose`.
struct Timing {
    /// From submitting to the first token (prefill and queueing).
    ttft: Duration,
    /// From the first token to the last.
    decode: Duration,
    /// Tokens generated.
    tokens: usize,
}

impl Timing {
    /// One line, like `ollama run --verbose` but on one line: prompt and
    /// answer token counts with their rates. `done` is `None` when the
    /// answer was stopped; `drafted`/`accepted` count speculative tokens
    /// over the session.
    fn line(&self, done: Option<&Completion>, drafted: usize, accepted: usize) -> String {
        let rate = |k: usize, d: Duration| k as f64 / d.as_secs_f64().max(1e-9);
        let mut parts = Vec::new();
        if let Some(c) = done {
            let fresh = c.prompt_tokens - c.cached_tokens.min(c.prompt_tokens);
            parts.push(format!(
                "prompt {} tokens ({} cached) {:.1} tok/s",
                c.prompt_tokens,
                c.cached_tokens,
                rate(fresh, self.ttft)
            ));
        }
        // The first token comes with the prefill; the rate is over the rest.
        parts.push(format!(
            "answer {} tokens {:.1} tok/s",
            self.tokens,
            rate(self.tokens.saturating_sub(1), self.decode)
        ));
        parts.push(format!("first token {:.2} s", self.ttft.as_secs_f64()));
        parts.push(format!(
            "finish {}",
            done.map_or("stopped", |c| c.finish.as_str())
        ));
        if drafted > 0 {
            parts.push(format!(
                "speculation {accepted}/{drafted} drafts accepted (session)"
            ));
        }
        format!("[{}]", parts.join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_exchange_goes_first_and_the_newest_message_stays() {
        let conv = |roles: &[&str]| -> Vec<Message> {
            roles.iter().map(|r| Message::new(*r, "x")).collect()
        };
        let c = conv(&["system", "user", "assistant", "user", "assistant", "user"]);
        assert_eq!(oldest_exchange(&c), Some(2));
        assert_eq!(oldest_exchange(&c[..4]), Some(2));
        assert_eq!(oldest_exchange(&conv(&["system", "user"])), None);
        assert_eq!(oldest_exchange(&conv(&["user"])), None);
        assert_eq!(oldest_exchange(&conv(&["system"])), None);
        // An answer cut off and a second user message: both users' turns.
        assert_eq!(
            oldest_exchange(&conv(&["user", "user", "assistant", "user"])),
            Some(1)
        );
    }

    #[test]
    fn verbose_line_reports_counts_and_rates() {
        let t = Timing {
            ttft: Duration::from_millis(500),
            decode: Duration::from_secs(2),
            tokens: 41,
        };
        let c = Completion {
            finish: FinishReason::Stop,
            prompt_tokens: 120,
            completion_tokens: 41,
            cached_tokens: 20,
            stop_string: None,
        };
        assert_eq!(
            t.line(Some(&c), 0, 0),
            "[prompt 120 tokens (20 cached) 200.0 tok/s | answer 41 tokens 20.0 tok/s | first token 0.50 s | finish stop]"
        );
        assert_eq!(
            t.line(None, 8, 5),
            "[answer 41 tokens 20.0 tok/s | first token 0.50 s | finish stopped | speculation 5/8 drafts accepted (session)]"
        );
    }
}
