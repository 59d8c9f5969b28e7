//! The chat endpoint (`/api/chat`) from a client's side: opening a session
//! (TCP, WebSocket upgrade, the handshake or a refusal) for tests and the
//! load generator alike, and [`ChatClient`], a blocking client on one socket
//! that sends real Ogg Opus and records everything that comes back in a
//! [`SessionLog`].
//!
//! Message kinds are the protocol's ([`moshid::protocol`]); errors
//! are classified as `moshid client` classifies them
//! ([`moshid::client::would_block`], [`moshid::client::is_closed`]).
//!
//! Invariants: every read and write is bounded (socket timeouts, deadlines);
//! a session that does not start says why ([`NotStarted`]) instead of
//! hanging; received audio is decoded untrimmed, as sphn decodes it, so
//! each 80 ms frame decodes to [`FRAME_SAMPLES`] samples.

use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use moshid::client::{is_closed, would_block};
use moshid::codec::{DecoderConfig, EncoderConfig, OggOpusDecoder, OggOpusEncoder, FRAME_SAMPLES};
use moshid::protocol::END_OF_INPUT_MESSAGE;
use serde_json::Value;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

use crate::ogg::assert_audio_in_order;
use crate::{FRAME, IO_TIMEOUT, SESSION_END_TIMEOUT};

/// Kind bytes of the chat protocol, as `u8` for building and matching raw
/// messages: the protocol's own.
pub use moshid::protocol::kind;

/// A chat WebSocket over plain TCP.
pub type ChatSocket = WebSocket<TcpStream>;

/// Why a session was not started.
#[derive(Debug)]
pub enum NotStarted {
    /// An error message came instead of the handshake, or the upgrade was
    /// refused with an HTTP error (`HTTP 503: …`).
    Refused(String),
    /// The connection closed before anything came.
    Closed,
    /// Some other first message.
    Unexpected(Vec<u8>),
    /// The connection, the upgrade or the wait failed (timeout, reset…).
    Failed(String),
}

/// The HTTP address of a `ws://HOST:PORT/…` URL.
pub fn url_addr(url: &str) -> Result<SocketAddr, String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority} has no address"))
}

/// TCP connect and WebSocket upgrade of `url` (reads bounded by
/// `timeout`); an HTTP error answer to the upgrade is a refusal.
pub fn upgrade(url: &str, timeout: Duration) -> Result<ChatSocket, NotStarted> {
    let addr = url_addr(url).map_err(NotStarted::Failed)?;
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| NotStarted::Failed(format!("connecting to {addr}: {e}")))?;
    let setup = |s: &TcpStream| -> std::io::Result<()> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))
    };
    setup(&stream).map_err(|e| NotStarted::Failed(e.to_string()))?;
    match tungstenite::client(url, stream) {
        Ok((ws, _response)) => Ok(ws),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => {
            let body = r
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).trim().to_string())
                .unwrap_or_default();
            Err(NotStarted::Refused(format!("HTTP {}: {body}", r.status())))
        }
        Err(e) => Err(NotStarted::Failed(format!(
            "WebSocket upgrade of {url}: {e}"
        ))),
    }
}

/// Reads the session's first message, which must come before `deadline`:
/// `Ok` for the handshake, a refusal for an error message.
pub fn await_handshake(ws: &mut ChatSocket, deadline: Instant) -> Result<(), NotStarted> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NotStarted::Failed("no session handshake in time".into()));
        }
        ws.get_ref()
            .set_read_timeout(Some(left))
            .map_err(|e| NotStarted::Failed(e.to_string()))?;
        match ws.read() {
            Ok(Message::Binary(m)) => {
                return match m.split_first() {
                    Some((&kind::HANDSHAKE, [])) => Ok(()),
                    Some((&kind::ERROR, why)) => {
                        let why = String::from_utf8_lossy(why).into_owned();
                        // Let the close handshake finish, bounded.
                        let _ = next_binary_within(ws, Duration::from_secs(5));
                        Err(NotStarted::Refused(why))
                    }
                    _ => Err(NotStarted::Unexpected(m.to_vec())),
                };
            }
            Ok(Message::Close(_)) => return Err(NotStarted::Closed),
            Ok(_) => {}
            Err(e) if would_block(&e) => {}
            Err(e) if is_closed(&e) => return Err(NotStarted::Closed),
            Err(e) => return Err(NotStarted::Failed(format!("before the handshake: {e}"))),
        }
    }
}

