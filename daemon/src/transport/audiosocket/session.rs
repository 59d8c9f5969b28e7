//! One AudioSocket call, on the I/O core that accepted its connection.
//!
//! Order: the UUID must be the first message (within
//! `audiosocket.uuid_timeout_ms`; until then the connection is pending in
//! the core's budget and may be closed for a newer one); then the slot is taken (parameters from
//! `audiosocket.params`); the first audio message fixes the call's kind and
//! rate, builds the line's audio path and starts the pacer. From then on
//! one 20 ms packet of the same kind goes out per pacing tick — the
//! model's audio when queued, silence before the model speaks and whenever
//! its audio runs dry.
//!
//! One task per call: it waits on whichever comes first — bytes from
//! Asterisk, an answer from the engine, the next packet time — so audio
//! flows both ways at once. Reads are readiness-based (glommio polls, then
//! `recv`s), so giving up a pending read to send a packet loses nothing;
//! writes are awaited to the end, bounded by the socket's write timeout
//! (`session.send_timeout_ms`).
//!
//! Invariants:
//! * Every buffer is made once: the receive buffer (two maximal messages),
//!   the send buffer (one packet), the line path at the first audio
//!   message; the loop's timer is one timer reset for each wait.
//! * Frames in flight stay within the link's budget: when audio cannot be
//!   taken, the session stops reading its socket (TCP slows the sender) and
//!   goes on sending packets.
//! * A refused message is answered with kind `0xff` and a one-byte code
//!   ([`error_code`]), then the connection closes; only this call ends.
//! * Whatever ends the call, its slot is released and its record logged.
//! * Events: the call is an event source under its record id and its UUID
//!   (`GET /v1/sessions/{uuid}/events`): text pieces, DTMF digits, the final
//!   record (and `session.webhook_url`). Stage metrics (switch read once
//!   per message and per packet; no clock read while off): `decode` per
//!   audio message (line decoding, resampling, frames to the lane),
//!   `encode` per model frame (in the link), `send` per packet written.

