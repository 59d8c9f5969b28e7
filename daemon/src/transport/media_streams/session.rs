//! One Media Streams connection, on the I/O core that accepted it.
//!
//! Before `start`: `connected` is accepted, `stop` ends the stream, any
//! other event is a protocol error. `start` names the stream, its format
//! (G.711 at 8 kHz, mono) and its `customParameters` (session parameters,
//! over the URL's query); then the slot is taken and the pacer starts.
//! Until `start` the connection holds no slot and is pending in the core's
//! connection budget (`listen.max_pending_per_core`): a newer connection
//! may close it to make room.
//!
//! One task per stream waits on whichever comes first — a message, an
//! answer from the engine, the next packet time. The model's audio goes out
//! as `media` events of 20 ms (160 bytes of G.711), one per 20 ms from
//! absolute deadlines while audio is queued; nothing is sent while none is
//! (the far end plays its own silence), and the first packet after a pause
//! goes at once.
//!
//! Marks: a `mark` is echoed once the model's answers to every frame sent
//! to the engine before it have been queued and every packet queued before
//! that has been sent — "the audio before it was sent". `clear` drops the
//! queued audio (barge-in) and echoes every pending mark at once, as Twilio
//! does.
//!
//! Invariants: every buffer is made once per stream (decoded payload,
//! outgoing message buffer, line path, marks queue with a fixed capacity);
//! an outgoing message's bytes are split off one reusable `BytesMut` that
//! the next message reclaims, so steady state allocates nothing of ours per
//! packet (tungstenite still allocates each *incoming* message); frames in
//! flight stay within the link's budget — when audio cannot be taken the
//! stream stops reading its socket; an error ends only this stream, with an
//! `error` event and a close frame that says why; whatever ends it, its
//! slot is released and its record logged.
//!
//! Events: the stream is an event source under its record id and its
//! `streamSid` (`GET /v1/sessions/{streamSid}/events`): text pieces, DTMF
//! digits, the final record; a `webhook_url` custom parameter (or query
//! parameter) names its own webhook where `events.session_webhook_prefixes`
//! allows it. Stage metrics (switch read once per event and per packet; no
//! clock read while off): `decode` per `media` event (base64, G.711,
//! resampling, frames to the lane), `encode` per model frame (in the
//! link), `send` per `media` event sent.

use crate::app::CoreApp;
use crate::events::SessionState;
use crate::io::conn::Conn;
use crate::io::pending::{Pending, PendingEnd};
use crate::log_record::{LogLine, Record};
use crate::metrics::Stage;
use crate::session::params::session_params;
use crate::session::record::{EndReason, SessionRecord};
use crate::transport::line::{LineCodec, LineIn, LineOut, Pacer, PACKETS_PER_FRAME, PACKET_MS};
use crate::transport::session::{self, ws_end_reason, Core, DtmfLog, Transport};
use crate::FRAME_SAMPLES;
use async_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use async_tungstenite::tungstenite::protocol::CloseFrame;
use async_tungstenite::tungstenite::{Message, Utf8Bytes};
use async_tungstenite::WebSocketStream;
use base64::Engine;
use bytes::BytesMut;
use futures_lite::StreamExt;
use futures_util::SinkExt;
use moshid_telephony::g711::Law;
use moshid_telephony::media_streams::{self as events, BASE64};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Capacity kept in the outgoing message buffer.
const OUT_BUFFER_BYTES: usize = 4096;

type Ws = WebSocketStream<Conn>;

/// A mark waiting for its echo.
struct PendingMark {
    /// Frames sent to the engine before it.
    after_frames: u64,
    /// Packets queued before it, once those frames are answered.
    at_packet: Option<u64>,
    /// The name as a JSON string.
    name_json: String,
}

/// Counters for the end-of-stream log line.
#[derive(Default)]
struct StreamStats {
    media_in: u64,
    other_tracks: u64,
    media_out: u64,
    marks: u64,
    clears: u64,
    cleared_packets: u64,
    dtmf: DtmfLog,
}

