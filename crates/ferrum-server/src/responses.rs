//! OpenAI's Responses API: `POST /v1/responses` (plain, or streamed as
//! semantic events), `GET` and `DELETE /v1/responses/{id}` for stored
//! ones. The Vercel AI SDK's default OpenAI provider and openai-python's
//! `client.responses` speak it.
//!
//! As with Anthropic's API ([`crate::anthropic`]), a request becomes the
//! equivalent chat request (its `input` items as messages, after the stored
//! conversation `previous_response_id` names), and the answer is translated
//! into output items: `reasoning`, `message`, `function_call`. Stored
//! conversations live in memory, bounded in number and age ([`Store`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::generation::{answer_chat, prepare_chat, Answer};
use crate::guard::{body, body_len, off_reactor};
use crate::protocol::{function_tool, parse, reject_unknown_except, ChatRequest};
use crate::stream::{named_sse, Item};
use crate::{now, Shared};

/// Stored responses kept at most, and for how long.
const STORE_MAX: usize = 1024;
const STORE_TTL: Duration = Duration::from_secs(3600);

/// A stored response: the conversation it ends (as chat messages, its own
/// answer included) and the response object.
struct Stored {
    at: Instant,
    messages: Vec<Value>,
    response: Value,
}

/// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`
/// (`store`, on by default as in OpenAI's API): at most [`STORE_MAX`],
/// each for [`STORE_TTL`]; the oldest go first.
#[derive(Default)]
pub struct Store {
    map: Mutex<HashMap<String, Stored>>,
}

impl Store {
    fn put(&self, id: String, messages: Vec<Value>, response: Value) {
        let Ok(mut map) = self.map.lock() else { return };
        map.retain(|_, s| s.at.elapsed() < STORE_TTL);
        while map.len() >= STORE_MAX {
            let oldest = map.iter().min_by_key(|(_, s)| s.at).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(id, Stored { at: Instant::now(), messages, response });
    }

    fn get(&self, id: &str) -> Option<(Vec<Value>, Value)> {
        let map = self.map.lock().ok()?;
        let s = map.get(id).filter(|s| s.at.elapsed() < STORE_TTL)?;
        Some((s.messages.clone(), s.response.clone()))
    }

    fn remove(&self, id: &str) -> bool {
        self.map.lock().is_ok_and(|mut m| m.remove(id).is_some())
    }
}

#[derive(Deserialize)]
struct ResponsesRequest {
    model: String,
    input: Value,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    text: Option<Value>,
    max_output_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    #[serde(default)]
    stream: bool,
    store: Option<bool>,
    previous_response_id: Option<String>,
    metadata: Option<Value>,
    /// Every other field: refused by name, except [`NO_EFFECT`]'s.
    #[serde(flatten)]
    unknown: Map<String, Value>,
}

/// Fields that change nothing a local server does: `reasoning` (effort
/// and summaries: the model thinks as its template says), caching and
/// routing hints, the caller's ids.
const NO_EFFECT: &[&str] = &[
    "reasoning",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
    "truncation",
    "include",
];

/// A message's text: a string, or text parts (`input_text`,
/// `output_text`).
fn text_of(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (k, p) in parts.iter().enumerate() {
                match p["type"].as_str().unwrap_or("") {
                    "input_text" | "output_text" | "text" => {
                        out.push_str(p["text"].as_str().unwrap_or(""))
                    }
                    kind => {
                        return Err(ApiError::bad(format!(
                            "{at}.content[{k}]: {kind:?} content is not supported; this model reads text only"
                        )))
                    }
                }
            }
            Ok(out)
        }
        other => Err(ApiError::bad(format!(
            "{at}.content must be a string or a list of parts, not {other}"
        ))),
    }
}

