//! The `/api/chat` WebSocket session, Kyutai's protocol: binary messages whose
//! first byte is the kind (0x00 handshake, 0x01 Ogg Opus audio, 0x02 text,
//! 0x03 control, 0x04 metadata JSON, 0x05 error, 0x06 ping; unknown kinds are
//! ignored).
//!
//! One task per session on the core that accepted it. The loop waits on
//! whichever comes first, a client message or a record from the engine, so
//! audio flows both ways at once without a second task.
//!
//! Invariants:
//! * The handshake is the first message, sent only once a slot is held.
//! * Frames in flight (sent to the engine, not yet answered) never exceed
//!   `session.max_frames_in_flight`: at the bound the session stops reading
//!   its socket, so a client that sends faster than real time is slowed by
//!   TCP, not buffered without bound.
//! * Every buffer (decoder, cutter, encoder, frame, outgoing frames) is made
//!   once at start; the engine's records are encoded where they lie in the
//!   mailbox (no copy of their PCM into the session).
//! * Answers go out through [`WsOut`]: the encoder writes its Ogg pages
//!   straight into the session's outgoing buffer behind a WebSocket frame
//!   header, the text piece follows as its own message, and every frame
//!   answered since the last write goes to the socket in one `write_all`
//!   (one system call per 80 ms frame, none per page or message). Control
//!   messages and the goodbye go through tungstenite, whose write buffer is
//!   flushed before each of our writes so that frames never interleave.
//! * Whatever ends the session, its slot is released and its record logged;
//!   a protocol error gets a 0x05 message and a close, and concerns only
//!   this session.
//! * Stage metrics (decode per audio message, encode and send per output
//!   frame — framing into the buffer, with the batch's socket write added to
//!   its last frame — the push stamp of each frame) are recorded into the core's
//!   counters; the switch is read once per client message and once per
//!   batch of engine outputs, and while it is off no clock is read for
//!   them. The session keeps no metrics state: its own accounting is the
//!   [`SessionRecord`], whatever the switch says.
//! * Every text piece also goes to the session's [`EventSink`] (its
//!   subscribers on `GET /v1/sessions/{id}/events`, its final record and
//!   webhook); the id is the one the upgrade's `Moshid-Session-Id` header
//!   handed out. A `webhook_url` query parameter names the session's own
//!   webhook where `events.session_webhook_prefixes` allows it.

use crate::app::CoreApp;
use crate::codec::{DecoderConfig, EncoderConfig, FrameCutter, OggOpusDecoder, OggOpusEncoder};
use crate::engine::admission::Ticket;
use crate::engine::records::{FromEngine, FromEngineKind};
use crate::events::{EventSink, SessionState};
use crate::io::mailbox::Mailbox;
use crate::metrics::Stage;
use crate::protocol::{kind, parse_client_message, ClientMessage};
use crate::session::params::session_params;
use crate::session::record::{EndReason, SessionRecord};
use crate::transport::session::{self, ws_end_reason, Admitted};
use crate::transport::ws_out::{self, PushError, WsOut};
use crate::FRAME_SAMPLES;
use async_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use async_tungstenite::tungstenite::protocol::CloseFrame;
use async_tungstenite::tungstenite::{Bytes, Message};
use async_tungstenite::WebSocketStream;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt, StreamExt};
use futures_util::SinkExt;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long a session waits for the engine to answer a frame before it
/// gives up on it (the engine ticks every 80 ms; this is many ticks).
const ENGINE_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a session waits for its prompt to run before the handshake.
const PROMPT_TIMEOUT: Duration = Duration::from_secs(60);

enum Event {
    Incoming(Option<Result<Message, async_tungstenite::tungstenite::Error>>),
    IdleTimeout,
    Outputs,
}

/// Per-session buffers, made once.
struct Buffers {
    decoder: OggOpusDecoder,
    cutter: FrameCutter,
    encoder: OggOpusEncoder,
    frame: Box<[f32; FRAME_SAMPLES]>,
    /// Outgoing frames not yet written: room for two answered frames
    /// (audio and text each) before a write is forced.
    wire: WsOut,
    /// Wire bytes of one answered frame at most (audio with the header
    /// pages, the longest text piece).
    frame_wire_bytes: usize,
}

