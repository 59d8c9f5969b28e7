//! Shared helpers of the end-to-end tests: start the real `moshid serve`
//! binary on an ephemeral loopback port, query its HTTP endpoints, and talk
//! to `/api/chat` with a small blocking tungstenite client that sends real
//! Ogg Opus (encoded with `moshid::codec`).
//!
//! Every wait is bounded: socket reads and writes have timeouts and every
//! loop has a deadline, so a hung daemon fails a test instead of hanging it.

#![allow(dead_code)] // each test binary uses a subset of these helpers

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use moshid::codec::{DecoderConfig, EncoderConfig, OggOpusDecoder, OggOpusEncoder, FRAME_SAMPLES};
use serde_json::Value;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// The first start writes the demo checkpoint and warms the engine up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on any single socket read or write, and on the HTTP requests.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on waiting for the daemon to be idle again.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on waiting for a session to end once its client stopped sending.
pub const SESSION_END_TIMEOUT: Duration = Duration::from_secs(30);
/// One model frame.
pub const FRAME: Duration = Duration::from_millis(80);

/// Message kinds of the chat protocol.
pub use moshid::protocol::kind;

/// A config whose sessions end by themselves shortly after their client
/// stops sending (the idle timeout is how a session ends with its
/// metadata: a client's WebSocket close ends it without any).
pub fn config_with_idle_timeout(idle_ms: u64) -> String {
    format!(r#"{{"session": {{"idle_timeout_ms": {idle_ms}}}}}"#)
}

/// Daemon starts are serialized: the first one writes the shared demo
/// checkpoint, which concurrent first starts would race on.
static START_LOCK: Mutex<()> = Mutex::new(());

/// A running `moshid serve`; dropping it stops the process.
pub struct Daemon {
    child: Child,
    pub addr: SocketAddr,
    /// The SIP endpoint's UDP address, when `sip.enabled`.
    pub sip: Option<SocketAddr>,
    /// The AudioSocket listener, when `audiosocket.enabled`.
    pub audiosocket: Option<SocketAddr>,
    stderr_path: PathBuf,
    dir: tempfile::TempDir,
    /// For a daemon with built-in TLS: how the helpers' requests trust it.
    tls: Option<Arc<rustls::ClientConfig>>,
}

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

/// One HTTP/1.1 request (`Connection: close`) with an optional body:
/// `(status, body)`.
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
    let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("HTTP connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("HTTP request");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: no response head in {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, body.to_string())
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

/// Opens a TCP connection to `addr` with the helpers' timeouts and, with
/// `tls`, completes a handshake for the name `localhost`.
pub fn open_stream(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> std::io::Result<ClientStream> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
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

impl Daemon {
    /// Starts `moshid serve --listen 127.0.0.1:0 --cache-dir <shared cache>`
    /// plus `extra_args`, with `config_json` written to a file and passed as
    /// `--config` when given; returns once the daemon prints that it listens
    /// and `/ready` answers 200.
    pub fn start(extra_args: &[&str], config_json: Option<&str>) -> Daemon {
        Self::start_inner(extra_args, config_json, None)
    }

    /// [`Daemon::start`] for a daemon with built-in TLS (the config names
    /// its certificate): the helpers' requests trust `tls`.
    pub fn start_tls(
        extra_args: &[&str],
        config_json: &str,
        tls: Arc<rustls::ClientConfig>,
    ) -> Daemon {
        Self::start_inner(extra_args, Some(config_json), Some(tls))
    }

    fn start_inner(
        extra_args: &[&str],
        config_json: Option<&str>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Daemon {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tempfile::Builder::new()
            .prefix("moshid-e2e-")
            .tempdir_in(tmp)
            .expect("creating a temp dir under CARGO_TARGET_TMPDIR");
        let cache = tmp.join("moshid-e2e-demo-cache");
        let stderr_path = dir.path().join("stderr.log");
        let stderr = File::create(&stderr_path).expect("creating the stderr log");

        let mut cmd = Command::new(env!("CARGO_BIN_EXE_moshid"));
        cmd.arg("serve")
            .args(["--listen", "127.0.0.1:0", "--cache-dir"])
            .arg(&cache);
        if let Some(json) = config_json {
            let path = dir.path().join("config.json");
            std::fs::write(&path, json).expect("writing the config file");
            cmd.arg("--config").arg(path);
        }
        cmd.args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));

        let _serialized = START_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let mut child = cmd.spawn().expect("spawning moshid serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut daemon = Daemon {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            sip: None,
            audiosocket: None,
            stderr_path,
            dir,
            tls,
        };

        // A thread reads stdout to its end (so the daemon never blocks on a
        // full pipe) and forwards the lines.
        let (tx, rx) = mpsc::channel::<String>();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + READY_TIMEOUT;
        let prefix = format!("moshid listening on {scheme}://");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(a) = line.trim().strip_prefix("audiosocket listening on ") {
                        daemon.audiosocket = Some(a.parse().unwrap_or_else(|e| {
                            panic!("bad AudioSocket address in {line:?}: {e}")
                        }));
                    }
                    // `sip listening on udp ADDR [tcp ADDR]`: the same address.
                    if let Some(a) = line.trim().strip_prefix("sip listening on udp ") {
                        let a = a.split_whitespace().next().unwrap_or("");
                        daemon.sip = Some(a.parse().unwrap_or_else(|e| {
                            panic!("bad SIP address in {line:?}: {e}")
                        }));
                    }
                    if let Some(addr) = line.trim().strip_prefix(prefix.as_str()) {
                        daemon.addr = addr.parse().unwrap_or_else(|e| {
                            panic!("bad address in {line:?}: {e}")
                        });
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = daemon.child.wait().ok();
                    panic!(
                        "moshid serve exited ({status:?}) before listening; stderr:\n{}",
                        daemon.stderr_tail()
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "moshid serve did not print its listening line within {READY_TIMEOUT:?}; stderr:\n{}",
                    daemon.stderr_tail()
                ),
            }
        }
        daemon.poll_until("/ready to answer 200", READY_TIMEOUT, |d| {
            d.http_get("/ready").0 == 200
        });
        daemon
    }

    /// `ws://ADDR/api/chat?QUERY` (no `?` when the query is empty).
    pub fn chat_url(&self, query: &str) -> String {
        if query.is_empty() {
            format!("ws://{}/api/chat", self.addr)
        } else {
            format!("ws://{}/api/chat?{query}", self.addr)
        }
    }

    /// The last few kilobytes of the daemon's stderr (for failure messages).
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let start = text.len().saturating_sub(6000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    /// The whole stderr log.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// A temp folder that lives as long as the daemon.
    pub fn temp_dir(&self) -> &Path {
        self.dir.path()
    }

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

    /// One `GET` request with extra header lines (`"Name: value"`).
    pub fn http_get_with(&self, path: &str, headers: &[&str]) -> (u16, String) {
        let (status, _, body) = self.http_request("GET", path, headers);
        (status, body)
    }

    /// One request: `(status, head, body)`.
    pub fn http_request(
        &self,
        method: &str,
        path: &str,
        headers: &[&str],
    ) -> (u16, String, String) {
        let mut s = self.open();
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{extra}\r\n",
            self.addr
        )
        .expect("HTTP request");
        let mut raw = Vec::new();
        if let Err(e) = s.read_to_end(&mut raw) {
            // The daemon closes after answering; a reset after a complete
            // answer is fine, anything else is not.
            assert!(
                !raw.is_empty(),
                "GET {path}: {e}; stderr:\n{}",
                self.stderr_tail()
            );
        }
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("GET {path}: no complete response head in {text:?}"));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("GET {path}: bad status line in {head:?}"));
        (status, head.to_string(), body.to_string())
    }

    /// `GET path`, which must answer 200 with JSON.
    pub fn get_json(&self, path: &str) -> Value {
        let (status, body) = self.http_get(path);
        assert_eq!(status, 200, "GET {path} answered {status}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }

    /// `/capacity`.
    pub fn capacity(&self) -> Value {
        self.get_json("/capacity")
    }

    /// Polls `/capacity` until no session holds anything (every
    /// `session_state` table empty, no active session); returns that
    /// snapshot. Fails after [`IDLE_TIMEOUT`] with the last one.
    pub fn wait_idle(&self) -> Value {
        let deadline = Instant::now() + IDLE_TIMEOUT;
        loop {
            let cap = self.capacity();
            if is_idle(&cap) {
                return cap;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not become idle within {IDLE_TIMEOUT:?}: {cap:#}\nstderr:\n{}",
                self.stderr_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls `/capacity` until `cond` holds (bounded by [`IDLE_TIMEOUT`]).
    pub fn wait_capacity(&self, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + IDLE_TIMEOUT;
        loop {
            let cap = self.capacity();
            if cond(&cap) {
                return cap;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {cap:#}\nstderr:\n{}",
                self.stderr_tail()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn poll_until(&self, what: &str, timeout: Duration, cond: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !cond(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; stderr:\n{}",
                self.stderr_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the daemon a signal (`"HUP"`, `"TERM"`, …).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits until stderr has a line containing every one of `needles`;
    /// returns that line.
    pub fn wait_for_log_line(&self, needles: &[&str], timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self
                .stderr()
                .lines()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return line.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needles:?} within {timeout:?}; stderr:\n{}",
                self.stderr_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The sum of the `/metrics` series `name` whose labels include every
    /// one of `labels` (`reason="busy"`), once it is at least `min` or
    /// `timeout` has passed (counters copied on a timer lag a little).
    pub fn metric_at_least(&self, name: &str, labels: &[&str], min: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let (status, page) = self.http_get("/metrics");
            assert_eq!(status, 200, "{page}");
            let sum: u64 = page
                .lines()
                .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
                .filter(|l| labels.iter().all(|want| l.contains(want)))
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                .map(|v| v as u64)
                .sum();
            if sum >= min || Instant::now() >= deadline {
                return sum;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stage `stage`'s `count` or `sum` (seconds) in `/metrics`, over every
    /// thread (not the `core="all"` total).
    pub fn stage_total(&self, stage: &str, what: &str) -> f64 {
        let (status, page) = self.http_get("/metrics");
        assert_eq!(status, 200, "{page}");
        let series = format!("moshid_stage_duration_seconds_{what}{{stage=\"{stage}\",core=\"");
        page.lines()
            .filter_map(|l| l.strip_prefix(series.as_str()))
            .filter(|l| !l.starts_with("all"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// Waits until the daemon's stderr contains `needle`; returns the log.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.stderr();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not log {needle:?} within {timeout:?}; stderr:\n{}",
                self.stderr_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the daemon with SIGTERM and returns its exit status (bounded:
    /// killed after 60 s).
    pub fn stop(mut self) -> ExitStatus {
        self.terminate(Duration::from_secs(60))
    }

    fn terminate(&mut self, grace: Duration) -> ExitStatus {
        if let Ok(Some(status)) = self.child.try_wait() {
            return status;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().expect("waiting for the killed daemon")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "---- moshid serve stderr (tail) ----\n{}\n------------------------------------",
                self.stderr_tail()
            );
        }
        self.terminate(Duration::from_secs(10));
    }
}

/// Whether a `/capacity` snapshot shows nothing held by any session.
pub fn is_idle(cap: &Value) -> bool {
    let st = &cap["session_state"];
    let zero = |v: &Value| v.as_u64() == Some(0);
    let all_zero = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(zero));
    zero(&st["held_slots"])
        && zero(&st["pending_params"])
        && zero(&st["engine_open_slots"])
        && all_zero(&st["routed_per_core"])
        && all_zero(&st["pending_closes_per_core"])
        && zero(&cap["capacity"]["active_sessions"])
        && cap["capacity"]["free_slots"] == cap["capacity"]["max_slots"]
}

/// A deterministic test signal of `n` frames: a tone around `220 + 37·variant`
/// Hz with a slow vibrato, a harmonic and an amplitude envelope.
pub fn signal(variant: u32, n: usize) -> Vec<[f32; FRAME_SAMPLES]> {
    let f0 = 220.0 + 37.0 * variant as f64;
    let mut phase = 0.0f64;
    (0..n)
        .map(|i| {
            let mut frame = [0.0f32; FRAME_SAMPLES];
            for (j, x) in frame.iter_mut().enumerate() {
                let t = (i * FRAME_SAMPLES + j) as f64 / 24_000.0;
                let f = f0 * (1.0 + 0.05 * (2.0 * std::f64::consts::PI * 3.0 * t).sin());
                phase += 2.0 * std::f64::consts::PI * f / 24_000.0;
                let env = 0.5 + 0.5 * (2.0 * std::f64::consts::PI * 0.7 * t).sin().abs();
                *x = (0.3 * env * (phase.sin() + 0.3 * (2.0 * phase).sin())) as f32;
            }
            frame
        })
        .collect()
}

/// How a client paces its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Frame `i` goes at `start + i · 80 ms`.
    RealTime,
    /// As fast as the socket takes them (the daemon applies backpressure).
    Burst,
}

/// Everything a client received, in order.
#[derive(Debug, Default, Clone)]
pub struct SessionLog {
    /// Kind byte of every binary message, in arrival order.
    pub kinds: Vec<u8>,
    /// Payload (Ogg bytes) of every audio message.
    pub audio_payloads: Vec<Vec<u8>>,
    /// PCM decoded from each audio message (untrimmed, as sphn decodes).
    pub audio_pcm: Vec<Vec<f32>>,
    /// Text pieces.
    pub texts: Vec<String>,
    /// The metadata message's JSON, if one came.
    pub metadata: Option<Value>,
    /// Error messages.
    pub errors: Vec<String>,
    /// Text (non-binary) WebSocket messages received.
    pub text_messages: usize,
    /// Whether the server closed the connection (close frame or EOF).
    pub closed: bool,
    /// The server's close frame, if any.
    pub close_frame: Option<(CloseCode, String)>,
    /// A transport error that ended the connection (reset etc.).
    pub transport_error: Option<String>,
    /// When each frame was sent.
    pub sent_at: Vec<Instant>,
    /// When each audio message arrived.
    pub audio_arrivals: Vec<Instant>,
}

impl SessionLog {
    /// `metadata.session`.
    pub fn session(&self) -> &Value {
        match &self.metadata {
            Some(m) => &m["session"],
            None => panic!("no metadata received: {}", self.summary()),
        }
    }

    /// `metadata.session.end_reason.kind`.
    pub fn end_kind(&self) -> Option<&str> {
        self.metadata.as_ref()?["session"]["end_reason"]["kind"].as_str()
    }

    /// A one-line description for failure messages.
    pub fn summary(&self) -> String {
        format!(
            "{} audio, {} text, metadata {:?}, errors {:?}, closed {} ({:?}), transport error {:?}",
            self.audio_payloads.len(),
            self.texts.len(),
            self.metadata.as_ref().map(|m| m.to_string()),
            self.errors,
            self.closed,
            self.close_frame,
            self.transport_error
        )
    }

    /// All decoded PCM, concatenated.
    pub fn pcm(&self) -> Vec<f32> {
        self.audio_pcm.concat()
    }

    /// Checks a session that sent `frames_in` frames and then ended by the
    /// idle timeout: one 80 ms audio message per frame after the first, in
    /// order (consecutive Ogg pages, granule +1920 per page), text only after
    /// audio, the metadata after every audio message, with the right counts.
    pub fn assert_complete(&self, frames_in: usize, who: &str) {
        let n_out = frames_in - 1;
        assert_eq!(
            self.audio_payloads.len(),
            n_out,
            "{who}: expected {n_out} audio messages for {frames_in} frames: {}",
            self.summary()
        );
        for (i, pcm) in self.audio_pcm.iter().enumerate() {
            assert_eq!(
                pcm.len(),
                FRAME_SAMPLES,
                "{who}: audio message {i} decodes to {} samples",
                pcm.len()
            );
        }
        assert_audio_in_order(&self.audio_payloads, who);
        assert!(
            self.texts.len() <= n_out,
            "{who}: more text pieces than frames: {}",
            self.summary()
        );
        // Text follows the audio of its frame; the metadata comes after all audio.
        let first_audio = self.kinds.iter().position(|&k| k == kind::AUDIO);
        let first_text = self.kinds.iter().position(|&k| k == kind::TEXT);
        if let (Some(t), Some(a)) = (first_text, first_audio) {
            assert!(a < t, "{who}: text before any audio: {:?}", self.kinds);
        }
        let meta_at = self.kinds.iter().position(|&k| k == kind::METADATA);
        let last_audio = self.kinds.iter().rposition(|&k| k == kind::AUDIO);
        assert!(
            meta_at.is_some() && meta_at > last_audio,
            "{who}: metadata missing or before the last audio: {:?}",
            self.kinds
        );
        let s = self.session();
        assert_eq!(s["frames_in"], frames_in as u64, "{who}: {s}");
        assert_eq!(s["frames_out"], n_out as u64, "{who}: {s}");
        assert_eq!(s["frames_dropped"], 0, "{who}: {s}");
        assert_eq!(s["text_tokens"], n_out as u64, "{who}: {s}");
        assert_eq!(
            self.end_kind(),
            Some("idle_timeout"),
            "{who}: session did not end by the idle timeout: {}",
            self.summary()
        );
        assert!(self.closed, "{who}: not closed: {}", self.summary());
    }
}

/// The `(granule position, page sequence number)` of every Ogg page in `bytes`.
pub fn ogg_pages(bytes: &[u8]) -> Vec<(u64, u32)> {
    let mut pages = Vec::new();
    let mut at = 0;
    while at + 27 <= bytes.len() {
        assert_eq!(&bytes[at..at + 4], b"OggS", "not an Ogg page at byte {at}");
        let granule = u64::from_le_bytes(bytes[at + 6..at + 14].try_into().unwrap());
        let seq = u32::from_le_bytes(bytes[at + 18..at + 22].try_into().unwrap());
        let nseg = bytes[at + 26] as usize;
        let body: usize = bytes[at + 27..at + 27 + nseg]
            .iter()
            .map(|&b| b as usize)
            .sum();
        pages.push((granule, seq));
        at += 27 + nseg + body;
    }
    assert_eq!(at, bytes.len(), "trailing bytes after the last Ogg page");
    pages
}

/// Audio messages are whole Ogg pages whose sequence numbers are consecutive
/// and whose granule grows by one 40 ms packet (1920 at 48 kHz) per audio page.
pub fn assert_audio_in_order(payloads: &[Vec<u8>], who: &str) {
    let mut next_seq = 0u32;
    let mut granule = 0u64;
    for (i, p) in payloads.iter().enumerate() {
        for (g, seq) in ogg_pages(p) {
            assert_eq!(seq, next_seq, "{who}: audio message {i}: page out of order");
            next_seq += 1;
            if g != 0 {
                assert_eq!(g, granule + 1920, "{who}: audio message {i}: granule jump");
                granule = g;
            }
        }
    }
}

/// Opens a WebSocket to `/api/chat?query` (TCP connect and upgrade only).
pub fn connect_ws(addr: SocketAddr, query: &str) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("TCP connect");
    stream.set_nodelay(true).unwrap();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let url = if query.is_empty() {
        format!("ws://{addr}/api/chat")
    } else {
        format!("ws://{addr}/api/chat?{query}")
    };
    match tungstenite::client(url.as_str(), stream) {
        Ok((ws, _response)) => ws,
        Err(e) => panic!("WebSocket upgrade of {url} failed: {e}"),
    }
}

/// Reads the next binary message (bounded by the socket's read timeout);
/// `None` when the server closed instead.
pub fn next_binary(ws: &mut WebSocket<TcpStream>) -> Option<Vec<u8>> {
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) => return Some(b.to_vec()),
            Ok(Message::Close(_)) => return None,
            Ok(Message::Text(t)) => panic!("unexpected text message {t:?}"),
            Ok(_) => {}
            Err(e) if is_closed(&e) => return None,
            Err(e) => panic!("reading from the daemon: {e}"),
        }
    }
}

fn would_block(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io)
        if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

fn is_closed(e: &tungstenite::Error) -> bool {
    use tungstenite::error::ProtocolError;
    match e {
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => true,
        tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => true,
        tungstenite::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// Why a session was not started.
#[derive(Debug)]
pub enum NotStarted {
    /// An error message came instead of the handshake.
    Refused(String),
    /// The connection closed before anything came.
    Closed,
    /// Some other first message.
    Unexpected(Vec<u8>),
}

/// Runs `n` clients on threads that all start (connect and are admitted)
/// before any of them runs, so that their frames overlap. A client that
/// cannot start (a refusal, a dead daemon) fails the test with its own
/// panic instead of leaving the others waiting for it forever.
pub fn start_together<C, R>(
    n: usize,
    start: impl Fn(usize) -> C + Send + Sync + 'static,
    run: impl Fn(usize, C) -> R + Send + Sync + 'static,
) -> Vec<R>
where
    R: Send + 'static,
{
    let start = Arc::new(start);
    let run = Arc::new(run);
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let mut go = Vec::with_capacity(n);
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (go_tx, go_rx) = mpsc::channel::<()>();
            go.push(go_tx);
            let (start, run, started_tx) = (start.clone(), run.clone(), started_tx.clone());
            thread::spawn(move || {
                let client = start(i);
                let _ = started_tx.send(());
                // A closed channel: another client failed to start.
                go_rx.recv().ok().map(|()| run(i, client))
            })
        })
        .collect();
    drop(started_tx);
    let mut started = 0;
    while started < n {
        match started_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(()) => started += 1,
            // A thread that ended before it started has panicked: its
            // join below reports why.
            Err(_) if threads.iter().any(|t| t.is_finished()) => break,
            Err(_) => {}
        }
    }
    if started == n {
        for g in &go {
            let _ = g.send(());
        }
    }
    drop(go);
    let results: Vec<Option<R>> = threads
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.join().unwrap_or_else(|_| panic!("client {i} failed")))
        .collect();
    results
        .into_iter()
        .map(|r| r.expect("every client started"))
        .collect()
}

/// A minimal chat client on one blocking socket: sends real Ogg Opus,
/// records what comes back in a [`SessionLog`].
pub struct ChatClient {
    ws: WebSocket<TcpStream>,
    encoder: OggOpusEncoder,
    buf: Vec<u8>,
    decoder: OggOpusDecoder,
    pub log: SessionLog,
    pub frames_sent: usize,
}

impl ChatClient {
    /// Connects and waits for the handshake, which must be the first message.
    pub fn connect(addr: SocketAddr, query: &str) -> Result<ChatClient, NotStarted> {
        let mut ws = connect_ws(addr, query);
        match next_binary(&mut ws) {
            Some(m) if m == [kind::HANDSHAKE] => Ok(Self::new(ws)),
            Some(m) if m.first() == Some(&kind::ERROR) => {
                // Let the close handshake finish, bounded.
                let _ = next_binary(&mut ws);
                Err(NotStarted::Refused(
                    String::from_utf8_lossy(&m[1..]).into_owned(),
                ))
            }
            Some(m) => Err(NotStarted::Unexpected(m)),
            None => Err(NotStarted::Closed),
        }
    }

    /// [`ChatClient::connect`], which must succeed.
    pub fn start(addr: SocketAddr, query: &str) -> ChatClient {
        Self::connect(addr, query).unwrap_or_else(|e| panic!("session not started: {e:?}"))
    }

    fn new(ws: WebSocket<TcpStream>) -> Self {
        let encoder = OggOpusEncoder::new(EncoderConfig::default()).expect("encoder");
        let buf = vec![0u8; 1 + encoder.max_output_bytes_per_frame()];
        let decoder = OggOpusDecoder::new(DecoderConfig {
            trim_pre_skip: false,
            ..DecoderConfig::default()
        })
        .expect("decoder");
        ChatClient {
            ws,
            encoder,
            buf,
            decoder,
            log: SessionLog::default(),
            frames_sent: 0,
        }
    }

    /// The Ogg bytes of the next frame of this client's stream (headers
    /// included on the first call), without sending them.
    pub fn encode(&mut self, frame: &[f32; FRAME_SAMPLES]) -> Vec<u8> {
        let n = self
            .encoder
            .encode_frame(frame, &mut self.buf)
            .expect("encoding a frame");
        self.buf[..n].to_vec()
    }

    /// Sends one frame as a 0x01 message.
    pub fn send_frame(&mut self, frame: &[f32; FRAME_SAMPLES]) {
        let ogg = self.encode(frame);
        let mut msg = Vec::with_capacity(1 + ogg.len());
        msg.push(kind::AUDIO);
        msg.extend_from_slice(&ogg);
        self.send(Message::Binary(msg.into()));
        self.log.sent_at.push(Instant::now());
        self.frames_sent += 1;
    }

    /// Sends one binary message as is.
    pub fn send_raw(&mut self, bytes: Vec<u8>) {
        self.send(Message::Binary(bytes.into()));
    }

    /// Sends any WebSocket message (blocking, bounded by the write timeout).
    pub fn send(&mut self, msg: Message) {
        if let Err(e) = self.try_send(msg) {
            panic!("sending to the daemon: {e}; so far: {}", self.log.summary());
        }
    }

    /// Sends a message; errors are returned (the daemon may have closed).
    pub fn try_send(&mut self, msg: Message) -> Result<(), tungstenite::Error> {
        self.ws
            .get_ref()
            .set_write_timeout(Some(IO_TIMEOUT))
            .unwrap();
        self.ws.send(msg)
    }

    /// Sends `frames` at `pace`, reading whatever comes meanwhile. Stops
    /// sending early (without failing) if the server closes.
    pub fn send_frames(&mut self, frames: &[[f32; FRAME_SAMPLES]], pace: Pace) {
        let start = Instant::now();
        for (i, frame) in frames.iter().enumerate() {
            if pace == Pace::RealTime {
                let due = start + FRAME * i as u32;
                self.receive_until(due);
            } else {
                self.receive_until(Instant::now());
            }
            if self.log.closed {
                return;
            }
            self.send_frame(frame);
        }
    }

    /// Reads messages until `deadline` or until the connection is closed.
    pub fn receive_until(&mut self, deadline: Instant) {
        while !self.log.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            // A zero timeout means "block forever" to std: poll for 1 ms at least.
            let wait = left.clamp(Duration::from_millis(1), Duration::from_millis(50));
            self.ws.get_ref().set_read_timeout(Some(wait)).unwrap();
            match self.ws.read() {
                Ok(msg) => self.on_message(msg),
                Err(e) if would_block(&e) => {}
                Err(e) if is_closed(&e) => self.log.closed = true,
                Err(e) => {
                    self.log.transport_error = Some(e.to_string());
                    self.log.closed = true;
                }
            }
            if left.is_zero() {
                break;
            }
        }
    }

    /// Reads until the server closes the connection; fails after `timeout`.
    pub fn wait_closed(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.receive_until(deadline);
        assert!(
            self.log.closed,
            "the daemon did not end the session within {timeout:?}: {}",
            self.log.summary()
        );
    }

    /// Sends `frames` at `pace`, then waits for the daemon to end the session
    /// (idle timeout) and returns the log.
    pub fn run(mut self, frames: &[[f32; FRAME_SAMPLES]], pace: Pace) -> SessionLog {
        self.send_frames(frames, pace);
        self.wait_closed(SESSION_END_TIMEOUT);
        self.log
    }

    /// Drops the TCP connection without a WebSocket close.
    pub fn drop_connection(self) {
        let _ = self.ws.get_ref().shutdown(Shutdown::Both);
    }

    /// Closes with a WebSocket close frame and waits (bounded) for the answer.
    pub fn close(mut self) {
        let _ = self.ws.close(None);
        let deadline = Instant::now() + Duration::from_secs(5);
        self.receive_until(deadline);
    }

    fn on_message(&mut self, msg: Message) {
        match msg {
            Message::Binary(data) => {
                let Some((&k, payload)) = data.split_first() else {
                    return;
                };
                self.log.kinds.push(k);
                match k {
                    kind::AUDIO => {
                        self.decoder
                            .push_bytes(payload)
                            .expect("decoding server audio");
                        let mut pcm = Vec::new();
                        while let Some(p) = self.decoder.next_pcm().expect("decoding server audio")
                        {
                            pcm.extend_from_slice(p);
                        }
                        self.log.audio_arrivals.push(Instant::now());
                        self.log.audio_payloads.push(payload.to_vec());
                        self.log.audio_pcm.push(pcm);
                    }
                    kind::TEXT => self
                        .log
                        .texts
                        .push(String::from_utf8(payload.to_vec()).expect("UTF-8 text piece")),
                    kind::METADATA => {
                        assert!(self.log.metadata.is_none(), "two metadata messages");
                        self.log.metadata =
                            Some(serde_json::from_slice(payload).expect("metadata is JSON"));
                    }
                    kind::ERROR => self
                        .log
                        .errors
                        .push(String::from_utf8_lossy(payload).into_owned()),
                    _ => {}
                }
            }
            Message::Text(_) => self.log.text_messages += 1,
            Message::Close(frame) => {
                self.log.close_frame = frame.map(|f| (f.code, f.reason.to_string()));
                // Let tungstenite send its close reply; the server then drops
                // the connection.
                let _ = self.ws.flush();
                self.log.closed = true;
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
    }
}
