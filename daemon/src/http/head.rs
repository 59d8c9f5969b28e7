//! Reading a request: the head (request line + headers) with [`read_head`],
//! then an optional `Content-Length` body with [`read_body`], or a JSON
//! body with [`read_json`].
//!
//! Invariants:
//! - `read_head` never holds more than `max_head_bytes` in the buffer, and
//!   fails as soon as the bytes received cannot start a valid request (it does
//!   not wait for `\r\n\r\n` to reject garbage).
//! - On success the caller's buffer holds exactly the bytes received after the
//!   head (body start, or WebSocket frames the client sent right after its
//!   upgrade request); nothing read from the socket is lost.
//! - `read_body` checks `Content-Length` against `max_body_bytes` before
//!   reading anything, so a large announced body costs nothing.
//! - Neither function has a clock: wrap them in [`deadline`] (or any timeout)
//!   so a slow or silent client cannot hold the connection.

use std::future::Future;
use std::io::ErrorKind;
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::query::parse_query;
use super::HttpError;

/// Bounds on what one request may make the server read and hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// Longest request head (request line, headers, final empty line).
    /// Over it: [`HttpError::HeadTooLarge`] (431).
    pub max_head_bytes: usize,
    /// Most header lines. Over it: [`HttpError::TooManyHeaders`] (431).
    pub max_headers: usize,
    /// Largest `Content-Length` [`read_body`] accepts. Over it:
    /// [`HttpError::BodyTooLarge`] (413).
    pub max_body_bytes: usize,
}

impl Default for HeadLimits {
    /// 8 KiB head, 64 headers, 64 KiB body: ample for browsers and the
    /// control API's small JSON bodies.
    fn default() -> Self {
        Self {
            max_head_bytes: 8 * 1024,
            max_headers: 64,
            max_body_bytes: 64 * 1024,
        }
    }
}

/// A parsed request head. Strings are owned (one small allocation each, per
/// connection, never per frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method as sent, e.g. `GET` (methods are case-sensitive).
    pub method: String,
    /// Path of the request target, still percent-encoded, without the query.
    /// An absolute-form target (`http://host/p?q`) is reduced to `/p`.
    pub path: String,
    /// Raw query string after `?` (not decoded; see [`RequestHead::query_pairs`]).
    pub query: Option<String>,
    /// `1` for HTTP/1.1, `0` for HTTP/1.0.
    pub minor_version: u8,
    /// Headers in order received; names as sent, values trimmed (bytes that are
    /// not UTF-8 are replaced by U+FFFD).
    pub headers: Vec<(String, String)>,
    /// Validated `Content-Length` (several identical values are accepted).
    pub content_length: Option<u64>,
}