/// One stream's own side of the shared session loop ([`session::run`]).
struct Stream {
    ws: Ws,
    sid: String,
    input: LineIn,
    output: LineOut,
    /// Decoded G.711 of the last `media` event, and how much was taken.
    pending: Vec<u8>,
    pending_len: usize,
    pending_taken: usize,
    frame: Box<[f32; FRAME_SAMPLES]>,
    marks: VecDeque<PendingMark>,
    max_marks: usize,
    out: BytesMut,
    seq: u64,
    chunk: u64,
    pacer: Pacer,
    stats: StreamStats,
}

/// What the first phase found.
struct Started {
    sid: String,
    law: Law,
    params: Vec<(String, String)>,
}

/// Runs one `/v1/media-stream` connection to its end and returns its record.
/// `pending` is its place in the core's budget of connections that have
/// not started: the stream starts with its `start` event.
pub async fn run(
    mut ws: Ws,
    app: CoreApp,
    query: Vec<(String, String)>,
    pending: Pending,
) -> SessionRecord {
    let shared = app.shared.clone();
    let cfg = &shared.config;
    let mut rec = SessionRecord::start(shared.session_id(), "media_stream");
    let _ = ws
        .get_ref()
        .tcp()
        .set_write_timeout(Some(Duration::from_millis(cfg.session.send_timeout_ms)));
    let idle = Duration::from_millis(cfg.session.idle_timeout_ms);
    let started = match pending
        .handshake(idle, await_start(&mut ws, idle, query))
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(reason)) => {
            rec.end(reason);
            return finish_early(ws, rec, None, &app).await;
        }
        Err(PendingEnd::TimedOut) => {
            rec.end(EndReason::IdleTimeout);
            return finish_early(ws, rec, None, &app).await;
        }
        // Closed to make room for a newer connection: no answer, no log
        // line (the core's budget counts and logs evictions).
        Err(PendingEnd::Evicted) => return rec,
    };
    let params = session_params(&started.params, &cfg.defaults, &shared.model_info)
        .map_err(|e| e.to_string())
        .and_then(|p| Ok((p, crate::events::webhook::from_pairs(&started.params, cfg)?)));
    let (params, webhook) = match params {
        Ok(p) => p,
        Err(e) => {
            rec.end(EndReason::BadParameters(e));
            return finish_early(ws, rec, Some(&started.sid), &app).await;
        }
    };
    let codec = LineCodec::G711(started.law);
    let cap = (cfg.session.max_frames_in_flight + 2) * PACKETS_PER_FRAME;
    let line = LineIn::new(codec, 8_000).and_then(|i| Ok((i, LineOut::new(codec, 8_000, cap)?)));
    let (input, output) = match line {
        Ok(l) => l,
        Err(e) => {
            rec.end(EndReason::SendFailed(format!("audio path: {e}")));
            return finish_early(ws, rec, Some(&started.sid), &app).await;
        }
    };
    let admitted = session::admit(
        &app,
        &mut rec,
        params,
        Some(started.sid.clone()),
        SessionState::Active,
        webhook,
    );
    let admitted = match admitted {
        Ok(a) => a,
        Err(refusal) => {
            rec.end(EndReason::Refused(refusal.to_string()));
            return finish_early(ws, rec, Some(&started.sid), &app).await;
        }
    };
    let max_marks = cfg.media_streams.max_pending_marks;
    // Largest decoded payload a message within the size limit can carry.
    let max_payload = cfg.session.max_message_bytes / 4 * 3 + 3;
    let mut s = Stream {
        ws,
        sid: started.sid,
        input,
        output,
        pending: vec![0; max_payload],
        pending_len: 0,
        pending_taken: 0,
        frame: Box::new([0.0; FRAME_SAMPLES]),
        marks: VecDeque::with_capacity(max_marks),
        max_marks,
        out: BytesMut::with_capacity(OUT_BUFFER_BYTES),
        seq: 0,
        chunk: 0,
        pacer: Pacer::default(),
        stats: StreamStats::default(),
    };
    s.pacer.start(Instant::now());
    session::run(s, Core::new(app, admitted, rec)).await
}

