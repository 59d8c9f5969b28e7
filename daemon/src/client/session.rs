//! A blocking connection to a moshid (or any Kyutai-protocol) chat endpoint.
//!
//! # Threads
//! [`ChatConnection::connect`] opens the TCP stream, does the WebSocket upgrade
//! and waits for the server's handshake message on the caller's thread. It
//! then hands the socket to one I/O thread (`moshid-client-io`) that owns it
//! for the rest of the session; the caller keeps two halves that talk to that
//! thread through channels and can be used from two threads at once
//! ([`ChatConnection::split`]):
//! - [`ChatSender`] encodes frames to Ogg Opus on the calling thread and queues
//!   the messages on a bounded channel (`SEND_QUEUE_MESSAGES` deep). The I/O
//!   thread takes queued messages only once the socket has accepted the
//!   previous ones, so a server that reads slowly blocks `send_frame` (this is
//!   how "as fast as the server admits" works) while reading goes on.
//! - [`ChatReceiver`] takes [`ServerEvent`]s from an unbounded channel that
//!   the I/O thread fills as messages arrive (audio is decoded there).
//!
//! The I/O thread alternates between writing what is queued and reading with
//! a short socket timeout (`POLL_INTERVAL`, 2 ms): incoming messages are
//! handled as soon as they arrive, and a queued frame waits at most one poll
//! interval before it is written. A tungstenite `WebSocket` cannot be split
//! into independent read and write halves, which is why one thread owns it.
//!
//! # Invariants
//! - Events come in the order the server sent the messages; one [`ServerEvent::Audio`]
//!   holds the PCM decoded from one audio message (none for header-only ones).
//! - Unknown kinds, control, ping, handshake repeats, empty and text WebSocket
//!   messages are ignored.
//! - [`ServerEvent::Closed`] comes last, exactly once from the I/O thread, and
//!   `recv_event` keeps returning it afterwards. A transport or codec error is
//!   delivered as `Err` just before it.
//! - Dropping or closing the sender closes the connection (WebSocket close
//!   handshake, at most `CLOSE_GRACE` of waiting for the server's answer).
//! - Received audio is decoded without trimming the Opus pre-skip, as the
//!   official client (sphn) does, so each 80 ms frame the server encodes
//!   decodes to exactly [`FRAME_SAMPLES`] samples.

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;
use tungstenite::error::ProtocolError;
use tungstenite::handshake::HandshakeError;
use tungstenite::http::Uri;
use tungstenite::{Message, WebSocket};

use super::ClientError;
use crate::codec::{
    CodecError, DecoderConfig, EncoderConfig, OggOpusDecoder, OggOpusEncoder, FRAME_SAMPLES,
};
use crate::protocol::{split_message, MessageKind};

/// Path of the chat endpoint, used when a URL has none.
pub const DEFAULT_CHAT_PATH: &str = "/api/chat";
/// Socket read timeout of the I/O thread: the longest a queued message waits.
const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// How long closing waits for the server to answer the close handshake.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Messages queued between the sender and the I/O thread (320 ms of audio).
const SEND_QUEUE_MESSAGES: usize = 4;
/// Audio payloads are fed to the decoder in pieces of at most this size, so
/// that any message size fits its buffer.
const DECODER_PUSH_BYTES: usize = 32 * 1024;

/// What the server sent, as the receiver sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// 24 kHz mono PCM decoded from one audio message.
    Audio(Vec<f32>),
    /// A piece of text, as sent (pieces are not separated by spaces).
    Text(String),
    /// A metadata message's JSON (a string value if it is not valid JSON).
    Metadata(Value),
    /// The server's error message; the server closes the connection after it.
    Error(String),
    /// The connection is closed; nothing follows.
    Closed,
}

enum Outgoing {
    Message(Vec<u8>),
    Close,
}

type EventResult = Result<ServerEvent, ClientError>;

/// A chat session: a sender and a receiver on one WebSocket (see module docs).
pub struct ChatConnection {
    sender: ChatSender,
    receiver: ChatReceiver,
    io_thread: Option<JoinHandle<()>>,
    url: String,
}

/// The sending half: encodes and queues audio frames.
pub struct ChatSender {
    encoder: OggOpusEncoder,
    buf: Vec<u8>,
    outgoing: SyncSender<Outgoing>,
    frames_sent: u64,
}