struct ChatSession<S> {
    ws: WebSocketStream<S>,
    app: CoreApp,
    ticket: Ticket,
    mailbox: Rc<Mailbox>,
    buf: Buffers,
    rec: SessionRecord,
    events: EventSink,
    in_flight: usize,
    /// Set once the client's input is over and the model is being drained
    /// (Hibiki): the text token that ends the stream has been seen.
    drain: Option<Drain>,
}

/// The state of a Hibiki drain after the end of input.
struct Drain {
    /// The text token that ends the stream.
    text_eos: u32,
    /// Whether it was generated.
    done: bool,
}

/// Runs one `/api/chat` session (id `id`, handed out with the upgrade) to
/// its end and returns its record.
pub async fn run<S>(
    mut ws: WebSocketStream<S>,
    app: CoreApp,
    query: Vec<(String, String)>,
    id: u64,
) -> SessionRecord
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let shared = app.shared.clone();
    let cfg = &shared.config;
    let mut rec = SessionRecord::start(id, "ws");
    let params = session_params(&query, &cfg.defaults, &shared.model_info)
        .and_then(|p| crate::session::prompt::with_prompt(p, &query, &shared.model_info))
        .map_err(|e| e.to_string())
        .and_then(|p| Ok((p, crate::events::webhook::from_pairs(&query, cfg)?)));
    let (params, webhook) = match params {
        Ok(p) => p,
        Err(e) => {
            rec.end(EndReason::BadParameters(e.clone()));
            refuse(&mut ws, &e).await;
            rec.log();
            return rec;
        }
    };
    let decoder_cfg = DecoderConfig {
        max_buffered_bytes: cfg.session.max_message_bytes + DecoderConfig::default().max_page_bytes,
        // Kyutai's server hands the decoder's output to the model untrimmed;
        // so do we, so that clients get one answer per frame they sent.
        trim_pre_skip: false,
        ..DecoderConfig::default()
    };
    let buffers = match (
        OggOpusDecoder::new(decoder_cfg),
        FrameCutter::new(FRAME_SAMPLES + crate::codec::MAX_PACKET_SAMPLES),
        OggOpusEncoder::new(EncoderConfig::default()),
    ) {
        (Ok(decoder), Ok(cutter), Ok(encoder)) => {
            let frame_wire_bytes = ws_out::message_bytes(encoder.max_output_bytes_per_frame())
                + ws_out::message_bytes(shared.max_text_bytes);
            Buffers {
                decoder,
                cutter,
                encoder,
                frame: Box::new([0.0; FRAME_SAMPLES]),
                wire: WsOut::with_capacity(2 * frame_wire_bytes),
                frame_wire_bytes,
            }
        }
        _ => {
            rec.end(EndReason::SendFailed("codec initialisation failed".into()));
            refuse(&mut ws, "internal error: codec initialisation failed").await;
            rec.log();
            return rec;
        }
    };
    let admitted = session::admit(&app, &mut rec, params, None, SessionState::Active, webhook);
    let Admitted {
        ticket,
        mailbox,
        events,
    } = match admitted {
        Ok(a) => a,
        Err(refusal) => {
            rec.end(EndReason::Refused(refusal.to_string()));
            refuse(&mut ws, &refusal.to_string()).await;
            rec.log();
            return rec;
        }
    };
    let mut s = ChatSession {
        ws,
        app,
        ticket,
        mailbox,
        buf: buffers,
        rec,
        events,
        in_flight: 0,
        drain: None,
    };
    let reason = s.serve().await;
    s.finish(reason).await
}

/// Sends an error message and closes, for a session that never started.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>, why: &str) {
    let mut msg = Vec::with_capacity(1 + why.len());
    msg.push(kind::ERROR);
    msg.extend_from_slice(why.as_bytes());
    let _ = ws.send(Message::Binary(msg.into())).await;
    let _ = ws.close(None).await;
}