/// Reads events until `start`.
async fn await_start(
    ws: &mut Ws,
    idle: Duration,
    query: Vec<(String, String)>,
) -> Result<Started, EndReason> {
    loop {
        let msg = match glommio::timer::timeout(idle, async { Ok(ws.next().await) }).await {
            Err(_) => return Err(EndReason::IdleTimeout),
            Ok(None) => return Err(EndReason::ClientClosed),
            Ok(Some(Err(e))) => return Err(ws_end_reason(e)),
            Ok(Some(Ok(m))) => m,
        };
        let text = match msg {
            Message::Text(t) => t,
            Message::Close(_) => return Err(EndReason::ClientClosed),
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
            Message::Binary(_) => return Err(binary_refused()),
        };
        let event = events::parse(text.as_str()).map_err(bad_json)?;
        match event.event.as_str() {
            "connected" => {}
            "stop" => return Err(EndReason::ClientClosed),
            "start" => {
                let Some(start) = event.start else {
                    return Err(protocol("`start` without its `start` object"));
                };
                let sid = start
                    .stream_sid
                    .or_else(|| event.stream_sid.map(|s| s.as_str().to_string()))
                    .ok_or_else(|| protocol("`start` without a streamSid"))?;
                events::check_stream_sid(&sid).map_err(protocol)?;
                let law = match &start.media_format {
                    None => Law::Mu,
                    Some(f) => {
                        let law = match f.encoding.as_str() {
                            "audio/x-mulaw" => Law::Mu,
                            "audio/x-alaw" => Law::A,
                            other => {
                                return Err(EndReason::ProtocolError(format!(
                                    "mediaFormat.encoding `{}` is not supported (audio/x-mulaw or audio/x-alaw)",
                                    clip(other)
                                )))
                            }
                        };
                        if f.sample_rate != 8_000 || f.channels != 1 {
                            return Err(EndReason::ProtocolError(format!(
                                "mediaFormat {} Hz × {} channels is not supported (8000 Hz, 1 channel)",
                                f.sample_rate, f.channels
                            )));
                        }
                        law
                    }
                };
                let mut params = query;
                if let Some(map) = &start.custom_parameters {
                    params
                        .extend(events::custom_parameters(map).map_err(EndReason::ProtocolError)?);
                }
                return Ok(Started { sid, law, params });
            }
            "media" | "mark" | "clear" | "dtmf" => {
                return Err(EndReason::ProtocolError(format!(
                    "`{}` before `start`",
                    event.event.as_str()
                )))
            }
            other => return Err(unknown_event(other)),
        }
    }
}

fn protocol(what: &str) -> EndReason {
    EndReason::ProtocolError(what.to_string())
}

fn bad_json(e: serde_json::Error) -> EndReason {
    EndReason::ProtocolError(format!("bad JSON event: {e}"))
}

fn binary_refused() -> EndReason {
    protocol("binary messages are not part of the protocol; events are JSON text")
}

fn unknown_event(name: &str) -> EndReason {
    EndReason::ProtocolError(format!("unknown event `{}`", clip(name)))
}

