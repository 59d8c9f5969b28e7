//! The HTTP request head parser (`http::read_head`) over an in-memory reader
//! that hands the bytes over in arbitrary splits, then `read_body` and the
//! head's accessors. Input: `[split_seed, bytes...]`.
//!
//! Checked: no panic; the buffer never exceeds the head limit; on success the
//! bytes left in the buffer are exactly the last ones read (nothing read
//! past the head is lost).
#![no_main]

use futures_lite::{AsyncRead, AsyncWrite};
use libfuzzer_sys::fuzz_target;
use moshid::http::{read_body, read_head, HeadLimits};
use moshid_fuzz::chunks;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

struct Reader<'a> {
    chunks: Vec<&'a [u8]>,
    next: usize,
    delivered: Vec<u8>,
}

impl AsyncRead for Reader<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let Some(chunk) = self.chunks.get(self.next).copied() else {
            return Poll::Ready(Ok(0));
        };
        let n = chunk.len().min(buf.len());
        buf[..n].copy_from_slice(&chunk[..n]);
        if n == chunk.len() {
            self.next += 1;
        } else {
            let i = self.next;
            self.chunks[i] = &chunk[n..];
        }
        self.delivered.extend_from_slice(&chunk[..n]);
        Poll::Ready(Ok(n))
    }
}

impl AsyncWrite for Reader<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fuzz_target!(|data: &[u8]| {
    let [seed, bytes @ ..] = data else { return };
    // The daemon's defaults (listen.max_head_bytes, listen.max_body_bytes).
    let limits = HeadLimits {
        max_head_bytes: 16 * 1024,
        max_body_bytes: 64 * 1024,
        ..HeadLimits::default()
    };
    let mut reader = Reader {
        chunks: chunks(bytes, *seed),
        next: 0,
        delivered: Vec::new(),
    };
    let mut buf = Vec::new();
    let result = futures_lite::future::block_on(read_head(&mut reader, &mut buf, &limits));
    assert!(reader.delivered.len() <= limits.max_head_bytes);
    let Ok(head) = result else { return };
    assert!(buf.len() <= reader.delivered.len());
    assert_eq!(
        &reader.delivered[reader.delivered.len() - buf.len()..],
        &buf[..],
        "bytes after the head lost"
    );
    let _ = head.query_pairs();
    let _ = head.is_websocket_upgrade();
    let _ = head.bearer_token();
    let _ = head.api_key();
    let _ = head.expects_continue();
    let _ = head.header("host");
    let _ = moshid::http::websocket_accept_key(&head);
    if let Ok(body) =
        futures_lite::future::block_on(read_body(&mut reader, &head, &mut buf, &limits))
    {
        assert!(body.len() <= limits.max_body_bytes);
        assert_eq!(Some(body.len() as u64), head.content_length.or(Some(0)));
    }
});
