//! Anthropic's Messages API: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, so tools written for Anthropic's API
//! (the official SDKs, Claude Code-style agents) can use a local model.
//!
//! A request becomes the equivalent OpenAI chat request and goes through
//! the same preparation and generation as `/v1/chat/completions`; the
//! answer (whole, or its stream of chunks) is translated back into
//! Anthropic's content blocks and named events. Errors on these paths get
//! Anthropic's shape ([`error_body`], applied by the server's error layer).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::generation::{answer_chat, prepare_chat, prepare_chat_with, Answer};
use crate::guard::{body, body_len, off_reactor};
use crate::protocol::{function_tool, parse, reject_unknown_except, ChatRequest};
use crate::stream::{named_sse, Item};
use crate::Shared;

#[derive(Deserialize)]
struct MessagesRequest {
    model: String,
    /// Required by Anthropic's API (absent only in `count_tokens`).
    max_tokens: Option<i64>,
    messages: Vec<Value>,
    system: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    #[serde(default)]
    stream: bool,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
    /// `format` (a JSON schema the answer follows) and `effort`.
    output_config: Option<Value>,
    /// Every other field: refused by name, except [`NO_EFFECT`]'s.
    #[serde(flatten)]
    unknown: Map<String, Value>,
}

/// Fields that change nothing a local server does, accepted and unused:
/// caller tracking (`metadata`, `user_profile_id`, `workspace_id`),
/// routing (`service_tier`, `speed`, `inference_geo`), `diagnostics`, and
/// `cache_control` (the prefix cache reuses every shared prefix anyway).
const NO_EFFECT: &[&str] = &[
    "metadata",
    "user_profile_id",
    "workspace_id",
    "service_tier",
    "speed",
    "inference_geo",
    "diagnostics",
    "cache_control",
];

/// The text of a `system` prompt or a `tool_result`'s content: a string,
/// or a list of text blocks.
fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad(format!(
                            "{what}: content blocks of type {} are not supported here (only text)",
                            kind.unwrap_or("(none)")
                        )))
                    }
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        other => Err(ApiError::bad(format!(
            "{what} must be a string or a list of text blocks, not {other}"
        ))),
    }
}

/// Anthropic's messages as OpenAI chat messages: `tool_use` blocks become
/// an assistant's `tool_calls`, each `tool_result` a `tool` message, and
/// earlier turns' thinking is dropped (as the chat templates of thinking
/// models drop it).
fn openai_messages(system: Option<&Value>, messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(sys) = system {
        out.push(json!({"role": "system", "content": text_of(sys, "system")?}));
    }
    // Tool names by call id, for templates that name a tool's result.
    let mut names: Map<String, Value> = Map::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(ApiError::bad(format!(
                "messages.{i}.role must be \"user\" or \"assistant\", not {:?}",
                m.get("role").unwrap_or(&Value::Null)
            )));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(json!({"role": role, "content": s}));
                continue;
            }
            Some(Value::Array(b)) => b,
            _ => {
                return Err(ApiError::bad(format!(
                    "messages.{i}.content must be a string or a list of content blocks"
                )))
            }
        };
        let (mut text, mut calls) = (String::new(), Vec::new());
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("messages.{i}.content.{j}");
            match b.get("type").and_then(Value::as_str).unwrap_or("") {
                "text" => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                "tool_use" if role == "assistant" => {
                    let (Some(id), Some(name)) = (
                        b.get("id").and_then(Value::as_str),
                        b.get("name").and_then(Value::as_str),
                    ) else {
                        return Err(ApiError::bad(format!(
                            "{at}: a tool_use block needs id and name"
                        )));
                    };
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    names.insert(id.to_string(), json!(name));
                    calls.push(json!({"id": id, "type": "function",
                                      "function": {"name": name, "arguments": input.to_string()}}));
                }
                "tool_result" if role == "user" => {
                    let id = b
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            ApiError::bad(format!("{at}: a tool_result block needs tool_use_id"))
                        })?;
                    let content = text_of(b.get("content").unwrap_or(&Value::Null), &at)?;
                    let mut msg = json!({"role": "tool", "tool_call_id": id, "content": content});
                    if let Some(name) = names.get(id) {
                        msg["name"] = name.clone();
                    }
                    out.push(msg);
                }
                "thinking" | "redacted_thinking" if role == "assistant" => {}
                "image" | "document" => {
                    return Err(ApiError::bad(format!(
                        "{at}: {} content is not supported; this model reads text only",
                        b["type"].as_str().unwrap_or("")
                    )))
                }
                kind => {
                    return Err(ApiError::bad(format!(
                        "{at}: content blocks of type {kind:?} are not supported in {role} messages"
                    )))
                }
            }
        }
        if role == "assistant" {
            let mut msg = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        } else if !text.is_empty() {
            out.push(json!({"role": "user", "content": text}));
        }
    }
    Ok(out)
}