/// At most 40 characters of client text in an error.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl Transport for Stream {
    type Input = Option<Result<Message, async_tungstenite::tungstenite::Error>>;

    async fn read(&mut self) -> Self::Input {
        self.ws.next().await
    }

    fn ready_to_read(&mut self) -> bool {
        self.pending_taken == self.pending_len
    }

    async fn on_input(&mut self, core: &mut Core, input: Self::Input) -> Result<(), EndReason> {
        match input {
            None => Err(EndReason::ClientClosed),
            Some(Err(e)) => Err(ws_end_reason(e)),
            Some(Ok(msg)) => self.on_message(core, msg).await,
        }
    }

    fn take_waiting(&mut self, core: &mut Core) -> Result<(), EndReason> {
        self.take_pending(core)
    }

    fn output(&mut self) -> Option<&mut LineOut> {
        Some(&mut self.output)
    }

    async fn send_due(&mut self, core: &mut Core, now: Instant) -> Result<(), EndReason> {
        self.send_packets(core, now).await?;
        self.echo_marks().await
    }

    fn next_send(&self) -> Option<Instant> {
        // Nothing is sent while nothing is queued.
        self.pacer
            .next_deadline()
            .filter(|_| !self.output.is_empty())
    }

    fn prepare(&mut self, now: Instant) {
        if self.output.is_empty() {
            // Nothing to pace: the next packet may go at once.
            self.pacer.rest(now);
        }
    }

    fn on_answers(&mut self, core: &mut Core) {
        self.place_marks(core);
    }

    async fn goodbye(&mut self, core: &Core, reason: &EndReason) {
        let limit = Duration::from_millis(core.link.app.shared.config.session.send_timeout_ms);
        if !matches!(
            reason,
            EndReason::ClientClosed | EndReason::SendFailed(_) | EndReason::SlowConsumer
        ) {
            let _ = glommio::timer::timeout(limit, async {
                goodbye(&mut self.ws, Some(&self.sid), reason).await;
                Ok(())
            })
            .await;
        } else if matches!(reason, EndReason::ClientClosed) {
            // Complete the closing handshake (or close after `stop`):
            // tungstenite queued the reply to the client's close frame and
            // writes it on a flush (its `close` refuses to write once the
            // peer has closed).
            let _ = glommio::timer::timeout(limit, async {
                let _ = self.ws.flush().await;
                let _ = self.ws.close(None).await;
                Ok(())
            })
            .await;
        }
    }

    async fn close(self, rec: &SessionRecord, reason: &EndReason) {
        self.log_end(rec, reason);
    }
}

impl Stream {
    /// Handles one message after `start`; `Err` ends the stream.
    async fn on_message(&mut self, core: &mut Core, msg: Message) -> Result<(), EndReason> {
        let text = match msg {
            Message::Text(t) => t,
            Message::Close(_) => return Err(EndReason::ClientClosed),
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => return Ok(()),
            Message::Binary(_) => return Err(binary_refused()),
        };
        let event = events::parse(text.as_str()).map_err(bad_json)?;
        match event.event.as_str() {
            "media" => {
                let Some(media) = event.media else {
                    return Err(protocol("`media` without its `media` object"));
                };
                if media
                    .track
                    .as_ref()
                    .is_some_and(|t| !t.as_str().starts_with("inbound"))
                {
                    self.stats.other_tracks += 1;
                    return Ok(());
                }
                let t = core.link.app.ctx.metrics_on().then(Instant::now);
                let n = BASE64
                    .decode_slice(media.payload.as_str(), &mut self.pending)
                    .map_err(|e| {
                        EndReason::ProtocolError(format!("bad base64 in media.payload: {e}"))
                    })?;
                self.stats.media_in += 1;
                self.pending_len = n;
                self.pending_taken = 0;
                let taken = self.take_pending(core);
                if let Some(t) = t {
                    core.link.app.ctx.stages.record(Stage::Decode, t.elapsed());
                }
                taken
            }
            "mark" => {
                let Some(mark) = event.mark else {
                    return Err(protocol("`mark` without its `mark` object"));
                };
                if self.marks.len() == self.max_marks {
                    return Err(protocol(
                        "too many marks waiting for their echo (media_streams.max_pending_marks)",
                    ));
                }
                let name_json =
                    serde_json::to_string(mark.name.as_str()).expect("a string serializes");
                self.stats.marks += 1;
                let after_frames = core.link.sent();
                let at_packet =
                    (core.link.answered() >= after_frames).then(|| self.output.stats().queued);
                self.marks.push_back(PendingMark {
                    after_frames,
                    at_packet,
                    name_json,
                });
                self.echo_marks().await
            }
            "clear" => {
                self.stats.clears += 1;
                self.stats.cleared_packets += self.output.clear() as u64;
                while let Some(m) = self.marks.pop_front() {
                    self.send_mark(&m.name_json).await?;
                }
                Ok(())
            }
            "dtmf" => {
                let digit = event
                    .dtmf
                    .as_ref()
                    .and_then(|d| d.digit.as_str().bytes().next())
                    .unwrap_or(b'?');
                self.stats.dtmf.record(core, digit);
                Ok(())
            }
            "stop" => Err(EndReason::ClientClosed),
            "connected" => Ok(()),
            "start" => Err(protocol("a second `start`")),
            other => Err(unknown_event(other)),
        }
    }

