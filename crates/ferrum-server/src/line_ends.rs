//! Requests whose lines end in a bare LF are refused.
//!
//! RFC 9112 (section 2.2) lets a server accept a lone LF as a line end, and
//! hyper's parser does. A proxy in front that does not would see different
//! header lines, or a different end of the head or of a chunk, than Ferrum
//! does: the mismatch request smuggling is built on. So the bytes of each
//! request's head and chunked framing are watched as they arrive, and the
//! first bare LF is replaced by a NUL byte, which hyper's parser refuses
//! (400 Bad Request for a head; a failed body read for chunk framing).
//! Bodies pass untouched: a JSON body may hold any bytes.
//!
//! Following a request from one to the next needs its framing: the head's
//! `Content-Length` or chunked `Transfer-Encoding`. Where the framing is
//! malformed, watching stops and hyper's own checks refuse the request.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Longest line kept for parsing (header lines are capped well below by
/// hyper's head limit); a longer one is still checked for its line end.
const MAX_LINE: usize = 8 << 10;

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// In a request head (or the empty lines before one).
    Head,
    /// In a body of known length: this many bytes left.
    Body(u64),
    /// At a chunk-size line.
    ChunkSize,
    /// In a chunk's data: this many bytes left.
    ChunkData(u64),
    /// At the line end after a chunk's data.
    ChunkEnd,
    /// In the trailer section after the last chunk.
    Trailers,
    /// Not watching any more (refused, or framing this cannot follow).
    Off,
}

/// The framing state of one connection's requests (see the module comment).
#[derive(Debug)]
struct Watch {
    state: State,
    line: Vec<u8>,
    prev_cr: bool,
    /// In the current head: whether a request line has come, and its
    /// framing so far.
    head_started: bool,
    content_length: u64,
    chunked: bool,
}

impl Watch {
    fn new() -> Self {
        Self {
            state: State::Head,
            line: Vec::new(),
            prev_cr: false,
            head_started: false,
            content_length: 0,
            chunked: false,
        }
    }

    /// Follows `bytes`, the next ones read, and replaces the first bare LF
    /// in a head or in chunk framing by a NUL.
    fn scan(&mut self, bytes: &mut [u8]) {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Off => return,
                State::Body(left) | State::ChunkData(left) => {
                    let n = left.min((bytes.len() - i) as u64);
                    i += n as usize;
                    let left = left - n;
                    if left == 0 {
                        self.state = match self.state {
                            State::Body(_) => State::Head,
                            _ => State::ChunkEnd,
                        };
                    } else {
                        self.state = match self.state {
                            State::Body(_) => State::Body(left),
                            _ => State::ChunkData(left),
                        };
                    }
                }
                _ => {
                    let b = bytes[i];
                    if b == b'\n' {
                        if !self.prev_cr {
                            bytes[i] = 0;
                            self.state = State::Off;
                            return;
                        }
                        self.prev_cr = false;
                        self.end_line();
                    } else {
                        self.prev_cr = b == b'\r';
                        if self.line.len() < MAX_LINE {
                            self.line.push(b);
                        }
                    }
                    i += 1;
                }
            }
        }
    }

    /// A line of the head or the chunk framing ended (CRLF).
    fn end_line(&mut self) {
        let mut line = std::mem::take(&mut self.line);
        line.pop(); // its CR
        self.state = match self.state {
            State::Head if line.is_empty() && !self.head_started => State::Head,
            State::Head if line.is_empty() => {
                let next = if self.chunked {
                    State::ChunkSize
                } else if self.content_length > 0 {
                    State::Body(self.content_length)
                } else {
                    State::Head
                };
                (self.head_started, self.content_length, self.chunked) = (false, 0, false);
                next
            }
            State::Head => {
                self.head_started = true;
                self.header(&line)
            }
            State::ChunkSize => {
                let digits = line.split(|&b| b == b';').next().unwrap_or_default();
                match std::str::from_utf8(digits)
                    .ok()
                    .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
                {
                    Some(0) => State::Trailers,
                    Some(n) => State::ChunkData(n),
                    None => State::Off,
                }
            }
            State::ChunkEnd if line.is_empty() => State::ChunkSize,
            State::Trailers if line.is_empty() => State::Head,
            State::Trailers => State::Trailers,
            _ => State::Off,
        };
        line.clear();
        self.line = line;
    }

    /// Notes a head line's framing; the state after it.
    fn header(&mut self, line: &[u8]) -> State {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return State::Head; // the request line
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = String::from_utf8_lossy(value);
        if name.eq_ignore_ascii_case(b"content-length") {
            match value.trim().parse() {
                Ok(n) => self.content_length = n,
                Err(_) => return State::Off,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.chunked = value.to_ascii_lowercase().contains("chunked");
        }
        State::Head
    }
}

/// A connection whose requests must end their lines in CRLF.
pub struct StrictLineEnds<S> {
    inner: S,
    watch: Watch,
}

impl<S> StrictLineEnds<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, watch: Watch::new() }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StrictLineEnds<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.watch.scan(&mut buf.filled_mut()[before..]);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StrictLineEnds<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the watch passes on for `input` fed in pieces of `step` bytes.
    fn watched(input: &[u8], step: usize) -> Vec<u8> {
        let mut w = Watch::new();
        let mut out = input.to_vec();
        for piece in out.chunks_mut(step) {
            w.scan(piece);
        }
        out
    }

    fn refused_at(input: &[u8]) -> Option<usize> {
        let outs: Vec<Vec<u8>> = [1, 3, 7, input.len()]
            .iter()
            .map(|&s| watched(input, s))
            .collect();
        // The result must not depend on how reads split the bytes.
        assert!(outs.windows(2).all(|w| w[0] == w[1]), "{outs:?}");
        let out = &outs[0];
        let changed: Vec<usize> = (0..input.len()).filter(|&i| out[i] != input[i]).collect();
        assert!(changed.len() <= 1, "{changed:?}");
        changed.first().map(|&i| {
            assert_eq!((input[i], out[i]), (b'\n', 0));
            i
        })
    }

    #[test]
    fn crlf_requests_pass_untouched_bodies_and_all() {
        let body = b"{\"prompt\": \"a\nb\"}\n";
        let mut reqs = format!(
            "\r\nPOST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        reqs.extend_from_slice(body);
        reqs.extend_from_slice(
            b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              5;ext=1\r\na\nb\nc\r\n0\r\nX-Trailer: 1\r\n\r\n\
              GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert_eq!(refused_at(&reqs), None);
    }

    #[test]
    fn a_bare_lf_in_a_head_or_chunk_line_is_refused() {
        let head = b"GET /health HTTP/1.1\nHost: x\r\n\r\n";
        assert_eq!(refused_at(head), Some(20));
        let header = b"GET /health HTTP/1.1\r\nHost: x\n\r\n";
        assert_eq!(refused_at(header), Some(29));
        // In a later request on the same connection, after a body.
        let second =
            b"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\n\n\nGET / HTTP/1.1\nHost: x\r\n\r\n";
        assert_eq!(refused_at(second), Some(55));
        let chunk = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\nx\r\n0\r\n\r\n";
        assert_eq!(refused_at(chunk), Some(49));
        let after_data = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\n0\r\n\r\n";
        assert_eq!(refused_at(after_data), Some(52));
    }

    #[test]
    fn framing_it_cannot_follow_stops_the_watch() {
        let bad_length =
            b"POST /a HTTP/1.1\r\nContent-Length: zz\r\n\r\nGET / HTTP/1.1\nHost: x\r\n\r\n";
        assert_eq!(refused_at(bad_length), None);
    }
}