impl<S: AsyncRead + AsyncWrite + Unpin> ChatSession<S> {
    async fn serve(&mut self) -> EndReason {
        // A model with prompts runs the session's prompt first: the handshake
        // follows it, as NVIDIA's server sends it.
        if self.app.shared.model_info.prompts.is_some() {
            if let Some(reason) = self.wait_for_prompt().await {
                return reason;
            }
        }
        if let Err(e) = self
            .ws
            .send(Message::Binary(Bytes::from_static(&[kind::HANDSHAKE])))
            .await
        {
            return EndReason::SendFailed(e.to_string());
        }
        let cfg = &self.app.shared.config.session;
        let idle = Duration::from_millis(cfg.idle_timeout_ms);
        let max_in_flight = cfg.max_frames_in_flight;
        let max_secs = cfg.max_session_seconds;
        loop {
            if let Some(reason) = self.pump_outputs().await {
                return reason;
            }
            if max_secs > 0 && self.rec.elapsed_secs() > max_secs as f64 {
                return EndReason::MaxDuration;
            }
            if self.mailbox.shutdown_requested() {
                return EndReason::ServerShutdown;
            }
            let event = if self.in_flight >= max_in_flight {
                // Backpressure: wait for the engine before reading more.
                match glommio::timer::timeout(ENGINE_ANSWER_TIMEOUT, async {
                    self.mailbox.ready().await;
                    Ok(())
                })
                .await
                {
                    Ok(()) => Event::Outputs,
                    Err(_) => return EndReason::EngineStalled,
                }
            } else {
                let mailbox = self.mailbox.clone();
                let incoming = async {
                    match glommio::timer::timeout(idle, async { Ok(self.ws.next().await) }).await {
                        Ok(m) => Event::Incoming(m),
                        Err(_) => Event::IdleTimeout,
                    }
                };
                let outputs = async {
                    mailbox.ready().await;
                    Event::Outputs
                };
                futures_lite::future::or(incoming, outputs).await
            };
            match event {
                Event::Outputs => {}
                Event::IdleTimeout => return EndReason::IdleTimeout,
                Event::Incoming(None) => return EndReason::ClientClosed,
                Event::Incoming(Some(Err(e))) => return ws_end_reason(e),
                Event::Incoming(Some(Ok(msg))) => {
                    if let Some(reason) = self.on_message(msg).await {
                        return reason;
                    }
                }
            }
        }
    }

    /// Waits for the engine's word that the prompt ran; `Some` ends the
    /// session (a fault, a stall, or the server shutting down).
    async fn wait_for_prompt(&mut self) -> Option<EndReason> {
        let mut rec = crate::engine::records::FromEngine::default();
        loop {
            let waited = glommio::timer::timeout(PROMPT_TIMEOUT, async {
                self.mailbox.ready().await;
                Ok(())
            })
            .await;
            if waited.is_err() {
                return Some(EndReason::EngineStalled);
            }
            if self.mailbox.shutdown_requested() {
                return Some(EndReason::ServerShutdown);
            }
            while self.mailbox.take(&mut rec) {
                match rec.kind {
                    FromEngineKind::PromptReady => return None,
                    FromEngineKind::Fault => return Some(EndReason::ModelFault),
                    _ => {}
                }
            }
        }
    }

    /// Handles one client message; `Some` ends the session.
    async fn on_message(&mut self, msg: Message) -> Option<EndReason> {
        let data = match msg {
            Message::Binary(data) => data,
            Message::Close(_) => return Some(EndReason::ClientClosed),
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => return None,
            Message::Text(_) => {
                return Some(EndReason::ProtocolError(
                    "text messages are not part of the protocol; send binary".into(),
                ))
            }
        };
        match parse_client_message(&data) {
            ClientMessage::Empty => Some(EndReason::ProtocolError("empty message".into())),
            ClientMessage::Audio(payload) => {
                // Stage metrics: the switch is read once per message.
                let metrics_on = self.app.ctx.metrics_on();
                let mut decode_time = Duration::ZERO;
                let end = self.on_audio(payload, metrics_on, &mut decode_time).await;
                if metrics_on {
                    self.app.ctx.stages.record(Stage::Decode, decode_time);
                }
                end
            }
            ClientMessage::EndOfInput => Some(self.finish_input().await),
            // Accepted and ignored: handshake echoes, text, control, metadata, ping.
            ClientMessage::Ignored(_) => None,
        }
    }