    /// Feeds the decoded payload to the engine as far as its budget allows.
    fn take_pending(&mut self, core: &mut Core) -> Result<(), EndReason> {
        if self.pending_taken == self.pending_len {
            return Ok(());
        }
        let budget = core.link.budget(Some(&self.output));
        let link = &mut core.link;
        let rec = &mut core.rec;
        // Complete when the media message that ended them was read.
        let arrived = core.last_rx;
        let taken = self.input.push(
            &self.pending[self.pending_taken..self.pending_len],
            budget,
            &mut self.frame,
            |f| link.send(f, arrived, rec),
        );
        self.pending_taken += taken;
        Ok(())
    }

    /// Gives marks waiting for the engine their place in the packet queue.
    fn place_marks(&mut self, core: &Core) {
        let answered = core.link.answered();
        let queued = self.output.stats().queued;
        for m in self.marks.iter_mut().filter(|m| m.at_packet.is_none()) {
            if answered >= m.after_frames {
                m.at_packet = Some(queued);
            }
        }
    }

    /// Echoes the marks whose audio has been sent, in order.
    async fn echo_marks(&mut self) -> Result<(), EndReason> {
        let taken = self.output.stats().taken;
        while self
            .marks
            .front()
            .is_some_and(|m| m.at_packet.is_some_and(|at| taken >= at))
        {
            let m = self.marks.pop_front().expect("checked");
            self.send_mark(&m.name_json).await?;
        }
        Ok(())
    }

    async fn send_mark(&mut self, name_json: &str) -> Result<(), EndReason> {
        self.seq += 1;
        self.out.reserve(OUT_BUFFER_BYTES);
        events::write_mark(&mut self.out, self.seq, &self.sid, name_json);
        self.send_out().await
    }

    /// Sends the packets due now.
    async fn send_packets(&mut self, core: &Core, now: Instant) -> Result<(), EndReason> {
        let (send, skip) = self.pacer.due(now);
        self.output.skip(skip as usize);
        self.chunk += skip as u64;
        for _ in 0..send {
            let Some(packet) = self.output.front() else {
                break;
            };
            self.seq += 1;
            self.chunk += 1;
            self.out.reserve(OUT_BUFFER_BYTES);
            let ts = (self.chunk - 1) * PACKET_MS as u64;
            events::write_media(&mut self.out, self.seq, &self.sid, self.chunk, ts, packet);
            self.output.pop();
            let ctx = &core.link.app.ctx;
            let t = ctx.metrics_on().then(Instant::now);
            self.send_out().await?;
            if let Some(t) = t {
                ctx.stages.record(Stage::Send, t.elapsed());
            }
            self.stats.media_out += 1;
            self.echo_marks().await?;
        }
        Ok(())
    }

