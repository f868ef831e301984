//! `/health`, `/metrics`, `/v1/models`, `/tokenize`, `/detokenize`.

use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use ferrum_tokenizer::Tokenizer;
use serde_json::json;

use crate::error::ApiError;
use crate::generation::render_chat;
use crate::guard::{body, body_len, off_reactor};
use crate::protocol::{parse, DetokenizeRequest, Ending, TokenizeRequest};
use crate::{Ready, Shared};

/// 200 once the model is loaded, 503 before.
pub async fn health(State(s): State<Shared>) -> impl IntoResponse {
    match s.ready.get() {
        Some(_) => (StatusCode::OK, Json(json!({"status": "ok"}))),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        ),
    }
}

pub async fn metrics(State(s): State<Shared>) -> impl IntoResponse {
    metrics::gauge!("ferrum_requests_pending").set(s.load.pending.load(Ordering::SeqCst) as f64);
    if let Some(Ready::Llm { engine, .. }) = s.ready.get() {
        let st = engine.stats();
        metrics::gauge!("ferrum_kv_caches_live").set(st.get(&st.live_caches) as f64);
    }
    metrics::gauge!("ferrum_model_ready").set(if s.ready.get().is_some() { 1.0 } else { 0.0 });
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.prometheus.render(),
    )
}

fn max_len(r: &Ready) -> usize {
    match r {
        Ready::Llm { capacity, .. } => *capacity,
        Ready::Embed { embedder, .. } => embedder.max_tokens(),
    }
}

/// The model's OpenAI object under `id` (`max_model_len` is null while
/// loading).
fn model_object(s: &Shared, id: &str) -> serde_json::Value {
    json!({
        "id": id,
        "object": "model",
        "created": s.created,
        "owned_by": "ferrum",
        "max_model_len": s.ready.get().map(max_len),
    })
}

pub async fn models(State(s): State<Shared>) -> Json<serde_json::Value> {
    let ids = std::iter::once(&s.cfg.served_model_name).chain(&s.cfg.model_aliases);
    let data: Vec<_> = ids.map(|id| model_object(&s, id)).collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}` (`models.retrieve`): 404 for another id.
pub async fn model(
    State(s): State<Shared>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    s.check_model(Some(&id))?;
    // Any other name (`--accept-any-model`) gets the model's own id.
    let id = if s.serves(&id) {
        &id
    } else {
        &s.cfg.served_model_name
    };
    Ok(Json(model_object(&s, id)))
}

fn tokenizer(r: &Ready) -> &Tokenizer {
    match r {
        Ready::Llm { tok, .. } => tok,
        Ready::Embed { embedder, .. } => embedder.tokenizer(),
    }
}

pub async fn tokenize(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let (tokens, max_model_len) = off_reactor(body_len(&b), move || tokenize_now(&s, b)).await?;
    let head = format!(
        "{{\"count\":{},\"max_model_len\":{max_model_len},\"tokens\":[",
        tokens.len()
    );
    let body = axum::body::Body::from_stream(tokio_stream::iter(
        std::iter::once(Bytes::from(head))
            .chain(id_chunks(tokens))
            .chain(std::iter::once(Bytes::from_static(b"]}")))
            .map(Ok::<_, std::convert::Infallible>),
    ));
    Ok(([(header::CONTENT_TYPE, "application/json")], body))
}

/// Ids written into `/tokenize`'s JSON as the response is sent, a few
/// thousand at a time: a 16 MB text's 3 million ids never exist as one
/// 20 MB string (nor, as before, as 100 MB of `serde_json::Value`s).
fn id_chunks(ids: Vec<u32>) -> impl Iterator<Item = Bytes> {
    const CHUNK: usize = 8192;
    (0..ids.len().div_ceil(CHUNK)).map(move |c| {
        use std::fmt::Write;
        let mut text = String::with_capacity(CHUNK * 7);
        for (j, id) in ids[c * CHUNK..].iter().take(CHUNK).enumerate() {
            let comma = if c + j > 0 { "," } else { "" };
            // Writing into a String cannot fail.
            let _ = write!(text, "{comma}{id}");
        }
        Bytes::from(text)
    })
}

/// The ids of a `/tokenize` request, and the model's context length.
fn tokenize_now(
    s: &Shared,
    b: Result<Bytes, BytesRejection>,
) -> Result<(Vec<u32>, usize), ApiError> {
    let bytes = body(b)?;
    let req: TokenizeRequest = parse(&bytes)?;
    s.check_model(req.model.as_deref())?;
    let ready = s.ready()?;
    let tok = tokenizer(ready);
    let tokens = match (&req.prompt, &req.messages, ready) {
        // As `/v1/completions` reads a prompt: special-token text is the
        // token, so the count is the one a completion would see.
        (Some(p), None, _) => tok.encode(&p.0, req.add_special_tokens, true),
        (None, Some(m), Ready::Llm { template, .. }) => {
            let text = render_chat(
                template.as_ref(),
                tok,
                m,
                None,
                req.chat_template_kwargs.as_ref(),
                Ending::NewAnswer,
            )?;
            tok.encode(&text, false, true)
        }
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of prompt or messages (messages need a chat model)",
                None,
            ))
        }
    }
    .map_err(ApiError::from_model)?;
    Ok((tokens, max_len(ready)))
}

pub async fn detokenize(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    off_reactor(body_len(&b), move || {
        let req: DetokenizeRequest = parse(&body(b)?)?;
        s.check_model(req.model.as_deref())?;
        let tok = tokenizer(s.ready()?);
        tok.check_ids(&req.tokens)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("tokens")))?;
        Ok(Json(json!({"prompt": tok.decode(&req.tokens, false)})))
    })
    .await
}