    /// Waits until a frame may be sent without exceeding the in-flight bound,
    /// sending what the engine answers meanwhile.
    async fn wait_for_room(&mut self) -> Option<EndReason> {
        while self.in_flight >= self.app.shared.config.session.max_frames_in_flight {
            if glommio::timer::timeout(ENGINE_ANSWER_TIMEOUT, async {
                self.mailbox.ready().await;
                Ok(())
            })
            .await
            .is_err()
            {
                return Some(EndReason::EngineStalled);
            }
            if self.mailbox.shutdown_requested() {
                return Some(EndReason::ServerShutdown);
            }
            if let Some(reason) = self.pump_outputs().await {
                return Some(reason);
            }
        }
        None
    }

    /// Hibiki's end of a stream, as the official inference does it: one
    /// end-of-stream input frame, then silence, until the model emits its
    /// end-of-text token or `session.drain_max_frames` frames have gone.
    async fn drain_model(&mut self, text_eos: u32) -> Option<EndReason> {
        self.drain = Some(Drain {
            text_eos,
            done: false,
        });
        if let Some(reason) = self.wait_for_room().await {
            return Some(reason);
        }
        if self.app.ctx.send_end_of_input(self.ticket).is_ok() {
            self.in_flight += 1;
        }
        self.buf.frame.fill(0.0);
        let max_frames = self.app.shared.config.session.drain_max_frames;
        for _ in 0..max_frames {
            if self.drain.as_ref().is_some_and(|d| d.done) {
                break;
            }
            if let Some(reason) = self.wait_for_room().await {
                return Some(reason);
            }
            if self.drain.as_ref().is_some_and(|d| d.done) {
                break;
            }
            match self.app.ctx.send_frame(self.ticket, &self.buf.frame) {
                Ok(()) => self.in_flight += 1,
                Err(_) => self.rec.frames_dropped += 1,
            }
        }
        None
    }

    /// The client's input is over: drain the model where it needs it, wait
    /// for the answers to every frame in flight, send them, and end normally.
    async fn finish_input(&mut self) -> EndReason {
        self.events.state(SessionState::Draining);
        if let Some(text_eos) = self.app.shared.model_info.drain_text_eos {
            if let Some(reason) = self.drain_model(text_eos).await {
                return reason;
            }
        }
        while self.in_flight > 0 {
            if glommio::timer::timeout(ENGINE_ANSWER_TIMEOUT, async {
                self.mailbox.ready().await;
                Ok(())
            })
            .await
            .is_err()
            {
                return EndReason::EngineStalled;
            }
            if self.mailbox.shutdown_requested() {
                return EndReason::ServerShutdown;
            }
            if let Some(reason) = self.pump_outputs().await {
                return reason;
            }
        }
        EndReason::InputFinished
    }

    /// Decodes audio bytes, cuts frames and sends them to the engine. With
    /// `metrics_on`, adds the time spent decoding to `decode_time` (waits for
    /// the engine excluded) and stamps each frame as it is pushed.
    async fn on_audio(
        &mut self,
        payload: &[u8],
        metrics_on: bool,
        decode_time: &mut Duration,
    ) -> Option<EndReason> {
        // The frames this message completes became complete now (the
        // engine measures the stream's phase from it).
        let arrived = Instant::now();
        let t = metrics_on.then_some(arrived);
        let pushed = self.buf.decoder.push_bytes(payload);
        if let Some(t) = t {
            *decode_time += t.elapsed();
        }
        if let Err(e) = pushed {
            return Some(EndReason::ProtocolError(format!("bad Ogg Opus audio: {e}")));
        }
        loop {
            let t = metrics_on.then(Instant::now);
            let next = self.buf.decoder.next_pcm();
            if let Some(t) = t {
                *decode_time += t.elapsed();
            }
            // The cutter holds less than one frame here and has room for a
            // frame plus the longest packet, so it always takes a whole packet.
            let whole_packet_taken = match next {
                Ok(Some(pcm)) => self.buf.cutter.push(pcm) == pcm.len(),
                Ok(None) => return None,
                Err(e) => {
                    return Some(EndReason::ProtocolError(format!("bad Ogg Opus audio: {e}")))
                }
            };
            if !whole_packet_taken {
                return Some(EndReason::ProtocolError(
                    "audio packet longer than the frame buffer".into(),
                ));
            }
            while self.buf.cutter.pop_frame(&mut self.buf.frame) {
                // Frames beyond the in-flight bound wait here for answers.
                if let Some(reason) = self.wait_for_room().await {
                    return Some(reason);
                }
                let pushed_at = metrics_on.then(Instant::now);
                match self.app.ctx.send_completed_frame(
                    self.ticket,
                    &self.buf.frame,
                    pushed_at,
                    Some(arrived),
                ) {
                    Ok(()) => {
                        self.in_flight += 1;
                        self.rec.frames_in += 1;
                    }
                    Err(_) => self.rec.frames_dropped += 1,
                }
            }
        }
    }

