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
use crate::log_record::{LogLine, Record};
use crate::metrics::Stage;
use crate::session::params::session_params;
use crate::session::record::{EndReason, SessionRecord};
use crate::transport::line::{LineCodec, LineIn, LineOut, Pacer, PACKETS_PER_FRAME};
use crate::transport::session::{self, io_end_reason, Core, DtmfLog, Transport};
use crate::FRAME_SAMPLES;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use moshid_telephony::audiosocket::{
    self as protocol, error_code, kind, Frame, FrameError, HEADER_BYTES,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long the closing connection drains what Asterisk still sends.
const CLOSE_LINGER: Duration = Duration::from_millis(500);

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
            .map_err(io_end_reason)
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
    dtmf: DtmfLog,
    peer_error: Option<Option<u8>>,
}

/// The call's line for audio of `kind` at `rate_hz`: made at the first
/// audio message (its packet queue holding `cap` packets), the same one
/// afterwards; audio of another kind ends the call (and the code to send).
fn line_for(
    line: &mut Option<Line>,
    kind: u8,
    rate_hz: u32,
    cap: usize,
) -> Result<&mut Line, (EndReason, u8)> {
    if let Some(l) = line.as_ref().filter(|l| l.kind != kind) {
        let why = format!(
            "audio kind changed from {:#04x} ({} Hz) to {kind:#04x} ({rate_hz} Hz)",
            l.kind, l.rate_hz
        );
        return Err((EndReason::ProtocolError(why), error_code::FORMAT_CHANGED));
    }
    if line.is_none() {
        let (input, output) = LineIn::new(LineCodec::SlinLe, rate_hz)
            .and_then(|input| Ok((input, LineOut::new(LineCodec::SlinLe, rate_hz, cap)?)))
            .map_err(|e| {
                let why = format!("audio path for {rate_hz} Hz: {e}");
                (EndReason::SendFailed(why), error_code::INTERNAL)
            })?;
        *line = Some(Line {
            kind,
            rate_hz,
            input,
            output,
        });
    }
    Ok(line.as_mut().expect("made above"))
}

/// One call's own side of the shared session loop ([`session::run`]).
struct Call {
    io: Io,
    peer: SocketAddr,
    uuid: [u8; 16],
    max_payload: usize,
    line: Option<Line>,
    /// Whether the input side can go on.
    input: Input,
    /// Bytes of the audio message at `io.start` already taken.
    audio_taken: usize,
    frame: Box<[f32; FRAME_SAMPLES]>,
    pacer: Pacer,
    stats: CallStats,
    /// The code sent with `0xff` when the call ends with an error of ours.
    error_code: Option<u8>,
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
    let admitted = session::admit(
        &app,
        &mut rec,
        params,
        Some(protocol::uuid_text(&uuid)),
        SessionState::Active,
        crate::events::webhook::default_for(cfg),
    );
    let admitted = match admitted {
        Ok(a) => a,
        Err(refusal) => {
            rec.end(EndReason::Refused(refusal.to_string()));
            return finish_early(io, rec, Some(error_code::REFUSED), peer).await;
        }
    };
    let call = Call {
        io,
        peer,
        uuid,
        max_payload,
        line: None,
        input: Input::NeedMore,
        audio_taken: 0,
        frame: Box::new([0.0; FRAME_SAMPLES]),
        pacer: Pacer::default(),
        stats: CallStats::default(),
        error_code: None,
    };
    session::run(call, Core::new(app, admitted, rec)).await
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
            Err(e) => return Err((io_end_reason(e), None)),
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
    LogLine::new(Record::AudiosocketCallEnd)
        .field("id", rec.id)
        .field("peer", peer)
        .field("uuid", "-")
        .field("reason", reason)
        .opt("error_code", code.map(|c| format!("{c:#04x}")))
        .emit();
    crate::http::close_gracefully(io.stream, CLOSE_LINGER).await;
    rec
}

impl Transport for Call {
    type Input = std::io::Result<usize>;

    async fn read(&mut self) -> std::io::Result<usize> {
        let Io {
            stream, rx, end, ..
        } = &mut self.io;
        stream.read(&mut rx[*end..]).await
    }

    fn ready_to_read(&mut self) -> bool {
        let can_read = matches!(self.input, Input::NeedMore);
        if can_read {
            self.io.compact();
        }
        can_read
    }

    async fn on_input(
        &mut self,
        core: &mut Core,
        read: std::io::Result<usize>,
    ) -> Result<(), EndReason> {
        match read {
            Ok(0) => Err(EndReason::ClientClosed),
            Ok(n) => {
                self.io.end += n;
                self.take_waiting(core)
            }
            Err(e) => Err(io_end_reason(e)),
        }
    }

    fn take_waiting(&mut self, core: &mut Core) -> Result<(), EndReason> {
        self.input = self.take_input(core)?;
        Ok(())
    }

    fn output(&mut self) -> Option<&mut LineOut> {
        self.line.as_mut().map(|l| &mut l.output)
    }

    async fn send_due(&mut self, core: &mut Core, now: Instant) -> Result<(), EndReason> {
        self.send_packets(core, now).await
    }