/// `input` (a string, or items) as chat messages appended to `out`.
fn input_messages(input: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => return Err(ApiError::bad("input must be a string or a list of items")),
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        match item["type"].as_str().unwrap_or("message") {
            "message" => {
                let role = item["role"].as_str().unwrap_or("");
                let role = match role {
                    "user" | "assistant" | "system" => role,
                    "developer" => "system",
                    _ => {
                        return Err(ApiError::bad(format!(
                            "{at}.role must be user, assistant, system or developer"
                        )))
                    }
                };
                out.push(json!({"role": role, "content": text_of(&item["content"], &at)?}));
            }
            "function_call" => {
                let call = json!({"id": item["call_id"], "type": "function",
                                  "function": {"name": item["name"], "arguments": item["arguments"]}});
                // Calls of one turn go on one assistant message.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => {
                        out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                    }
                }
            }
            "function_call_output" => {
                let output = text_of(&item["output"], &at)?;
                out.push(
                    json!({"role": "tool", "tool_call_id": item["call_id"], "content": output}),
                );
            }
            // Earlier reasoning is dropped, as thinking models' templates
            // drop it.
            "reasoning" => {}
            kind => {
                return Err(ApiError::bad(format!(
                    "{at}: items of type {kind:?} are not supported"
                )))
            }
        }
    }
    Ok(())
}

/// Function tools as chat tools; OpenAI's hosted tools are not offered.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t["type"] != "function" {
                return Err(ApiError::bad(format!(
                    "tools[{i}]: only function tools are supported (not {})",
                    t["type"]
                )));
            }
            Ok(function_tool(
                &t["name"],
                t.get("description"),
                t.get("parameters"),
            ))
        })
        .collect()
}

/// The request as a chat request, and the conversation's messages.
fn chat_request(
    s: &Shared,
    mut req: ResponsesRequest,
) -> Result<(ChatRequest, Vec<Value>), ApiError> {
    reject_unknown_except(&mut req.unknown, NO_EFFECT)?;
    let mut messages = match &req.previous_response_id {
        Some(id) => s.responses.get(id).map(|p| p.0).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no stored response {id:?} (responses are kept for an hour, the latest {STORE_MAX})"),
                None,
            )
        })?,
        None => Vec::new(),
    };
    // Instructions apply to this request only.
    let mut all = Vec::new();
    if let Some(i) = &req.instructions {
        all.push(json!({"role": "system", "content": i}));
    }
    input_messages(&req.input, &mut messages)?;
    all.extend(messages.iter().cloned());
    let mut r = json!({"model": req.model, "messages": all, "stream": req.stream,
                       "stream_options": {"include_usage": true}});
    for (k, v) in [
        ("max_tokens", req.max_output_tokens.map(Value::from)),
        ("temperature", req.temperature.map(Value::from)),
        ("top_p", req.top_p.map(Value::from)),
        (
            "parallel_tool_calls",
            req.parallel_tool_calls.map(Value::from),
        ),
    ] {
        if let Some(v) = v {
            r[k] = v;
        }
    }
    if let Some(tools) = &req.tools {
        r["tools"] = Value::Array(chat_tools(tools)?);
    }
    if let Some(tc) = &req.tool_choice {
        r["tool_choice"] = match tc {
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                json!({"type": "function", "function": {"name": o.get("name")}})
            }
            other => other.clone(),
        };
    }
    if let Some(format) = req.text.as_ref().and_then(|t| t.get("format")) {
        r["response_format"] = match format["type"].as_str() {
            Some("json_schema") => json!({"type": "json_schema", "json_schema": {
                "name": format.get("name").cloned().unwrap_or(json!("output")),
                "schema": format["schema"]}}),
            Some("json_object") => json!({"type": "json_object"}),
            Some("text") | None => json!({"type": "text"}),
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "text.format.type {other:?} is not supported"
                )))
            }
        };
    }
    let chat =
        serde_json::from_value(r).map_err(|e| ApiError::bad(format!("invalid request: {e}")))?;
    Ok((chat, messages))
}

/// What the response object repeats of its request.
struct Echo {
    id: String,
    model: String,
    created_at: u64,
    request: Value,
}

impl Echo {
    fn response(&self, status: &str, output: Vec<Value>, usage: Value) -> Value {
        let mut r = json!({"id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "model": self.model, "output": output, "usage": usage,
            "error": null, "incomplete_details": null});
        if status == "incomplete" {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        if let Value::Object(req) = &self.request {
            for (k, v) in req {
                r[k] = v.clone();
            }
        }
        r
    }

    fn item_id(&self, kind: &str, k: usize) -> String {
        format!("{kind}_{}_{k}", self.id.trim_start_matches("resp_"))
    }
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [],
           "content": [{"type": "reasoning_text", "text": text}]})
}

