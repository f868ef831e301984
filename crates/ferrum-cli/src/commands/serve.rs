//! `ferrum serve`: the OpenAI-compatible HTTP server.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::Args;
use ferrum_engine::{Embedder, EngineConfig};
use ferrum_kernels::CpuBackend;
use ferrum_server::{LoadedModel, ServeConfig};

use crate::model_files::{resolve, Device, KvArgs, ModelFiles, SpecArgs, DEFAULT_MODEL};

#[derive(Args)]
pub struct ServeArgs {
    /// Where to run: cpu, cuda or cuda:N (needs a build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Model: a .gguf file, a Hugging Face folder or an alias. An encoder
    /// (BERT, e.g. `minilm`) serves /v1/embeddings; a decoder serves chat
    /// and completions.
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: String,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model id clients send (default: the --model argument).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1/* (also FERRUM_API_KEY).
    #[arg(long, env = "FERRUM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
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
    #[command(flatten)]
    kv: KvArgs,
    #[command(flatten)]
    spec: SpecArgs,
}

fn is_encoder(dir: &std::path::Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v.get("model_type")
                .and_then(|m| m.as_str())
                .map(|m| m == "bert")
        })
        .unwrap_or(false)
}

pub fn run(args: ServeArgs) -> Result<()> {
    let path = resolve(&args.model)?;
    let cfg = ServeConfig {
        host: args.host,
        port: args.port,
        served_model_name: args.served_model_name.unwrap_or_else(|| args.model.clone()),
        api_key: args.api_key.filter(|k| !k.is_empty()),
        max_queue: args.max_queue.max(1),
        max_body_bytes: args.max_body_bytes,
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        engine: EngineConfig {
            max_num_seqs: args.max_num_seqs.max(1),
            max_num_batched_tokens: args.max_num_batched_tokens.max(1),
            threads: None,
        },
        webui: !args.no_webui,
    };
    let pool = args.kv.pool();
    let loader = Box::new(move || -> Result<LoadedModel, String> {
        let load = || -> Result<LoadedModel> {
            if path.is_dir() && is_encoder(&path) {
                return Ok(LoadedModel::Embedding(Embedder::<CpuBackend>::load(&path)?));
            }
            let files = ModelFiles::open(&path)?;
            Ok(LoadedModel::Llm {
                tokenizer: files.tokenizer()?,
                model: files.load_llm(args.device, &pool)?,
                speculation: args.spec.load(args.device)?,
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

/// What `serve` prints once the port is bound: where a person and a client
/// go. A wildcard address is shown as `localhost`, which a browser on this
/// machine can open.
fn start_line(addr: SocketAddr, webui: bool) -> String {
    let host = match addr.ip() {
        ip if ip.is_unspecified() => "localhost".to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
        IpAddr::V4(ip) => ip.to_string(),
    };
    let base = format!("http://{host}:{}", addr.port());
    let all = if addr.ip().is_unspecified() {
        " (listening on all interfaces)"
    } else {
        ""
    };
    if webui {
        format!("ferrum serve: chat at {base}/ and the OpenAI API at {base}/v1{all}")
    } else {
        format!("ferrum serve: OpenAI API at {base}/v1{all}")
    }
}

#[cfg(test)]
mod tests {
    use super::start_line;

    #[test]
    fn start_line_names_a_url_a_browser_can_open() {
        let at = |a: &str| a.parse().unwrap_or_else(|e| panic!("{a}: {e}"));
        assert_eq!(
            start_line(at("127.0.0.1:8000"), true),
            "ferrum serve: chat at http://127.0.0.1:8000/ and the OpenAI API at http://127.0.0.1:8000/v1"
        );
        assert_eq!(
            start_line(at("0.0.0.0:80"), false),
            "ferrum serve: OpenAI API at http://localhost:80/v1 (listening on all interfaces)"
        );
        assert_eq!(
            start_line(at("[::1]:9"), false),
            "ferrum serve: OpenAI API at http://[::1]:9/v1"
        );
    }
}
