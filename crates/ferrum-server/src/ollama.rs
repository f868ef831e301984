//! Ollama's API: `/api/chat`, `/api/generate`, `/api/embed` (and the older
//! `/api/embeddings`), `/api/tags`, `/api/show`, `/api/ps`, `/api/version`,
//! for the apps that speak only it (Open WebUI, Continue, the `ollama`
//! Python and JS clients).
//!
//! As with Anthropic's API ([`crate::anthropic`]), requests become their
//! OpenAI equivalents and answers are translated back: a JSON object, or
//! (Ollama's default) newline-delimited JSON objects ending with one whose
//! `done` is true. Errors are `{"error": "..."}` (the server's error layer).
//! There is one model and it is always loaded: `keep_alive` is accepted
//! and has no effect, and pulling or deleting models is not offered here
//! (`ferrum pull` does that).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::embeddings::{embed, prepare_embeddings};
use crate::error::ApiError;
use crate::generation::{answer_chat, answer_completion, prepare_chat, prepare_completion, Answer};
use crate::guard::{body, body_len, off_reactor};
use crate::protocol::{parse, EmbeddingRequest};
use crate::stream::{ndjson, Item};
use crate::{Ready, Shared};

/// The Ollama release whose API this follows, for clients that check
/// `/api/version` before using tools, `think` or `format` schemas.
const OLLAMA_VERSION: &str = "0.12.0";

/// A request's model name, checked against the served one; Ollama's
/// clients add `:latest` to a name without a tag.
fn check_model(s: &Shared, model: &str) -> Result<(), ApiError> {
    s.check_model(Some(model.strip_suffix(":latest").unwrap_or(model)))
}

/// Ollama's name for the served model: tagged `latest` unless it has a tag.
fn tagged(name: &str) -> String {
    if name.contains(':') {
        name.to_string()
    } else {
        format!("{name}:latest")
    }
}

/// Options that change nothing here: memory, threads and devices (the
/// server's own settings decide those) and the context size (the model's
/// KV capacity is fixed at start).
const NO_EFFECT: &[&str] = &[
    "num_ctx",
    "num_keep",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "numa",
    "low_vram",
    "vocab_only",
    "f16_kv",
    "logits_all",
];

/// Sampling options this server does not implement, with the value that
/// means "off": accepted at that value (apps send the defaults), refused
/// otherwise.
const OFF_AT: &[(&str, f64)] = &[("mirostat", 0.0), ("typical_p", 1.0), ("tfs_z", 1.0)];

/// Ollama's `options` as OpenAI request fields on `r`.
fn apply_options(options: Option<&Map<String, Value>>, r: &mut Value) -> Result<(), ApiError> {
    let Some(options) = options else {
        return Ok(());
    };
    for (k, v) in options {
        let field = match k.as_str() {
            "temperature" | "top_p" | "top_k" | "min_p" | "seed" | "presence_penalty"
            | "frequency_penalty" => k.as_str(),
            "repeat_penalty" => "repetition_penalty",
            "stop" => "stop",
            "num_predict" => match v.as_i64() {
                // -1: until the context ends; -2: fill the context.
                Some(-1 | -2) => continue,
                Some(n) if n >= 1 => "max_tokens",
                _ => {
                    return Err(ApiError::bad(format!(
                        "options.num_predict is {v}; it must be -1, -2 or at least 1"
                    )))
                }
            },
            "repeat_last_n" => continue,
            name if NO_EFFECT.contains(&name) => continue,
            name => match OFF_AT.iter().find(|o| o.0 == name) {
                Some((_, off)) if v.as_f64() == Some(*off) => continue,
                Some(_) => {
                    return Err(ApiError::bad(format!(
                        "options.{name} is not supported by this server (only its default, which turns it off)"
                    )))
                }
                None => {
                    tracing::warn!(option = name, "ignoring an unknown Ollama option");
                    continue;
                }
            },
        };
        r[field] = v.clone();
    }
    Ok(())
}

/// `format`: `"json"`, a JSON schema, or nothing.
fn apply_format(format: Option<&Value>, r: &mut Value) -> Result<(), ApiError> {
    match format {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            r["response_format"] = json!({"type": "json_object"})
        }
        Some(schema @ Value::Object(_)) => {
            r["response_format"] =
                json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}})
        }
        Some(other) => {
            return Err(ApiError::bad(format!(
                "format must be \"json\" or a JSON schema object, not {other}"
            )))
        }
    }
    Ok(())
}

