//! `ferrum serve`: an OpenAI-compatible HTTP API over one model.
//!
//! The server binds first and loads the model in the background, so
//! `/health` answers 503 while loading and 200 once requests can be served.
//! A language model serves `/v1/chat/completions` and `/v1/completions`; an
//! encoder serves `/v1/embeddings`. Both have `/v1/models`, `/tokenize`,
//! `/detokenize`, `/health` and Prometheus `/metrics`; `/` is a chat page
//! for the browser (see [`webui`]) unless turned off.

mod access_log;
mod admin;
mod anthropic;
mod embed_worker;
mod embeddings;
mod error;
mod generation;
mod guard;
mod kv_events;
mod line_ends;
mod listen;
mod ollama;
mod protocol;
mod render;
mod responses;
mod stream;
mod structured;
mod vllm_metrics;
mod webui;
mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
pub use ferrum_engine::EngineConfig;
use ferrum_engine::{Embedder, Engine, Speculation};
use ferrum_models::PagedLlm;
use ferrum_structured::Grammars;
use ferrum_tokenizer::chat::ChatTemplate;
use ferrum_tokenizer::Tokenizer;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::mpsc;

pub use error::ApiError;
pub use ferrum_formats::sampling::RecommendedSampling;

/// How the server listens and what it accepts.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    /// The `model` id clients use, and the one responses carry; requests
    /// naming a model that is neither it nor an alias get 404.
    pub served_model_name: String,
    /// More ids the same model answers to (vLLM's `--served-model-name A
    /// B`); `/v1/models` lists them all, so a client can offer a choice.
    pub model_aliases: Vec<String>,
    /// Serve requests whatever model they name (for apps that hard-code
    /// one); responses still carry `served_model_name`.
    pub accept_any_model: bool,
    /// When not empty, `/v1/*`, `/tokenize` and `/detokenize` need
    /// `Authorization: Bearer <key>` with one of these keys.
    pub api_keys: Vec<String>,
    /// `/metrics` needs a key too (when there are keys).
    pub metrics_require_key: bool,
    /// Host names served besides IP literals and `localhost` (`*`: any);
    /// see [`guard`].
    pub allowed_hosts: Vec<String>,
    /// Origins (`https://app.example`) whose pages may call the API, with
    /// CORS; `*` allows any. Empty: only this server's own page.
    pub allowed_origins: Vec<String>,
    /// Longest wait for a request's headers (idle keep-alive included) and,
    /// separately, for its body.
    pub read_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Longest a write to a client may wait without progress before the
    /// connection (and its generation) is dropped.
    pub write_timeout: Duration,
    /// Requests accepted but unfinished before new ones get 429.
    pub max_queue: usize,
    /// Largest request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// After SIGINT/SIGTERM, how long in-flight requests may take to finish.
    pub shutdown_timeout: Duration,
    /// Batching limits of the generation engine.
    pub engine: EngineConfig,
    /// Serve the browser chat page at `/`.
    pub webui: bool,
    /// Also take tool calls written as fenced JSON blocks (see
    /// `ToolParser::lenient`).
    pub lenient_tool_calls: bool,
    /// Where a chat answer's reasoning goes.
    pub reasoning_format: ReasoningFormat,
    /// Reasoning tokens a thinking model may write before its reasoning is
    /// closed for it (`None`: no limit).
    pub reasoning_budget: Option<usize>,
    /// What the model is, for the Ollama endpoints' `details`.
    pub card: ModelCard,
    /// Publish the prefix cache's changes as vLLM's KV events on this
    /// ZeroMQ endpoint (`tcp://*:5557`), under `kv_events_topic`.
    pub kv_events_endpoint: Option<String>,
    pub kv_events_topic: String,
}

