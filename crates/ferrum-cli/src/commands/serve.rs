//! `ferrum serve`: the OpenAI-compatible HTTP server.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use ferrum_engine::{Embedder, EngineConfig};
use ferrum_models::registry::{self, Family};
use ferrum_server::{LoadedModel, ReasoningFormat, ServeConfig};

use crate::model_files::{
    model_card, on_device, resolve, Device, KvArgs, ModelArg, ModelFiles, SpecArgs,
};

#[derive(Args)]
pub struct ServeArgs {
    /// Where to run: cpu, cuda or cuda:N (needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// An encoder (BERT, e.g. `minilm`) serves /v1/embeddings; a decoder
    /// serves chat and completions.
    #[command(flatten)]
    model: ModelArg,
    /// Use the Jinja chat template in FILE instead of the model's (one
    /// that is missing or wrong; llama-server's --chat-template-file).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model id clients send (default: the --model alias, or the
    /// file or folder name of a --model path). Several names: the model
    /// answers to each, responses carry the first (as vLLM does).
    #[arg(long, num_args = 1..)]
    served_model_name: Vec<String>,
    /// Require `Authorization: Bearer KEY` on /v1/* (also FERRUM_API_KEY).
    #[arg(long, env = "FERRUM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Read the API keys from this file, one per line (keeps them out of
    /// `ps`); any of them is accepted. Blank lines and `#` lines are skipped.
    #[arg(long, value_name = "PATH", conflicts_with = "api_key")]
    api_key_file: Option<PathBuf>,
    /// /metrics needs the API key too.
    #[arg(long)]
    metrics_require_key: bool,
    /// Serve requests that name any model (apps that hard-code one, e.g.
    /// gpt-4o-mini); by default another name is a 404.
    #[arg(long)]
    accept_any_model: bool,
    /// Host names to answer besides IP addresses and localhost
    /// (comma-separated; `*` for any). Others are refused, which stops DNS
    /// rebinding from reaching the server through a web page.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    allowed_hosts: Vec<String>,
    /// Origins whose web pages may call the API, with CORS
    /// (comma-separated, e.g. https://app.example; `*` for any). By default
    /// only the server's own chat page may.
    #[arg(long, value_delimiter = ',', value_name = "ORIGINS")]
    allowed_origins: Vec<String>,
    /// Seconds a client gets to send a request's headers (and an idle
    /// connection is kept), and again to send its body.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    read_timeout: u64,
    /// Seconds a write to a client may wait without progress (a client that
    /// stopped reading) before its connection and generation are dropped.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    write_timeout: u64,
    /// Connections open at once; more wait to be accepted.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_connections: u64,
    /// Requests waiting or running before new ones get HTTP 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Largest accepted request body in bytes (HTTP 413 above).
    #[arg(long, default_value_t = 32 << 20)]
    max_body_bytes: usize,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// Sequences batched together in one engine step.
    #[arg(long, default_value_t = EngineConfig::default().max_num_seqs)]
    max_num_seqs: usize,
    /// Tokens per engine step (prefill chunks + decodes); longer prompts
    /// are prefilled in chunks of this size between decode steps.
    #[arg(long, default_value_t = EngineConfig::default().max_num_batched_tokens)]
    max_num_batched_tokens: usize,
    /// Do not serve the browser chat page at `/` (the API stays).
    #[arg(long)]
    no_webui: bool,
    /// How tool calls are read from the output: `strict`, the chat
    /// template's own format only; `lenient` also takes a ```json fenced
    /// call to a declared function, as small models often write one (other
    /// fenced blocks then stream only once closed).
    #[arg(long, value_enum, default_value_t = ToolCallParser::Strict)]
    tool_call_parser: ToolCallParser,
    /// Where a thinking model's `<think>` reasoning goes: `auto` returns it
    /// as `reasoning_content` when the chat template writes `<think>`
    /// (Qwen3, DeepSeek-R1), `deepseek` does so for any model, `none` leaves
    /// it in `content` (llama-server's `--reasoning-format`).
    #[arg(long, value_enum, default_value_t = ReasoningArg::Auto)]
    reasoning_format: ReasoningArg,
    /// Reasoning tokens a thinking model may write before its `</think>`
    /// is written for it; 0 skips the thinking, -1 leaves it unlimited
    /// (llama-server's `--reasoning-budget`). Anthropic requests' own
    /// `thinking.budget_tokens` wins.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    reasoning_budget: i64,
    /// Publish the prefix cache's changes as vLLM's KV-cache events (ZeroMQ
    /// PUB, msgpack) for KV-aware routers: `tcp://*:5557` binds, a host
    /// connects (vLLM's `--kv-events-config` endpoint).
    #[arg(long, value_name = "ENDPOINT")]
    kv_events_endpoint: Option<String>,
    /// The topic (first frame) of each KV-event message.
    #[arg(long, default_value = "", requires = "kv_events_endpoint")]
    kv_events_topic: String,
    #[command(flatten)]
    kv: KvArgs,
    #[command(flatten)]
    spec: SpecArgs,
}

/// `--reasoning-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ReasoningArg {
    Auto,
    Deepseek,
    None,
}

/// `--tool-call-parser`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ToolCallParser {
    Strict,
    Lenient,
}