/// `think`: true or false, or a level (`low`, `medium`, `high`), which
/// turns thinking on.
fn apply_think(think: Option<&Value>, r: &mut Value) -> Result<(), ApiError> {
    let on = match think {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Bool(b)) => *b,
        Some(Value::String(l)) if ["low", "medium", "high"].contains(&l.as_str()) => true,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "think must be true, false, \"low\", \"medium\" or \"high\", not {other}"
            )))
        }
    };
    r["chat_template_kwargs"] = json!({"enable_thinking": on});
    Ok(())
}

/// Images need a vision model, which this server does not run yet.
fn refuse_images(images: Option<&Value>, at: &str) -> Result<(), ApiError> {
    match images {
        Some(Value::Array(a)) if !a.is_empty() => Err(ApiError::bad(format!(
            "{at}images: this model reads text only"
        ))),
        _ => Ok(()),
    }
}

/// Ollama's chat messages as OpenAI's: tool calls carry their arguments as
/// an object (OpenAI: a JSON string) and tool results name their tool.
fn openai_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        refuse_images(m.get("images"), &format!("messages[{i}]."))?;
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = match m.get("content") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s,
            Some(_) => {
                return Err(ApiError::bad(format!(
                    "messages[{i}].content must be a string"
                )))
            }
        };
        let mut msg = json!({"role": role, "content": content});
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let f = &c["function"];
                    let args = match &f["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => "{}".to_string(),
                        other => other.to_string(),
                    };
                    json!({"id": format!("call_{i}_{k}"), "type": "function",
                           "function": {"name": f["name"], "arguments": args}})
                })
                .collect();
            msg["tool_calls"] = Value::Array(calls);
        }
        if let Some(name) = m.get("tool_name").filter(|n| n.is_string()) {
            msg["name"] = name.clone();
        }
        out.push(msg);
    }
    Ok(out)
}

/// The fields `/api/chat` and `/api/generate` share.
#[derive(Deserialize)]
struct Common {
    model: String,
    format: Option<Value>,
    options: Option<Map<String, Value>>,
    stream: Option<bool>,
    think: Option<Value>,
}

#[derive(Deserialize)]
struct ChatReq {
    #[serde(flatten)]
    common: Common,
    #[serde(default)]
    messages: Vec<Value>,
    tools: Option<Value>,
}

#[derive(Deserialize)]
struct GenerateReq {
    #[serde(flatten)]
    common: Common,
    prompt: Option<String>,
    suffix: Option<String>,
    system: Option<String>,
    template: Option<String>,
    context: Option<Vec<i64>>,
    #[serde(default)]
    raw: bool,
    images: Option<Value>,
}