fn call_item(id: &str, call_id: &Value, name: &Value, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
           "arguments": arguments, "status": status})
}

/// OpenAI's Responses `usage` for a chat `usage`.
fn usage(u: &Value) -> Value {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let (input, output) = (n("/prompt_tokens"), n("/completion_tokens"));
    json!({"input_tokens": input,
           "input_tokens_details": {"cached_tokens": n("/prompt_tokens_details/cached_tokens"), "cache_write_tokens": 0},
           "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": input + output})
}

fn status(finish: &str) -> &'static str {
    if finish == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

/// The chat message a response's output adds to its conversation.
fn assistant_message(output: &[Value]) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for item in output {
        match item["type"].as_str() {
            Some("message") => text.push_str(item["content"][0]["text"].as_str().unwrap_or("")),
            Some("function_call") => calls.push(json!({"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}})),
            _ => {}
        }
    }
    let mut m = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// A whole chat answer as a response object.
fn whole(echo: &Echo, v: &Value) -> Value {
    let choice = &v["choices"][0];
    let m = &choice["message"];
    let mut output = Vec::new();
    if let Some(r) = m["reasoning_content"].as_str() {
        output.push(reasoning_item(&echo.item_id("rs", output.len()), r));
    }
    let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
    let text = m["content"].as_str().unwrap_or("");
    if !text.is_empty() || calls.is_empty() {
        output.push(message_item(
            &echo.item_id("msg", output.len()),
            text,
            "completed",
        ));
    }
    for c in &calls {
        let id = echo.item_id("fc", output.len());
        let f = &c["function"];
        output.push(call_item(
            &id,
            &c["id"],
            &f["name"],
            f["arguments"].as_str().unwrap_or(""),
            "completed",
        ));
    }
    echo.response(
        status(choice["finish_reason"].as_str().unwrap_or("")),
        output,
        usage(&v["usage"]),
    )
}

/// The item being streamed.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: Value,
        name: Value,
        args: String,
    },
}

/// Turns a chat answer's chunks into the Responses API's events.
struct Events {
    echo: Echo,
    seq: u64,
    started: bool,
    output: Vec<Value>,
    open: Option<Open>,
    finish: &'static str,
    usage: Value,
    /// Where to keep the finished response (`store`), with its conversation.
    store: Option<(Shared, Vec<Value>)>,
}

type Event = (&'static str, Value);

impl Events {
    fn new(echo: Echo, store: Option<(Shared, Vec<Value>)>) -> Self {
        Self {
            echo,
            seq: 0,
            started: false,
            output: Vec::new(),
            open: None,
            finish: "completed",
            usage: Value::Null,
            store,
        }
    }

    fn event(&mut self, kind: &'static str, mut data: Value) -> Event {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        (kind, data)
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        let index = self.output.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                let part = json!({"type": "reasoning_text", "text": text});
                out.push(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id,
                    "output_index": index, "content_index": 0, "text": text}),
                ));
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id,
                    "output_index": index, "content_index": 0, "part": part}),
                ));
                reasoning_item(&id, &text)
            }
            Some(Open::Message { id, text }) => {
                out.push(self.event(
                    "response.output_text.done",
                    json!({"item_id": id,
                    "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                ));
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id,
                    "output_index": index, "content_index": 0, "part": part}),
                ));
                message_item(&id, &text, "completed")
            }
            Some(Open::Call { id, call_id, name, args }) => {
                out.push(self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id,
                    "output_index": index, "arguments": args, "name": name}),
                ));
                call_item(&id, &call_id, &name, &args, "completed")
            }
        };
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
    }

    /// Opens an item (closing the one open), announcing it and its part.
    fn open(&mut self, open: Open, out: &mut Vec<Event>) {
        self.close(out);
        let index = self.output.len();
        let (item, part) = match &open {
            Open::Reasoning { id, .. } => (
                json!({"type": "reasoning", "id": id, "summary": [], "content": []}),
                Some(json!({"type": "reasoning_text", "text": ""})),
            ),
            Open::Message { id, .. } => (
                json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}),
                Some(json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})),
            ),
            Open::Call { id, call_id, name, .. } => {
                (call_item(id, call_id, name, "", "in_progress"), None)
            }
        };
        let id = item["id"].clone();
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        if let Some(part) = part {
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id,
                "output_index": index, "content_index": 0, "part": part}),
            ));
        }
        self.open = Some(open);
    }

    fn frame(&mut self, item: Item) -> Vec<Event> {
        let mut out = Vec::new();
        match item {
            Item::Chunk(v) => {
                if !self.started {
                    self.started = true;
                    let r = self.echo.response("in_progress", Vec::new(), Value::Null);
                    out.push(self.event("response.created", json!({"response": r.clone()})));
                    out.push(self.event("response.in_progress", json!({"response": r})));
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.usage = usage(u);
                }
                let Some(choice) = v["choices"].get(0).cloned() else {
                    return out;
                };
                let d = &choice["delta"];
                let index = self.output.len();
                if let Some(r) = d["reasoning_content"].as_str() {
                    if !matches!(self.open, Some(Open::Reasoning { .. })) {
                        let id = self.echo.item_id("rs", index);
                        self.open(Open::Reasoning { id, text: String::new() }, &mut out);
                    }
                    if let Some(Open::Reasoning { id, text }) = &mut self.open {
                        text.push_str(r);
                        let data = json!({"item_id": id, "output_index": self.output.len(),
                                          "content_index": 0, "delta": r});
                        out.push(self.event("response.reasoning_text.delta", data));
                    }
                }
                if let Some(t) = d["content"].as_str().filter(|t| !t.is_empty()) {
                    if !matches!(self.open, Some(Open::Message { .. })) {
                        let id = self.echo.item_id("msg", self.output.len());
                        self.open(Open::Message { id, text: String::new() }, &mut out);
                    }
                    if let Some(Open::Message { id, text }) = &mut self.open {
                        text.push_str(t);
                        let data = json!({"item_id": id, "output_index": self.output.len(),
                                          "content_index": 0, "delta": t, "logprobs": []});
                        out.push(self.event("response.output_text.delta", data));
                    }
                }
                for c in d["tool_calls"].as_array().cloned().unwrap_or_default() {
                    let f = &c["function"];
                    if let Some(call_id) = c.get("id") {
                        let id = self.echo.item_id("fc", self.output.len());
                        let open = Open::Call {
                            id,
                            call_id: call_id.clone(),
                            name: f["name"].clone(),
                            args: String::new(),
                        };
                        self.open(open, &mut out);
                    }
                    let delta = f["arguments"].as_str().unwrap_or("");
                    if let (false, Some(Open::Call { id, args, .. })) =
                        (delta.is_empty(), &mut self.open)
                    {
                        args.push_str(delta);
                        let data = json!({"item_id": id, "output_index": self.output.len(), "delta": delta});
                        out.push(self.event("response.function_call_arguments.delta", data));
                    }
                }
                if let Some(f) = choice["finish_reason"].as_str() {
                    self.close(&mut out);
                    self.finish = status(f);
                }
            }
            Item::End => {
                self.close(&mut out);
                let r = self
                    .echo
                    .response(self.finish, self.output.clone(), self.usage.clone());
                if let Some((s, mut messages)) = self.store.take() {
                    messages.push(assistant_message(&self.output));
                    s.responses.put(self.echo.id.clone(), messages, r.clone());
                }
                out.push(self.event("response.completed", json!({"response": r})));
            }
            Item::Failed(e) => {
                let data = json!({"code": e.code, "message": e.message, "param": e.param});
                out.push(self.event("error", data));
            }
        }
        out
    }
}