/// What a model is, as Ollama's `/api/tags`, `/api/show` and `/api/ps`
/// describe it (read from the file's header before loading).
#[derive(Clone, Debug, Default)]
pub struct ModelCard {
    /// `gguf` or `safetensors`.
    pub format: String,
    /// The architecture (`llama`, `qwen2`, `gemma3` ...).
    pub family: String,
    pub parameters: u64,
    /// The type most of the weights' bytes are in (`Q4_K`, `BF16` ...).
    pub quantization: String,
    /// Bytes on disk.
    pub size: u64,
    pub modified: Option<SystemTime>,
}

impl ModelCard {
    /// `135M`, `1.5B` (Ollama's `parameter_size`).
    pub fn parameter_size(&self) -> String {
        let n = self.parameters as f64;
        if n >= 1e9 {
            format!("{:.1}B", n / 1e9)
        } else if n >= 1e6 {
            format!("{:.0}M", n / 1e6)
        } else {
            format!("{}", self.parameters)
        }
    }
}

/// Where a thinking model's reasoning (`<think>...</think>`) goes, as
/// llama-server's `--reasoning-format` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Split into `reasoning_content` when the chat template writes
    /// `<think>` (Qwen3, DeepSeek-R1); other models are left alone.
    Auto,
    /// Split for every model.
    Deepseek,
    /// Left in `content`.
    None,
}

/// A model ready to serve.
// One value per server lifetime: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum LoadedModel {
    Llm {
        model: Box<dyn PagedLlm>,
        tokenizer: Tokenizer,
        speculation: Option<Speculation>,
        /// What the model recommends where a request sets no sampling
        /// value (in range: `RecommendedSampling::sanitized`).
        sampling: RecommendedSampling,
    },
    Embedding(Embedder),
}

/// Loads the model (runs on a blocking thread after the port is bound).
pub type Loader = Box<dyn FnOnce() -> Result<LoadedModel, String> + Send>;

// One value per server lifetime: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Ready {
    Llm {
        jobs: mpsc::UnboundedSender<worker::Job>,
        tok: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
        /// Compiles output grammars (or why this model cannot have them).
        grammars: Result<Arc<Grammars>, String>,
        capacity: usize,
        engine: Engine,
        sampling: RecommendedSampling,
    },
    Embed {
        jobs: mpsc::UnboundedSender<embed_worker::EmbedJob>,
        embedder: Arc<Embedder>,
    },
}

struct AppState {
    cfg: ServeConfig,
    /// Set when the shutdown deadline passes: open streams end with an
    /// error event.
    cut: tokio::sync::watch::Sender<bool>,
    ready: OnceLock<Ready>,
    load: Arc<worker::Load>,
    prometheus: PrometheusHandle,
    created: u64,
    next_id: AtomicU64,
    /// Responses kept for `previous_response_id`.
    responses: responses::Store,
}

type Shared = Arc<AppState>;

impl AppState {
    /// The loaded model's recommended sampling (none before it is ready).
    fn model_sampling(&self) -> RecommendedSampling {
        match self.ready.get() {
            Some(Ready::Llm { sampling, .. }) => *sampling,
            _ => RecommendedSampling::default(),
        }
    }

    fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready.get().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model is still loading; retry shortly",
                None,
            )
        })
    }

    /// 404 for a request that names a model this server does not serve
    /// (unless any name is accepted).
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if !self.serves(m) && !self.cfg.accept_any_model => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model {m:?} does not exist; this server serves {:?}",
                    self.cfg.served_model_name
                ),
                Some("model_not_found"),
            )),
            _ => Ok(()),
        }
    }

    /// Whether `name` is the model's id or one of its aliases.
    fn serves(&self, name: &str) -> bool {
        name == self.cfg.served_model_name || self.cfg.model_aliases.iter().any(|a| a == name)
    }

    fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:08x}{n:08x}", self.created as u32)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn router(state: Shared) -> Router {
    let limit = state.cfg.max_body_bytes;
    let page = if state.cfg.webui {
        webui::routes()
    } else {
        Router::new()
    };
    page.route("/health", get(admin::health))
        .route("/metrics", get(admin::metrics))
        .route("/v1/models", get(admin::models))
        .route("/v1/models/{id}", get(admin::model))
        .route("/tokenize", post(admin::tokenize))
        .route("/detokenize", post(admin::detokenize))
        .route("/v1/chat/completions", post(generation::chat))
        .route("/v1/chat/completions/render", post(render::chat))
        .route("/v1/completions", post(generation::completions))
        .route("/v1/completions/render", post(render::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed_api))
        .route("/api/embeddings", post(ollama::embeddings_api))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/version", get(ollama::version))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint", None) })
        .method_not_allowed_fallback(|method: Method| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("this endpoint does not take {method} requests"),
                None,
            )
        })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::read_body,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), guard::auth))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::browser,
        ))
        .layer(middleware::from_fn(http_metrics))
        .layer(middleware::from_fn(api_error_shapes))
        .layer(middleware::from_fn(access_log::access_log))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Errors in the shape of the API a path belongs to: every layer and
