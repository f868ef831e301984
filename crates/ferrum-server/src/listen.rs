//! The accept loop: HTTP/1.1 connections with a header-read timeout and a
//! cap on how many are open at once.
//!
//! `axum::serve` has neither, so a client that sends half a request (or
//! opens connections and says nothing) would hold a task and a socket for
//! good. hyper's header-read timer also runs while a kept-alive connection
//! waits for its next request, so the same limit closes idle connections.
//! The body's own deadline is [`crate::guard::read_body`]'s, so a stalled
//! upload is cut too.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// How connections are bounded.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Longest wait for a request's headers, idle keep-alive included.
    pub header_timeout: Duration,
    /// Connections open at once; more wait in the kernel's backlog.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open
/// connections finish their current request and returns when all have
/// closed (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let accept = async {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off, go on.
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let service = TowerToHyperService::new(app.clone());
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                // (The guard `wait_for` returns must not live across an await.)
                let stopping = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                tokio::select! {
                    r = conn.as_mut() => log_conn_end(r),
                    () = stopping => {
                        conn.as_mut().graceful_shutdown();
                        log_conn_end(conn.await);
                    }
                }
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = shutdown => {}
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a slot until it closes.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

fn log_conn_end(r: Result<(), hyper::Error>) {
    if let Err(e) = r {
        if e.is_timeout() {
            tracing::debug!("closed a connection that sent no request in time");
        } else {
            tracing::debug!("connection ended: {e}");
        }
    }
}