/// Anthropic's tool definitions (`name`, `description`, `input_schema`) as
/// OpenAI function tools. Anthropic's server tools (web search, code
/// execution ...) are not offered by a local model.
fn openai_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if let Some(kind) = t.get("type").and_then(Value::as_str) {
                if kind != "custom" {
                    return Err(ApiError::bad(format!(
                        "tools.{i}: the {kind:?} tool is one of Anthropic's own; this server runs only tools the client defines"
                    )));
                }
            }
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad(format!("tools.{i}.name is required")))?;
            let any_object = json!({"type": "object"});
            let schema = t.get("input_schema").unwrap_or(&any_object);
            Ok(function_tool(&json!(name), t.get("description"), Some(schema)))
        })
        .collect()
}

/// `tool_choice` as OpenAI's (auto, required for `any`, a named function,
/// none), and whether parallel calls were turned off.
fn openai_tool_choice(v: &Value) -> Result<(Value, bool), ApiError> {
    let parallel = !v
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let choice = match v.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = v
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad("tool_choice of type \"tool\" needs a name"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(ApiError::bad(
                "tool_choice.type must be one of auto, any, tool, none",
            ))
        }
    };
    Ok((choice, parallel))
}

/// The equivalent OpenAI chat request.
fn chat_request(mut req: MessagesRequest) -> Result<ChatRequest, ApiError> {
    reject_unknown_except(&mut req.unknown, NO_EFFECT)?;
    let mut r = json!({
        "model": req.model,
        "messages": openai_messages(req.system.as_ref(), &req.messages)?,
        "stream": req.stream,
        // Anthropic's stream always ends with the usage.
        "stream_options": {"include_usage": true},
    });
    // A last message of the assistant's is a prefill the answer continues.
    if req
        .messages
        .last()
        .is_some_and(|m| m["role"] == "assistant")
    {
        r["continue_final_message"] = json!(true);
    }
    let fields = [
        ("max_tokens", req.max_tokens.map(Value::from)),
        ("temperature", req.temperature.map(Value::from)),
        ("top_p", req.top_p.map(Value::from)),
        ("top_k", req.top_k.map(Value::from)),
        ("stop", req.stop_sequences.map(Value::from)),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            r[k] = v;
        }
    }
    if let Some(tools) = &req.tools {
        r["tools"] = Value::Array(openai_tools(tools)?);
    }
    if let Some(tc) = &req.tool_choice {
        let (choice, parallel) = openai_tool_choice(tc)?;
        r["tool_choice"] = choice;
        r["parallel_tool_calls"] = json!(parallel);
    }
    // Thinking on or off is the template's `enable_thinking` (Qwen3's
    // name); `adaptive` and `between_tools` leave the template's default.
    // `budget_tokens` is the request's reasoning budget (`messages`).
    if let Some(t) = &req.thinking {
        match t.get("type").and_then(Value::as_str) {
            Some("enabled") => r["chat_template_kwargs"] = json!({"enable_thinking": true}),
            Some("disabled") => r["chat_template_kwargs"] = json!({"enable_thinking": false}),
            Some("adaptive" | "between_tools") => {}
            _ => {
                return Err(ApiError::bad(
                    "thinking.type must be one of enabled, disabled, adaptive, between_tools",
                ))
            }
        }
    }
    // `effort` has no local meaning; `format` is enforced by a grammar.
    if let Some(format) = req.output_config.as_ref().and_then(|o| o.get("format")) {
        match (
            format.get("type").and_then(Value::as_str),
            format.get("schema"),
        ) {
            (Some("json_schema"), Some(schema)) => {
                r["response_format"] = json!({"type": "json_schema",
                                              "json_schema": {"name": "output", "schema": schema}});
            }
            _ => {
                return Err(ApiError::bad(
                    "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                ))
            }
        }
    }
    serde_json::from_value(r).map_err(|e| ApiError::bad(format!("invalid request: {e}")))
}

/// `thinking.budget_tokens` of an enabled `thinking`.
fn thinking_budget(thinking: Option<&Value>) -> Result<Option<usize>, ApiError> {
    let Some(t) = thinking.filter(|t| t["type"] == "enabled") else {
        return Ok(None);
    };
    match t.get("budget_tokens") {
        None | Some(Value::Null) => Ok(None),
        Some(b) => b
            .as_u64()
            .map(|b| Some(b as usize))
            .ok_or_else(|| ApiError::bad("thinking.budget_tokens must be a non-negative integer")),
    }
}

/// `stop_reason` and `stop_sequence` for an OpenAI choice's
/// `finish_reason` and `stop_reason` (vLLM's extension: the stop string
/// that ended it).
fn stop_reason(choice: &Value) -> (&'static str, Value) {
    let stop = choice["stop_reason"].as_str();
    let reason = match (choice["finish_reason"].as_str().unwrap_or(""), stop) {
        ("length", _) => "max_tokens",
        ("tool_calls", _) => "tool_use",
        (_, Some(_)) => "stop_sequence",
        _ => "end_turn",
    };
    (reason, json!(stop))
}

/// `msg_...` for the answer's `chatcmpl-...` id.
fn message_id(chat_id: &str) -> String {
    format!("msg_{}", chat_id.rsplit('-').next().unwrap_or(chat_id))
}

/// Anthropic's `usage` for OpenAI's: `input_tokens` leaves out what the
/// prefix cache served, which is `cache_read_input_tokens`.
fn usage(u: &Value) -> Value {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let cached = n(u.pointer("/prompt_tokens_details/cached_tokens"));
    json!({"input_tokens": n(u.get("prompt_tokens")).saturating_sub(cached),
           "output_tokens": n(u.get("completion_tokens")),
           "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0})
}

/// A tool call's `input`: its arguments as an object (`{}` where the model
/// wrote something else, which a tool grammar prevents).
fn tool_input(arguments: &Value) -> Value {
    arguments
        .as_str()
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// A whole `chat.completion` as an Anthropic `message`.
fn message(v: &Value, model: &str) -> Value {
    let choice = &v["choices"][0];
    let msg = &choice["message"];
    let mut content = Vec::new();
    if let Some(r) = msg.get("reasoning_content").and_then(Value::as_str) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(t) = msg["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": t}));
    }
    for c in msg["tool_calls"].as_array().into_iter().flatten() {
        content.push(
            json!({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                            "input": tool_input(&c["function"]["arguments"])}),
        );
    }
    let (reason, sequence) = stop_reason(choice);
    json!({"id": message_id(v["id"].as_str().unwrap_or("")), "type": "message", "role": "assistant",
           "model": model, "content": content, "stop_reason": reason, "stop_sequence": sequence,
           "usage": usage(&v["usage"])})
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    Tool,
}

/// Turns a chat answer's chunks into Anthropic's events: `message_start`,
/// then each content block's start, deltas and stop, then
/// `message_delta` (stop reason, usage) and `message_stop`.
struct Events {
    model: String,
    input_tokens: usize,
    started: bool,
    /// The open block and its index.
    open: Option<(Block, usize)>,
    blocks: usize,
    /// `stop_reason` and `stop_sequence`.
    stop: (&'static str, Value),
    usage: Value,
}

/// An event's name and data.
type Event = (&'static str, Value);

fn event(kind: &'static str, data: Value) -> Event {
    (kind, data)
}

impl Events {
    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((_, index)) = self.open.take() {
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// Opens a block of `kind` unless one is open (tool calls always open
    /// their own).
    fn open(&mut self, kind: Block, start: Value, out: &mut Vec<Event>) -> usize {
        match self.open {
            Some((k, index)) if k == kind && kind != Block::Tool => index,
            _ => {
                self.close(out);
                let index = self.blocks;
                self.blocks += 1;
                self.open = Some((kind, index));
                out.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": start}),
                ));
                index
            }
        }
    }

    fn delta(index: usize, delta: Value) -> Event {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    fn frame(&mut self, item: Item) -> Vec<Event> {
        let mut out = Vec::new();
        match item {
            Item::Chunk(v) => {
                if !self.started {
                    self.started = true;
                    out.push(event(
                        "message_start",
                        json!({"type": "message_start", "message": {
                        "id": message_id(v["id"].as_str().unwrap_or("")), "type": "message",
                        "role": "assistant", "model": self.model, "content": [],
                        "stop_reason": null, "stop_sequence": null,
                        "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}}),
                    ));
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.usage = usage(u);
                }
                let Some(choice) = v["choices"].get(0) else {
                    return out;
                };
                let d = &choice["delta"];
                if let Some(r) = d["reasoning_content"].as_str() {
                    let start = json!({"type": "thinking", "thinking": "", "signature": ""});
                    let i = self.open(Block::Thinking, start, &mut out);
                    out.push(Self::delta(
                        i,
                        json!({"type": "thinking_delta", "thinking": r}),
                    ));
                }
                if let Some(t) = d["content"].as_str().filter(|t| !t.is_empty()) {
                    let i = self.open(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                    out.push(Self::delta(i, json!({"type": "text_delta", "text": t})));
                }
                for c in d["tool_calls"].as_array().into_iter().flatten() {
                    if let Some(id) = c.get("id") {
                        let start = json!({"type": "tool_use", "id": id,
                                           "name": c["function"]["name"], "input": {}});
                        self.open(Block::Tool, start, &mut out);
                    }
                    let args = c["function"]["arguments"].as_str().unwrap_or("");
                    if let (false, Some((Block::Tool, i))) = (args.is_empty(), self.open) {
                        out.push(Self::delta(
                            i,
                            json!({"type": "input_json_delta", "partial_json": args}),
                        ));
                    }
                }
                if choice["finish_reason"].is_string() {
                    self.close(&mut out);
                    self.stop = stop_reason(choice);
                }
            }
            Item::End => {
                self.close(&mut out);
                let usage = self.usage.clone();
                out.push(event(
                    "message_delta",
                    json!({"type": "message_delta",
                    "delta": {"stop_reason": self.stop.0, "stop_sequence": self.stop.1},
                    "usage": usage}),
                ));
                out.push(event("message_stop", json!({"type": "message_stop"})));
            }
            Item::Failed(e) => out.push(event("error", error_body(e.status, &e.message))),
        }
        out
    }
}

/// `POST /v1/messages`.
pub async fn messages(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let shared = s.clone();
    let prep = off_reactor(body_len(&b), move || {
        let req: MessagesRequest = parse(&body(b)?)?;
        if req.max_tokens.is_none() {
            return Err(ApiError::bad("max_tokens: field required"));
        }
        let budget = thinking_budget(req.thinking.as_ref())?;
        prepare_chat_with(&shared, chat_request(req)?, budget)
    })
    .await?;
    let input_tokens = prep.prompt_tokens();
    let model = s.cfg.served_model_name.clone();
    Ok(match answer_chat(&s, prep).await? {
        Answer::Whole(v) => Json(message(&v, &model)).into_response(),
        Answer::Stream(items) => {
            let mut events = Events {
                model,
                input_tokens,
                started: false,
                open: None,
                blocks: 0,
                stop: ("end_turn", Value::Null),
                usage: json!({"output_tokens": 0}),
            };
            named_sse(items, move |item| events.frame(item))
        }
    })
}

/// `POST /v1/messages/count_tokens`: the prompt's length, as the chat
/// template and tokenizer make it.
pub async fn count_tokens(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let shared = s.clone();
    let prep = off_reactor(body_len(&b), move || {
        prepare_chat(&shared, chat_request(parse(&body(b)?)?)?)
    })
    .await?;
    Ok(Json(json!({"input_tokens": prep.prompt_tokens()})))
}

/// Anthropic's error body for a status and message.
pub fn error_body(status: StatusCode, message: &str) -> Value {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request(body: Value) -> Result<Value, ApiError> {
        let req: MessagesRequest = serde_json::from_value(body).unwrap();
        let chat = chat_request(req)?;
        Ok(json!({
            "messages": chat.messages.iter().map(|m| json!({"role": m.role, "text": m.text().unwrap(),
                "extra": m.extra})).collect::<Vec<_>>(),
            "tools": chat.tools, "tool_choice": chat.tool_choice,
            "parallel": chat.parallel_tool_calls, "kwargs": chat.chat_template_kwargs,
        }))
    }

    #[test]
    fn a_tool_round_trip_becomes_openai_messages() {
        let r = request(json!({
            "model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "Be brief."}],
            "tools": [{"name": "get_weather", "description": "Weather",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
                    {"type": "text", "text": "Thanks"}]}
            ]
        }))
        .unwrap();
        let m = &r["messages"];
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[0]["text"], "Be brief.");
        assert_eq!(m[2]["text"], "Checking.");
        let call = &m[2]["extra"]["tool_calls"][0];
        assert_eq!(call["id"], "toolu_1");
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(m[3]["role"], "tool");
        assert_eq!(m[3]["text"], "18C");
        assert_eq!(m[3]["extra"]["tool_call_id"], "toolu_1");
        assert_eq!(m[3]["extra"]["name"], "get_weather");
        assert_eq!(
            (m[4]["role"].as_str(), m[4]["text"].as_str()),
            (Some("user"), Some("Thanks"))
        );
        assert_eq!(m.as_array().unwrap().len(), 5);
        assert_eq!(
            r["tools"][0]["function"]["parameters"]["properties"]["city"]["type"],
            "string"
        );
        assert_eq!(r["tool_choice"], "required");
        assert_eq!(r["parallel"], false);
        assert_eq!(r["kwargs"]["enable_thinking"], true);
    }

    #[test]
    fn what_a_local_model_cannot_do_is_refused_by_name() {
        let base = |extra: Value| {
            let mut b = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            request(b).err().map(|e| e.message)
        };
        let image = json!({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]});
        assert!(base(image)
            .unwrap()
            .contains("image content is not supported"));
        let server_tool = json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert!(base(server_tool).unwrap().contains("web_search_20250305"));
        assert!(base(json!({"mcp_servers": []}))
            .unwrap()
            .contains("mcp_servers"));
        let role = json!({"messages": [{"role": "system", "content": "x"}]});
        assert!(base(role).unwrap().contains("messages.0.role"));
        assert!(base(json!({"tool_choice": {"type": "sometimes"}})).is_some());
        assert!(base(json!({"metadata": {"user_id": "u"}})).is_none());
    }

    #[test]
    fn answers_become_content_blocks() {
        let v = json!({"id": "chatcmpl-00ab", "choices": [{"finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me check.", "reasoning_content": "The user wants weather.",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 8}}});
        let m = message(&v, "local");
        assert_eq!(m["id"], "msg_00ab");
        assert_eq!(m["stop_reason"], "tool_use");
        let kinds: Vec<&str> = m["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use"]);
        assert_eq!(m["content"][2]["input"], json!({"city": "Paris"}));
        assert_eq!(
            m["usage"],
            json!({"input_tokens": 22, "output_tokens": 12,
                                      "cache_read_input_tokens": 8, "cache_creation_input_tokens": 0})
        );
        let stopped = |finish: &str, stop: Value| {
            stop_reason(&json!({"finish_reason": finish, "stop_reason": stop}))
        };
        assert_eq!(
            stopped("stop", json!("\n\n")),
            ("stop_sequence", json!("\n\n"))
        );
        assert_eq!(stopped("stop", Value::Null), ("end_turn", Value::Null));
        assert_eq!(stopped("length", Value::Null).0, "max_tokens");
    }

    #[test]
    fn chunks_become_named_events_with_balanced_blocks() {
        let mut ev = Events {
            model: "local".into(),
            input_tokens: 7,
            started: false,
            open: None,
            blocks: 0,
            stop: ("end_turn", Value::Null),
            usage: json!({"output_tokens": 0}),
        };
        let chunk = |delta: Value, finish: Value| {
            Item::Chunk(
                json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
            )
        };
        let items = vec![
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"reasoning_content": "thinking"}), Value::Null),
            chunk(json!({"content": "Hi"}), Value::Null),
            chunk(json!({"content": " there"}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "f", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": 1}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
            Item::Chunk(
                json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}),
            ),
            Item::End,
        ];
        let events: Vec<Event> = items.into_iter().flat_map(|i| ev.frame(i)).collect();
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (name, data) in &events {
            assert_eq!(data["type"], *name, "an event's name is its data's type");
        }
        let kinds: Vec<&str> = events
            .iter()
            .filter(|e| e.0 == "content_block_start")
            .map(|e| e.1["content_block"]["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use"]);
        let last = &events[events.len() - 2].1;
        assert_eq!(last["delta"]["stop_reason"], "tool_use");
        assert_eq!(last["usage"]["output_tokens"], 5);
        assert_eq!(last["usage"]["input_tokens"], 7);
        assert_eq!(
            events[9].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"a\": 1}"})
        );
    }
}
