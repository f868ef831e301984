//! One log line per request, as a server's operator reads them: method,
//! path, status, tokens and time. The line is written when the response's
//! body ends (a stream's last event, or the client hanging up), so a
//! streamed answer's line carries its whole time and its token counts.
//!
//! Handlers do not pass the counts back: the request's [`Tokens`] is a
//! task-local that `generation::submit` hands to the job, and the worker
//! adds each choice's counts when it finishes.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

tokio::task_local! {
    static TOKENS: Arc<Tokens>;
}

/// The tokens one request read and wrote.
#[derive(Default)]
pub struct Tokens {
    prompt: AtomicUsize,
    completion: AtomicUsize,
}

impl Tokens {
    pub fn add(&self, prompt: usize, completion: usize) {
        self.prompt.fetch_add(prompt, Ordering::Relaxed);
        self.completion.fetch_add(completion, Ordering::Relaxed);
    }
}

/// The counter of the request being handled (`None` outside one).
pub fn current() -> Option<Arc<Tokens>> {
    TOKENS.try_with(Arc::clone).ok()
}

/// The middleware: runs the request with its counter in scope and logs
/// when the response body is done.
pub async fn access_log(req: Request, next: Next) -> Response {
    let mut entry = Entry {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        status: 0,
        start: Instant::now(),
        tokens: Arc::new(Tokens::default()),
    };
    let response = TOKENS.scope(entry.tokens.clone(), next.run(req)).await;
    let (parts, inner) = response.into_parts();
    entry.status = parts.status.as_u16();
    Response::from_parts(parts, Body::new(Logged { inner, _entry: entry }))
}

/// What the line says; written when dropped with the body.
struct Entry {
    method: String,
    path: String,
    status: u16,
    start: Instant,
    tokens: Arc<Tokens>,
}

impl Entry {
    fn line(&self) -> String {
        let (p, c) = (
            self.tokens.prompt.load(Ordering::Relaxed),
            self.tokens.completion.load(Ordering::Relaxed),
        );
        let tokens = match (p, c) {
            (0, 0) => String::new(),
            (p, 0) => format!(" {p} tokens"),
            (p, c) => format!(" {p}+{c} tokens"),
        };
        format!(
            "{} {} {}{tokens} {:.3}s",
            self.method,
            self.path,
            self.status,
            self.start.elapsed().as_secs_f64()
        )
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // Probes come every few seconds; they would bury the requests.
        if matches!(self.path.as_str(), "/health" | "/metrics") {
            tracing::debug!("{}", self.line());
        } else {
            tracing::info!("{}", self.line());
        }
    }
}

/// A response body that carries its log entry to its end.
struct Logged {
    inner: Body,
    _entry: Entry,
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_request_and_its_tokens() {
        let entry = |status, p, c| {
            let tokens = Arc::new(Tokens::default());
            tokens.add(p, c);
            Entry {
                method: "POST".into(),
                path: "/v1/chat/completions".into(),
                status,
                start: Instant::now(),
                tokens,
            }
        };
        let line = entry(200, 12, 34).line();
        assert!(
            line.starts_with("POST /v1/chat/completions 200 12+34 tokens 0.0"),
            "{line}"
        );
        assert!(line.ends_with('s'));
        assert!(entry(200, 7, 0).line().contains(" 200 7 tokens "));
        assert!(entry(404, 0, 0).line().contains(" 404 0.0"));
    }
}
