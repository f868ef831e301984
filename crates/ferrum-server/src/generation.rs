//! `POST /v1/chat/completions` and `POST /v1/completions`, plain and
//! streamed (server-sent events ending with `data: [DONE]`). The answers
//! are built here in OpenAI's shapes; the Anthropic and Ollama endpoints
//! prepare their requests and translate the answers through the same
//! functions ([`prepare_chat`], [`answer_chat`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrum_engine::{FinishReason, ReasoningBudget, Sampled};
use ferrum_structured::reasoning::{Part, ReasoningParser};
use ferrum_structured::tools::{Piece, ToolParser};
use ferrum_structured::Constraint;
use ferrum_tokenizer::chat::{ChatOptions, ChatTemplate, Message};
use ferrum_tokenizer::Tokenizer;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::guard::{body, body_len, off_reactor};
use crate::protocol::{
    parse, reject_unknown, ChatMessage, ChatRequest, CompletionRequest, Ending, GenParams, Prompt,
};
use crate::stream::{openai_sse, stream, Chunk, Item, Tally};
use crate::structured::{self, call_id, tool_calls_json, ToolSetup};
use crate::worker::{ChoiceDone, Event, Job};
use crate::{now, Ready, ReasoningFormat, Shared};

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// The chat template applied to `messages`, ready to tokenize, ending as
/// `ending` asks.
pub fn render_chat(
    template: Option<&ChatTemplate>,
    tok: &Tokenizer,
    messages: &[ChatMessage],
    tools: Option<&Value>,
    kwargs: Option<&serde_json::Map<String, Value>>,
    ending: Ending,
) -> Result<String, ApiError> {
    let Some(template) = template else {
        return Err(ApiError::invalid(
            "this model has no chat template; use /v1/completions",
            Some("messages"),
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let mut conv = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                format!(
                    "messages[{i}].role {:?} is not one of {}",
                    m.role,
                    ROLES.join(", ")
                ),
                Some("messages"),
            ));
        }
        let role = if m.role == "developer" {
            "system"
        } else {
            &m.role
        };
        let mut msg = Message::new(role, m.text()?);
        msg.extra = structured::template_extra(m);
        conv.push(msg);
    }
    let text_of = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
    let special = tok.special();
    let (bos, eos) = (text_of(special.bos), text_of(special.eos));
    let opts = ChatOptions {
        add_generation_prompt: ending == Ending::NewAnswer,
        tools,
        bos_token: &bos,
        eos_token: &eos,
        kwargs,
    };
    let text = template.render(&conv, &opts).map_err(|e| {
        ApiError::invalid(
            format!("cannot apply the chat template: {e}"),
            Some("messages"),
        )
    })?;
    match (ending, conv.last()) {
        (Ending::ContinueLast, Some(last)) => open_last(text, last),
        _ => Ok(text),
    }
}

/// The rendered chat cut just after the last message's text, so the model
/// continues it (the template's end-of-turn marks after it are dropped),
/// as vLLM's `continue_final_message` does. Only an assistant's message is
/// continued; one the template changed beyond finding is an error.
fn open_last(mut text: String, last: &Message) -> Result<String, ApiError> {
    let field = Some("continue_final_message");
    if last.role != "assistant" {
        return Err(ApiError::invalid(
            "continue_final_message needs the last message to be the assistant's",
            field,
        ));
    }
    let content = last.content.trim_end();
    let at = (!content.is_empty())
        .then(|| text.rfind(content))
        .flatten()
        .ok_or_else(|| {
            ApiError::invalid(
                "the last message is empty, or the chat template does not show it as sent, so it cannot be continued",
                field,
            )
        })?;
    text.truncate(at + content.len());
    Ok(text)
}