/// handler writes OpenAI's, which becomes Anthropic's on `/v1/messages`
/// and Ollama's `{"error": "..."}` on `/api/` (so their clients raise
/// their typed errors). Statuses and headers stay.
async fn api_error_shapes(req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let (anthropic, ollama) = (path.starts_with("/v1/messages"), path.starts_with("/api/"));
    let response = next.run(req).await;
    let status = response.status();
    if !(anthropic || ollama) || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let message = match axum::body::to_bytes(body, 1 << 20).await {
        Ok(b) => serde_json::from_slice::<serde_json::Value>(&b)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&b).into_owned()),
        Err(e) => e.to_string(),
    };
    let body = if anthropic {
        anthropic::error_body(status, &message)
    } else {
        serde_json::json!({ "error": message })
    }
    .to_string();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

async fn http_metrics(req: Request, next: Next) -> Response {
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().to_string();
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("ferrum_http_requests_total", "path" => path, "method" => method, "status" => status)
        .increment(1);
    response
}

/// Hands freed heap pages back to the kernel every five seconds.
///
/// Responses are built from many small allocations (a logprobs answer is
/// thousands of JSON values) on whichever thread ran the handler, and
/// glibc keeps what they free in that arena's heap: under
/// `scripts/soak.py`'s 64 clients the resident set stayed tens of MB
/// above what was in use. A trim walks the arenas' free lists, on the
/// blocking pool (its time is logged at debug level); the model thread
/// allocates nothing per token, so it does not wait on it.
fn spawn_memory_upkeep() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let _ = tokio::task::spawn_blocking(|| {
                let start = std::time::Instant::now();
                ferrum_types::release_freed_memory();
                let ms = start.elapsed().as_secs_f64() * 1e3;
                tracing::debug!(ms, "returned freed heap pages");
            })
            .await;
        }
    });
}

/// A server whose port is bound; [`Bound::run`] loads the model and serves.
/// Binding first lets the caller tell the user where to go (the real port
/// when 0 was asked for) before the model loads.
pub struct Bound {
    listener: tokio::net::TcpListener,
    local: SocketAddr,
    state: Shared,
}

/// Binds the listening socket. Fails when the port cannot be bound.
pub async fn bind(mut cfg: ServeConfig) -> Result<Bound, String> {
    let prometheus = vllm_metrics::install(&cfg.served_model_name)?;
    vllm_metrics::spawn_upkeep(prometheus.clone());
    spawn_memory_upkeep();
    if let Some(endpoint) = &cfg.kv_events_endpoint {
        let socket = kv_events::open(endpoint).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        cfg.engine.kv_events = Some(tx);
        tokio::spawn(kv_events::publish(socket, cfg.kv_events_topic.clone(), rx));
        tracing::info!("publishing KV-cache events on {endpoint}");
    }
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local: SocketAddr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let state = Arc::new(AppState {
        cfg,
        cut: tokio::sync::watch::channel(false).0,
        ready: OnceLock::new(),
        load: Arc::new(worker::Load::default()),
        prometheus,
        created: now(),
        next_id: AtomicU64::new(0),
        responses: responses::Store::default(),
    });
    Ok(Bound { listener, local, state })
}

