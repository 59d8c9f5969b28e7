//! HTTP/1.1 requests to the daemon, plain or over TLS: one request per
//! connection (`Connection: close`), the answer read to its end.
//!
//! Invariant: every request is written and parsed by [`exchange`]; sockets
//! have [`IO_TIMEOUT`] on reads and writes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::{Daemon, IO_TIMEOUT};

/// A client socket to the daemon, plain or TLS.
pub enum ClientStream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl ClientStream {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for ClientStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            ClientStream::Plain(s) => s.read(buf),
            ClientStream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for ClientStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            ClientStream::Plain(s) => s.write(buf),
            ClientStream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.flush(),
            ClientStream::Tls(s) => s.flush(),
        }
    }
}

/// A TLS client configuration that trusts exactly `root` (ring provider,
/// as the daemon uses).
pub fn tls_client(root: &rustls::pki_types::CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    store
        .add(root.clone())
        .expect("adding a test root certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(store)
        .with_no_client_auth();
    Arc::new(config)
}

/// Opens a TCP connection to `addr` with `timeout` on connect, reads and
/// writes and, with `tls`, completes a handshake for the name `localhost`.
pub fn connect(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    timeout: Duration,
) -> std::io::Result<ClientStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let Some(config) = tls else {
        return Ok(ClientStream::Plain(s));
    };
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("a valid name");
    let conn = rustls::ClientConnection::new(config.clone(), name)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut stream = rustls::StreamOwned::new(conn, s);
    // Complete the handshake now, so that a refused certificate is an error here.
    while stream.conn.is_handshaking() {
        stream
            .conn
            .complete_io(&mut stream.sock)
            .map_err(|e| std::io::Error::other(format!("TLS handshake: {e}")))?;
    }
    Ok(ClientStream::Tls(Box::new(stream)))
}

/// [`connect`] with [`IO_TIMEOUT`].
pub fn open_stream(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> std::io::Result<ClientStream> {
    connect(addr, tls, IO_TIMEOUT)
}

/// An answer: status, head (status line and headers) and body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// Writes one request on `stream` (`headers`: whole lines, each ending in
/// `\r\n`) and reads the answer to the end of the connection. A reset
/// after a complete answer is fine (the daemon closes after answering).
pub fn exchange(
    stream: &mut (impl Read + Write),
    host: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> std::io::Result<Response> {
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}\r\n{body}"
    )?;
    let mut raw = Vec::new();
    if let Err(e) = stream.read_to_end(&mut raw) {
        if raw.is_empty() {
            return Err(e);
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let bad = |what: &str| std::io::Error::other(format!("{method} {path}: {what} in {text:?}"));
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no complete response head"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    Ok(Response {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

/// The header lines of a JSON body (`Content-Length: 0` without one).
fn json_headers(extra: &str, body: &str) -> String {
    format!(
        "{extra}Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    )
}

/// One request with an optional JSON body, `timeout` on every step.
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> std::io::Result<Response> {
    let mut s = connect(addr, None, timeout)?;
    let body = body.unwrap_or("");
    exchange(&mut s, addr, method, path, &json_headers("", body), body)
}

/// `GET path` on `addr` (plain HTTP), the body parsed as JSON; for tools.
pub fn get_json(addr: SocketAddr, path: &str, timeout: Duration) -> anyhow::Result<Value> {
    let r = try_request(addr, "GET", path, None, timeout)?;
    anyhow::ensure!(r.status == 200, "GET {path}: {}: {}", r.status, r.body);
    Ok(serde_json::from_str(&r.body)?)
}

/// One HTTP/1.1 request with an optional body: `(status, body)`.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    http_request_with(addr, method, path, body, "")
}

/// [`http_request`] with `extra` header lines (each ending in `\r\n`).
pub fn http_request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    extra: &str,
) -> (u16, String) {
    let mut s = open_stream(addr, None).expect("HTTP connect");
    let body = body.unwrap_or("");
    let r = exchange(&mut s, addr, method, path, &json_headers(extra, body), body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    (r.status, r.body)
}

/// A request with a JSON body (or none) to the control API at `addr`:
/// `(status, JSON body, or Null when the body is not JSON)`.
pub fn json_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let body = body.map(|b| b.to_string());
    let (status, text) = http_request(addr, method, path, body.as_deref());
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

impl Daemon {
    /// `http://ADDR/PATH`, or `https://ADDR/PATH` for a TLS daemon.
    pub fn url(&self, path: &str) -> String {
        match self.tls {
            None => format!("http://{}{path}", self.addr),
            Some(_) => format!("https://{}{path}", self.addr),
        }
    }

    /// A connection to the daemon (TLS for a TLS daemon).
    pub fn open(&self) -> ClientStream {
        open_stream(self.addr, self.tls.as_ref()).unwrap_or_else(|e| {
            panic!(
                "connecting to the daemon: {e}; stderr:\n{}",
                self.stderr_tail()
            )
        })
    }

    /// One `GET` request: `(status, body)`.
    pub fn http_get(&self, path: &str) -> (u16, String) {
        self.http_get_with(path, &[])
    }

    /// One `GET`, `None` when it cannot be made (not listening yet).
    pub(crate) fn try_http_get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = open_stream(self.addr, self.tls.as_ref()).ok()?;
        let r = exchange(&mut s, self.addr, "GET", path, "", "").ok()?;
        Some((r.status, r.body))
    }

    /// One `GET` request with extra header lines (`"Name: value"`).
    pub fn http_get_with(&self, path: &str, headers: &[&str]) -> (u16, String) {
        let (status, _, body) = self.http_request("GET", path, headers);
        (status, body)
    }

    /// One request without a body: `(status, head, body)`.
    pub fn http_request(
        &self,
        method: &str,
        path: &str,
        headers: &[&str],
    ) -> (u16, String, String) {
        let mut s = self.open();
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        let r = exchange(&mut s, self.addr, method, path, &extra, "")
            .unwrap_or_else(|e| panic!("{method} {path}: {e}; stderr:\n{}", self.stderr_tail()));
        (r.status, r.head, r.body)
    }

    /// One request with a JSON body (or none), plain HTTP: `(status, body)`.
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http_request(self.addr, method, path, Some(body))
    }

    /// `GET path`, which must answer 200 with JSON.
    pub fn get_json(&self, path: &str) -> Value {
        let (status, body) = self.http_get(path);
        assert_eq!(status, 200, "GET {path} answered {status}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }

    /// A request with a JSON body, which must answer 200 with JSON.
    pub fn json(&self, method: &str, path: &str, body: &str) -> Value {
        let (status, text) = self.request(method, path, body);
        assert_eq!(status, 200, "{method} {path}: {text}");
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"))
    }
}