/// Queues one prompt; the receiver yields its events. Refuses prompts that
/// leave no room to generate (400, naming `field`, where the prompt came
/// from) and a full queue (429).
fn submit(
    s: &Shared,
    prompt: Vec<u32>,
    field: &'static str,
    p: &GenParams,
    default_max: Option<usize>,
    prompt_logprobs: Option<usize>,
    constraint: Option<Constraint>,
) -> Result<mpsc::UnboundedReceiver<Event>, ApiError> {
    let Ready::Llm { jobs, capacity, tok, .. } = s.ready()? else {
        return Err(ApiError::invalid(
            "this server runs an embedding model; use /v1/embeddings",
            Some("model"),
        ));
    };
    let vocab = tok.vocab_size();
    if let Some((id, _)) = p.sampling.logit_bias.iter().find(|b| b.0 as usize >= vocab) {
        return Err(ApiError::invalid(
            format!("logit_bias names token {id}, outside the vocabulary of {vocab} tokens"),
            Some("logit_bias"),
        ));
    }
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
    }
    if prompt.len() >= *capacity {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                format!(
                    "the prompt is {} tokens; this model's context is {capacity} tokens, which leaves no room to generate",
                    prompt.len()
                ),
                Some(field),
            )
        });
    }
    let room = capacity - prompt.len();
    let max_tokens = p.max_tokens.or(default_max).unwrap_or(room).min(room);
    let pending = s.load.pending.fetch_add(1, Ordering::SeqCst);
    if pending >= s.cfg.max_queue {
        s.load.pending.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the server is busy ({pending} requests queued); retry later"),
            Some("queue_full"),
        ));
    }
    metrics::gauge!("ferrum_requests_pending").set((pending + 1) as f64);
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt,
        n: p.n,
        max_tokens,
        sampling: p.sampling.clone(),
        stop: p.stop.clone(),
        ignore_eos: p.ignore_eos,
        prompt_logprobs,
        constraint,
        reasoning_budget: p.reasoning_budget.clone(),
        events: tx,
        tokens: crate::access_log::current(),
    };
    if jobs.send(job).is_err() {
        s.load.pending.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model thread is not running",
            None,
        ));
    }
    Ok(rx)
}

#[derive(Default)]
struct Choice {
    text: String,
    done: Option<ChoiceDone>,
}

/// Waits for every choice of every prompt (`n` per prompt, in order).
async fn collect(
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
    n: usize,
) -> Result<Vec<Choice>, ApiError> {
    let mut out: Vec<Choice> = (0..rxs.len() * n).map(|_| Choice::default()).collect();
    for (p, mut rx) in rxs.into_iter().enumerate() {
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Text { index, text, .. } => out[p * n + index].text.push_str(&text),
                Event::Done { index, done } => out[p * n + index].done = Some(done),
                Event::Failed(m) => {
                    return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m, None))
                }
            }
        }
    }
    Ok(out)
}

/// Counts for choices grouped `n` per prompt.
fn tally(choices: &[Choice], n: usize) -> Tally {
    let done = |c: &Choice| c.done.as_ref().map_or((0, 0), |d| (d.tokens, d.cached));
    Tally {
        completion: choices.iter().map(|c| done(c).0).sum(),
        cached: choices
            .chunks(n.max(1))
            .map(|g| g.iter().map(|c| done(c).1).max().unwrap_or(0))
            .sum(),
    }
}

fn finish_str(f: Option<FinishReason>) -> &'static str {
    match f {
        Some(FinishReason::Stop) => "stop",
        _ => "length",
    }
}

fn piece(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false)
}

/// A log-probability as JSON: always a number. What has none (-inf, or NaN
/// from a broken model) is OpenAI's -9999.0, "very unlikely", where JSON
/// would get null and clients' arithmetic on it fail.
fn logprob(lp: f32) -> Value {
    json!(if lp.is_finite() { lp } else { -9999.0 })
}