impl Common {
    /// The OpenAI request fields every generation shares (not `think`:
    /// only a chat template takes it).
    fn request(&self) -> Result<Value, ApiError> {
        let model = &self.model;
        let mut r = json!({
            "model": model.strip_suffix(":latest").unwrap_or(model),
            // Generated as a stream even when the answer is one object
            // ([`respond`]), which then times the prompt's processing.
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        apply_options(self.options.as_ref(), &mut r)?;
        apply_format(self.format.as_ref(), &mut r)?;
        Ok(r)
    }

    /// Ollama streams unless told not to.
    fn streams(&self) -> bool {
        self.stream.unwrap_or(true)
    }
}

fn from_value<T: serde::de::DeserializeOwned>(r: Value) -> Result<T, ApiError> {
    serde_json::from_value(r).map_err(|e| ApiError::bad(format!("invalid request: {e}")))
}

/// An instant as RFC 3339 in UTC (`2024-05-01T12:00:00.000000000Z`), as
/// Ollama writes `created_at`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What an answer's final object reports, and how its pieces are named.
struct Lines {
    model: String,
    /// `/api/chat` (a `message`) or `/api/generate` (`response`).
    chat: bool,
    started: Instant,
    first: Option<Instant>,
    prompt_tokens: usize,
    eval_count: usize,
    done_reason: &'static str,
    /// The name of the tool call being streamed.
    call_name: Value,
}

impl Lines {
    fn new(model: String, chat: bool, prompt_tokens: usize) -> Self {
        Self {
            model,
            chat,
            started: Instant::now(),
            first: None,
            prompt_tokens,
            eval_count: 0,
            done_reason: "stop",
            call_name: Value::Null,
        }
    }

    /// One object: text, thinking and tool calls as `/api/chat` or
    /// `/api/generate` name them.
    fn object(
        &self,
        content: &str,
        thinking: Option<&str>,
        calls: Vec<Value>,
        done: bool,
    ) -> Value {
        let mut v =
            json!({"model": self.model, "created_at": rfc3339(SystemTime::now()), "done": done});
        if self.chat {
            let mut m = json!({"role": "assistant", "content": content});
            if let Some(t) = thinking {
                m["thinking"] = json!(t);
            }
            if !calls.is_empty() {
                m["tool_calls"] = Value::Array(calls);
            }
            v["message"] = m;
        } else {
            v["response"] = json!(content);
            if let Some(t) = thinking {
                v["thinking"] = json!(t);
            }
        }
        v
    }

    /// The counts and durations of the final object.
    fn finish(&self, mut v: Value) -> Value {
        let end = Instant::now();
        let first = self.first.unwrap_or(end);
        v["done_reason"] = json!(self.done_reason);
        v["total_duration"] = json!(nanos(end - self.started));
        v["load_duration"] = json!(0);
        v["prompt_eval_count"] = json!(self.prompt_tokens);
        v["prompt_eval_duration"] = json!(nanos(first - self.started));
        v["eval_count"] = json!(self.eval_count);
        v["eval_duration"] = json!(nanos(end - first));
        v
    }

    fn note_finish(&mut self, choice: &Value, usage: &Value) {
        if let Some(f) = choice["finish_reason"].as_str() {
            self.done_reason = if f == "length" { "length" } else { "stop" };
        }
        if let Some(n) = usage["completion_tokens"].as_u64() {
            self.eval_count = n as usize;
        }
    }

    /// One streamed item as objects (none for an empty piece).
    fn frame(&mut self, item: Item) -> Vec<Value> {
        match item {
            Item::Chunk(v) => {
                self.note_finish(v["choices"].get(0).unwrap_or(&Value::Null), &v["usage"]);
                let Some(choice) = v["choices"].get(0) else {
                    return Vec::new();
                };
                let d = &choice["delta"];
                let content = d["content"]
                    .as_str()
                    .or(choice["text"].as_str())
                    .unwrap_or("");
                let thinking = d["reasoning_content"].as_str();
                // A call streams as its id and name, then its arguments
                // whole (without the name): Ollama sends it at the second.
                let mut calls = Vec::new();
                for c in d["tool_calls"].as_array().into_iter().flatten() {
                    let f = &c["function"];
                    if c.get("id").is_some() {
                        self.call_name = f["name"].clone();
                    }
                    if f["arguments"].as_str().is_some_and(|a| !a.is_empty()) {
                        calls.push(json!({"function": {"name": self.call_name,
                                                       "arguments": arguments(&f["arguments"])}}));
                    }
                }
                if content.is_empty() && thinking.is_none() && calls.is_empty() {
                    return Vec::new();
                }
                self.first.get_or_insert_with(Instant::now);
                vec![self.object(content, thinking, calls, false)]
            }
            Item::End => {
                let v = self.object("", None, Vec::new(), true);
                vec![self.finish(v)]
            }
            Item::Failed(e) => vec![json!({"error": e.message})],
        }
    }
}

/// A tool call's arguments as an object, as Ollama sends them.
fn arguments(a: &Value) -> Value {
    a.as_str()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The answer as NDJSON lines, or (`stream: false`) gathered into one
/// object, which still reports how long the prompt took (until the first
/// piece of the answer).
async fn respond(answer: Answer, mut lines: Lines, stream: bool) -> Result<Response, ApiError> {
    let Answer::Stream(mut items) = answer else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the answer was not streamed",
            None,
        ));
    };
    if stream {
        return Ok(ndjson(items, move |item| lines.frame(item)));
    }
    let (mut content, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
    while let Some(item) = items.recv().await {
        match item {
            Item::Failed(e) => return Err(e),
            Item::End => {
                let thought = (!thinking.is_empty()).then_some(thinking.as_str());
                let v = lines.object(&content, thought, calls, true);
                return Ok(Json(lines.finish(v)).into_response());
            }
            chunk => {
                for o in lines.frame(chunk) {
                    let piece = if lines.chat { &o["message"] } else { &o };
                    let text = if lines.chat { "content" } else { "response" };
                    content += piece[text].as_str().unwrap_or("");
                    thinking += piece["thinking"].as_str().unwrap_or("");
                    calls.extend(
                        piece["tool_calls"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .cloned(),
                    );
                }
            }
        }
    }
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the answer ended before it was complete",
        None,
    ))
}

