//! Completing the RFC 6455 handshake for a request whose head [`read_head`]
//! already consumed, and handing the socket to async-tungstenite.
//!
//! Design: we validate the head ourselves, answer `101` with
//! `Sec-WebSocket-Accept` computed by tungstenite's own `derive_accept_key`,
//! and build the stream with `WebSocketStream::from_partially_read`, giving it
//! the bytes read past the head. The alternative (replaying the consumed bytes
//! through a prefix stream into `accept_hdr_async_with_config`) would parse the
//! head twice with two parsers and two sets of limits, answer bad upgrades with
//! tungstenite's errors instead of ours, and leave a wrapper type in every read
//! of the session. `from_partially_read` is exactly what tungstenite itself
//! calls at the end of its server handshake, so leftover bytes (frames the
//! client sent right behind its request) are handled by the same, tested path,
//! and the result is a plain `WebSocketStream<S>` on the socket.
//!
//! Invariant: message and frame size limits come from the caller's
//! [`WebSocketConfig`] and are enforced by tungstenite on every incoming
//! frame (a frame header announcing more than `max_frame_size` is refused
//! before its payload is buffered).
//!
//! [`read_head`]: super::read_head

use async_tungstenite::tungstenite::handshake::derive_accept_key;
use async_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use async_tungstenite::WebSocketStream;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::{respond_error, HttpError, RequestHead};

/// A [`WebSocketConfig`] with the given incoming limits (bytes of one message,
/// bytes of one frame's payload), a read buffer of
/// [`WS_READ_BUFFER_BYTES`] and tungstenite's defaults otherwise.
pub fn ws_config(max_message_bytes: usize, max_frame_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_frame_bytes))
        .read_buffer_size(WS_READ_BUFFER_BYTES)
}

/// Bytes tungstenite offers each socket read. Its default (128 KiB) is
/// zero-filled before every read attempt, which on a session receiving one
/// ~200-byte Ogg message per 80 ms costs more than the read itself; a larger
/// message still gets room for its whole length (tungstenite reserves a
/// frame's announced length).
pub const WS_READ_BUFFER_BYTES: usize = 4096;

/// Checks that `head` is a WebSocket upgrade this server can accept (GET,
/// HTTP/1.1, `Upgrade: websocket`, `Connection: upgrade`,
/// `Sec-WebSocket-Version: 13`, a `Sec-WebSocket-Key` that is base64 of 16
/// bytes) and returns the `Sec-WebSocket-Accept` value.
pub fn websocket_accept_key(head: &RequestHead) -> Result<String, HttpError> {
    if head.method != "GET" {
        return Err(HttpError::NotWebSocketUpgrade("method must be GET"));
    }
    if head.minor_version < 1 {
        return Err(HttpError::NotWebSocketUpgrade("HTTP/1.1 is required"));
    }
    if !head.has_token("upgrade", "websocket") {
        return Err(HttpError::NotWebSocketUpgrade(
            "missing `Upgrade: websocket` header",
        ));
    }
    if !head.has_token("connection", "upgrade") {
        return Err(HttpError::NotWebSocketUpgrade(
            "missing `Connection: Upgrade` header",
        ));
    }
    match head.header("sec-websocket-version") {
        None => {
            return Err(HttpError::NotWebSocketUpgrade(
                "missing Sec-WebSocket-Version header",
            ))
        }
        Some("13") => {}
        Some(other) => return Err(HttpError::UnsupportedWebSocketVersion(other.to_owned())),
    }
    let key = head
        .header("sec-websocket-key")
        .ok_or(HttpError::BadWebSocketKey("header missing"))?;
    if !is_base64_of_16_bytes(key) {
        return Err(HttpError::BadWebSocketKey(
            "must be the base64 encoding of 16 bytes (24 characters ending in `==`)",
        ));
    }
    Ok(derive_accept_key(key.as_bytes()))
}