/// Chat's `logprobs.content` entries.
fn chat_logprobs(tok: &Tokenizer, lps: &[Sampled], top: usize) -> Value {
    let entry = |id: u32, lp: f32| {
        let t = piece(tok, id);
        json!({"token": t, "logprob": logprob(lp), "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|s| {
            let mut e = entry(s.token, s.logprob);
            e["top_logprobs"] = s
                .top
                .iter()
                .take(top)
                .map(|&(id, lp)| entry(id, lp))
                .collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions' `logprobs` object over `entries`: each token with its
/// score, `None` for an echoed prompt's first token (nothing predicts it;
/// OpenAI reports null there). `offset` is where the text starts.
fn completion_logprobs(
    tok: &Tokenizer,
    entries: &[(u32, Option<&Sampled>)],
    top: usize,
    offset: usize,
) -> Value {
    let mut pos = offset;
    let (mut tokens, mut lp, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for &(id, scored) in entries {
        let t = piece(tok, id);
        offsets.push(pos);
        pos += t.len();
        tokens.push(t);
        lp.push(scored.map_or(Value::Null, |s| logprob(s.logprob)));
        tops.push(scored.map_or(Value::Null, |s| {
            let m: serde_json::Map<String, Value> = s
                .top
                .iter()
                .take(top)
                .map(|&(id, l)| (piece(tok, id), logprob(l)))
                .collect();
            Value::Object(m)
        }));
    }
    json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": tops, "text_offset": offsets})
}

/// The generated tokens' entries for [`completion_logprobs`].
fn generated(d: &ChoiceDone) -> Vec<(u32, Option<&Sampled>)> {
    d.logprobs[..d.tokens.min(d.logprobs.len())]
        .iter()
        .map(|s| (s.token, Some(s)))
        .collect()
}

fn usage(prompt: usize, t: Tally) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": t.completion,
           "total_tokens": prompt + t.completion,
           "prompt_tokens_details": {"cached_tokens": t.cached}})
}

fn fingerprint() -> String {
    format!("ferrum-{}", env!("CARGO_PKG_VERSION"))
}

/// A chat request parsed, checked, rendered and tokenized: the CPU work
/// before it can be queued, done off the async threads (see
/// [`crate::guard::off_reactor`]).
pub struct ChatPrep {
    p: GenParams,
    tok: Arc<Tokenizer>,
    tools: Option<ToolSetup>,
    prompt: Vec<u32>,
    constraint: Option<Constraint>,
    /// The answer's reasoning is split out; `Some(true)` when the prompt
    /// already opened it.
    reasoning: Option<bool>,
}

impl ChatPrep {
    /// The rendered prompt's length in tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt.len()
    }

    /// The rendered prompt's ids.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }
}

/// Whether (and how) a chat answer's reasoning is split out.
fn reasoning(format: ReasoningFormat, template: Option<&str>, prompt: &str) -> Option<bool> {
    let on = match format {
        ReasoningFormat::None => false,
        ReasoningFormat::Deepseek => true,
        ReasoningFormat::Auto => template.is_some_and(|t| t.contains("<think>")),
    };
    on.then(|| ReasoningParser::prompt_opens(prompt))
}

/// Checks, renders and tokenizes a chat request (CPU work: run it through
/// [`off_reactor`]). The other APIs build a [`ChatRequest`] from their own
/// shapes and come through here too.
pub fn prepare_chat(s: &Shared, req: ChatRequest) -> Result<ChatPrep, ApiError> {
    prepare_chat_with(s, req, None)
}

/// [`prepare_chat`] with a reasoning budget for this request (Anthropic's
/// `thinking.budget_tokens`) over the server's `--reasoning-budget`.
pub fn prepare_chat_with(
    s: &Shared,
    req: ChatRequest,
    budget: Option<usize>,
) -> Result<ChatPrep, ApiError> {
    reject_unknown(&req.unknown)?;
    s.check_model(req.gen.model.as_deref())?;
    let p = req.gen.validate(true, &s.model_sampling())?;
    tracing::debug!(
        user = req.gen.user.as_deref(),
        messages = req.messages.len(),
        "chat request"
    );
    let Ready::Llm { tok, template, grammars, .. } = s.ready()? else {
        return Err(ApiError::invalid(
            "this server runs an embedding model; use /v1/embeddings",
            Some("model"),
        ));
    };
    let tok = tok.clone();
    let spec = structured::output_spec(&req.gen)?;
    let tools = structured::tool_setup(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        tok.chat_template(),
        s.cfg.lenient_tool_calls,
    )?;
    // The template sees the tools unless tool_choice is "none".
    let shown = tools.as_ref().and(req.tools.as_ref());
    let text = render_chat(
        template.as_ref(),
        &tok,
        &req.messages,
        shown,
        req.chat_template_kwargs.as_ref(),
        req.ending()?,
    )?;
    let prompt = tok
        .encode(&text, false, true)
        .map_err(ApiError::from_model)?;
    let reasoning = reasoning(s.cfg.reasoning_format, tok.chat_template(), &text);
    // A prompt that opened the reasoning leaves it free: the output format
    // or the tool calls apply from its end.
    let after = (reasoning == Some(true)).then_some(ReasoningParser::CLOSE);
    let constraint = structured::constraint(grammars, spec, tools.as_ref(), after)?;
    // A model that may open its reasoning itself (the prompt neither opened
    // nor closed it, as Qwen3's does by default): the grammar lets that
    // block come first and applies from its end.
    let own_reasoning =
        reasoning == Some(false) && !text.trim_end().ends_with(ReasoningParser::CLOSE);
    let constraint = match (constraint, grammars) {
        (Some(c), Ok(g)) if own_reasoning => {
            Some(g.reasoning_first(c, ReasoningParser::OPEN, ReasoningParser::CLOSE))
        }
        (c, _) => c,
    };
    let mut p = p;
    if let (Some(inside), Some(tokens)) = (reasoning, budget.or(s.cfg.reasoning_budget)) {
        // The tokens that close the reasoning as the model writes it.
        let close = tok
            .encode("\n</think>\n\n", false, true)
            .map_err(ApiError::from_model)?;
        p.reasoning_budget = Some(ReasoningBudget { tokens, close, inside });
    }
    Ok(ChatPrep {
        p,
        tok,
        tools,
        prompt,
        constraint,
        reasoning,
    })
}

pub async fn chat(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let shared = s.clone();
    let prep = off_reactor(body_len(&b), move || {
        prepare_chat(&shared, parse(&body(b)?)?)
    })
    .await?;
    Ok(match answer_chat(&s, prep).await? {
        Answer::Whole(v) => Json(v).into_response(),
        Answer::Stream(items) => openai_sse(items),
    })
}

/// An answer in OpenAI's shapes: the whole object, or its chunks as they
/// come.
pub enum Answer {
    Whole(Value),
    Stream(mpsc::UnboundedReceiver<Item>),
}

/// Generates the answer to a prepared chat request: a `chat.completion`,
/// or (`stream`) its `chat.completion.chunk`s.
pub async fn answer_chat(s: &Shared, prep: ChatPrep) -> Result<Answer, ApiError> {
    let ChatPrep {
        p,
        tok,
        tools,
        prompt,
        constraint,
        reasoning,
    } = prep;
    let prompt_tokens = prompt.len();
    let rx = submit(s, prompt, "messages", &p, None, None, constraint)?;
    let id = s.request_id("chatcmpl");
    let created = now();
    let model = s.cfg.served_model_name.clone();
    if p.stream {
        let mut parsers: Vec<Option<ToolParser>> = (0..p.n)
            .map(|_| tools.as_ref().map(ToolSetup::parser))
            .collect();
        let mut reasoners: Vec<Option<ReasoningParser>> = (0..p.n)
            .map(|_| reasoning.map(ReasoningParser::new))
            .collect();
        return Ok(Answer::Stream(stream(s, vec![rx], p, move |kind| {
            let base = |choices: Value| {
                json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "system_fingerprint": fingerprint(), "choices": choices})
            };
            let delta = |i: usize, delta: Value, lp: Value| {
                base(json!([{"index": i, "delta": delta, "logprobs": lp, "finish_reason": null}]))
            };
            // Tool calls come out whole: a first chunk with the id and the
            // name, then the arguments (as OpenAI streams them, in pieces
            // the SDK joins).
            let pieces = |i: usize, pieces: Vec<Piece>, calls_before: usize, lp: Value| {
                let mut out = Vec::new();
                let mut lp = Some(lp);
                let mut k = calls_before;
                for piece in pieces {
                    match piece {
                        Piece::Content(t) => {
                            let l = lp.take().unwrap_or(Value::Null);
                            out.push(delta(i, json!({"content": t}), l));
                        }
                        Piece::Call(c) => {
                            let first = json!({"tool_calls": [{"index": k, "id": call_id(&id, k), "type": "function",
                                              "function": {"name": c.name, "arguments": ""}}]});
                            out.push(delta(i, first, Value::Null));
                            let args = json!({"tool_calls": [{"index": k, "function": {"arguments": c.arguments}}]});
                            out.push(delta(i, args, Value::Null));
                            k += 1;
                        }
                    }
                }
                out
            };
            // Reasoning goes out as `reasoning_content`, the answer through
            // the tool parser when there is one; `lp` rides on the first.
            let parts_out = |i: usize,
                             parts: Vec<Part>,
                             parser: &mut Option<ToolParser>,
                             mut lp: Option<Value>| {
                let mut out = Vec::new();
                for part in parts {
                    let l = lp.take().unwrap_or(Value::Null);
                    match (part, parser.as_mut()) {
                        (Part::Reasoning(r), _) => {
                            out.push(delta(i, json!({"reasoning_content": r}), l))
                        }
                        (Part::Content(t), Some(parser)) => {
                            let before = parser.calls;
                            let got = parser.push(&t);
                            out.extend(pieces(i, got, before, l));
                        }
                        (Part::Content(t), None) => out.push(delta(i, json!({"content": t}), l)),
                    }
                }
                out
            };
            match kind {
                Chunk::Start(i) => vec![base(
                    json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                )],
                Chunk::Text(i, t, lp) => {
                    let lp = Some(
                        lp.map(|(k, entries)| chat_logprobs(&tok, &entries, k))
                            .unwrap_or(Value::Null),
                    );
                    let parts = match &mut reasoners[i] {
                        Some(r) => r.push(&t),
                        None => vec![Part::Content(t)],
                    };
                    parts_out(i, parts, &mut parsers[i], lp)
                }
                Chunk::End(i, d, top) => {
                    let mut out = Vec::new();
                    let mut finish = finish_str(Some(d.finish));
                    let held = reasoners[i].as_mut().map(ReasoningParser::finish);
                    out.extend(parts_out(
                        i,
                        held.unwrap_or_default(),
                        &mut parsers[i],
                        None,
                    ));
                    if let Some(parser) = &mut parsers[i] {
                        let before = parser.calls;
                        let got = parser.finish();
                        out.extend(pieces(i, got, before, Value::Null));
                        if parser.calls > 0 {
                            finish = "tool_calls";
                        }
                    }
                    // Tokens whose text never went out (the end of
                    // generation) report theirs here.
                    let end = d.tokens.min(d.logprobs.len());
                    let rest = &d.logprobs[d.streamed.min(end)..end];
                    let lp = top
                        .filter(|_| !rest.is_empty())
                        .map(|k| chat_logprobs(&tok, rest, k));
                    out.push(base(json!([{"index": i, "delta": {}, "logprobs": lp,
                                          "finish_reason": finish, "stop_reason": d.stop_string}])));
                    out
                }
                Chunk::Usage(t) => {
                    let mut v = base(json!([]));
                    v["usage"] = usage(prompt_tokens, t);
                    vec![v]
                }
            }
        })));
    }
    let choices = collect(vec![rx], p.n).await?;
    let counts = tally(&choices, p.n);
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = match (p.logprobs, &c.done) {
                (Some(k), Some(d)) => {
                    chat_logprobs(&tok, &d.logprobs[..d.tokens.min(d.logprobs.len())], k)
                }
                _ => Value::Null,
            };
            let (message, finish) = chat_message(
                &c.text,
                tools.as_ref(),
                reasoning,
                &id,
                finish_str(c.done.as_ref().map(|d| d.finish)),
            );
            let stop = c.done.as_ref().and_then(|d| d.stop_string.as_deref());
            json!({"index": i, "message": message, "logprobs": lp, "finish_reason": finish,
                   "stop_reason": stop})
        })
        .collect();
    Ok(Answer::Whole(json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": fingerprint(), "choices": choices, "usage": usage(prompt_tokens, counts),
    })))
}