/// The receiving half: server events in arrival order.
pub struct ChatReceiver {
    events: Receiver<EventResult>,
    closed: bool,
}

impl ChatConnection {
    /// Connects to `url` with `params` appended to its query string (see
    /// [`chat_url`]), and returns once the server's handshake message has come.
    /// `timeout` bounds the whole of it: TCP connect, upgrade and handshake.
    /// An error message instead of the handshake (e.g. the server is full)
    /// is returned as [`ClientError::Rejected`].
    pub fn connect(
        url: &str,
        params: &[(String, String)],
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let url = chat_url(url, params)?;
        let deadline = Instant::now() + timeout;
        let uri: Uri = url.parse().map_err(|e| ClientError::InvalidUrl {
            url: url.clone(),
            reason: format!("{e}"),
        })?;
        let display = display_url(&uri);
        let host = uri.host().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(80);

        let stream = connect_tcp(&display, host, port, deadline, timeout)?;
        stream.set_nodelay(true)?;
        set_timeouts(&stream, remaining(deadline))?;
        let (mut ws, _response) = match tungstenite::client(url.as_str(), stream) {
            Ok(ok) => ok,
            Err(HandshakeError::Interrupted(_)) => {
                return Err(ClientError::Timeout {
                    what: "waiting for the WebSocket upgrade",
                    after: timeout,
                })
            }
            Err(HandshakeError::Failure(e)) => return Err(upgrade_failure(&display, e)),
        };

        let (event_tx, event_rx) = mpsc::channel();
        let mut decoder = OggOpusDecoder::new(DecoderConfig {
            trim_pre_skip: false,
            ..DecoderConfig::default()
        })?;
        wait_for_handshake(
            &mut ws,
            &mut decoder,
            &event_tx,
            &display,
            deadline,
            timeout,
        )?;

        set_timeouts(ws.get_ref(), POLL_INTERVAL)?;
        let encoder = OggOpusEncoder::new(EncoderConfig::default())?;
        let mut buf = vec![0u8; 1 + encoder.max_output_bytes_per_frame()];
        buf[0] = MessageKind::Audio.byte();
        let (out_tx, out_rx) = mpsc::sync_channel(SEND_QUEUE_MESSAGES);
        let io_thread = thread::Builder::new()
            .name("moshid-client-io".into())
            .spawn(move || io_thread_main(ws, decoder, out_rx, event_tx))?;
        Ok(Self {
            sender: ChatSender {
                encoder,
                buf,
                outgoing: out_tx,
                frames_sent: 0,
            },
            receiver: ChatReceiver {
                events: event_rx,
                closed: false,
            },
            io_thread: Some(io_thread),
            url: display,
        })
    }

    /// The endpoint, without its query string.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// See [`ChatSender::send_frame`].
    pub fn send_frame(&mut self, frame: &[f32; FRAME_SAMPLES]) -> Result<(), ClientError> {
        self.sender.send_frame(frame)
    }

    /// See [`ChatSender::send_message`].
    pub fn send_message(&mut self, message: Vec<u8>) -> Result<(), ClientError> {
        self.sender.send_message(message)
    }

    /// Frames sent so far.
    pub fn frames_sent(&self) -> u64 {
        self.sender.frames_sent
    }

    /// See [`ChatReceiver::recv_event`].
    pub fn recv_event(&mut self, timeout: Duration) -> Result<Option<ServerEvent>, ClientError> {
        self.receiver.recv_event(timeout)
    }

    /// The two halves, for a sender thread and a receiver thread. The I/O
    /// thread ends by itself once the connection is closed.
    pub fn split(self) -> (ChatSender, ChatReceiver) {
        (self.sender, self.receiver)
    }

    /// Closes the connection: sends a WebSocket close once everything queued
    /// is written, and returns the events that still came until the server
    /// closed too (at most about twice `CLOSE_GRACE`; `Closed` itself is not
    /// included, nor transport errors). Joins the I/O thread when it has ended.
    pub fn close(self) -> Vec<ServerEvent> {
        let Self {
            sender,
            mut receiver,
            io_thread,
            ..
        } = self;
        sender.close();
        let mut trailing = Vec::new();
        let deadline = Instant::now() + 2 * CLOSE_GRACE;
        while !receiver.closed {
            let left = remaining(deadline);
            if left.is_zero() {
                break;
            }
            match receiver.recv_event(left) {
                Ok(Some(ServerEvent::Closed)) | Ok(None) | Err(_) => {}
                Ok(Some(event)) => trailing.push(event),
            }
        }
        if receiver.closed {
            if let Some(io_thread) = io_thread {
                let _ = io_thread.join();
            }
        }
        trailing
    }
}