/// The name a `--model` argument is served as: an alias as given, a path
/// by its last component (responses would otherwise show a local path to
/// every client).
fn served_name(model: &str) -> String {
    let path = std::path::Path::new(model.trim_end_matches(['/', '\\']));
    match path.file_name() {
        Some(name) if path.components().count() > 1 => name.to_string_lossy().into_owned(),
        _ => model.to_string(),
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    ferrum_types::bound_retained_memory();
    let path = resolve(args.model.name())?;
    let cfg = ServeConfig {
        host: args.host,
        port: args.port,
        served_model_name: args
            .served_model_name
            .first()
            .cloned()
            .unwrap_or_else(|| served_name(args.model.name())),
        model_aliases: args.served_model_name.iter().skip(1).cloned().collect(),
        accept_any_model: args.accept_any_model,
        api_keys: match &args.api_key_file {
            Some(f) => read_keys(f)?,
            None => args.api_key.into_iter().filter(|k| !k.is_empty()).collect(),
        },
        metrics_require_key: args.metrics_require_key,
        allowed_hosts: args.allowed_hosts,
        allowed_origins: args.allowed_origins,
        read_timeout: Duration::from_secs(args.read_timeout),
        write_timeout: Duration::from_secs(args.write_timeout),
        max_connections: args.max_connections as usize,
        max_queue: args.max_queue.max(1),
        max_body_bytes: args.max_body_bytes,
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        engine: EngineConfig {
            max_num_seqs: args.max_num_seqs.max(1),
            max_num_batched_tokens: args.max_num_batched_tokens.max(1),
            threads: None,
            kv_events: None,
        },
        kv_events_endpoint: args.kv_events_endpoint,
        kv_events_topic: args.kv_events_topic,
        webui: !args.no_webui,
        lenient_tool_calls: args.tool_call_parser == ToolCallParser::Lenient,
        card: model_card(&path),
        reasoning_budget: usize::try_from(args.reasoning_budget).ok(),
        reasoning_format: match args.reasoning_format {
            ReasoningArg::Auto => ReasoningFormat::Auto,
            ReasoningArg::Deepseek => ReasoningFormat::Deepseek,
            ReasoningArg::None => ReasoningFormat::None,
        },
    };
    let pool = args.kv.pool(args.device)?;
    let loader = Box::new(move || -> Result<LoadedModel, String> {
        let load = || -> Result<LoadedModel> {
            if path.is_dir() && matches!(registry::hf_family(&path), Ok(Family::Bert)) {
                args.device.init()?;
                let embedder = on_device!(args.device, |B| Embedder::load::<B>(&path))?;
                return Ok(LoadedModel::Embedding(embedder));
            }
            let files = ModelFiles::open(&path)?;
            Ok(LoadedModel::Llm {
                sampling: files.recommended_sampling(),
                tokenizer: files.tokenizer_with(args.chat_template.as_deref())?,
                model: files.load_llm(args.device, &pool)?,
                speculation: args.spec.load(args.device, &pool)?,
            })
        };
        load().map_err(|e| format!("{e:#}"))
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let server = ferrum_server::bind(cfg).await?;
        println!("{}", start_line(server.local_addr(), server.has_webui()));
        server.run(loader).await
    })
    .map_err(|e| anyhow!(e))
}

/// The keys in an `--api-key-file`: one per line, blank and `#` lines
/// skipped. An empty file is an error, not an open server.
fn read_keys(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the API key file {}", path.display()))?;
    let keys: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    if keys.is_empty() {
        bail!("the API key file {} holds no key", path.display());
    }
    Ok(keys)
}

/// What `serve` prints once the port is bound: where a person and a client
/// go, one per line so it fits 80 columns. A wildcard address is shown as
/// `localhost`, which a browser on this machine can open.
fn start_line(addr: SocketAddr, webui: bool) -> String {
    let host = match addr.ip() {
        ip if ip.is_unspecified() => "localhost".to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
        IpAddr::V4(ip) => ip.to_string(),
    };
    let base = format!("http://{host}:{}", addr.port());
    let mut out = String::from("ferrum serve\n");
    if webui {
        out += &format!("  chat page   {base}/\n");
    }
    out += &format!("  OpenAI API  {base}/v1");
    if addr.ip().is_unspecified() {
        out += "\n  listening on all interfaces";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{served_name, start_line};

    #[test]
    fn paths_are_served_by_their_last_component() {
        assert_eq!(served_name("smollm2"), "smollm2");
        assert_eq!(served_name("qwen2.5-coder:0.5b"), "qwen2.5-coder:0.5b");
        assert_eq!(
            served_name("/home/me/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        );
        assert_eq!(served_name("models/Qwen2.5-0.5B/"), "Qwen2.5-0.5B");
        assert_eq!(served_name("./tiny"), "tiny");
    }

    #[test]
    fn start_line_names_a_url_a_browser_can_open_in_80_columns() {
        let at = |a: &str| a.parse().unwrap_or_else(|e| panic!("{a}: {e}"));
        assert_eq!(
            start_line(at("127.0.0.1:8000"), true),
            "ferrum serve\n  chat page   http://127.0.0.1:8000/\n  OpenAI API  http://127.0.0.1:8000/v1"
        );
        assert_eq!(
            start_line(at("0.0.0.0:80"), false),
            "ferrum serve\n  OpenAI API  http://localhost:80/v1\n  listening on all interfaces"
        );
        let widest = start_line(at("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"), true);
        assert!(widest.lines().all(|l| l.len() <= 80), "{widest}");
        assert!(start_line(at("[::1]:9"), false).ends_with("  OpenAI API  http://[::1]:9/v1"));
        assert!(start_line(at("255.255.255.255:65535"), true)
            .lines()
            .all(|l| l.len() <= 80));
    }
}