    /// Sends the message in `out` (its bytes are split off; the buffer is
    /// reclaimed by the next `reserve` once tungstenite dropped them).
    async fn send_out(&mut self) -> Result<(), EndReason> {
        let bytes = self.out.split();
        let text = Utf8Bytes::try_from(bytes).expect("events are ASCII JSON");
        self.ws
            .send(Message::Text(text))
            .await
            .map_err(ws_end_reason)
    }

    /// The end-of-stream log line.
    fn log_end(&self, rec: &SessionRecord, reason: &EndReason) {
        let out = self.output.stats();
        LogLine::new(Record::MediaStreamEnd)
            .field("id", rec.id)
            .field("stream_sid", &self.sid)
            .field("media_in", self.stats.media_in)
            .field("other_tracks", self.stats.other_tracks)
            .field("media_out", self.stats.media_out)
            .field("dropped_out", out.dropped)
            .field("skipped_out", self.pacer.skipped())
            .field("marks", self.stats.marks)
            .field("clears", self.stats.clears)
            .field("cleared_packets", self.stats.cleared_packets)
            .field("dtmf", self.stats.dtmf.count())
            .quoted("digits", self.stats.dtmf.digits())
            .field("reason", reason.label())
            .emit();
    }
}

/// Ends a stream that never got a slot.
async fn finish_early(
    mut ws: Ws,
    rec: SessionRecord,
    sid: Option<&str>,
    app: &CoreApp,
) -> SessionRecord {
    let reason = rec.end_reason.clone().expect("ended by the caller");
    if !matches!(
        reason,
        EndReason::ClientClosed | EndReason::SendFailed(_) | EndReason::SlowConsumer
    ) {
        let limit = Duration::from_millis(app.shared.config.session.send_timeout_ms);
        let _ = glommio::timer::timeout(limit, async {
            goodbye(&mut ws, sid, &reason).await;
            Ok(())
        })
        .await;
    } else if matches!(reason, EndReason::ClientClosed) {
        let _ = ws.close(None).await;
    }
    rec.log();
    LogLine::new(Record::MediaStreamEnd)
        .field("id", rec.id)
        .field("stream_sid", sid.unwrap_or("-"))
        .field("media_in", 0)
        .field("reason", reason.label())
        .emit();
    rec
}

/// An `error` event where the end is an error, then a close frame whose
/// reason says why.
async fn goodbye(ws: &mut Ws, sid: Option<&str>, reason: &EndReason) {
    let message = match reason {
        EndReason::ProtocolError(d) => Some(format!("protocol error: {d}")),
        EndReason::BadParameters(d) => Some(format!("bad parameters: {d}")),
        EndReason::Refused(d) => Some(format!("refused: {d}")),
        EndReason::IdleTimeout => Some("idle timeout: no message received".to_string()),
        EndReason::ModelFault => Some("the model failed for this stream".to_string()),
        EndReason::EngineStalled => Some("the engine did not answer in time".to_string()),
        EndReason::SendFailed(d) => Some(format!("internal error: {d}")),
        _ => None,
    };
    if let Some(text) = &message {
        let mut event = serde_json::json!({
            "event": "error",
            "error": { "reason": reason.label(), "message": text },
        });
        if let Some(sid) = sid {
            event["streamSid"] = sid.into();
        }
        let _ = ws.send(Message::Text(event.to_string().into())).await;
    }
    let code = match reason {
        EndReason::ProtocolError(_) => CloseCode::Protocol,
        EndReason::BadParameters(_) => CloseCode::Policy,
        EndReason::Refused(_) => CloseCode::Again,
        EndReason::ServerShutdown => CloseCode::Away,
        EndReason::ModelFault | EndReason::EngineStalled | EndReason::SendFailed(_) => {
            CloseCode::Error
        }
        _ => CloseCode::Normal,
    };
    // A close reason is at most 123 bytes.
    let text = message.unwrap_or_else(|| reason.label().to_string());
    let mut cut = text.len().min(123);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let _ = ws
        .close(Some(CloseFrame {
            code,
            reason: text[..cut].to_string().into(),
        }))
        .await;
}