impl RequestHead {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name` (case-insensitive), in order.
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether any `name` header holds `token` in its comma-separated list
    /// (case-insensitive), e.g. `Connection: keep-alive, Upgrade`.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.header_values(name)
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// `GET` with `Connection: upgrade` and `Upgrade: websocket`. Only says
    /// what the client asked for; [`accept_websocket`](super::accept_websocket)
    /// checks the rest (version, key).
    pub fn is_websocket_upgrade(&self) -> bool {
        self.method == "GET"
            && self.has_token("connection", "upgrade")
            && self.has_token("upgrade", "websocket")
    }

    /// The token of `Authorization: Bearer <token>` (scheme case-insensitive),
    /// if present and non-empty.
    pub fn bearer_token(&self) -> Option<&str> {
        let value = self.header("authorization")?;
        let (scheme, token) = value.split_once(' ')?;
        let token = token.trim();
        (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
    }

    /// The value of the `kyutai-api-key` header, if present and non-empty.
    pub fn api_key(&self) -> Option<&str> {
        self.header("kyutai-api-key").filter(|v| !v.is_empty())
    }

    /// Whether the client waits for `100 Continue` before sending its body.
    pub fn expects_continue(&self) -> bool {
        self.minor_version >= 1
            && self
                .header("expect")
                .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    }

    /// The decoded query parameters (empty when there is no query); see
    /// [`parse_query`].
    pub fn query_pairs(&self) -> Result<Vec<(String, String)>, HttpError> {
        parse_query(self.query.as_deref().unwrap_or(""))
    }
}

/// Reads and parses one request head from `stream`.
///
/// `buf` is the caller's reusable buffer: it is cleared on entry, and on
/// success holds exactly the bytes received after the head (pass them to
/// [`read_body`] or as `leftover` to
/// [`accept_websocket`](super::accept_websocket)). On error its contents are
/// unspecified.
///
/// There is no deadline inside: the caller bounds the time, e.g.
/// `deadline(Duration::from_secs(10), read_head(&mut s, &mut buf, &limits))`
/// (see [`deadline`]); otherwise a client that sends nothing holds the
/// connection forever.
///
/// Errors: [`HttpError::ClosedBeforeHead`] (no answer needed),
/// [`HttpError::Malformed`] (400), [`HttpError::HeadTooLarge`] /
/// [`HttpError::TooManyHeaders`] (431), [`HttpError::BadContentLength`] (400),
/// [`HttpError::TransferEncodingUnsupported`] (411), [`HttpError::Io`].
pub async fn read_head<S>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<RequestHead, HttpError>
where
    S: AsyncRead + Unpin + ?Sized,
{
    buf.clear();
    loop {
        if !buf.is_empty() {
            // Re-parsing from the start after each read is quadratic only in
            // the number of reads of one head of at most `max_head_bytes`.
            let mut headers = vec![httparse::EMPTY_HEADER; limits.max_headers];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let head = RequestHead::from_parsed(&req)?;
                    buf.drain(..len);
                    return Ok(head);
                }
                Ok(httparse::Status::Partial) => {
                    if buf.len() >= limits.max_head_bytes {
                        return Err(HttpError::HeadTooLarge {
                            limit: limits.max_head_bytes,
                        });
                    }
                }
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(HttpError::TooManyHeaders {
                        limit: limits.max_headers,
                    });
                }
                Err(e) => return Err(HttpError::Malformed(parse_error_message(e))),
            }
        } else if limits.max_head_bytes == 0 {
            return Err(HttpError::HeadTooLarge { limit: 0 });
        }
        // Read at most up to the head limit, so the buffer never exceeds it.
        let filled = buf.len();
        buf.resize(limits.max_head_bytes, 0);
        let n = loop {
            match stream.read(&mut buf[filled..]).await {
                Ok(n) => break n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    buf.truncate(filled);
                    return Err(e.into());
                }
            }
        };
        buf.truncate(filled + n);
        if n == 0 {
            return Err(HttpError::ClosedBeforeHead { received: filled });
        }
    }
}

/// Reads the request body announced by `head.content_length` (none: empty).
///
/// `buf` must hold what [`read_head`] left in it (the start of the body); on
/// success it holds exactly the body, which is also returned. Bytes past the
/// body are discarded: there is one request per connection (responses say
/// `Connection: close`). A `Content-Length` over `limits.max_body_bytes` is
/// refused before anything is read. Answers `Expect: 100-continue` with an
/// interim `100 Continue` (hence the `AsyncWrite` bound). Like `read_head`,
/// bound it with a deadline.
pub async fn read_body<'b, S>(
    stream: &mut S,
    head: &RequestHead,
    buf: &'b mut Vec<u8>,
    limits: &HeadLimits,
) -> Result<&'b [u8], HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let length = head.content_length.unwrap_or(0);
    if length > limits.max_body_bytes as u64 {
        return Err(HttpError::BodyTooLarge {
            length,
            limit: limits.max_body_bytes,
        });
    }
    // Fits in usize: bounded by max_body_bytes.
    let length = length as usize;
    if buf.len() >= length {
        buf.truncate(length);
        return Ok(buf);
    }
    if head.expects_continue() {
        stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        stream.flush().await?;
    }
    let mut filled = buf.len();
    buf.resize(length, 0);
    while filled < length {
        match stream.read(&mut buf[filled..]).await {
            Ok(0) => {
                return Err(HttpError::BodyTruncated {
                    expected: length,
                    received: filled,
                })
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(buf)
}

/// Runs `fut` (e.g. [`read_head`] or [`read_body`]) under a glommio timer:
/// [`HttpError::Timeout`] (408) if it has not finished within `dur`.
/// Must be called inside a glommio executor.
pub async fn deadline<T, F>(dur: Duration, fut: F) -> Result<T, HttpError>
where
    F: Future<Output = Result<T, HttpError>>,
{
    match glommio::timer::timeout(dur, async { Ok(fut.await) }).await {
        Ok(result) => result,
        Err(_) => Err(HttpError::Timeout),
    }
}

/// Reads a request's `Content-Length` body (as [`read_body`], within
/// `timeout`) and parses it as JSON: the one way the control API reads a
/// JSON body. `Ok(Err(e))`: the body was read but is not a `T` (the
/// caller answers 400, naming `e`); `Err`: the request failed (answer it
/// with [`super::respond_error`]).
pub async fn read_json<T, S>(
    stream: &mut S,
    head: &RequestHead,
    buf: &mut Vec<u8>,
    limits: &HeadLimits,
    timeout: Duration,
) -> Result<Result<T, serde_json::Error>, HttpError>
where
    T: serde::de::DeserializeOwned,
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let body = deadline(timeout, read_body(stream, head, buf, limits)).await?;
    Ok(serde_json::from_slice(body))
}

impl RequestHead {
    fn from_parsed(req: &httparse::Request<'_, '_>) -> Result<Self, HttpError> {
        // `parse` returned Complete, so method, path and version are set.
        let method = req.method.ok_or(HttpError::Malformed("missing method"))?;
        let target = req
            .path
            .ok_or(HttpError::Malformed("missing request target"))?;
        let minor_version = req
            .version
            .ok_or(HttpError::Malformed("missing HTTP version"))?;
        let (path, query) = split_target(target)?;

        let mut headers = Vec::with_capacity(req.headers.len());
        let mut content_length: Option<u64> = None;
        for h in req.headers.iter() {
            let value = String::from_utf8_lossy(h.value).trim().to_owned();
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(HttpError::TransferEncodingUnsupported(value));
            }
            if h.name.eq_ignore_ascii_case("content-length") {
                // RFC 9110 §8.6: a list of identical values is one value.
                for item in value.split(',') {
                    let n = parse_content_length(item.trim())?;
                    if let Some(prev) = content_length.filter(|&prev| prev != n) {
                        return Err(HttpError::BadContentLength(format!(
                            "conflicting values {prev} and {n}"
                        )));
                    }
                    content_length = Some(n);
                }
            }
            headers.push((h.name.to_owned(), value));
        }
        Ok(RequestHead {
            method: method.to_owned(),
            path,
            query,
            minor_version,
            headers,
            content_length,
        })
    }
}

fn parse_content_length(s: &str) -> Result<u64, HttpError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HttpError::BadContentLength(format!(
            "`{s}` is not a decimal number"
        )));
    }
    s.parse::<u64>()
        .map_err(|_| HttpError::BadContentLength(format!("`{s}` is out of range")))
}

/// Splits an origin-form (`/p?q`), absolute-form (`http://h/p?q`) or
/// asterisk-form (`*`) target into path and raw query.
fn split_target(target: &str) -> Result<(String, Option<String>), HttpError> {
    let target = target.split('#').next().unwrap_or_default();
    let origin_form = if target.starts_with('/') || target == "*" {
        target
    } else {
        let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
        let after_scheme = if lower.starts_with("http://") {
            &target[7..]
        } else if lower.starts_with("https://") {
            &target[8..]
        } else {
            return Err(HttpError::Malformed(
                "request target is not a path or absolute URL",
            ));
        };
        match after_scheme.find(['/', '?']) {
            Some(i) => &after_scheme[i..],
            None => "",
        }
    };
    let (path, query) = match origin_form.split_once('?') {
        Some((p, q)) => (p, Some(q.to_owned())),
        None => (origin_form, None),
    };
    let path = if path.is_empty() { "/" } else { path };
    Ok((path.to_owned(), query))
}

fn parse_error_message(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::Token => "malformed request line (bad method or target)",
        httparse::Error::Version => "malformed request line (bad HTTP version)",
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::TooManyHeaders => "too many headers",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8], limits: HeadLimits) -> (Result<RequestHead, HttpError>, Vec<u8>) {
        let mut cursor = futures_lite::io::Cursor::new(bytes.to_vec());
        let mut buf = Vec::new();
        let r = futures_lite::future::block_on(read_head(&mut cursor, &mut buf, &limits));
        (r, buf)
    }

    #[test]
    fn parses_head_and_keeps_leftover() {
        let (head, rest) = parse(
            b"POST /v1/rtp/sessions?a=1&b=x%20y HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\
              Authorization: bearer  tok \r\nKyutai-Api-Key: k\r\n\r\nhelloEXTRA",
            HeadLimits::default(),
        );
        let head = head.unwrap();
        assert_eq!(head.method, "POST");
        assert_eq!(head.path, "/v1/rtp/sessions");
        assert_eq!(head.query.as_deref(), Some("a=1&b=x%20y"));
        assert_eq!(head.minor_version, 1);
        assert_eq!(head.content_length, Some(5));
        assert_eq!(head.header("HOST"), Some("h"));
        assert_eq!(head.bearer_token(), Some("tok"));
        assert_eq!(head.api_key(), Some("k"));
        assert!(!head.is_websocket_upgrade());
        assert_eq!(
            head.query_pairs().unwrap(),
            vec![("a".into(), "1".into()), ("b".into(), "x y".into())]
        );
        assert_eq!(rest, b"helloEXTRA");
    }

    #[test]
    fn rejects_garbage_before_end_of_head() {
        // No "\r\n\r\n": rejected on the first bytes, not after a timeout.
        let (r, _) = parse(b"\x16\x03\x01\x02\x00\x01\x00", HeadLimits::default());
        assert!(matches!(r, Err(HttpError::Malformed(_))), "{r:?}");
        assert_eq!(r.unwrap_err().status(), Some(400));
    }

    #[test]
    fn head_limits() {
        let limits = HeadLimits {
            max_head_bytes: 64,
            max_headers: 2,
            max_body_bytes: 10,
        };
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(100));
        let (r, buf) = parse(long.as_bytes(), limits);
        assert!(
            matches!(r, Err(HttpError::HeadTooLarge { limit: 64 })),
            "{r:?}"
        );
        assert!(buf.len() <= 64);
        let (r, _) = parse(b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits);
        assert!(
            matches!(r, Err(HttpError::TooManyHeaders { limit: 2 })),
            "{r:?}"
        );
        assert_eq!(r.unwrap_err().status(), Some(431));
        let (r, _) = parse(b"GET / HTTP/1.1\r\nX: 1\r\n", limits);
        assert!(
            matches!(r, Err(HttpError::ClosedBeforeHead { received: 22 })),
            "{r:?}"
        );
    }

    #[test]
    fn content_length_and_transfer_encoding() {
        let d = HeadLimits::default();
        let (r, _) = parse(b"POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n", d);
        assert_eq!(r.unwrap().content_length, Some(3));
        for bad in ["+3", "3 4", "", "0x10", "99999999999999999999999"] {
            let req = format!("POST / HTTP/1.1\r\nContent-Length: {bad}\r\n\r\n");
            let (r, _) = parse(req.as_bytes(), d);
            assert!(
                matches!(r, Err(HttpError::BadContentLength(_))),
                "{bad}: {r:?}"
            );
        }
        let (r, _) = parse(
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            d,
        );
        assert!(matches!(r, Err(HttpError::BadContentLength(_))), "{r:?}");
        let (r, _) = parse(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", d);
        let e = r.unwrap_err();
        assert_eq!(e.status(), Some(411));
        assert!(e.to_string().contains("chunked"), "{e}");
    }

    #[test]
    fn body_reading() {
        let limits = HeadLimits {
            max_body_bytes: 8,
            ..HeadLimits::default()
        };
        let run = |bytes: &[u8]| {
            let mut s = futures_lite::io::Cursor::new(bytes.to_vec());
            let mut buf = Vec::new();
            futures_lite::future::block_on(async {
                let head = read_head(&mut s, &mut buf, &limits).await?;
                read_body(&mut s, &head, &mut buf, &limits)
                    .await
                    .map(|b| b.to_vec())
            })
        };
        assert_eq!(
            run(b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcdef").unwrap(),
            b"abcd"
        );
        assert_eq!(run(b"POST / HTTP/1.1\r\n\r\nabc").unwrap(), b"");
        let e = run(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\n").unwrap_err();
        assert!(
            matches!(
                e,
                HttpError::BodyTooLarge {
                    length: 9,
                    limit: 8
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.status(), Some(413));
        let e = run(b"POST / HTTP/1.1\r\nContent-Length: 6\r\n\r\nabc").unwrap_err();
        assert!(
            matches!(
                e,
                HttpError::BodyTruncated {
                    expected: 6,
                    received: 3
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn targets() {
        let d = HeadLimits::default();
        let (r, _) = parse(
            b"GET http://example.com:80/api/chat?x=1 HTTP/1.1\r\n\r\n",
            d,
        );
        let h = r.unwrap();
        assert_eq!(
            (h.path.as_str(), h.query.as_deref()),
            ("/api/chat", Some("x=1"))
        );
        let (r, _) = parse(b"GET HTTP://example.com HTTP/1.0\r\n\r\n", d);
        let h = r.unwrap();
        assert_eq!((h.path.as_str(), h.minor_version), ("/", 0));
        let (r, _) = parse(b"GET /a? HTTP/1.1\r\n\r\n", d);
        assert_eq!(r.unwrap().query.as_deref(), Some(""));
    }

    #[test]
    fn upgrade_and_auth_helpers() {
        let (r, _) = parse(
            b"GET /api/chat HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\n\
              Authorization: Basic abc\r\nkyutai-api-key: \r\n\r\n",
            HeadLimits::default(),
        );
        let h = r.unwrap();
        assert!(h.is_websocket_upgrade());
        assert_eq!(h.bearer_token(), None);
        assert_eq!(h.api_key(), None);
    }
}