/// The assistant message for `text`, with its tool calls parsed out when
/// the request offered tools; the finish reason becomes `tool_calls` when
/// there are any.
fn chat_message(
    text: &str,
    tools: Option<&ToolSetup>,
    reasoning: Option<bool>,
    id: &str,
    finish: &'static str,
) -> (Value, &'static str) {
    let (thought, text) = match reasoning {
        Some(inside) => split_reasoning(text, inside),
        None => (None, text.to_string()),
    };
    let (mut message, finish) = answer_message(&text, tools, id, finish);
    if let Some(r) = thought {
        message["reasoning_content"] = json!(r);
    }
    (message, finish)
}

/// A whole answer's reasoning (if any) and the rest.
fn split_reasoning(text: &str, inside: bool) -> (Option<String>, String) {
    let mut r = ReasoningParser::new(inside);
    let mut parts = r.push(text);
    parts.extend(r.finish());
    let (mut thought, mut answer) = (String::new(), String::new());
    for part in parts {
        match part {
            Part::Reasoning(t) => thought.push_str(&t),
            Part::Content(t) => answer.push_str(&t),
        }
    }
    (Some(thought).filter(|t| !t.is_empty()), answer)
}

/// The message of an answer (its reasoning taken out): content, and tool
/// calls when the request offered tools.
fn answer_message(
    text: &str,
    tools: Option<&ToolSetup>,
    id: &str,
    finish: &'static str,
) -> (Value, &'static str) {
    let Some(t) = tools else {
        return (
            json!({"role": "assistant", "content": text, "refusal": null}),
            finish,
        );
    };
    let mut parser = t.parser();
    let mut pieces = parser.push(text);
    pieces.extend(parser.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Content(c) => content.push_str(&c),
            Piece::Call(c) => calls.push(c),
        }
    }
    if calls.is_empty() {
        return (
            json!({"role": "assistant", "content": content, "refusal": null}),
            finish,
        );
    }
    let content = Some(content.trim().to_string()).filter(|c| !c.is_empty());
    (
        json!({"role": "assistant", "content": content, "refusal": null,
               "tool_calls": tool_calls_json(&calls, id, 0)}),
        "tool_calls",
    )
}