/// `POST /api/chat`.
pub async fn chat(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let shared = s.clone();
    let (prep, model, stream) = off_reactor(body_len(&b), move || {
        let req: ChatReq = parse(&body(b)?)?;
        check_model(&shared, &req.common.model)?;
        let mut r = req.common.request()?;
        r["messages"] = Value::Array(openai_messages(&req.messages)?);
        if let Some(t) = req.tools {
            r["tools"] = t;
        }
        apply_think(req.common.think.as_ref(), &mut r)?;
        let stream = req.common.streams();
        Ok((
            prepare_chat(&shared, from_value(r)?)?,
            req.common.model,
            stream,
        ))
    })
    .await?;
    let lines = Lines::new(model, true, prep.prompt_tokens());
    respond(answer_chat(&s, prep).await?, lines, stream).await
}

/// `POST /api/generate`: the prompt through the chat template (with
/// `system`), or as it is with `raw`. An empty prompt only asks for the
/// model to be loaded, which it is.
pub async fn generate(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let shared = s.clone();
    let prepared = off_reactor(body_len(&b), move || {
        let req: GenerateReq = parse(&body(b)?)?;
        check_model(&shared, &req.common.model)?;
        refuse_images(req.images.as_ref(), "")?;
        let unsupported = [
            ("suffix", req.suffix.as_ref().is_some_and(|x| !x.is_empty())),
            (
                "template",
                req.template.as_ref().is_some_and(|x| !x.is_empty()),
            ),
            (
                "context",
                req.context.as_ref().is_some_and(|x| !x.is_empty()),
            ),
        ];
        if let Some((name, _)) = unsupported.iter().find(|u| u.1) {
            return Err(ApiError::bad(format!(
                "{name} is not supported by this server; send the conversation to /api/chat instead"
            )));
        }
        let prompt = req.prompt.unwrap_or_default();
        if prompt.is_empty() {
            return Ok(None);
        }
        let mut r = req.common.request()?;
        let stream = req.common.streams();
        if req.raw {
            r["prompt"] = json!(prompt);
            // Ollama generates until the end of the context unless told.
            if r.get("max_tokens").is_none() {
                r["max_tokens"] = json!(i64::MAX);
            }
            let prep = prepare_completion(&shared, from_value(r)?)?;
            return Ok(Some((Err(prep), req.common.model, stream)));
        }
        let mut messages = Vec::new();
        if let Some(system) = req.system.filter(|x| !x.is_empty()) {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        r["messages"] = Value::Array(messages);
        apply_think(req.common.think.as_ref(), &mut r)?;
        Ok(Some((
            Ok(prepare_chat(&shared, from_value(r)?)?),
            req.common.model,
            stream,
        )))
    })
    .await?;
    let Some((prep, model, stream)) = prepared else {
        return Ok(Json(
            json!({"model": s.cfg.served_model_name, "created_at": rfc3339(SystemTime::now()),
                              "response": "", "done": true, "done_reason": "load"}),
        )
        .into_response());
    };
    match prep {
        Ok(chat) => {
            let lines = Lines::new(model, false, chat.prompt_tokens());
            respond(answer_chat(&s, chat).await?, lines, stream).await
        }
        Err(completion) => {
            let lines = Lines::new(model, false, completion.prompt_tokens());
            respond(answer_completion(&s, completion).await?, lines, stream).await
        }
    }
}

#[derive(Deserialize)]
struct EmbedReq {
    model: String,
    /// `/api/embed`: a string or a list of strings.
    input: Option<Value>,
    /// `/api/embeddings` (the older endpoint): one string.
    prompt: Option<String>,
    truncate: Option<bool>,
    dimensions: Option<i64>,
}

/// Embeds `/api/embed`'s `input` or `/api/embeddings`' `prompt`.
async fn embed_vectors(
    s: &Shared,
    b: Result<Bytes, BytesRejection>,
    older: bool,
) -> Result<(Vec<Value>, u64, String, Duration), ApiError> {
    let started = Instant::now();
    let shared = s.clone();
    let (prep, model) = off_reactor(body_len(&b), move || {
        let req: EmbedReq = parse(&body(b)?)?;
        check_model(&shared, &req.model)?;
        let input = match (older, req.input, req.prompt) {
            (false, Some(i), _) => i,
            (true, _, Some(p)) => json!(p),
            (false, None, _) => return Err(ApiError::bad("input is required")),
            (true, _, None) => return Err(ApiError::bad("prompt is required")),
        };
        let r = EmbeddingRequest {
            input,
            model: None,
            encoding_format: None,
            dimensions: req.dimensions,
            user: None,
        };
        let truncate = req.truncate.unwrap_or(true);
        Ok((prepare_embeddings(&shared, r, truncate)?, req.model))
    })
    .await?;
    let v = embed(s, prep).await?;
    let vectors = v["data"]
        .as_array()
        .map(|d| d.iter().map(|e| e["embedding"].clone()).collect())
        .unwrap_or_default();
    let tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    Ok((vectors, tokens, model, started.elapsed()))
}

/// `POST /api/embed`.
pub async fn embed_api(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (vectors, tokens, model, took) = embed_vectors(&s, b, false).await?;
    Ok(Json(
        json!({"model": model, "embeddings": vectors, "total_duration": nanos(took),
                   "load_duration": 0, "prompt_eval_count": tokens}),
    ))
}

/// `POST /api/embeddings`, the older form: one prompt, one vector.
pub async fn embeddings_api(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (mut vectors, ..) = embed_vectors(&s, b, true).await?;
    Ok(Json(
        json!({"embedding": vectors.pop().unwrap_or(Value::Null)}),
    ))
}

/// Ollama's `details` of the served model.
fn details(s: &Shared) -> Value {
    let c = &s.cfg.card;
    json!({"parent_model": "", "format": c.format, "family": c.family, "families": [c.family],
           "parameter_size": c.parameter_size(), "quantization_level": c.quantization})
}

fn modified_at(s: &Shared) -> String {
    rfc3339(s.cfg.card.modified.unwrap_or(UNIX_EPOCH))
}

/// `GET /api/tags`: the one model this server runs.
pub async fn tags(State(s): State<Shared>) -> Json<Value> {
    let name = tagged(&s.cfg.served_model_name);
    Json(
        json!({"models": [{"name": name, "model": name, "modified_at": modified_at(&s),
                            "size": s.cfg.card.size, "details": details(&s)}]}),
    )
}

/// `GET /api/ps`: the model, loaded (once it is).
pub async fn ps(State(s): State<Shared>) -> Json<Value> {
    let Some(ready) = s.ready.get() else {
        return Json(json!({"models": []}));
    };
    let name = tagged(&s.cfg.served_model_name);
    let context = match ready {
        Ready::Llm { capacity, .. } => *capacity,
        Ready::Embed { embedder, .. } => embedder.max_tokens(),
    };
    // Loaded for as long as the server runs.
    let expires = rfc3339(SystemTime::now() + Duration::from_secs(10 * 365 * 86_400));
    Json(
        json!({"models": [{"name": name, "model": name, "size": s.cfg.card.size,
                            "details": details(&s), "expires_at": expires, "size_vram": 0,
                            "context_length": context}]}),
    )
}

#[derive(Deserialize)]
struct ShowReq {
    model: Option<String>,
    /// The older name of `model`.
    name: Option<String>,
}

/// `POST /api/show`: the model's details, chat template and capabilities.
pub async fn show(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let len = body_len(&b);
    let req: ShowReq = off_reactor(len, move || parse(&body(b)?)).await?;
    let model = req
        .model
        .or(req.name)
        .ok_or_else(|| ApiError::bad("model is required"))?;
    check_model(&s, &model)?;
    let c = &s.cfg.card;
    let (template, capabilities, context) = match s.ready()? {
        Ready::Llm { tok, capacity, .. } => {
            let t = tok.chat_template().unwrap_or("");
            let mut caps = vec!["completion"];
            if t.contains("tools") {
                caps.push("tools");
            }
            if t.contains("<think>") {
                caps.push("thinking");
            }
            (t.to_string(), caps, *capacity)
        }
        Ready::Embed { embedder, .. } => (String::new(), vec!["embedding"], embedder.max_tokens()),
    };
    let mut info = Map::new();
    info.insert("general.architecture".into(), json!(c.family));
    info.insert("general.parameter_count".into(), json!(c.parameters));
    info.insert(format!("{}.context_length", c.family), json!(context));
    Ok(Json(
        json!({"modelfile": "", "parameters": "", "template": template, "details": details(&s),
                   "model_info": info, "capabilities": capabilities, "modified_at": modified_at(&s)}),
    ))
}

/// `GET /api/version`.
pub async fn version() -> Json<Value> {
    Json(json!({"version": OLLAMA_VERSION}))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn dates_are_rfc3339() {
        let at = |s: u64| rfc3339(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00.000000000Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20.000000000Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59.000000000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::new(86_400 * 365, 5)),
            "1971-01-01T00:00:00.000000005Z"
        );
    }

    fn with_options(options: Value) -> Result<Value, ApiError> {
        let mut r = json!({});
        apply_options(options.as_object(), &mut r)?;
        Ok(r)
    }

    #[test]
    fn options_become_openai_fields() {
        let r = with_options(json!({"temperature": 0.2, "top_k": 5, "num_predict": 12,
            "repeat_penalty": 1.1, "stop": ["\n"], "seed": 3, "num_ctx": 4096, "mirostat": 0,
            "typical_p": 1.0, "something_new": 1}))
        .unwrap();
        assert_eq!(
            r,
            json!({"temperature": 0.2, "top_k": 5, "max_tokens": 12,
                             "repetition_penalty": 1.1, "stop": ["\n"], "seed": 3})
        );
        assert!(with_options(json!({"num_predict": -1}))
            .unwrap()
            .get("max_tokens")
            .is_none());
        assert!(with_options(json!({"num_predict": 0})).is_err());
        let e = with_options(json!({"mirostat": 2})).unwrap_err();
        assert!(e.message.contains("mirostat"), "{}", e.message);
    }

    #[test]
    fn formats_and_think() {
        let mut r = json!({});
        apply_format(Some(&json!("json")), &mut r).unwrap();
        assert_eq!(r["response_format"]["type"], "json_object");
        apply_format(Some(&json!({"type": "object"})), &mut r).unwrap();
        assert_eq!(
            r["response_format"]["json_schema"]["schema"],
            json!({"type": "object"})
        );
        assert!(apply_format(Some(&json!("yaml")), &mut r).is_err());
        apply_think(Some(&json!("high")), &mut r).unwrap();
        assert_eq!(r["chat_template_kwargs"]["enable_thinking"], true);
        apply_think(Some(&json!(false)), &mut r).unwrap();
        assert_eq!(r["chat_template_kwargs"]["enable_thinking"], false);
        assert!(apply_think(Some(&json!(3)), &mut r).is_err());
    }

    #[test]
    fn tool_calls_round_trip_as_objects() {
        let m = openai_messages(&[
            json!({"role": "assistant", "content": "",
                   "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]}),
            json!({"role": "tool", "content": "3", "tool_name": "add"}),
        ])
        .unwrap();
        assert_eq!(
            m[0]["tool_calls"][0]["function"]["arguments"],
            "{\"a\":1,\"b\":2}"
        );
        assert_eq!(m[1]["name"], "add");
        let images = [json!({"role": "user", "content": "x", "images": ["aGk="]})];
        assert!(openai_messages(&images).is_err());
        assert_eq!(arguments(&json!("{\"a\": 1}")), json!({"a": 1}));
        assert_eq!(arguments(&json!("[1]")), json!({}), "only an object");
    }

    #[test]
    fn a_stream_ends_with_counts() {
        let mut l = Lines::new("m".into(), true, 9);
        let chunk = |delta: Value, finish: Value| {
            Item::Chunk(json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))
        };
        let mut out = Vec::new();
        for item in [
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"reasoning_content": "hm"}), Value::Null),
            chunk(json!({"content": "Hi"}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\": 1}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("length")),
            Item::Chunk(json!({"choices": [], "usage": {"completion_tokens": 4}})),
            Item::End,
        ] {
            out.extend(l.frame(item));
        }
        assert_eq!(out.len(), 4, "{out:?}");
        assert_eq!(out[0]["message"]["thinking"], "hm");
        assert_eq!(out[1]["message"]["content"], "Hi");
        assert_eq!(
            out[2]["message"]["tool_calls"][0],
            json!({"function": {"name": "f", "arguments": {"x": 1}}})
        );
        let last = &out[3];
        assert_eq!(
            (last["done"].as_bool(), last["done_reason"].as_str()),
            (Some(true), Some("length"))
        );
        assert_eq!(
            (
                last["eval_count"].as_u64(),
                last["prompt_eval_count"].as_u64()
            ),
            (Some(4), Some(9))
        );
        assert!(out[..3].iter().all(|v| v["done"] == false));
    }
}