/// `POST /v1/responses`.
pub async fn create(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let shared = s.clone();
    let (prep, messages, request, store, model) = off_reactor(body_len(&b), move || {
        let req: ResponsesRequest = parse(&body(b)?)?;
        let request = json!({"instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id, "temperature": req.temperature,
            "top_p": req.top_p, "tools": req.tools.clone().unwrap_or_default(),
            "tool_choice": req.tool_choice.clone().unwrap_or(json!("auto")),
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
            "text": req.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
            "metadata": req.metadata.clone().unwrap_or(json!({})), "store": req.store.unwrap_or(true)});
        let (store, model) = (req.store.unwrap_or(true), req.model.clone());
        let (chat, messages) = chat_request(&shared, req)?;
        Ok((prepare_chat(&shared, chat)?, messages, request, store, model))
    })
    .await?;
    let answer = answer_chat(&s, prep).await?;
    let id = format!(
        "resp_{:08x}{:08x}",
        now() as u32,
        s.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let echo = Echo { id, model, created_at: now(), request };
    Ok(match answer {
        Answer::Whole(v) => {
            let r = whole(&echo, &v);
            if store {
                let mut messages = messages;
                messages.push(assistant_message(r["output"].as_array().map_or(&[], |o| o)));
                s.responses.put(echo.id.clone(), messages, r.clone());
            }
            Json(r).into_response()
        }
        Answer::Stream(items) => {
            let mut events = Events::new(echo, store.then(|| (s.clone(), messages)));
            named_sse(items, move |item| events.frame(item))
        }
    })
}

fn not_stored(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no stored response {id:?}"),
        None,
    )
}