    fn next_send(&self) -> Option<Instant> {
        self.pacer.next_deadline()
    }

    async fn goodbye(&mut self, _core: &Core, reason: &EndReason) {
        self.say_goodbye(reason).await
    }

    async fn close(self, rec: &SessionRecord, reason: &EndReason) {
        self.log_end(rec, reason);
        crate::http::close_gracefully(self.io.stream, CLOSE_LINGER).await;
    }
}

impl Call {
    /// Handles every complete message buffered, as far as the engine's
    /// budget allows; `Err` ends the call.
    fn take_input(&mut self, core: &mut Core) -> Result<Input, EndReason> {
        loop {
            let parsed = protocol::parse(&self.io.rx[self.io.start..self.io.end], self.max_payload);
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
                Frame::Dtmf(digit) => self.stats.dtmf.record(core, digit),
                Frame::Audio {
                    kind,
                    rate_hz,
                    payload,
                } => {
                    let first = self.line.is_none();
                    let cap = (core.link.app.shared.config.session.max_frames_in_flight + 2)
                        * PACKETS_PER_FRAME;
                    let line =
                        line_for(&mut self.line, kind, rate_hz, cap).map_err(|(r, code)| {
                            self.error_code = Some(code);
                            r
                        })?;
                    if first {
                        self.io.tx = vec![0; HEADER_BYTES + line.output.packet_bytes()];
                        self.pacer.start(core.last_rx);
                    }
                    let rest = &payload[self.audio_taken..];
                    let budget = core.link.budget(Some(&line.output));
                    let link = &mut core.link;
                    let rec = &mut core.rec;
                    // The frames this message completes were complete when
                    // it was read (also when they wait here for answers).
                    let arrived = core.last_rx;
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
    async fn send_packets(&mut self, core: &Core, now: Instant) -> Result<(), EndReason> {
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
            let ctx = &core.link.app.ctx;
            let t = ctx.metrics_on().then(Instant::now);
            self.io.write_tx(HEADER_BYTES + n).await?;
            if let Some(t) = t {
                ctx.stages.record(Stage::Send, t.elapsed());
            }
            self.stats.packets_out += 1;
        }
        Ok(())
    }
}

impl Call {
    /// The code sent with `0xff` for a call ending for `reason`: the error
    /// of ours that ended it, else the one its reason has, if any.
    fn end_code(&self, reason: &EndReason) -> Option<u8> {
        let reason_code = match reason {
            EndReason::IdleTimeout => Some(error_code::IDLE_TIMEOUT),
            EndReason::ModelFault => Some(error_code::MODEL_FAULT),
            EndReason::EngineStalled => Some(error_code::ENGINE_STALLED),
            _ => None,
        };
        self.error_code.or(reason_code)
    }

    /// Tells Asterisk how the call ended: an error message with its code,
    /// or a hangup for our own ends (shutdown, session length); nothing to
    /// a peer that is gone, and no write to one that stopped reading.
    async fn say_goodbye(&mut self, reason: &EndReason) {
        let code = self.end_code(reason);
        let peer_gone = matches!(
            reason,
            EndReason::ClientClosed | EndReason::SendFailed(_) | EndReason::SlowConsumer
        );
        if peer_gone && code.is_none() {
            return;
        }
        self.io.tx.clear();
        match code {
            Some(code) => self.io.tx.extend_from_slice(&[kind::ERROR, 0, 1, code]),
            None => self.io.tx.extend_from_slice(&[kind::HANGUP, 0, 0]),
        }
        if !matches!(reason, EndReason::SlowConsumer) {
            let n = self.io.tx.len();
            let _ = self.io.write_tx(n).await;
        }
    }

    /// The end-of-call log line.
    fn log_end(&self, rec: &SessionRecord, reason: &EndReason) {
        let code = self.end_code(reason);
        let (rate, kind) = self.line.as_ref().map_or((0, 0), |l| (l.rate_hz, l.kind));
        let out = self
            .line
            .as_ref()
            .map(|l| l.output.stats())
            .unwrap_or_default();
        LogLine::new(Record::AudiosocketCallEnd)
            .field("id", rec.id)
            .field("peer", self.peer)
            .field("uuid", protocol::uuid_text(&self.uuid))
            .field("kind", format_args!("{kind:#04x}"))
            .field("rate_hz", rate)
            .field("audio_in", self.stats.audio_messages)
            .field("packets_out", self.stats.packets_out)
            .field("silence_out", self.stats.silence_out)
            .field("skipped_out", self.pacer.skipped())
            .field("dropped_out", out.dropped)
            .field("dtmf", self.stats.dtmf.count())
            .quoted("digits", self.stats.dtmf.digits())
            .field(
                "peer_error",
                match self.stats.peer_error {
                    None => "-".to_string(),
                    Some(None) => "none".to_string(),
                    Some(Some(c)) => format!("{c:#04x}"),
                },
            )
            .field("reason", reason.label())
            .opt("error_code", code.map(|c| format!("{c:#04x}")))
            .emit();
    }
}