/// Completes the handshake for `head` (already read from `stream`) and returns
/// the WebSocket. `leftover` is what [`read_head`](super::read_head) left in
/// its buffer (`std::mem::take(&mut buf)`): any frames the client sent right
/// after its request; they are read before anything new from the socket.
///
/// If the request is not an acceptable upgrade, answers it here (400, or 426
/// with `Sec-WebSocket-Version: 13`) and returns the error; the caller just
/// drops the connection. `config` sets the incoming size limits (see
/// [`ws_config`]); it must satisfy tungstenite's rule
/// `max_write_buffer_size > write_buffer_size` (tungstenite panics otherwise).
/// No subprotocol or extension is negotiated.
pub async fn accept_websocket<S>(
    stream: S,
    head: &RequestHead,
    leftover: Vec<u8>,
    config: WebSocketConfig,
) -> Result<WebSocketStream<S>, HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    accept_websocket_with(stream, head, leftover, config, &[]).await
}

/// [`accept_websocket`] with `extra_headers` in the `101` response (names
/// and values must not hold CR or LF: they are the daemon's own, such as
/// `Moshid-Session-Id`).
pub async fn accept_websocket_with<S>(
    mut stream: S,
    head: &RequestHead,
    leftover: Vec<u8>,
    config: WebSocketConfig,
    extra_headers: &[(&str, &str)],
) -> Result<WebSocketStream<S>, HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let accept = match websocket_accept_key(head) {
        Ok(accept) => accept,
        Err(e) => {
            // Best effort: the handshake error is what the caller needs.
            let _ = respond_error(&mut stream, &e).await;
            return Err(e);
        }
    };
    let mut response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n"
    );
    for (name, value) in extra_headers {
        debug_assert!(!name.contains(['\r', '\n']) && !value.contains(['\r', '\n']));
        response.push_str(&format!("{name}: {value}\r\n"));
    }
    response.push_str("\r\n");
    stream.write_all(response.as_bytes()).await?;
    stream.flush().await?;
    Ok(WebSocketStream::from_partially_read(stream, leftover, Role::Server, Some(config)).await)
}

/// 22 base64 characters then `==` (RFC 6455 §4.1: a random 16-byte nonce).
fn is_base64_of_16_bytes(key: &str) -> bool {
    let b = key.as_bytes();
    b.len() == 24
        && b[22..] == *b"=="
        && b[..22]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(extra: &[(&str, &str)]) -> RequestHead {
        let mut headers = vec![
            ("Upgrade".to_owned(), "websocket".to_owned()),
            ("Connection".to_owned(), "Upgrade".to_owned()),
            ("Sec-WebSocket-Version".to_owned(), "13".to_owned()),
            (
                "Sec-WebSocket-Key".to_owned(),
                "dGhlIHNhbXBsZSBub25jZQ==".to_owned(),
            ),
        ];
        for (n, v) in extra {
            headers.retain(|(name, _)| !name.eq_ignore_ascii_case(n));
            if !v.is_empty() {
                headers.push((n.to_string(), v.to_string()));
            }
        }
        RequestHead {
            method: "GET".into(),
            path: "/api/chat".into(),
            query: None,
            minor_version: 1,
            headers,
            content_length: None,
        }
    }

    #[test]
    fn rfc_example_key() {
        // RFC 6455 §1.3.
        assert_eq!(
            websocket_accept_key(&head(&[])).unwrap(),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn rejects_bad_upgrades() {
        let cases: &[(&[(&str, &str)], u16)] = &[
            (&[("Upgrade", "")], 400),
            (&[("Connection", "keep-alive")], 400),
            (&[("Sec-WebSocket-Version", "8")], 426),
            (&[("Sec-WebSocket-Version", "")], 400),
            (&[("Sec-WebSocket-Key", "")], 400),
            (&[("Sec-WebSocket-Key", "c2hvcnQ=")], 400),
            (&[("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ!=")], 400),
        ];
        for (extra, status) in cases {
            let e = websocket_accept_key(&head(extra)).unwrap_err();
            assert_eq!(e.status(), Some(*status), "{extra:?}: {e}");
        }
        let mut post = head(&[]);
        post.method = "POST".into();
        assert!(matches!(
            websocket_accept_key(&post),
            Err(HttpError::NotWebSocketUpgrade(_))
        ));
    }
}