impl Bound {
    /// The address the socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether `/` serves the chat page.
    pub fn has_webui(&self) -> bool {
        self.state.cfg.webui
    }

    /// Loads the model in the background and serves until SIGINT or
    /// SIGTERM. Returns an error when the model cannot be loaded.
    pub async fn run(self, loader: Loader) -> Result<(), String> {
        let Bound { listener, local, state } = self;
        let timeout = state.cfg.shutdown_timeout;
        tracing::info!(
            "listening on http://{local} (loading the model; /health is 503 until it is ready)"
        );
        let loading = {
            let state = state.clone();
            tokio::task::spawn_blocking(move || -> Result<(), String> {
                let ready = match loader()? {
                    LoadedModel::Llm { model, tokenizer, speculation, sampling } => {
                        let capacity = model.kv_capacity();
                        let template = match tokenizer.chat_template() {
                            Some(src) => Some(ChatTemplate::new(src).map_err(|e| e.to_string())?),
                            None => None,
                        };
                        let tok = Arc::new(tokenizer);
                        let vocab = model.config().vocab_size;
                        let started = std::time::Instant::now();
                        let grammars = Grammars::new(tok.clone(), vocab)
                            .map(Arc::new)
                            .map_err(|e| e.to_string());
                        match &grammars {
                            Ok(_) => tracing::info!(
                                "structured output ready (vocabulary indexed in {:.2} s)",
                                started.elapsed().as_secs_f64()
                            ),
                            Err(e) => tracing::warn!("structured output is not available: {e}"),
                        }
                        let cfg = state.cfg.engine.clone();
                        let engine = Engine::start_with(model, tok.clone(), cfg, speculation)
                            .map_err(|e| e.to_string())?;
                        let jobs = worker::spawn(engine.clone(), state.load.clone());
                        Ready::Llm {
                            jobs,
                            tok,
                            template,
                            grammars,
                            capacity,
                            engine,
                            sampling,
                        }
                    }
                    LoadedModel::Embedding(e) => {
                        let embedder = Arc::new(e);
                        let jobs = embed_worker::spawn(embedder.clone())
                            .map_err(|e| format!("cannot start the model thread: {e}"))?;
                        Ready::Embed { jobs, embedder }
                    }
                };
                let _ = state.ready.set(ready);
                tracing::info!("model ready: serving {:?}", state.cfg.served_model_name);
                Ok(())
            })
        };

        // Resolves only when loading fails; a loaded model keeps serving.
        let load_failure = async move {
            match loading.await {
                Ok(Ok(())) => std::future::pending::<String>().await,
                Ok(Err(e)) => format!("cannot load the model: {e}"),
                Err(e) => format!("the model loader crashed: {e}"),
            }
        };
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let limits = listen::ConnLimits {
            header_timeout: state.cfg.read_timeout,
            max_connections: state.cfg.max_connections.max(1),
            write_timeout: state.cfg.write_timeout,
        };
        let shared = state.clone();
        let watcher = state.clone();
        let server = listen::serve(listener, router(state), limits, async move {
            shutdown_signal().await;
            tracing::info!("shutting down: no new connections; finishing in-flight requests");
            let _ = stop_tx.send(true);
        });
        // Past the deadline, open streams get an error event (and a moment
        // to send it) before the process stops with an error.
        let deadline = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
            tokio::time::sleep(timeout).await;
            shared.cut.send_replace(true);
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        };
        let ended = tokio::select! {
            () = server => Ok(()),
            e = load_failure => Err(e),
            () = deadline => Ok(()),
        };
        // The cut streams may close every connection before the deadline's
        // grace ends: the cut itself says how the shutdown went.
        if *watcher.cut.borrow() {
            return Err(format!(
                "in-flight requests did not finish within the shutdown timeout ({timeout:?}); \
                 their streams were ended with an error"
            ));
        }
        ended
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
