//! The byte stream of one connection on the shared listener: plain TCP, or
//! TLS over TCP when `listen.tls_cert_file` is set. Everything above it (the
//! request head, the control endpoints, `/api/chat`, `/v1/media-stream`,
//! the page) reads and writes a [`Conn`] and never asks which it is.
//!
//! Invariants:
//! - The plain variant forwards every call to glommio's `TcpStream` as is: one
//!   `match` per call, no buffer, no copy, no extra system call.
//! - The TLS variant is boxed (a rustls connection is a few KiB) so that a
//!   `Conn` stays two words plus the socket, whichever it holds.
//! - A `Conn::Tls` has completed its handshake: it is only made by
//!   [`crate::tls::ServerTls::accept`], under the handshake timeout.

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use std::io::{self, IoSlice, IoSliceMut};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A server-side TLS stream over glommio's TCP stream.
pub type TlsStream = futures_rustls::server::TlsStream<TcpStream>;

/// One accepted connection, plain or TLS.
pub enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP, handshake done.
    Tls(Box<TlsStream>),
}

impl Conn {
    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Conn::Tls(_))
    }

    /// The TCP socket underneath (addresses, timeouts, `TCP_NODELAY`).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }

    fn poll_read_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read_vectored(cx, bufs),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    /// TLS: sends `close_notify`, then shuts the socket's write side.
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_close(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}
