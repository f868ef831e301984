//! Streamed answers: the model's events for one request become JSON
//! chunks in OpenAI's shapes ([`stream`]), which each API then frames its
//! own way: OpenAI's server-sent events ending in `data: [DONE]`
//! ([`openai_sse`]), named events ([`named_sse`]: Anthropic's, and
//! OpenAI's Responses API), Ollama's
//! newline-delimited JSON ([`ndjson`]).
//!
//! The other APIs translate OpenAI's chunks rather than the model's events
//! so the tool-call and reasoning parsers run in one place. A client that
//! goes away drops the framed body, which drops the item receiver, which
//! ends the task below, which drops the model's receivers, which makes the
//! model thread cancel the request at its next token.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use ferrum_engine::Sampled;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::error::ApiError;
use crate::protocol::GenParams;
use crate::worker::{ChoiceDone, Event};
use crate::Shared;

/// Token counts for `usage`.
#[derive(Clone, Copy, Default)]
pub struct Tally {
    pub completion: usize,
    /// Prompt tokens served from the prefix cache: per prompt, the most any
    /// of its `n` choices found (each prompt is counted once in
    /// `prompt_tokens`, so its cache hit is too).
    pub cached: usize,
}

/// What a stream chunk carries; the endpoint turns it into its JSON.
pub enum Chunk {
    Start(usize),
    /// Text and the log-probabilities of the tokens behind it (top-k, when
    /// asked for).
    Text(usize, String, Option<(usize, Vec<Sampled>)>),
    /// Finish of a choice, with the logprobs to report (top-k) if asked.
    End(usize, ChoiceDone, Option<usize>),
    Usage(Tally),
}

/// One item of a streamed answer, before framing.
pub enum Item {
    /// A chunk in OpenAI's shape (`chat.completion.chunk`,
    /// `text_completion`).
    Chunk(Value),
    /// The answer broke off: the model failed, or the shutdown deadline
    /// passed. Nothing follows.
    Failed(ApiError),
    /// Every choice finished (and usage went out, when asked for).
    End,
}

/// Turns the events of `rxs` (in order; `n` choices each) into items,
/// with `chunk` writing each chunk's JSON.
pub fn stream(
    s: &Shared,
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
    p: GenParams,
    mut chunk: impl FnMut(Chunk) -> Vec<Value> + Send + 'static,
) -> mpsc::UnboundedReceiver<Item> {
    let (tx, out) = mpsc::unbounded_channel::<Item>();
    let mut cut = s.cut.subscribe();
    tokio::spawn(async move {
        let send = |vs: Vec<Value>| vs.into_iter().all(|v| tx.send(Item::Chunk(v)).is_ok());
        let mut counts = Tally::default();
        for (pi, mut rx) in rxs.into_iter().enumerate() {
            let mut started = vec![false; p.n];
            let mut cached = 0;
            loop {
                // The shutdown deadline passed: say so, and end the stream.
                let ev = tokio::select! {
                    ev = rx.recv() => ev,
                    _ = cut.wait_for(|c| *c) => {
                        let _ = tx.send(Item::Failed(ApiError::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the server is shutting down and could not finish this request",
                            None,
                        )));
                        return;
                    }
                };
                let Some(ev) = ev else { break };
                let ok = match ev {
                    Event::Text { index, text, logprobs } => {
                        let i = pi * p.n + index;
                        let mut ok = true;
                        if !started[index] {
                            started[index] = true;
                            ok = send(chunk(Chunk::Start(i)));
                        }
                        let lp = p.logprobs.map(|k| (k, logprobs));
                        ok && send(chunk(Chunk::Text(i, text, lp)))
                    }
                    Event::Done { index, done } => {
                        let i = pi * p.n + index;
                        counts.completion += done.tokens;
                        cached = cached.max(done.cached);
                        let mut ok = true;
                        if !started[index] {
                            started[index] = true;
                            ok = send(chunk(Chunk::Start(i)));
                        }
                        ok && send(chunk(Chunk::End(i, done, p.logprobs)))
                    }
                    Event::Failed(m) => {
                        let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m, None);
                        let _ = tx.send(Item::Failed(e));
                        false
                    }
                };
                if !ok {
                    return;
                }
            }
            counts.cached += cached;
        }
        if p.include_usage && !send(chunk(Chunk::Usage(counts))) {
            return;
        }
        let _ = tx.send(Item::End);
    });
    out
}

/// Frames each item as any number of outputs, on a task of its own: a
/// client that goes away drops the output receiver, which ends the task,
/// which drops `items`.
fn framed<T: Send + 'static>(
    mut items: mpsc::UnboundedReceiver<Item>,
    mut frame: impl FnMut(Item) -> Vec<T> + Send + 'static,
) -> UnboundedReceiverStream<Result<T, Infallible>> {
    let (tx, out) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(item) = items.recv().await {
            if !frame(item).into_iter().all(|v| tx.send(Ok(v)).is_ok()) {
                return;
            }
        }
    });
    UnboundedReceiverStream::new(out)
}

/// Server-sent events, each item framed by `frame` (any number of events
/// per item).
pub fn sse(
    items: mpsc::UnboundedReceiver<Item>,
    frame: impl FnMut(Item) -> Vec<SseEvent> + Send + 'static,
) -> Response {
    Sse::new(framed(items, frame)).into_response()
}

/// Named server-sent events (`event: <name>`, `data: <json>`), as
/// Anthropic's API and OpenAI's Responses API send them.
pub fn named_sse(
    items: mpsc::UnboundedReceiver<Item>,
    mut frame: impl FnMut(Item) -> Vec<(&'static str, Value)> + Send + 'static,
) -> Response {
    sse(items, move |item| {
        let events = frame(item).into_iter();
        events
            .map(|(name, data)| SseEvent::default().event(name).data(data.to_string()))
            .collect()
    })
}

/// OpenAI's framing: each chunk (or error) as a `data:` event, then
/// `data: [DONE]`.
pub fn openai_sse(items: mpsc::UnboundedReceiver<Item>) -> Response {
    sse(items, |item| {
        let data = match item {
            Item::Chunk(v) => v.to_string(),
            Item::Failed(e) => e.body().to_string(),
            Item::End => "[DONE]".to_string(),
        };
        vec![SseEvent::default().data(data)]
    })
}

/// Newline-delimited JSON (`application/x-ndjson`), each item framed as
/// any number of objects by `frame`.
pub fn ndjson(
    items: mpsc::UnboundedReceiver<Item>,
    mut frame: impl FnMut(Item) -> Vec<Value> + Send + 'static,
) -> Response {
    let lines = framed(items, move |item| {
        frame(item)
            .into_iter()
            .map(|v| {
                let mut line = v.to_string();
                line.push('\n');
                Bytes::from(line)
            })
            .collect()
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}
