//! `POST /v1/embeddings`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use base64::Engine;
use ferrum_engine::Prepared;
use serde_json::json;
use tokio::sync::oneshot;

use crate::embed_worker::EmbedJob;
use crate::error::ApiError;
use crate::guard::{body, body_len, off_reactor};
use crate::protocol::{embedding_inputs, parse, EmbeddingRequest};
use crate::{Ready, Shared};

/// What an embedding request needs once parsed and tokenized (off the
/// async threads, see [`crate::guard::off_reactor`]).
pub struct EmbedPrep {
    base64: bool,
    prepared: Vec<Prepared>,
}

/// Checks and tokenizes an embedding request (CPU work: run it through
/// [`off_reactor`]); `truncate`: cut inputs longer than the model takes,
/// else refuse them.
pub fn prepare_embeddings(
    s: &Shared,
    req: EmbeddingRequest,
    truncate: bool,
) -> Result<EmbedPrep, ApiError> {
    s.check_model(req.model.as_deref())?;
    tracing::debug!(user = req.user.as_deref(), "embedding request");
    let Ready::Embed { embedder, .. } = s.ready()? else {
        return Err(ApiError::invalid(
            "this server runs a generative model; start `ferrum serve` with an embedding model (e.g. --model minilm) for /v1/embeddings",
            Some("model"),
        ));
    };
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("encoding_format {other:?} is not supported (use \"float\" or \"base64\")"),
                Some("encoding_format"),
            ))
        }
    };
    if let Some(d) = req.dimensions {
        if d != embedder.dim() as i64 {
            return Err(ApiError::invalid(
                format!(
                    "this model's vectors have {} dimensions and cannot be shortened to {d}",
                    embedder.dim()
                ),
                Some("dimensions"),
            ));
        }
    }
    let inputs = embedding_inputs(&req.input)?;
    let prepared = embedder
        .prepare(&inputs, truncate)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("input")))?;
    Ok(EmbedPrep { base64, prepared })
}

pub async fn embeddings(
    State(s): State<Shared>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let shared = s.clone();
    let prep = off_reactor(body_len(&b), move || {
        prepare_embeddings(&shared, parse(&body(b)?)?, true)
    })
    .await?;
    Ok(Json(embed(&s, prep).await?))
}

/// Embeds a prepared request: OpenAI's `list` of `embedding` objects.
pub async fn embed(s: &Shared, prep: EmbedPrep) -> Result<serde_json::Value, ApiError> {
    let EmbedPrep { base64, prepared } = prep;
    let Ready::Embed { jobs, .. } = s.ready()? else {
        return Err(ApiError::invalid(
            "this server runs a generative model",
            Some("model"),
        ));
    };
    let (reply, rx) = oneshot::channel();
    jobs.send(EmbedJob { inputs: prepared, reply })
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the embedding model is not running",
                None,
            )
        })?;
    let vectors = rx
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the embedding model stopped",
                None,
            )
        })?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), None))?;
    let prompt_tokens: usize = vectors.iter().map(|v| v.tokens).sum();
    let data: Vec<serde_json::Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v.vector)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    metrics::counter!("ferrum_embedding_inputs_total").increment(data.len() as u64);
    metrics::counter!("ferrum_prompt_tokens_total").increment(prompt_tokens as u64);
    if let Some(t) = crate::access_log::current() {
        t.add(prompt_tokens, 0);
    }
    Ok(json!({
        "object": "list",
        "data": data,
        "model": s.cfg.served_model_name,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }))
}