impl ChatSender {
    /// Encodes one 80 ms frame and queues it as an audio message; blocks while
    /// the queue is full (the server is not taking audio as fast as it comes).
    pub fn send_frame(&mut self, frame: &[f32; FRAME_SAMPLES]) -> Result<(), ClientError> {
        let len = self.encoder.encode_frame(frame, &mut self.buf[1..])?;
        let message = self.buf[..=len].to_vec();
        self.send_message(message)?;
        self.frames_sent += 1;
        Ok(())
    }

    /// Queues a raw protocol message (kind byte first); for tests and tools.
    pub fn send_message(&mut self, message: Vec<u8>) -> Result<(), ClientError> {
        self.outgoing
            .send(Outgoing::Message(message))
            .map_err(|_| ClientError::Disconnected)
    }

    /// Frames sent so far.
    pub fn frames_sent(&self) -> u64 {
        self.frames_sent
    }

    /// Starts the close handshake once everything queued has been written.
    pub fn close(self) {
        let _ = self.outgoing.send(Outgoing::Close);
    }
}

impl ChatReceiver {
    /// The next event, waiting at most `timeout` (`Ok(None)` when none came).
    /// After [`ServerEvent::Closed`] it returns `Closed` again at once.
    pub fn recv_event(&mut self, timeout: Duration) -> Result<Option<ServerEvent>, ClientError> {
        if self.closed {
            return Ok(Some(ServerEvent::Closed));
        }
        match self.events.recv_timeout(timeout) {
            Ok(Ok(ServerEvent::Closed)) | Err(RecvTimeoutError::Disconnected) => {
                self.closed = true;
                Ok(Some(ServerEvent::Closed))
            }
            Ok(Ok(event)) => Ok(Some(event)),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(None),
        }
    }

    /// Whether [`ServerEvent::Closed`] has been returned.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

/// The URL to connect to: `base` with `params` appended to its query string,
/// percent-encoded. `base` may omit the scheme (`ws://` is assumed; `http://`
/// is taken as `ws://`) and the path ([`DEFAULT_CHAT_PATH`] is used). TLS
/// (`wss://`) is not supported.
pub fn chat_url(base: &str, params: &[(String, String)]) -> Result<String, ClientError> {
    let base = base.trim();
    let invalid = |reason: &str| ClientError::InvalidUrl {
        url: base.to_string(),
        reason: reason.to_string(),
    };
    let rest = match base.split_once("://") {
        None => base,
        Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
            "ws" | "http" => rest,
            "wss" | "https" => {
                return Err(invalid(
                    "TLS (wss://) is not supported; use ws:// (e.g. through a local tunnel)",
                ))
            }
            _ => return Err(invalid("the scheme must be ws://")),
        },
    };
    let uri: Uri = format!("ws://{rest}")
        .parse()
        .map_err(|e| invalid(&format!("{e}")))?;
    let authority = uri
        .authority()
        .filter(|a| !a.host().is_empty())
        .ok_or_else(|| invalid("no host"))?;
    let path = match uri.path() {
        "" | "/" => DEFAULT_CHAT_PATH,
        path => path,
    };
    let mut query = uri.query().unwrap_or_default().to_string();
    for (key, value) in params {
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str(&percent_encode(key));
        query.push('=');
        query.push_str(&percent_encode(value));
    }
    let mut url = format!("ws://{authority}{path}");
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query);
    }
    Ok(url)
}