/// Opens a session on `url` (a `ws://` URL): upgrade and handshake, all
/// within `timeout`.
pub fn open_session(url: &str, timeout: Duration) -> Result<ChatSocket, NotStarted> {
    let deadline = Instant::now() + timeout;
    let mut ws = upgrade(url, timeout)?;
    await_handshake(&mut ws, deadline)?;
    Ok(ws)
}

/// `ws://ADDR/api/chat?QUERY` (no `?` when the query is empty).
pub fn chat_url(addr: SocketAddr, query: &str) -> String {
    if query.is_empty() {
        format!("ws://{addr}/api/chat")
    } else {
        format!("ws://{addr}/api/chat?{query}")
    }
}

/// Opens a WebSocket to `/api/chat?query` (TCP connect and upgrade only);
/// panics when that fails.
pub fn connect_ws(addr: SocketAddr, query: &str) -> ChatSocket {
    let url = chat_url(addr, query);
    match upgrade(&url, IO_TIMEOUT) {
        Ok(ws) => ws,
        Err(e) => panic!("WebSocket upgrade of {url} failed: {e:?}"),
    }
}

/// Reads the next binary message (bounded by the socket's read timeout);
/// `None` when the server closed instead.
pub fn next_binary(ws: &mut ChatSocket) -> Option<Vec<u8>> {
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

/// [`next_binary`] with a read timeout of `timeout`; `None` also when
/// nothing came.
fn next_binary_within(ws: &mut ChatSocket, timeout: Duration) -> Option<Vec<u8>> {
    ws.get_ref().set_read_timeout(Some(timeout)).ok()?;
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) => return Some(b.to_vec()),
            Ok(Message::Close(_)) | Ok(Message::Text(_)) => return None,
            Ok(_) => {}
            Err(_) => return None,
        }
    }
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
    /// Whether a close frame came at all (with or without a code): the
    /// closing handshake was completed rather than the connection dropped.
    pub close_received: bool,
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

    /// The close frame's reason, if one came.
    pub fn close_reason(&self) -> Option<&str> {
        self.close_frame.as_ref().map(|(_, r)| r.as_str())
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

/// A minimal chat client on one blocking socket: sends real Ogg Opus,
/// records what comes back in a [`SessionLog`].
pub struct ChatClient {
    ws: ChatSocket,
    encoder: OggOpusEncoder,
    buf: Vec<u8>,
    decoder: OggOpusDecoder,
    pub log: SessionLog,
    pub frames_sent: usize,
}

impl ChatClient {
    /// Connects and waits for the handshake, which must be the first
    /// message. A connection that cannot be made at all fails the test.
    pub fn connect(addr: SocketAddr, query: &str) -> Result<ChatClient, NotStarted> {
        let mut ws = connect_ws(addr, query);
        match await_handshake(&mut ws, Instant::now() + IO_TIMEOUT) {
            Ok(()) => Ok(Self::new(ws)),
            Err(NotStarted::Failed(why)) => panic!("starting a session on {addr}: {why}"),
            Err(e) => Err(e),
        }
    }

    /// [`ChatClient::connect`], which must succeed.
    pub fn start(addr: SocketAddr, query: &str) -> ChatClient {
        Self::connect(addr, query).unwrap_or_else(|e| panic!("session not started: {e:?}"))
    }

    fn new(ws: ChatSocket) -> Self {
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

    /// Sends one frame as an audio message.
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

    /// Says the input is over (control message, end of input).
    pub fn send_end_of_input(&mut self) {
        self.send_raw(END_OF_INPUT_MESSAGE.to_vec());
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

    /// Closes with a WebSocket close frame, waits (bounded) for the answer
    /// and returns the log (`close_received` says whether the daemon
    /// completed the closing handshake).
    pub fn close(mut self) -> SessionLog {
        let _ = self.ws.close(None);
        let deadline = Instant::now() + Duration::from_secs(5);
        self.receive_until(deadline);
        self.log
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
                        let pcm = moshid::client::decode_audio(&mut self.decoder, payload)
                            .expect("decoding server audio");
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
                self.log.close_received = true;
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