use crate::app::CoreApp;
use crate::events::SessionState;
use crate::io::pending::{Pending, PendingEnd};
use crate::metrics::Stage;
use crate::session::params::session_params;
use crate::session::record::{EndReason, SessionRecord};
use crate::transport::line::{LineCodec, LineIn, LineOut, Pacer, PACKETS_PER_FRAME};
use crate::transport::link::EngineLink;
use crate::FRAME_SAMPLES;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::timer::Timer;
use moshid_telephony::audiosocket::{
    self as protocol, error_code, kind, Frame, FrameError, HEADER_BYTES,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Longest the loop sleeps without a deadline (shutdown, session length).
const HOUSEKEEPING: Duration = Duration::from_millis(500);
/// How long the closing connection drains what Asterisk still sends.
const CLOSE_LINGER: Duration = Duration::from_millis(500);
/// DTMF digits kept for the end-of-call log line.
const DTMF_LOG_DIGITS: usize = 32;

/// The connection's bytes and buffers.
struct Io {
    stream: TcpStream,
    rx: Vec<u8>,
    start: usize,
    end: usize,
    tx: Vec<u8>,
}

impl Io {
    /// Moves unparsed bytes to the front of the receive buffer.
    fn compact(&mut self) {
        if self.start > 0 {
            self.rx.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Writes `tx[..n]`, bounded by the socket's write timeout.
    async fn write_tx(&mut self, n: usize) -> Result<(), EndReason> {
        self.stream
            .write_all(&self.tx[..n])
            .await
            .map_err(classify_io)
    }
}

/// What the call knows of its audio once the first audio message came.
struct Line {
    kind: u8,
    rate_hz: u32,
    input: LineIn,
    output: LineOut,
}

/// Counters for the end-of-call log line.
#[derive(Default)]
struct CallStats {
    audio_messages: u64,
    packets_out: u64,
    silence_out: u64,
    dtmf: u64,
    dtmf_digits: [u8; DTMF_LOG_DIGITS],
    peer_error: Option<Option<u8>>,
}

struct Call {
    io: Io,
    link: EngineLink,
    rec: SessionRecord,
    uuid: [u8; 16],
    line: Option<Line>,
    /// Bytes of the audio message at `io.start` already taken.
    audio_taken: usize,
    frame: Box<[f32; FRAME_SAMPLES]>,
    pacer: Pacer,
    timer: Timer,
    last_rx: Instant,
    stats: CallStats,
    /// The code sent with `0xff` when the call ends with an error of ours.
    error_code: Option<u8>,
}

enum Wake {
    Read(std::io::Result<usize>),
    Engine,
    Timer,
}

/// Whether the input side can go on.
enum Input {
    /// Everything buffered was taken; more bytes are welcome.
    NeedMore,
    /// A message waits for the engine to answer (do not read).
    Blocked,
}

/// Runs one AudioSocket connection to its end and returns its record.
/// `pending` is its place in the core's budget of connections that have
/// not started; the call starts with its UUID message.
pub async fn run(
    stream: TcpStream,
    peer: SocketAddr,
    app: CoreApp,
    pending: Pending,
) -> SessionRecord {
    let shared = app.shared.clone();
    let cfg = &shared.config;
    let mut rec = SessionRecord::start(shared.session_id(), "audiosocket");
    let send_timeout = Duration::from_millis(cfg.session.send_timeout_ms);
    let _ = stream.set_write_timeout(Some(send_timeout));
    let max_payload = cfg.audiosocket.max_payload_bytes;
    let mut io = Io {
        stream,
        rx: vec![0; 2 * (HEADER_BYTES + max_payload)],
        start: 0,
        end: 0,
        tx: Vec::new(),
    };

    // The UUID comes first.
    let uuid_timeout = Duration::from_millis(cfg.audiosocket.uuid_timeout_ms);
    let uuid = match pending
        .handshake(uuid_timeout, await_uuid(&mut io, max_payload))
        .await
    {
        Ok(Ok(Some(id))) => id,
        Ok(Ok(None)) => {
            rec.end(EndReason::ClientClosed);
            return finish_early(io, rec, None, peer).await;
        }
        Ok(Err((reason, code))) => {
            rec.end(reason);
            return finish_early(io, rec, code, peer).await;
        }
        Err(PendingEnd::TimedOut) => {
            rec.end(EndReason::ProtocolError(
                "no UUID message within audiosocket.uuid_timeout_ms".into(),
            ));
            return finish_early(io, rec, Some(error_code::UUID_TIMEOUT), peer).await;
        }
        // Closed to make room for a newer connection: no answer, no log
        // line (the core's budget counts and logs evictions).
        Err(PendingEnd::Evicted) => return rec,
    };
    let pairs: Vec<(String, String)> = cfg
        .audiosocket
        .params
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let params = match session_params(&pairs, &cfg.defaults, &shared.model_info) {
        Ok(p) => p,
        Err(e) => {
            rec.end(EndReason::BadParameters(format!("audiosocket.params: {e}")));
            return finish_early(io, rec, Some(error_code::BAD_PARAMETERS), peer).await;
        }
    };
    let (ticket, mailbox) = match app.ctx.admit(params, cfg.session.max_frames_in_flight + 1) {
        Ok(t) => t,
        Err(refusal) => {
            rec.end(EndReason::Refused(refusal.to_string()));
            return finish_early(io, rec, Some(error_code::REFUSED), peer).await;
        }
    };
    rec.slot = Some(ticket.slot);
    let events = shared.events.open(
        &rec,
        Some(protocol::uuid_text(&uuid)),
        app.ctx.core,
        SessionState::Active,
        crate::events::webhook::default_for(cfg),
    );
    let mut call = Call {
        io,
        link: EngineLink::new(app, ticket, mailbox, events),
        rec,
        uuid,
        line: None,
        audio_taken: 0,
        frame: Box::new([0.0; FRAME_SAMPLES]),
        pacer: Pacer::default(),
        timer: Timer::new(HOUSEKEEPING),
        last_rx: Instant::now(),
        stats: CallStats::default(),
        error_code: None,
    };
    let reason = call.serve().await;
    call.finish(reason, peer).await
}

/// Reads until the first message: `Some(uuid)`, `None` when Asterisk hung
/// up or closed first, or the end reason and the code to send. No deadline
/// inside: the caller's handshake bounds it.
async fn await_uuid(
    io: &mut Io,
    max_payload: usize,
) -> Result<Option<[u8; 16]>, (EndReason, Option<u8>)> {
    loop {
        match protocol::parse(&io.rx[io.start..io.end], max_payload) {
            Err(e) => return Err(protocol_error(e)),
            Ok(Some((frame, used))) => {
                io.start += used;
                return match frame {
                    Frame::Uuid(id) => Ok(Some(id)),
                    Frame::Hangup | Frame::Error(_) => Ok(None),
                    Frame::Audio { .. } | Frame::Dtmf(_) => Err(protocol_error(FrameError {
                        code: error_code::UUID_FIRST,
                        what: "the UUID message must come first",
                    })),
                };
            }
            Ok(None) => {}
        }
        io.compact();
        let end = io.end;
        match io.stream.read(&mut io.rx[end..]).await {
            Ok(0) => return Ok(None),
            Ok(n) => io.end += n,
            Err(e) => return Err((classify_io(e), None)),
        }
    }
}

fn protocol_error(e: FrameError) -> (EndReason, Option<u8>) {
    (EndReason::ProtocolError(e.what.to_string()), Some(e.code))
}

/// Ends a connection that never got a slot: the error message when there
/// is one, the log line, a graceful close.
async fn finish_early(
    mut io: Io,
    rec: SessionRecord,
    code: Option<u8>,
    peer: SocketAddr,
) -> SessionRecord {
    if let Some(code) = code {
        io.tx.clear();
        io.tx.extend_from_slice(&[kind::ERROR, 0, 1, code]);
        let _ = io.write_tx(4).await;
    }
    rec.log();
    let reason = rec.end_reason.as_ref().map_or("unknown", EndReason::label);
    eprintln!(
        "<6>audiosocket call end id={} peer={peer} uuid=- reason={reason} error_code={}",
        rec.id,
        code.map_or("-".to_string(), |c| format!("{c:#04x}"))
    );
    crate::http::close_gracefully(io.stream, CLOSE_LINGER).await;
    rec
}

impl Call {
    async fn serve(&mut self) -> EndReason {
        let cfg = &self.link.app.shared.config;
        let idle = Duration::from_millis(cfg.session.idle_timeout_ms);
        let max_secs = cfg.session.max_session_seconds;
        let max_payload = cfg.audiosocket.max_payload_bytes;
        // Messages already read behind the UUID.
        let mut input = match self.take_input(max_payload, Instant::now()) {
            Ok(i) => i,
            Err(reason) => return reason,
        };
        loop {
            let now = Instant::now();
            match self
                .link
                .pump(self.line.as_mut().map(|l| &mut l.output), &mut self.rec)
            {
                Ok(0) => {}
                Ok(_) => {
                    // Answers make room: blocked audio may go on.
                    input = match self.take_input(max_payload, now) {
                        Ok(i) => i,
                        Err(reason) => return reason,
                    };
                }
                Err(reason) => return reason,
            }
            if let Err(reason) = self.send_due(now).await {
                return reason;
            }
            if matches!(input, Input::Blocked) {
                // Sent packets make room too.
                input = match self.take_input(max_payload, now) {
                    Ok(i) => i,
                    Err(reason) => return reason,
                };
            }
            if self.link.mailbox.shutdown_requested() {
                return EndReason::ServerShutdown;
            }
            if max_secs > 0 && self.rec.elapsed_secs() > max_secs as f64 {
                return EndReason::MaxDuration;
            }
            let now = Instant::now();
            if now.duration_since(self.last_rx) >= idle {
                self.error_code = Some(error_code::IDLE_TIMEOUT);
                return EndReason::IdleTimeout;
            }
            if self.link.stall_deadline().is_some_and(|d| now >= d) {
                self.error_code = Some(error_code::ENGINE_STALLED);
                return EndReason::EngineStalled;
            }
            let mut wake_at = (now + HOUSEKEEPING).min(self.last_rx + idle);
            if let Some(d) = self.pacer.next_deadline() {
                wake_at = wake_at.min(d);
            }
            if let Some(d) = self.link.stall_deadline() {
                wake_at = wake_at.min(d);
            }
            self.timer.reset(wake_at.saturating_duration_since(now));
            let can_read = matches!(input, Input::NeedMore);
            if can_read {
                self.io.compact();
            }
            let wake = {
                let Io {
                    stream, rx, end, ..
                } = &mut self.io;
                let timer = &mut self.timer;
                let mailbox = &self.link.mailbox;
                let read = async {
                    if can_read {
                        Wake::Read(stream.read(&mut rx[*end..]).await)
                    } else {
                        futures_lite::future::pending::<Wake>().await
                    }
                };
                let engine = async {
                    mailbox.ready().await;
                    Wake::Engine
                };
                let tick = async {
                    timer.await;
                    Wake::Timer
                };
                futures_lite::future::or(read, futures_lite::future::or(engine, tick)).await
            };
            match wake {
                Wake::Engine | Wake::Timer => {}
                Wake::Read(Ok(0)) => return EndReason::ClientClosed,
                Wake::Read(Ok(n)) => {
                    self.io.end += n;
                    self.last_rx = Instant::now();
                    input = match self.take_input(max_payload, self.last_rx) {
                        Ok(i) => i,
                        Err(reason) => return reason,
                    };
                }
                Wake::Read(Err(e)) => return classify_io(e),
            }
        }
    }

    /// Handles every complete message buffered, as far as the engine's
    /// budget allows; `Err` ends the call.
    fn take_input(&mut self, max_payload: usize, now: Instant) -> Result<Input, EndReason> {
        loop {
            let parsed = protocol::parse(&self.io.rx[self.io.start..self.io.end], max_payload);
            let (frame, used) = match parsed {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(Input::NeedMore),
                Err(e) => {
                    self.error_code = Some(e.code);
                    return Err(EndReason::ProtocolError(e.what.to_string()));
                }
            };
            match frame {
                Frame::Hangup => return Err(EndReason::ClientClosed),
                Frame::Error(code) => {
                    self.stats.peer_error = Some(code);
                    return Err(EndReason::ClientClosed);
                }
                Frame::Uuid(_) => {
                    self.error_code = Some(error_code::UUID_FIRST);
                    return Err(EndReason::ProtocolError("a second UUID message".into()));
                }
                Frame::Dtmf(digit) => {
                    if let Some(events) = self.link.events() {
                        events.dtmf(digit, 0);
                    }
                    let i = self.stats.dtmf as usize;
                    if i < DTMF_LOG_DIGITS {
                        self.stats.dtmf_digits[i] = if digit.is_ascii_graphic() {
                            digit
                        } else {
                            b'?'
                        };
                    }
                    self.stats.dtmf += 1;
                }
                Frame::Audio {
                    kind,
                    rate_hz,
                    payload,
                } => {
                    let line = match &mut self.line {
                        Some(line) if line.kind == kind => line,
                        Some(line) => {
                            self.error_code = Some(error_code::FORMAT_CHANGED);
                            return Err(EndReason::ProtocolError(format!(
                                "audio kind changed from {:#04x} ({} Hz) to {kind:#04x} ({rate_hz} Hz)",
                                line.kind, line.rate_hz
                            )));
                        }
                        None => {
                            let cap = (self.link.app.shared.config.session.max_frames_in_flight
                                + 2)
                                * PACKETS_PER_FRAME;
                            let built = LineIn::new(LineCodec::SlinLe, rate_hz).and_then(|input| {
                                Ok((input, LineOut::new(LineCodec::SlinLe, rate_hz, cap)?))
                            });
                            let (input, output) = match built {
                                Ok(b) => b,
                                Err(e) => {
                                    self.error_code = Some(error_code::INTERNAL);
                                    return Err(EndReason::SendFailed(format!(
                                        "audio path for {rate_hz} Hz: {e}"
                                    )));
                                }
                            };
                            self.io.tx = vec![0; HEADER_BYTES + output.packet_bytes()];
                            self.pacer.start(now);
                            self.line.insert(Line {
                                kind,
                                rate_hz,
                                input,
                                output,
                            })
                        }
                    };
                    let rest = &payload[self.audio_taken..];
                    let budget = self.link.budget(Some(&line.output));
                    let link = &mut self.link;
                    let rec = &mut self.rec;
                    // The frames this message completes were complete when
                    // it was read (also when they wait here for answers).
                    let arrived = self.last_rx;
                    let t = link.app.ctx.metrics_on().then(Instant::now);
                    let taken = line.input.push(rest, budget, &mut self.frame, |f| {
                        link.send(f, arrived, rec)
                    });
                    if let Some(t) = t {
                        link.app.ctx.stages.record(Stage::Decode, t.elapsed());
                    }
                    if taken < rest.len() {
                        // Waits for answers; the rest of this message stays buffered.
                        self.audio_taken += taken;
                        return Ok(Input::Blocked);
                    }
                    self.audio_taken = 0;
                    self.stats.audio_messages += 1;
                }
            }
            self.io.start += used;
        }
    }

    /// Sends the packets due now (the model's audio, else silence).
    async fn send_due(&mut self, now: Instant) -> Result<(), EndReason> {
        let Some(line) = self.line.as_mut() else {
            return Ok(());
        };
        let (send, skip) = self.pacer.due(now);
        line.output.skip(skip as usize);
        for _ in 0..send {
            let n = line.output.packet_bytes();
            protocol::write_header(&mut self.io.tx, line.kind, n);
            match line.output.front() {
                Some(p) => {
                    self.io.tx[HEADER_BYTES..HEADER_BYTES + n].copy_from_slice(p);
                    line.output.pop();
                }
                None => {
                    line.output
                        .silence(&mut self.io.tx[HEADER_BYTES..HEADER_BYTES + n]);
                    self.stats.silence_out += 1;
                }
            }
            let t = self.link.app.ctx.metrics_on().then(Instant::now);
            self.io.write_tx(HEADER_BYTES + n).await?;
            if let Some(t) = t {
                self.link.app.ctx.stages.record(Stage::Send, t.elapsed());
            }
            self.stats.packets_out += 1;
        }
        Ok(())
    }

    /// Releases the slot, tells Asterisk how the call ended, logs it.
    async fn finish(mut self, reason: EndReason, peer: SocketAddr) -> SessionRecord {
        self.link.release();
        let reason_code = match &reason {
            EndReason::IdleTimeout => Some(error_code::IDLE_TIMEOUT),
            EndReason::ModelFault => Some(error_code::MODEL_FAULT),
            EndReason::EngineStalled => Some(error_code::ENGINE_STALLED),
            _ => None,
        };
        let code = self.error_code.or(reason_code);
        self.rec.end(reason);
        self.link.finish_events(&self.rec);
        let reason = self.rec.end_reason.clone().expect("set just above");
        let peer_gone = matches!(
            reason,
            EndReason::ClientClosed | EndReason::SendFailed(_) | EndReason::SlowConsumer
        );
        if !peer_gone || code.is_some() {
            let n = match code {
                Some(code) => {
                    self.io.tx.clear();
                    self.io.tx.extend_from_slice(&[kind::ERROR, 0, 1, code]);
                    4
                }
                // Our own ends (shutdown, session length): a hangup.
                None => {
                    self.io.tx.clear();
                    self.io.tx.extend_from_slice(&[kind::HANGUP, 0, 0]);
                    3
                }
            };
            if !matches!(reason, EndReason::SlowConsumer) {
                let _ = self.io.write_tx(n).await;
            }
        }
        self.rec.log();
        let digits = &self.stats.dtmf_digits[..(self.stats.dtmf as usize).min(DTMF_LOG_DIGITS)];
        let (rate, kind) = self.line.as_ref().map_or((0, 0), |l| (l.rate_hz, l.kind));
        let out = self
            .line
            .as_ref()
            .map(|l| l.output.stats())
            .unwrap_or_default();
        eprintln!(
            "<6>audiosocket call end id={} peer={peer} uuid={} kind={kind:#04x} rate_hz={rate} audio_in={} packets_out={} silence_out={} skipped_out={} dropped_out={} dtmf={} digits={:?} peer_error={} reason={} error_code={}",
            self.rec.id,
            protocol::uuid_text(&self.uuid),
            self.stats.audio_messages,
            self.stats.packets_out,
            self.stats.silence_out,
            self.pacer.skipped(),
            out.dropped,
            self.stats.dtmf,
            String::from_utf8_lossy(digits),
            match self.stats.peer_error {
                None => "-".to_string(),
                Some(None) => "none".to_string(),
                Some(Some(c)) => format!("{c:#04x}"),
            },
            reason.label(),
            code.map_or("-".to_string(), |c| format!("{c:#04x}")),
        );
        crate::http::close_gracefully(self.io.stream, CLOSE_LINGER).await;
        self.rec
    }
}

/// An I/O error as an end reason.
fn classify_io(e: std::io::Error) -> EndReason {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::TimedOut => EndReason::SlowConsumer,
        ErrorKind::ConnectionReset
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionAborted => EndReason::ClientClosed,
        _ => EndReason::SendFailed(e.to_string()),
    }
}