/// Percent-encodes everything but RFC 3986 unreserved characters (a
/// query key or value).
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn display_url(uri: &Uri) -> String {
    match uri.authority() {
        Some(authority) => format!("ws://{authority}{}", uri.path()),
        None => uri.to_string(),
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Sets both socket timeouts (a zero duration means "no timeout" to std, so
/// the shortest is 1 ms).
fn set_timeouts(stream: &TcpStream, timeout: Duration) -> io::Result<()> {
    let timeout = Some(timeout.max(Duration::from_millis(1)));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)
}

fn connect_tcp(
    url: &str,
    host: &str,
    port: u16,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream, ClientError> {
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|source| ClientError::Connect {
            url: url.to_string(),
            source,
        })?;
    let mut last_error = None;
    for addr in addrs {
        let left = remaining(deadline);
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => return Ok(stream),
            Err(e) => last_error = Some(e),
        }
    }
    Err(match last_error {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => ClientError::NoServer {
            url: url.to_string(),
        },
        Some(e)
            if matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ) =>
        {
            ClientError::Timeout {
                what: "connecting",
                after: timeout,
            }
        }
        Some(source) => ClientError::Connect {
            url: url.to_string(),
            source,
        },
        None if remaining(deadline).is_zero() => ClientError::Timeout {
            what: "connecting",
            after: timeout,
        },
        None => ClientError::Connect {
            url: url.to_string(),
            source: io::Error::new(io::ErrorKind::NotFound, "the host has no address"),
        },
    })
}

fn upgrade_failure(url: &str, error: tungstenite::Error) -> ClientError {
    let reason = match &error {
        tungstenite::Error::Http(response) => {
            let body = response
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).trim().to_string())
                .unwrap_or_default();
            if body.is_empty() {
                format!("HTTP {}", response.status())
            } else {
                format!("HTTP {}: {body}", response.status())
            }
        }
        other => other.to_string(),
    };
    ClientError::Handshake {
        url: url.to_string(),
        reason,
    }
}

