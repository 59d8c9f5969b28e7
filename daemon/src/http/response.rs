//! Writing a complete response (head and body in one write) on a connection
//! that serves exactly one request.
//!
//! Every response carries `Content-Length` and `Connection: close`: the
//! control endpoints are hit rarely (probes, scrapes, admin calls), so the
//! server answers one request per connection and never has to find request
//! boundaries again. After answering, the caller ends the connection with
//! [`close_gracefully`], which keeps a response from being lost to a TCP reset
//! when the client sent more than was read (e.g. a rejected oversized head).

use std::io::{self, ErrorKind, Write as _};
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::HttpError;

/// Writes `status`, `Content-Type`, `Content-Length`, `Connection: close`, the
/// `extra_headers` and `body`, in one `write_all`, then flushes. Header names
/// and values containing CR or LF are refused (`ErrorKind::InvalidInput`), so
/// no caller can split the response.
pub async fn write_response<S>(
    stream: &mut S,
    status: u16,
    content_type: &str,
    body: &[u8],
    extra_headers: &[(&str, &str)],
) -> Result<(), HttpError>
where
    S: AsyncWrite + Unpin + ?Sized,
{
    let fields = extra_headers.iter().flat_map(|(n, v)| [*n, *v]);
    if std::iter::once(content_type)
        .chain(fields)
        .any(|s| s.contains(['\r', '\n']))
    {
        return Err(
            io::Error::new(ErrorKind::InvalidInput, "CR or LF in a response header").into(),
        );
    }
    let mut out = Vec::with_capacity(128 + body.len());
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        reason_phrase(status),
        body.len()
    );
    for (name, value) in extra_headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    stream.write_all(&out).await?;
    stream.flush().await?;
    Ok(())
}

/// [`write_response`] with an `application/json` body.
pub async fn write_json<S>(
    stream: &mut S,
    status: u16,
    value: &serde_json::Value,
) -> Result<(), HttpError>
where
    S: AsyncWrite + Unpin + ?Sized,
{
    // Serialising a `Value` cannot fail (its map keys are strings).
    let body = serde_json::to_vec(value).unwrap_or_default();
    write_response(stream, status, "application/json", &body, &[]).await
}

/// Writes `{"error": message}` with `status`.
pub async fn write_error<S>(stream: &mut S, status: u16, message: &str) -> Result<(), HttpError>
where
    S: AsyncWrite + Unpin + ?Sized,
{
    write_json(stream, status, &serde_json::json!({ "error": message })).await
}

/// Answers `err` as JSON with its [`HttpError::status`] (426 also gets
/// `Upgrade: websocket` and `Sec-WebSocket-Version: 13`). Writes nothing for
/// errors that have no status (I/O failure, peer gone).
pub async fn respond_error<S>(stream: &mut S, err: &HttpError) -> Result<(), HttpError>
where
    S: AsyncWrite + Unpin + ?Sized,
{
    let Some(status) = err.status() else {
        return Ok(());
    };
    let body =
        serde_json::to_vec(&serde_json::json!({ "error": err.to_string() })).unwrap_or_default();
    let extra: &[(&str, &str)] = if status == 426 {
        &[("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")]
    } else {
        &[]
    };
    write_response(stream, status, "application/json", &body, extra).await
}

/// Most bytes [`close_gracefully`] reads and discards.
const DRAIN_LIMIT: usize = 64 * 1024;

/// Ends a connection after the response: shuts down the write side (the
/// client sees end of stream after the response), then reads and discards what
/// the client still sends, until it closes, [`DRAIN_LIMIT`] bytes, or
/// `linger` has passed. Closing a socket with unread input makes the kernel
/// send a reset, which can destroy the response before the client reads it.
/// Best effort: errors are ignored. Must run inside a glommio executor.
pub async fn close_gracefully<S>(mut stream: S, linger: Duration)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if stream.close().await.is_err() {
        return;
    }
    let drain = async {
        let mut scratch = [0u8; 1024];
        let mut drained = 0;
        while drained < DRAIN_LIMIT {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        Ok(())
    };
    let _ = glommio::timer::timeout(linger, drain).await;
}

/// The reason phrase for the statuses this daemon sends (empty otherwise,
/// which HTTP/1.1 allows).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "",
    }
}
