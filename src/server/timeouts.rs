//! HTTP/1.1 connection timeouts that hyper cannot tell apart: its header read timeout also
//! runs while a kept-alive connection waits for the next request, so a connection idle for 10 s
//! was closed by the server, while the apiserver's webhook client keeps idle connections for up
//! to 90 s and does not retry a POST sent on a connection the server is closing ("broken
//! pipe", "use of closed network connection" under load). [`Timeouts`] wraps the decrypted
//! stream instead: a request's headers must arrive within `header` of its first byte (and of
//! the connection's start), and an idle connection is closed only after `idle` from the last
//! byte of the last response - longer than the apiserver's 90 s, so the client always closes
//! an idle connection first.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Where an HTTP/1.1 connection is, as its bytes show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Reading a request's headers (from the connection's start, or a request's first byte).
    Headers,
    /// The headers are in: the body and the handler (bounded by the request timeout).
    Request,
    /// A response was written: waiting for the next request.
    Idle,
}

/// `io` with the header and idle timeouts; `enabled: false` passes everything through (HTTP/2,
/// whose frames have no header block to find).
pub struct Timeouts<IO> {
    io: IO,
    enabled: bool,
    header: Duration,
    idle: Duration,
    phase: Phase,
    /// How much of `\r\n\r\n` the bytes read so far end with.
    matched: usize,
    deadline: Pin<Box<Sleep>>,
}

impl<IO> Timeouts<IO> {
    pub fn new(io: IO, enabled: bool, header: Duration, idle: Duration) -> Self {
        Self {
            io,
            enabled,
            header,
            idle,
            phase: Phase::Headers,
            matched: 0,
            deadline: Box::pin(tokio::time::sleep(header)),
        }
    }

    /// Finds the end of the header block in `bytes` (continuing a match across reads).
    fn scan(&mut self, bytes: &[u8]) -> bool {
        const END: &[u8] = b"\r\n\r\n";
        for &b in bytes {
            self.matched = if b == END[self.matched] {
                self.matched + 1
            } else if b == b'\r' {
                1
            } else {
                0
            };
            if self.matched == END.len() {
                self.matched = 0;
                return true;
            }
        }
        false
    }

    fn arm(&mut self, after: Duration) {
        self.deadline.as_mut().reset(Instant::now() + after);
    }

    /// After a write: a response (or part of one) went out, so the connection is idle from its
    /// last byte.
    fn wrote(&mut self, written: &Poll<io::Result<usize>>) {
        if self.enabled && matches!(written, Poll::Ready(Ok(n)) if *n > 0) {
            self.phase = Phase::Idle;
            let idle = self.idle;
            self.arm(idle);
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Timeouts<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if this.enabled => {
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    if this.phase == Phase::Idle {
                        this.phase = Phase::Headers;
                        this.matched = 0;
                        let header = this.header;
                        this.arm(header);
                    }
                    if this.phase == Phase::Headers && this.scan(read) {
                        this.phase = Phase::Request;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.enabled && this.phase != Phase::Request => {
                if this.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if this.phase == Phase::Idle {
                    // Closed as a client closes: end of stream, no error.
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the request's headers did not arrive in time",
                    )))
                }
            }
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Timeouts<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, data);
        self.wrote(&written);
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_end_of_the_headers_is_found_across_reads() {
        let mut t = Timeouts::new((), true, Duration::from_secs(1), Duration::from_secs(1));
        assert!(!t.scan(b"POST /validate HTTP/1.1\r\nHost: x\r\n"));
        assert!(!t.scan(b"\r"));
        assert!(t.scan(b"\n{\"body\""));
        assert!(!t.scan(b"GET / HTTP/1.1\r\n\r\r\n"));
        assert!(t.scan(b"\r\n"));
    }
}
