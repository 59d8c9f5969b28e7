//! [`HttpError`]: everything that can go wrong between accepting a socket and
//! handing it to a handler, with the HTTP status to answer with.

use std::io;

/// An error while reading a request, writing a response or upgrading.
///
/// Every variant's message says what was wrong with the request, so it can be
/// sent back verbatim in a `{"error": …}` body (see
/// [`respond_error`](super::respond_error)). [`HttpError::status`] gives the
/// status code to answer with, or `None` where answering is pointless (the
/// peer went away, the socket failed).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The socket failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection before the head was complete.
    #[error("connection closed after {received} bytes, before the request head was complete")]
    ClosedBeforeHead {
        /// Bytes received before end of stream.
        received: usize,
    },
    /// The deadline the caller applied (see [`deadline`](super::deadline)) passed.
    #[error("timed out waiting for the request")]
    Timeout,
    /// The request line or a header line could not be parsed.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// The head (request line and headers) is longer than the limit.
    #[error("request head larger than {limit} bytes")]
    HeadTooLarge {
        /// `HeadLimits::max_head_bytes`.
        limit: usize,
    },
    /// More header lines than the limit.
    #[error("more than {limit} request headers")]
    TooManyHeaders {
        /// `HeadLimits::max_headers`.
        limit: usize,
    },
    /// `Content-Length` is not a decimal number, or several disagree.
    #[error("bad Content-Length: {0}")]
    BadContentLength(String),
    /// The request has a `Transfer-Encoding` (chunked bodies are not supported).
    #[error("Transfer-Encoding `{0}` is not supported; send the body with a Content-Length")]
    TransferEncodingUnsupported(String),
    /// `Content-Length` is over the body limit.
    #[error("request body of {length} bytes is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The announced `Content-Length`.
        length: u64,
        /// `HeadLimits::max_body_bytes`.
        limit: usize,
    },
    /// The peer closed the connection in the middle of the body.
    #[error("connection closed after {received} of {expected} body bytes")]
    BodyTruncated {
        /// The announced `Content-Length`.
        expected: usize,
        /// Bytes received.
        received: usize,
    },
    /// The request is not a valid WebSocket upgrade; says which part is missing.
    #[error("not a WebSocket upgrade: {0}")]
    NotWebSocketUpgrade(&'static str),
    /// `Sec-WebSocket-Version` is not 13 (answered with 426 and
    /// `Sec-WebSocket-Version: 13`).
    #[error("unsupported Sec-WebSocket-Version `{0}`; only 13 is supported")]
    UnsupportedWebSocketVersion(String),
    /// `Sec-WebSocket-Key` is missing or not the base64 form of 16 bytes.
    #[error("bad Sec-WebSocket-Key: {0}")]
    BadWebSocketKey(&'static str),
    /// A query string could not be decoded.
    #[error("bad query string: {0}")]
    BadQuery(String),
    /// A query string has more parameters than allowed.
    #[error("query string has more than {limit} parameters")]
    TooManyQueryParams {
        /// The limit given to `parse_query_limited`.
        limit: usize,
    },
}

impl HttpError {
    /// The status code to answer with, or `None` when no answer should be
    /// attempted (I/O failure, peer gone before sending a request).
    pub fn status(&self) -> Option<u16> {
        Some(match self {
            HttpError::Io(_) | HttpError::ClosedBeforeHead { .. } => return None,
            HttpError::Timeout => 408,
            HttpError::HeadTooLarge { .. } | HttpError::TooManyHeaders { .. } => 431,
            HttpError::TransferEncodingUnsupported(_) => 411,
            HttpError::BodyTooLarge { .. } => 413,
            HttpError::UnsupportedWebSocketVersion(_) => 426,
            HttpError::Malformed(_)
            | HttpError::BadContentLength(_)
            | HttpError::BodyTruncated { .. }
            | HttpError::NotWebSocketUpgrade(_)
            | HttpError::BadWebSocketKey(_)
            | HttpError::BadQuery(_)
            | HttpError::TooManyQueryParams { .. } => 400,
        })
    }
}
