//! vLLM's `/v1/completions/render` and `/v1/chat/completions/render`: the
//! prompt ids a request would run on, without generating.
//!
//! Routers that place requests by prefix (vllm-router's `cache_aware`,
//! llm-d's precise prefix scorer) tokenize each request on a worker first.
//! They try these endpoints, then fall back to `/tokenize`: without them
//! every routed request costs a 404 and one more round trip. The prompt is
//! prepared exactly as generation prepares it (template, tools, special
//! tokens, `continue_final_message`), so an invalid request is the same 400.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generation::{prepare_chat, prepare_completion};
use crate::guard::{body, body_len, off_reactor};
use crate::protocol::parse;
use crate::Shared;

/// `{"model", "token_ids"}`, as vLLM answers (its request for token-in
/// generation, whose sampling fields are left out here).
pub async fn chat(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let shared = s.clone();
    let prep = off_reactor(body_len(&b), move || {
        prepare_chat(&shared, parse(&body(b)?)?)
    })
    .await?;
    Ok(Json(json!({
        "model": s.cfg.served_model_name,
        "token_ids": prep.prompt(),
    })))
}

/// One `{"model", "prompt", "token_ids"}` per prompt of the request, as
/// vLLM answers (it adds its sampling parameters); `prompt` is the ids'
/// text, special tokens included.
pub async fn completions(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    off_reactor(body_len(&b), move || {
        let prep = prepare_completion(&s, parse(&body(b)?)?)?;
        let model = &s.cfg.served_model_name;
        let prompts: Vec<Value> = prep
            .prompts()
            .iter()
            .map(|ids| json!({"model": model, "prompt": prep.decode(ids), "token_ids": ids}))
            .collect();
        Ok(Json(Value::Array(prompts)))
    })
    .await
}
