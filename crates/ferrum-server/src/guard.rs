//! What every request passes before a handler: the body's deadline, the
//! browser-facing checks (Host, Origin and CORS, JSON content type) and the
//! API key.
//!
//! The browser checks exist because a page on any site can make the
//! browser send requests to `127.0.0.1:8000`. A "simple" cross-origin POST
//! (`text/plain`, or a body with no type) skips the CORS preflight, so
//! JSON endpoints accept only `application/json`, which needs one. A page
//! can also rebind its own DNS name to 127.0.0.1 and become same-origin,
//! but its requests then carry that name in `Host`; only IP literals,
//! `localhost` and the names in `--allowed-hosts` are served. Requests
//! whose `Origin` is neither this server nor listed in `--allowed-origins`
//! are refused outright, not just left without CORS headers.

use std::net::IpAddr;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::Shared;

/// Reads the whole body within the read timeout and the size limit, so a
/// client that stalls mid-upload is answered 408 instead of holding the
/// request open. A body whose declared length is over the limit is refused
/// before any of it is read.
pub async fn read_body(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let limit = s.cfg.max_body_bytes;
    let timeout = s.cfg.read_timeout;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {limit} bytes"),
            None,
        )
        .into_response()
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large();
    }
    let bytes = match tokio::time::timeout(timeout, collect(body, limit, declared)).await {
        Ok(Ok(b)) => b,
        Ok(Err(Unread::TooLarge)) => return too_large(),
        // A body that breaks off or is framed wrong (a chunk size `zz`).
        Ok(Err(Unread::Broken(e))) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
                None,
            )
            .into_response()
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    timeout.as_secs_f32()
                ),
                None,
            )
            .into_response()
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Why a body was not read.
enum Unread {
    TooLarge,
    Broken(axum::Error),
}

/// The body in one buffer, each frame copied in as it arrives (sized from
/// `Content-Length` where declared).
///
/// Not `axum::body::to_bytes`: it keeps every frame until the end and
/// then copies them into one buffer, so a 16 MB body was resident twice
/// over while the request was read.
async fn collect(mut body: Body, limit: usize, declared: Option<u64>) -> Result<Bytes, Unread> {
    use http_body_util::BodyExt;
    let size = declared.map_or(0, |n| usize::try_from(n).unwrap_or(limit));
    let mut buf = Vec::with_capacity(size.min(limit));
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(Unread::Broken)?.into_data() else {
            continue; // trailers
        };
        if buf.len() + data.len() > limit {
            return Err(Unread::TooLarge);
        }
        buf.extend_from_slice(&data);
    }
    Ok(Bytes::from(buf))
}

/// The host part of a `Host` header (no port; IPv6 without brackets).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(name, _)| name)
}

/// Whether a `Host` may be served: IP literals and `localhost` always (DNS
/// rebinding needs a name), other names only when listed (`*` lists all).
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host);
    name.parse::<IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(name))
}

/// How an `Origin` relates to this server.
#[derive(Debug, PartialEq, Eq)]
pub enum OriginKind {
    /// This server's own page: no CORS needed.
    Same,
    /// Listed in `--allowed-origins`: answered with CORS headers.
    Allowed,
    Refused,
}

pub fn classify_origin(origin: &str, host: Option<&str>, allowed: &[String]) -> OriginKind {
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    if authority.is_some()
        && authority.map(str::to_ascii_lowercase) == host.map(str::to_ascii_lowercase)
    {
        OriginKind::Same
    } else if allowed.iter().any(|a| a == "*" || a == origin) {
        OriginKind::Allowed
    } else {
        OriginKind::Refused
    }
}

fn text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn cors_headers(resp: &mut Response, origin: &str) {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.append(header::VARY, HeaderValue::from_static("Origin"));
}

/// Host, Origin (with CORS preflight) and content-type checks.
pub async fn browser(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    // RFC 9112 §3.2: an HTTP/1.1 request has exactly one Host header.
    let hosts = headers.get_all(header::HOST).iter().count();
    if hosts > 1 || (hosts == 0 && req.version() == axum::http::Version::HTTP_11) {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("an HTTP/1.1 request needs exactly one Host header (this one has {hosts})"),
            None,
        )
        .into_response();
    }
    let host = text(headers, header::HOST);
    if let Some(h) = host {
        if !host_allowed(h, &s.cfg.allowed_hosts) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "this server does not answer to the host {h:?}; start it with --allowed-hosts {} to allow that name",
                    host_name(h)
                ),
                Some("host_not_allowed"),
            )
            .into_response();
        }
    }
    let origin = text(headers, header::ORIGIN).map(str::to_string);
    let kind = origin
        .as_deref()
        .map(|o| classify_origin(o, host, &s.cfg.allowed_origins));
    if let (Some(o), Some(OriginKind::Refused)) = (&origin, &kind) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "requests from pages at {o} are not allowed; start the server with --allowed-origins {o} to allow them"
            ),
            Some("origin_not_allowed"),
        )
        .into_response();
    }
    let preflight = req.method() == Method::OPTIONS
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if let (Some(o), true) = (&origin, preflight) {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        cors_headers(&mut resp, o);
        let h = resp.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        return resp;
    }
    if req.method() == Method::POST {
        let ct = text(headers, header::CONTENT_TYPE).unwrap_or("");
        let essence = ct.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            let got = if ct.is_empty() { "none" } else { ct };
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("send the body as JSON with Content-Type: application/json (got {got})"),
                Some("unsupported_media_type"),
            )
            .into_response();
        }
    }
    let mut resp = next.run(req).await;
    if let (Some(o), Some(OriginKind::Allowed)) = (&origin, &kind) {
        cors_headers(&mut resp, o);
    }
    resp
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is
/// case-insensitive (RFC 7235).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = text(headers, header::AUTHORIZATION)?.trim();
    let (scheme, token) = v.split_once(char::is_whitespace)?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Whether `given` is one of `keys`, in time that does not depend on where
