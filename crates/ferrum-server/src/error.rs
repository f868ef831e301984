//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrum_types::FerrumError;
use std::borrow::Cow;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (a name the server knows, or one the
    /// client sent).
    pub param: Option<Cow<'static, str>>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400: the request itself is wrong.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: param.map(Cow::Borrowed),
            code: None,
        }
    }

    /// A 400 that names no field (the message does).
    pub fn bad(message: impl Into<String>) -> Self {
        Self::invalid(message, None)
    }

    pub fn new(status: StatusCode, message: impl Into<String>, code: Option<&'static str>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code,
        }
    }

    /// OpenAI's `type`: client errors are `invalid_request_error`, the rest
    /// are named for their status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// A model-side failure while serving one request. Errors that come from
    /// the request's content (bad ids, too long) stay 400s.
    pub fn from_model(e: FerrumError) -> Self {
        match e {
            FerrumError::ContextOverflow { needed, capacity } => Self {
                code: Some("context_length_exceeded"),
                ..Self::invalid(
                    format!(
                        "this request needs {needed} tokens of context; the model has {capacity}"
                    ),
                    None,
                )
            },
            FerrumError::InvalidArgument(m) => Self::invalid(m, None),
            other => Self::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string(), None),
        }
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Seconds a client told 429 should wait: a queue slot frees when any
/// request ends, which is about this often under load.
const RETRY_AFTER_SECS: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        resp
    }
}