/// A completion request parsed, checked and tokenized, off the async
/// threads (see [`crate::guard::off_reactor`]).
pub struct CompletionPrep {
    p: GenParams,
    echo: bool,
    tok: Arc<Tokenizer>,
    constraint: Option<Constraint>,
    prompts: Vec<Vec<u32>>,
}

impl CompletionPrep {
    /// The prompts' length in tokens, all together.
    pub fn prompt_tokens(&self) -> usize {
        self.prompts.iter().map(Vec::len).sum()
    }

    /// Each prompt's ids.
    pub fn prompts(&self) -> &[Vec<u32>] {
        &self.prompts
    }

    /// The text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tok.decode(ids, false)
    }
}

/// Checks and tokenizes a completion request (CPU work: run it through
/// [`off_reactor`]).
pub fn prepare_completion(s: &Shared, req: CompletionRequest) -> Result<CompletionPrep, ApiError> {
    reject_unknown(&req.unknown)?;
    s.check_model(req.gen.model.as_deref())?;
    let p = req.gen.validate(false, &s.model_sampling())?;
    tracing::debug!(user = req.gen.user.as_deref(), "completion request");
    let Ready::Llm { tok, grammars, .. } = s.ready()? else {
        return Err(ApiError::invalid(
            "this server runs an embedding model; use /v1/embeddings",
            Some("model"),
        ));
    };
    let tok = tok.clone();
    let constraint =
        structured::constraint(grammars, structured::output_spec(&req.gen)?, None, None)?;
    // Special-token text in a prompt (`<|im_start|>`) is that token, as in
    // llama-server and vLLM: clients that render a chat template themselves
    // send the prompt the model was trained on, not its spelling in text.
    let prompts: Vec<Vec<u32>> = match req.prompt {
        Prompt::Text(t) => vec![tok.encode(&t, true, true).map_err(ApiError::from_model)?],
        Prompt::Texts(ts) if !ts.is_empty() => ts
            .iter()
            .map(|t| tok.encode(t, true, true))
            .collect::<Result<_, _>>()
            .map_err(ApiError::from_model)?,
        Prompt::Tokens(ids) => vec![ids],
        Prompt::TokenLists(l) if !l.is_empty() => l,
        _ => {
            return Err(ApiError::invalid(
                "prompt must not be an empty list",
                Some("prompt"),
            ))
        }
    };
    for ids in &prompts {
        tok.check_ids(ids)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?;
    }
    if req.echo && p.stream {
        return Err(ApiError::invalid(
            "echo is not supported with stream",
            Some("echo"),
        ));
    }
    Ok(CompletionPrep {
        p,
        echo: req.echo,
        tok,
        constraint,
        prompts,
    })
}

