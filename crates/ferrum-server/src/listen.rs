//! The accept loop: HTTP/1.1 connections with a header-read timeout, a
//! write timeout and a cap on how many are open at once.
//!
//! `axum::serve` has neither, so a client that sends half a request (or
//! opens connections and says nothing) would hold a task and a socket for
//! good. hyper's header-read timer also runs while a kept-alive connection
//! waits for its next request, so the same limit closes idle connections.
//! The body's own deadline is [`crate::guard::read_body`]'s, so a stalled
//! upload is cut too. A client that stops reading is cut after the write
//! timeout ([`StalledWrites`]): its connection slot comes back, and the
//! dropped stream cancels its generation. At the cap, a few reserve slots
//! take connections whose `/health` and `/metrics` are answered at once and
//! whose other requests wait for a regular slot ([`RESERVE`]), so probes
//! and scrapers see a busy server, not a dead one. Lines must end in CRLF
//! ([`StrictLineEnds`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use crate::line_ends::StrictLineEnds;

/// How connections are bounded.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Longest wait for a request's headers, idle keep-alive included.
    pub header_timeout: Duration,
    /// Connections open at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Longest a write may wait without progress (the client not reading).
    pub write_timeout: Duration,
}

/// A connection whose writes fail with `TimedOut` once one has waited
/// `limit` without any progress: a client that stops reading would
/// otherwise hold its connection, its slot and its buffered stream for
/// good. The clock restarts whenever bytes go out.
pub struct StalledWrites<S> {
    inner: S,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> StalledWrites<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Self { inner, limit, stalled: None }
    }

    /// What a write's `poll` gave, with the stall clock applied.
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => {
                let limit = self.limit;
                let timer = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StalledWrites<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StalledWrites<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Connections taken beyond the cap for health checks and metrics (see the
/// module comment).
const RESERVE: usize = 8;

/// Paths a reserve connection serves at once.
fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/metrics")
}

/// `app` for reserve connections: probes at once, every other request
/// after a regular slot comes free (held until its handler answers).
fn reserve_app(app: Router, slots: Arc<Semaphore>) -> Router {
    app.layer(middleware::from_fn(move |req: Request, next: Next| {
        let slots = slots.clone();
        async move {
            let _slot: Option<OwnedSemaphorePermit> = if is_probe(req.uri().path()) {
                None
            } else {
                slots.acquire_owned().await.ok()
            };
            let resp: Response = next.run(req).await;
            resp
        }
    }))
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
    let reserve = Arc::new(Semaphore::new(RESERVE));
    let at_cap = reserve_app(app.clone(), slots.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let accept = async {
        loop {
            // A regular slot when one is free, else a reserve one.
            let (permit, mut reserved) = tokio::select! {
                biased;
                p = slots.clone().acquire_owned() => (p, false),
                p = reserve.clone().acquire_owned() => (p, true),
            };
            let Ok(mut permit) = permit else {
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
            // A slot may have come free while this accept waited on a
            // reserve permit: take it, so the connection counts against the
            // cap (on a reserve permit a silent one would leave that slot to
            // the next client).
            if reserved {
                if let Ok(slot) = slots.clone().try_acquire_owned() {
                    permit = slot;
                    reserved = false;
                }
            }
            let _ = stream.set_nodelay(true);
            let service = TowerToHyperService::new(if reserved { &at_cap } else { &app }.clone());
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_timeout)
                    .serve_connection(
                        TokioIo::new(StalledWrites::new(
                            StrictLineEnds::new(stream),
                            limits.write_timeout,
                        )),
                        service,
                    );
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
    let _ = reserve.acquire_many(RESERVE as u32).await;
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

#[cfg(test)]
mod tests {
    use super::StalledWrites;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Writes to a peer that never reads fail after the limit; a peer
    /// that reads keeps them going, however long the whole takes.
    #[tokio::test(start_paused = true)]
    async fn writes_fail_only_when_the_peer_stops_reading() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut w = StalledWrites::new(a, Duration::from_secs(5));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let mut got = 0;
            while got < 4096 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                got += b.read(&mut buf).await.unwrap();
            }
            b
        });
        // 4 KiB through a 64-byte pipe read 16 bytes a second: far longer
        // than the limit in all, never stalled that long at once.
        w.write_all(&[7u8; 4096]).await.unwrap();
        let _peer = reader.await.unwrap();
        let err = w.write_all(&[7u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    }
}