    /// Sends everything the engine has answered; `Some` ends the session.
    /// Each answered frame is framed into the outgoing buffer (its audio
    /// message, then its text message); the buffer is written when it has
    /// no room for another frame and once at the end. With metrics on (read
    /// once per call), each output frame gives one `encode` sample and one
    /// `send` sample (its framing; a write is added to the sample of the
    /// last frame it carries).
    async fn pump_outputs(&mut self) -> Option<EndReason> {
        let metrics_on = self.app.ctx.metrics_on();
        // Send time of the latest frame, recorded once the next frame or
        // the write is timed.
        let mut unrecorded_send: Option<Duration> = None;
        let mailbox = self.mailbox.clone();
        loop {
            if self.buf.wire.free_bytes() < self.buf.frame_wire_bytes {
                if let Err(reason) = self.write_wire(metrics_on, &mut unrecorded_send).await {
                    return Some(reason);
                }
            }
            // The record is encoded where it lies in the mailbox.
            match mailbox.take_with(|rec| self.on_record(rec, metrics_on, &mut unrecorded_send)) {
                None => break,
                Some(Ok(())) => {}
                Some(Err(reason)) => return Some(reason),
            }
        }
        if !self.buf.wire.is_empty() {
            if let Err(reason) = self.write_wire(metrics_on, &mut unrecorded_send).await {
                return Some(reason);
            }
        }
        None
    }

