//! The browser chat page at `/`: static files compiled into the binary (no
//! CDN, no build step; it works on an air-gapped machine). The page talks
//! only to this server's own `/health`, `/v1/models` and
//! `/v1/chat/completions`. Three libraries come with it, unchanged from
//! their npm packages, with their licences at `/webui/vendor/THIRD-PARTY.txt`:
//! highlight.js (code), KaTeX (math, as MathML: no fonts or styles) and
//! DOMPurify (which cleans what those two return).
//!
//! Model output is untrusted, so the page builds its DOM from text nodes;
//! the only HTML it takes is the highlighter's and KaTeX's, through
//! DOMPurify's allow-list. The Content-Security-Policy below is the second
//! wall: no inline script or style attribute, no script or connection to
//! another origin, so even injected markup could neither run nor send
//! anything away.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../webui/index.html");
const SCRIPT: &str = include_str!("../webui/app.js");
const STYLE: &str = include_str!("../webui/style.css");
const ICON: &str = include_str!("../webui/icon.svg");
const HIGHLIGHT: &str = include_str!("../webui/vendor/highlight.min.js");
const KATEX: &str = include_str!("../webui/vendor/katex.min.js");
const PURIFY: &str = include_str!("../webui/vendor/purify.min.js");
const LICENCES: &str = include_str!("../webui/vendor/THIRD-PARTY.txt");
const JS: &str = "text/javascript; charset=utf-8";

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The page's routes, to be merged into the API router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route("/webui/app.js", get(|| async { asset(SCRIPT, JS) }))
        .route(
            "/webui/vendor/highlight.min.js",
            get(|| async { asset(HIGHLIGHT, JS) }),
        )
        .route(
            "/webui/vendor/katex.min.js",
            get(|| async { asset(KATEX, JS) }),
        )
        .route(
            "/webui/vendor/purify.min.js",
            get(|| async { asset(PURIFY, JS) }),
        )
        .route(
            "/webui/vendor/THIRD-PARTY.txt",
            get(|| async { asset(LICENCES, "text/plain; charset=utf-8") }),
        )
        .route(
            "/webui/style.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route(
            "/favicon.svg",
            get(|| async { asset(ICON, "image/svg+xml") }),
        )
}

fn asset(body: &'static str, content_type: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            // Small files that change with the binary: revalidate each load.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}