/// Reads until the handshake message. Messages of other kinds that come first
/// are delivered as events; an error message fails the connection.
fn wait_for_handshake(
    ws: &mut WebSocket<TcpStream>,
    decoder: &mut OggOpusDecoder,
    events: &Sender<EventResult>,
    url: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), ClientError> {
    loop {
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(ClientError::Timeout {
                what: "waiting for the session handshake",
                after: timeout,
            });
        }
        set_timeouts(ws.get_ref(), left)?;
        match ws.read() {
            Ok(Message::Binary(data)) => match split_message(&data) {
                Some((kind, _)) if kind == MessageKind::Handshake.byte() => return Ok(()),
                Some((kind, payload)) if kind == MessageKind::Error.byte() => {
                    return Err(ClientError::Rejected {
                        url: url.to_string(),
                        message: String::from_utf8_lossy(payload).into_owned(),
                    })
                }
                _ => handle_message(&data, decoder, events)?,
            },
            Ok(_) => {}
            Err(e) if would_block(&e) => {}
            Err(e) if is_closed(&e) => {
                return Err(ClientError::ClosedBeforeHandshake {
                    url: url.to_string(),
                })
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A read or write that found nothing to do before the socket's timeout
/// (or on a non-blocking socket): not an error of the connection.
pub fn would_block(error: &tungstenite::Error) -> bool {
    matches!(error, tungstenite::Error::Io(e)
        if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}

/// The connection is gone, cleanly or not (a server may drop the TCP
/// connection right after an error message).
pub fn is_closed(error: &tungstenite::Error) -> bool {
    match error {
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => true,
        tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => true,
        tungstenite::Error::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// Turns one binary message into an event (or nothing) on `events`.
fn handle_message(
    data: &[u8],
    decoder: &mut OggOpusDecoder,
    events: &Sender<EventResult>,
) -> Result<(), ClientError> {
    let Some((kind, payload)) = split_message(data) else {
        return Ok(());
    };
    let lossy = || String::from_utf8_lossy(payload).into_owned();
    let event = match MessageKind::from_byte(kind) {
        Some(MessageKind::Audio) => {
            let pcm = decode_audio(decoder, payload)?;
            if pcm.is_empty() {
                return Ok(());
            }
            ServerEvent::Audio(pcm)
        }
        Some(MessageKind::Text) => ServerEvent::Text(lossy()),
        Some(MessageKind::Metadata) => {
            ServerEvent::Metadata(serde_json::from_slice(payload).unwrap_or(Value::String(lossy())))
        }
        Some(MessageKind::Error) => ServerEvent::Error(lossy()),
        Some(MessageKind::Handshake | MessageKind::Control | MessageKind::Ping) | None => {
            return Ok(())
        }
    };
    // Nobody listening any more is not an error of the connection.
    let _ = events.send(Ok(event));
    Ok(())
}

/// The PCM of one audio message's payload (Ogg bytes, any chunking), fed to
/// `decoder` in pieces that fit its buffer.
pub fn decode_audio(decoder: &mut OggOpusDecoder, payload: &[u8]) -> Result<Vec<f32>, CodecError> {
    let mut pcm = Vec::new();
    for piece in payload.chunks(DECODER_PUSH_BYTES) {
        decoder.push_bytes(piece)?;
        while let Some(decoded) = decoder.next_pcm()? {
            pcm.extend_from_slice(decoded);
        }
    }
    Ok(pcm)
}

fn io_thread_main(
    mut ws: WebSocket<TcpStream>,
    mut decoder: OggOpusDecoder,
    outgoing: Receiver<Outgoing>,
    events: Sender<EventResult>,
) {
    if let Err(e) = pump(&mut ws, &mut decoder, &outgoing, &events) {
        let _ = events.send(Err(e));
    }
    let _ = events.send(Ok(ServerEvent::Closed));
}

/// The I/O thread's loop; returns when the connection is closed.
fn pump(
    ws: &mut WebSocket<TcpStream>,
    decoder: &mut OggOpusDecoder,
    outgoing: &Receiver<Outgoing>,
    events: &Sender<EventResult>,
) -> Result<(), ClientError> {
    // Bytes tungstenite holds that the socket has not taken yet.
    let mut unflushed = false;
    // Set once we have sent a close or the server has.
    let mut closing_since: Option<Instant> = None;
    loop {
        if unflushed {
            unflushed = !try_flush(ws)?;
        }
        if !unflushed && closing_since.is_none() {
            let mut wrote = false;
            while !unflushed {
                match outgoing.try_recv() {
                    Ok(Outgoing::Message(data)) => match ws.write(Message::Binary(data.into())) {
                        Ok(()) => wrote = true,
                        // The message is buffered; the socket is full.
                        Err(e) if would_block(&e) => unflushed = true,
                        Err(e) if is_closed(&e) => return Ok(()),
                        Err(e) => return Err(e.into()),
                    },
                    Ok(Outgoing::Close) | Err(TryRecvError::Disconnected) => {
                        closing_since = Some(Instant::now());
                        match ws.close(None) {
                            Ok(()) => {}
                            Err(e) if would_block(&e) => unflushed = true,
                            Err(e) if is_closed(&e) => return Ok(()),
                            Err(e) => return Err(e.into()),
                        }
                        break;
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            if wrote && !unflushed {
                unflushed = !try_flush(ws)?;
            }
        }
        match ws.read() {
            Ok(Message::Binary(data)) => handle_message(&data, decoder, events)?,
            // tungstenite queues the close reply; the server then drops the
            // connection and `read` says so.
            Ok(Message::Close(_)) => {
                closing_since.get_or_insert_with(Instant::now);
            }
            Ok(_) => {}
            Err(e) if would_block(&e) => {}
            Err(e) if is_closed(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        if closing_since.is_some_and(|since| since.elapsed() >= CLOSE_GRACE) {
            return Ok(());
        }
    }
}

/// Flushes tungstenite's buffer; `Ok(false)` when the socket is full.
fn try_flush(ws: &mut WebSocket<TcpStream>) -> Result<bool, ClientError> {
    match ws.flush() {
        Ok(()) => Ok(true),
        Err(e) if would_block(&e) => Ok(false),
        Err(e) if is_closed(&e) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn chat_url_defaults_and_query() {
        assert_eq!(
            chat_url("127.0.0.1:8998", &[]).unwrap(),
            "ws://127.0.0.1:8998/api/chat"
        );
        assert_eq!(
            chat_url("http://h:1/", &params(&[("seed", "42")])).unwrap(),
            "ws://h:1/api/chat?seed=42"
        );
        assert_eq!(
            chat_url(
                "ws://h:1/x?a=1",
                &params(&[("text_temperature", "0.7"), ("p", "a b&c")])
            )
            .unwrap(),
            "ws://h:1/x?a=1&text_temperature=0.7&p=a%20b%26c"
        );
        assert!(chat_url("wss://h/api/chat", &[]).is_err());
        assert!(chat_url("ftp://h/api/chat", &[]).is_err());
        assert!(chat_url("ws:///api/chat", &[]).is_err());
    }
}