    /// Accounts for one engine record and, for an output, frames its audio
    /// and text into the outgoing buffer (which has room for one frame).
    fn on_record(
        &mut self,
        rec: &FromEngine,
        metrics_on: bool,
        unrecorded_send: &mut Option<Duration>,
    ) -> Result<(), EndReason> {
        if rec.kind == FromEngineKind::PromptReady {
            return Ok(());
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        if rec.late {
            self.rec.late_frames += 1;
        }
        match rec.kind {
            FromEngineKind::NoOutputYet => return Ok(()),
            FromEngineKind::Dropped => {
                self.rec.frames_dropped += 1;
                return Ok(());
            }
            FromEngineKind::Fault => return Err(EndReason::ModelFault),
            FromEngineKind::Output => {}
            FromEngineKind::PromptReady => unreachable!("handled above"),
        }
        self.rec.frames_out += 1;
        self.rec.text_tokens += 1;
        let t = metrics_on.then(Instant::now);
        let encoder = &mut self.buf.encoder;
        let max_bytes = encoder.max_output_bytes_per_frame();
        let pushed = self.buf.wire.push_with(kind::AUDIO, max_bytes, |out| {
            encoder.encode_frame(&rec.pcm, out)
        });
        match pushed {
            Ok(()) => {}
            Err(PushError::Fill(e)) => {
                return Err(EndReason::SendFailed(format!("encoding failed: {e}")))
            }
            Err(PushError::Full) => unreachable!("the caller made room for a frame"),
        }
        let send_start = t.map(|t| {
            let now = Instant::now();
            self.app
                .ctx
                .stages
                .record(Stage::Encode, now.saturating_duration_since(t));
            now
        });
        let token = rec.text_token;
        if let Some(d) = self.drain.as_mut() {
            d.done |= token == d.text_eos;
        }
        if let Some(text) = self.app.shared.pieces.text_for_token(token) {
            self.events.text(self.rec.frames_out - 1, token, text);
            self.buf
                .wire
                .push(kind::TEXT, text.as_bytes())
                .expect("the room made by the caller holds the longest text piece");
        }
        if let Some(t) = send_start {
            if let Some(previous) = unrecorded_send.replace(t.elapsed()) {
                self.app.ctx.stages.record(Stage::Send, previous);
            }
        }
        Ok(())
    }

    /// Writes the outgoing buffer to the socket with one `write_all`, after
    /// whatever tungstenite holds (an automatic pong) so that frames never
    /// interleave. With metrics on, the write's time is added to
    /// `unrecorded_send` (the last framed frame's), which is then recorded.
    async fn write_wire(
        &mut self,
        metrics_on: bool,
        unrecorded_send: &mut Option<Duration>,
    ) -> Result<(), EndReason> {
        let t = metrics_on.then(Instant::now);
        if let Err(e) = self.ws.flush().await {
            return Err(EndReason::SendFailed(e.to_string()));
        }
        let written = self.ws.get_mut().write_all(self.buf.wire.as_bytes()).await;
        self.buf.wire.clear();
        if let (Some(t), Some(send)) = (t, unrecorded_send.take()) {
            self.app.ctx.stages.record(Stage::Send, send + t.elapsed());
        }
        written.map_err(|e| EndReason::SendFailed(e.to_string()))
    }

    /// Releases the slot, tells the client how the session ended, logs it.
    async fn finish(mut self, reason: EndReason) -> SessionRecord {
        self.app.ctx.end_session(self.ticket);
        self.rec.end(reason);
        self.events.finish(&self.rec);
        let reason = self.rec.end_reason.clone().expect("set just above");
        let client_gone = matches!(
            reason,
            EndReason::ClientClosed | EndReason::SendFailed(_) | EndReason::SlowConsumer
        );
        if !client_gone {
            // The goodbye is bounded in time too: a client that stopped
            // reading cannot hold the session open.
            let limit = Duration::from_millis(self.app.shared.config.session.send_timeout_ms);
            let meta = self.rec.to_json().to_string();
            let _ = glommio::timer::timeout(limit, async {
                say_goodbye(&mut self.ws, &reason, &meta).await;
                Ok(())
            })
            .await;
        } else if matches!(reason, EndReason::ClientClosed) {
            // Complete the closing handshake: tungstenite queued the reply to
            // the client's close frame and writes it on a flush (its `close`
            // refuses to write once the peer has closed), so the client sees
            // a clean close instead of a dropped connection.
            let limit = Duration::from_millis(self.app.shared.config.session.send_timeout_ms);
            let _ = glommio::timer::timeout(limit, async {
                let _ = self.ws.flush().await;
                Ok(())
            })
            .await;
        }
        self.rec.log();
        self.rec
    }
}

/// The end of a session the client can still hear: the record as metadata,
/// an error message where the end was an error, and a close frame.
async fn say_goodbye<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    reason: &EndReason,
    meta: &str,
) {
    let error_text = match reason {
        EndReason::ProtocolError(d) => Some(format!("protocol error: {d}")),
        EndReason::IdleTimeout => Some("idle timeout: no audio received".to_string()),
        EndReason::ModelFault => Some("the model failed for this stream".to_string()),
        EndReason::EngineStalled => Some("the engine did not answer in time".to_string()),
        EndReason::ServerShutdown => Some("server shutting down".to_string()),
        EndReason::MaxDuration => Some("maximum session length reached".to_string()),
        _ => None,
    };
    let mut msg = vec![kind::METADATA];
    msg.extend_from_slice(meta.as_bytes());
    let _ = ws.send(Message::Binary(msg.into())).await;
    if let Some(text) = error_text {
        let mut msg = vec![kind::ERROR];
        msg.extend_from_slice(text.as_bytes());
        let _ = ws.send(Message::Binary(msg.into())).await;
    }
    let code = if matches!(reason, EndReason::ProtocolError(_)) {
        CloseCode::Protocol
    } else {
        CloseCode::Normal
    };
    let _ = ws
        .close(Some(CloseFrame {
            code,
            reason: reason.label().into(),
        }))
        .await;
}