pub async fn completions(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let shared = s.clone();
    let prep = off_reactor(body_len(&b), move || {
        prepare_completion(&shared, parse(&body(b)?)?)
    })
    .await?;
    Ok(match answer_completion(&s, prep).await? {
        Answer::Whole(v) => Json(v).into_response(),
        Answer::Stream(items) => openai_sse(items),
    })
}

/// Generates the answer to a prepared completion request: a
/// `text_completion`, or (`stream`) its chunks.
pub async fn answer_completion(s: &Shared, prep: CompletionPrep) -> Result<Answer, ApiError> {
    let CompletionPrep { p, echo, tok, constraint, prompts } = prep;
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    // Only `echo` needs the prompts' text back.
    let echoes: Vec<String> = if echo {
        prompts.iter().map(|ids| tok.decode(ids, true)).collect()
    } else {
        Vec::new()
    };
    // `echo` with `logprobs` scores each prompt; its first token has none.
    let score_prompt = p.logprobs.filter(|_| echo);
    let firsts: Vec<Option<u32>> = prompts.iter().map(|ids| ids.first().copied()).collect();
    // OpenAI's default for the legacy endpoint is 16 tokens.
    let rxs = prompts
        .into_iter()
        .map(|ids| {
            submit(
                s,
                ids,
                "prompt",
                &p,
                Some(16),
                score_prompt,
                constraint.clone(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let id = s.request_id("cmpl");
    let created = now();
    let model = s.cfg.served_model_name.clone();
    if p.stream {
        return Ok(Answer::Stream(stream(s, rxs, p, move |kind| {
            let base = |choices: Value| {
                json!({"id": id, "object": "text_completion", "created": created, "model": model,
                       "system_fingerprint": fingerprint(), "choices": choices})
            };
            let v = match kind {
                Chunk::Start(_) => return Vec::new(),
                Chunk::Text(i, t, _) => {
                    base(json!([{"index": i, "text": t, "logprobs": null, "finish_reason": null}]))
                }
                Chunk::End(i, d, top) => {
                    let lp = top.map(|k| completion_logprobs(&tok, &generated(&d), k, 0));
                    base(json!([{"index": i, "text": "", "logprobs": lp,
                                 "finish_reason": finish_str(Some(d.finish)), "stop_reason": d.stop_string}]))
                }
                Chunk::Usage(t) => {
                    let mut v = base(json!([]));
                    v["usage"] = usage(prompt_tokens, t);
                    v
                }
            };
            vec![v]
        })));
    }
    let n = p.n;
    let choices = collect(rxs, n).await?;
    let counts = tally(&choices, p.n);
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let prefix = if echo { echoes[i / n].as_str() } else { "" };
            let lp = match (p.logprobs, &c.done) {
                (Some(k), Some(d)) if echo => {
                    // The prompt from offset 0, then what was generated.
                    let first = firsts[i / n].map(|t| (t, None));
                    let scored = d.prompt_logprobs.iter().map(|s| (s.token, Some(s)));
                    let entries: Vec<_> = first.into_iter().chain(scored).chain(generated(d)).collect();
                    completion_logprobs(&tok, &entries, k, 0)
                }
                (Some(k), Some(d)) => completion_logprobs(&tok, &generated(d), k, prefix.len()),
                _ => Value::Null,
            };
            let stop = c.done.as_ref().and_then(|d| d.stop_string.as_deref());
            json!({"index": i, "text": format!("{prefix}{}", c.text), "logprobs": lp,
                   "finish_reason": finish_str(c.done.as_ref().map(|d| d.finish)), "stop_reason": stop})
        })
        .collect();
    Ok(Answer::Whole(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "system_fingerprint": fingerprint(), "choices": choices, "usage": usage(prompt_tokens, counts),
    })))
}