/// the bytes differ (every key is compared).
pub fn key_matches(keys: &[String], given: &str) -> bool {
    keys.iter().fold(false, |found, k| {
        found | bool::from(k.as_bytes().ct_eq(given.as_bytes()))
    })
}

const X_API_KEY: header::HeaderName = header::HeaderName::from_static("x-api-key");

/// With API keys set: the API (and `/metrics` when asked) needs one.
pub async fn auth(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let protected = path.starts_with("/v1/")
        || path.starts_with("/api/")
        || path == "/tokenize"
        || path == "/detokenize"
        || (path == "/metrics" && s.cfg.metrics_require_key);
    if protected && !s.cfg.api_keys.is_empty() {
        // Anthropic's clients send `x-api-key: <key>` instead.
        let given = bearer(req.headers()).or_else(|| text(req.headers(), X_API_KEY));
        let ok = given.is_some_and(|k| key_matches(&s.cfg.api_keys, k));
        if !ok {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key (send Authorization: Bearer <key>, or x-api-key: <key>)",
                Some("invalid_api_key"),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// The longest a request's CPU work (parsing, chat templates, tokenizing,
/// grammar compiles) may take before the request fails with 503; the
/// templates' own fuel bounds what runs on after that.
const CPU_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A request body this large can leave megabytes of freed memory in the
/// allocator's heaps after its preparation (before `ferrum serve` bounded
/// glibc's retention, four 16 MB tokenizations kept +88 MB resident), so
/// it is handed back to the OS after (a few ms, off the async threads;
/// small requests skip it).
const LARGE_BODY: usize = 1 << 20;

/// The body `read_body` buffered (and already held to the size limit and
/// the read timeout); a rejection here keeps its own status.
pub fn body(
    b: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<axum::body::Bytes, ApiError> {
    b.map_err(|e| ApiError::new(e.status(), e.body_text(), None))
}

/// A request body's size, for [`off_reactor`] (0 where it was refused).
pub fn body_len(b: &Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>) -> usize {
    b.as_ref().map_or(0, |b| b.len())
}

/// Runs a request's CPU work on the blocking pool, not on the async
/// threads, so `/health`, `/metrics` and every other connection keep
/// being served while a 16 MB body is tokenized or a template runs; past
/// [`CPU_LIMIT`] the request fails (the work is left to finish in the
/// background). `body_len` is the request body's size ([`LARGE_BODY`]).
pub async fn off_reactor<T: Send + 'static>(
    body_len: usize,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let work = move || {
        let done = work();
        if body_len >= LARGE_BODY {
            ferrum_types::release_freed_memory();
        }
        done
    };
    match tokio::time::timeout(CPU_LIMIT, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("request preparation failed: {e}"),
            None,
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "preparing this request took over {} s (template, tokenizer or grammar)",
                CPU_LIMIT.as_secs()
            ),
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_by_name_need_listing() {
        let none: Vec<String> = vec![];
        for h in [
            "127.0.0.1:8000",
            "localhost:8000",
            "[::1]:8000",
            "10.1.2.3",
            "LOCALHOST",
        ] {
            assert!(host_allowed(h, &none), "{h}");
        }
        assert!(!host_allowed("evil.example:8000", &none));
        assert!(!host_allowed("localhost.evil.example", &none));
        let listed = vec!["ferrum.lan".to_string()];
        assert!(host_allowed("Ferrum.LAN:8000", &listed));
        assert!(host_allowed("anything.example", &["*".to_string()]));
    }

    #[test]
    fn origins_are_same_listed_or_refused() {
        let allowed = vec!["https://app.example".to_string()];
        let host = Some("127.0.0.1:8000");
        assert_eq!(
            classify_origin("http://127.0.0.1:8000", host, &allowed),
            OriginKind::Same
        );
        assert_eq!(
            classify_origin("https://app.example", host, &allowed),
            OriginKind::Allowed
        );
        for o in [
            "http://127.0.0.1:9000",
            "null",
            "https://app.example.evil",
            "file://",
        ] {
            assert_eq!(
                classify_origin(o, host, &allowed),
                OriginKind::Refused,
                "{o}"
            );
        }
        assert_eq!(
            classify_origin("null", host, &["*".to_string()]),
            OriginKind::Allowed
        );
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}")),
            );
            bearer(&h).map(str::to_string)
        };
        assert_eq!(with("Bearer k1").as_deref(), Some("k1"));
        assert_eq!(with("bearer   k1 ").as_deref(), Some("k1"));
        assert_eq!(with("BEARER k1").as_deref(), Some("k1"));
        assert_eq!(with("Basic k1"), None);
        assert_eq!(with("Bearerk1"), None);
        let keys = vec!["alpha".to_string(), "beta".to_string()];
        assert!(key_matches(&keys, "beta") && !key_matches(&keys, "bet") && !key_matches(&[], "x"));
    }
}