/// `GET /v1/responses/{id}`.
pub async fn retrieve(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    s.responses
        .get(&id)
        .map(|r| Json(r.1))
        .ok_or_else(|| not_stored(&id))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if s.responses.remove(&id) {
        Ok(Json(
            json!({"id": id, "object": "response", "deleted": true}),
        ))
    } else {
        Err(not_stored(&id))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn input_items_become_chat_messages() {
        let mut out = Vec::new();
        input_messages(
            &json!([
                {"role": "developer", "content": "Be brief."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            ]),
            &mut out,
        )
        .unwrap();
        let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(out[1]["content"], "Weather?");
        let calls = out[2]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "one turn's calls go on one message");
        assert_eq!(calls[1]["function"]["arguments"], "{\"city\":\"Rome\"}");
        assert_eq!(
            (out[3]["tool_call_id"].as_str(), out[3]["content"].as_str()),
            (Some("c1"), Some("18C"))
        );
        let image =
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]);
        assert!(input_messages(&image, &mut Vec::new()).is_err());
    }

    #[test]
    fn the_store_is_bounded() {
        let s = Store::default();
        for i in 0..STORE_MAX + 5 {
            s.put(format!("r{i}"), vec![json!(i)], json!({"id": i}));
        }
        assert!(s.get("r0").is_none(), "the oldest went first");
        assert_eq!(
            s.get(&format!("r{}", STORE_MAX + 4)).unwrap().0,
            vec![json!(STORE_MAX + 4)]
        );
        assert!(s.remove("r10") && !s.remove("r10"));
        assert_eq!(s.map.lock().unwrap().len(), STORE_MAX - 1);
    }

    #[test]
    fn chunks_become_semantic_events() {
        let echo = Echo {
            id: "resp_1".into(),
            model: "m".into(),
            created_at: 0,
            request: json!({}),
        };
        let mut ev = Events::new(echo, None);
        let chunk = |delta: Value, finish: Value| {
            Item::Chunk(json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))
        };
        let events: Vec<Event> = [
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"reasoning_content": "hm"}), Value::Null),
            chunk(json!({"content": "Hi"}), Value::Null),
            chunk(json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]}), Value::Null),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}), Value::Null),
            chunk(json!({}), json!("length")),
            Item::Chunk(json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})),
            Item::End,
        ]
        .into_iter()
        .flat_map(|i| ev.frame(i))
        .collect();
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(names.first(), Some(&"response.created"));
        assert_eq!(names.last(), Some(&"response.completed"));
        for (i, (name, data)) in events.iter().enumerate() {
            assert_eq!(data["type"], *name);
            assert_eq!(data["sequence_number"], i, "numbered in order");
        }
        let added = names
            .iter()
            .filter(|n| **n == "response.output_item.added")
            .count();
        let done = names
            .iter()
            .filter(|n| **n == "response.output_item.done")
            .count();
        assert_eq!((added, done), (3, 3));
        let r = &events.last().unwrap().1["response"];
        let kinds: Vec<&str> = r["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["usage"]["total_tokens"], 7);
        assert_eq!(r["output"][2]["arguments"], "{}");
    }
}
