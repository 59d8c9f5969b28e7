//! One Realtime WebSocket session (either endpoint), on the I/O core that
//! accepted it: set-up, the loop, the audio in, the engine's answers out,
//! and the end.
//!
//! Set-up: the model must fit the endpoint (a Hibiki model on
//! `/v1/realtime/translations`, another on `/v1/realtime`); the URL's
//! query gives the session parameters of every transport (`seed`,
//! temperatures, `webhook_url`, …) and `responses`; then a slot is taken
//! and `session.created` is the first event. A refusal is an `error` event
//! and a close, and the session never held a slot.
//!
//! The loop waits on whichever comes first: a client event, an answer from
//! the engine, a deadline (idle, length, engine stall). Audio appended is
//! decoded into the session's buffer and cut into frames under the engine
//! link's budget; while bytes of it wait for room the socket is not read,
//! so a client sending faster than real time is slowed by TCP. Each frame
//! is sent to the engine stamped with the arrival of the message that
//! completed it (the engine measures the stream's phase from it, as for
//! `/api/chat`). Answers are encoded into [`OutFrames`], then written as
//! events into the [`Wire`] and to the socket with one write per batch.
//!
//! Invariants: frames in flight stay within the link's budget; every buffer
//! is made at set-up or on a format change; an event the session refuses
//! is answered with an `error` and the session goes on, while malformed
//! input (not a JSON event, a field of the wrong type, bad base64, audio
//! that is not whole samples, a binary message, a message over
//! `realtime.max_event_bytes`) ends this session only, with an `error`
//! first; whatever ends it, its slot is released, its events finished
//! (SSE, webhook) and its record logged. Stage metrics: `decode` per
//! append (base64, codec, frames to the lane), `encode` per model frame
//! (codec, resampling), `send` per frame's events (framing, with the batch
//! write added to the batch's last frame); the switch is read once per
//! message and per batch.

use super::audio::{AudioIn, OutFrames};
use super::client_event::{self, max_audio_bytes, ClientEvent, Kind};
use super::error::ApiError;
use super::responses::{Ending, Responses};
use super::settings::{Endpoint, Settings};
use super::vad::{Vad, VadEvent};
use super::wire::Wire;
use crate::app::{CoreApp, Shared};
use crate::config::realtime::ResponseMode;
use crate::events::SessionState;
use crate::io::conn::Conn;
use crate::metrics::Stage;
use crate::session::params::session_params;
use crate::session::record::{EndReason, SessionRecord};
use crate::transport::link::{ws_end_reason, EngineLink};
use crate::{FRAME_MS, FRAME_SAMPLES};
use async_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use async_tungstenite::tungstenite::protocol::CloseFrame;
use async_tungstenite::tungstenite::Message;
use async_tungstenite::WebSocketStream;
use futures_lite::{AsyncWriteExt, StreamExt};
use futures_util::SinkExt;
use glommio::timer::Timer;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(super) type Ws = WebSocketStream<Conn>;

/// Longest the loop sleeps without a deadline.
const HOUSEKEEPING: Duration = Duration::from_millis(500);

/// Why a client event was not done.
pub(super) enum Reject {
    /// Refused: an `error` event, and the session goes on.
    Refused(ApiError),
    /// Malformed: an `error` event, and the session ends.
    Fatal(ApiError),
    /// The session ends for another reason.
    End(EndReason),
}

impl From<EndReason> for Reject {
    fn from(r: EndReason) -> Self {
        Reject::End(r)
    }
}

/// The state of a translation's end (`session.close`).
pub(super) struct Drain {
    /// The text token that ends the model's stream, if it has one.
    pub text_eos: Option<u32>,
    /// Whether the end-of-stream input was sent.
    pub eos_sent: bool,
    /// Silent frames still allowed (`session.drain_max_frames`).
    pub fillers_left: usize,
    /// Whether the model ended its text.
    pub done: bool,
}

/// A response's transcript, kept up to a bound for its `.done` events.
pub(super) struct Transcript {
    pub text: String,
    pub truncated: bool,
}

impl Transcript {
    /// Appends `piece` if it fits whole.
    pub fn push(&mut self, piece: &str) {
        if self.text.len() + piece.len() <= self.text.capacity() {
            self.text.push_str(piece);
        } else {
            self.truncated = true;
        }
    }

    /// Empties it for the next response.
    pub fn clear(&mut self) {
        self.text.clear();
        self.truncated = false;
    }
}

/// One session.
pub(super) struct RtSession {
    pub ws: Ws,
    pub link: EngineLink,
    pub shared: Arc<Shared>,
    pub rec: SessionRecord,
    pub endpoint: Endpoint,
    pub api_id: String,
    /// The served model's name (`GET /v1/model`'s), in the session objects.
    pub model_name: String,
    pub settings: Settings,
    pub input: AudioIn,
    pub out_frames: OutFrames,
    pub wire: Wire,
    pub responses: Responses,
    pub vad: Option<Vad>,
    pub vad_events: VecDeque<VadEvent>,
    /// The caller's items so far (commits and detected speech).
    pub user_items: u64,
    pub transcript: Transcript,
    /// Output frames whose events were written.
    pub frames_emitted: u64,
    pub frame: Box<[f32; FRAME_SAMPLES]>,
    pub last_rx: Instant,
    timer: Timer,
    pub drain: Option<Drain>,
    /// The malformed input that ends the session, for its goodbye.
    fatal: Option<ApiError>,
    /// The framing time of the last frame written, until the write is added.
    unrecorded_send: Option<Duration>,
}

/// Runs one session of `endpoint` (id `id`, handed out with the upgrade)
/// to its end and returns its record.
pub async fn run(
    ws: Ws,
    app: CoreApp,
    query: Vec<(String, String)>,
    id: u64,
    endpoint: Endpoint,
    model_name: &str,
) -> SessionRecord {
    let shared = app.shared.clone();
    let cfg = &shared.config;
    let transport = match endpoint {
        Endpoint::Conversation => "realtime",
        Endpoint::Translation => "realtime_translation",
    };
    let mut rec = SessionRecord::start(id, transport);
    let _ = ws
        .get_ref()
        .tcp()
        .set_write_timeout(Some(Duration::from_millis(cfg.session.send_timeout_ms)));
    let setup = model_fits(endpoint, &shared).and_then(|()| {
        let params = session_params(&query, &cfg.defaults, &shared.model_info)
            .map_err(|e| e.to_string())
            .and_then(|p| Ok((p, crate::events::webhook::from_pairs(&query, cfg)?)))
            .map_err(|e| {
                Box::new((
                    EndReason::BadParameters(e.clone()),
                    ApiError::invalid("bad_parameters", e),
                ))
            })?;
        let mode = response_mode(&query, cfg.realtime.responses)
            .map_err(|e| Box::new((EndReason::BadParameters(e.message.clone()), e)))?;
        Ok((params, mode))
    });
    let ((params, webhook), mode) = match setup {
        Ok(s) => s,
        Err(refused) => {
            let (reason, e) = *refused;
            return refuse(ws, rec, reason, e, &app).await;
        }
    };
    let (ticket, mailbox) = match app.ctx.admit(params, cfg.session.max_frames_in_flight + 1) {
        Ok(t) => t,
        Err(refusal) => {
            let e = ApiError::server("session_refused", refusal.to_string());
            return refuse(ws, rec, EndReason::Refused(refusal.to_string()), e, &app).await;
        }
    };
    rec.slot = Some(ticket.slot);
    let api_id = format!("sess_{id}");
    let events = shared.events.open(
        &rec,
        Some(api_id.clone()),
        app.ctx.core,
        SessionState::Active,
        webhook,
    );
    let link = EngineLink::new(app, ticket, mailbox, events);
    let mut s = match RtSession::new(
        ws,
        link,
        rec,
        endpoint,
        (api_id, model_name.to_string()),
        mode,
    ) {
        Ok(s) => s,
        Err(unbuilt) => {
            let (ws, mut link, mut rec, e) = *unbuilt;
            link.release();
            rec.end(EndReason::SendFailed(e.clone()));
            link.finish_events(&rec);
            let err = ApiError::server("internal_error", e);
            return refuse(
                ws,
                rec,
                EndReason::SendFailed(String::new()),
                err,
                &link.app,
            )
            .await;
        }
    };
    let reason = match s.send_created().await {
        Ok(()) => s.serve().await,
        Err(r) => r,
    };
    s.finish(reason).await
}

/// Whether the served model fits the endpoint.
fn model_fits(endpoint: Endpoint, shared: &Shared) -> Result<(), Refused> {
    let hibiki = shared.model_info.is_hibiki;
    let why = match (endpoint, hibiki) {
        (Endpoint::Conversation, true) => {
            "this daemon serves a Hibiki translation model: open /v1/realtime/translations"
        }
        (Endpoint::Translation, false) => {
            "this daemon serves a conversation model (Moshi), not a translation model: open /v1/realtime"
        }
        _ => return Ok(()),
    };
    Err(Box::new((
        EndReason::BadParameters(why.into()),
        ApiError::invalid("model_not_supported", why).param("model"),
    )))
}

/// Why a session is refused before it starts, and the `error` that says so
/// (boxed: large, and taken once at most).
type Refused = Box<(EndReason, ApiError)>;

/// The URL's `responses=turns|continuous`, over the configured default.
fn response_mode(
    query: &[(String, String)],
    default: ResponseMode,
) -> Result<ResponseMode, ApiError> {
    let mut mode = default;
    for (k, v) in query.iter().filter(|(k, _)| k == "responses") {
        mode = match v.as_str() {
            "turns" => ResponseMode::Turns,
            "continuous" => ResponseMode::Continuous,
            _ => {
                return Err(ApiError::invalid(
                    "bad_parameters",
                    format!("parameter `{k}`: must be turns or continuous"),
                )
                .param(k.clone()))
            }
        };
    }
    Ok(mode)
}

/// What a session that could not be built hands back to be ended (boxed:
/// the socket and the link are large, and this path is taken once at most).
type Unbuilt = Box<(Ws, EngineLink, SessionRecord, String)>;

impl RtSession {
    fn new(
        ws: Ws,
        link: EngineLink,
        rec: SessionRecord,
        endpoint: Endpoint,
        (api_id, model_name): (String, String),
        mode: ResponseMode,
    ) -> Result<Self, Unbuilt> {
        let shared = link.app.shared.clone();
        let cfg = &shared.config;
        let settings = match endpoint {
            Endpoint::Conversation => Settings::default(),
            Endpoint::Translation => Settings {
                turn_detection: None,
                ..Settings::default()
            },
        };
        let in_flight = cfg.session.max_frames_in_flight + 1;
        let audio = AudioIn::new(
            settings.input,
            max_audio_bytes(cfg.realtime.max_event_bytes),
        )
        .and_then(|i| Ok((i, OutFrames::new(settings.output, in_flight)?)));
        let (input, out_frames) = match audio {
            Ok(a) => a,
            Err(e) => return Err(Box::new((ws, link, rec, format!("audio path: {e}")))),
        };
        let silence_frames = (cfg.realtime.response_silence_ms as f64 / FRAME_MS).ceil() as u32;
        let wire = Wire::new(rec.id, out_frames.frame_bytes(), shared.max_text_bytes);
        Ok(RtSession {
            vad: settings.turn_detection.as_ref().map(Vad::new),
            vad_events: VecDeque::with_capacity(in_flight),
            responses: Responses::new(mode, silence_frames),
            transcript: Transcript {
                text: String::with_capacity(cfg.realtime.max_transcript_bytes),
                truncated: false,
            },
            settings,
            input,
            out_frames,
            wire,
            ws,
            link,
            shared,
            rec,
            endpoint,
            api_id,
            model_name,
            user_items: 0,
            frames_emitted: 0,
            frame: Box::new([0.0; FRAME_SAMPLES]),
            last_rx: Instant::now(),
            timer: Timer::new(HOUSEKEEPING),
            drain: None,
            fatal: None,
            unrecorded_send: None,
        })
    }

    /// Unix seconds at which the session's length runs out (0: never).
    pub fn expires_at(&self) -> u64 {
        let max = self.shared.config.session.max_session_seconds;
        if max == 0 {
            return 0;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        now + max.saturating_sub(self.rec.elapsed_secs() as u64)
    }

    async fn serve(&mut self) -> EndReason {
        let cfg = &self.shared.config.session;
        let idle = Duration::from_millis(cfg.idle_timeout_ms);
        let max_secs = cfg.max_session_seconds;
        loop {
            if let Err(reason) = self.pump().await {
                return reason;
            }
            if let Err(reason) = self.feed().await {
                return reason;
            }
            if let Some(reason) = self.drain_finished() {
                return reason;
            }
            if self.link.mailbox.shutdown_requested() {
                return EndReason::ServerShutdown;
            }
            if max_secs > 0 && self.rec.elapsed_secs() > max_secs as f64 {
                return EndReason::MaxDuration;
            }
            let now = Instant::now();
            if self.drain.is_none() && now.duration_since(self.last_rx) >= idle {
                return EndReason::IdleTimeout;
            }
            if self.link.stall_deadline().is_some_and(|d| now >= d) {
                return EndReason::EngineStalled;
            }
            let mut wake_at = now + HOUSEKEEPING;
            if self.drain.is_none() {
                wake_at = wake_at.min(self.last_rx + idle);
            }
            if let Some(d) = self.link.stall_deadline() {
                wake_at = wake_at.min(d);
            }
            self.timer.reset(wake_at.saturating_duration_since(now));
            let can_read = !self.input.has_pending() && self.drain.is_none();
            match self.wait(can_read).await {
                Wake::Engine | Wake::Timer => {}
                Wake::Message(None) => return EndReason::ClientClosed,
                Wake::Message(Some(Err(e))) => return self.socket_error(e),
                Wake::Message(Some(Ok(msg))) => {
                    self.last_rx = Instant::now();
                    if let Err(reason) = self.on_message(msg).await {
                        return reason;
                    }
                }
            }
        }
    }

    async fn wait(&mut self, can_read: bool) -> Wake {
        let ws = &mut self.ws;
        let timer = &mut self.timer;
        let mailbox = &self.link.mailbox;
        let read = async {
            if can_read {
                Wake::Message(ws.next().await)
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
    }

    /// One client message; `Err` ends the session.
    async fn on_message(&mut self, msg: Message) -> Result<(), EndReason> {
        let text = match msg {
            Message::Text(t) => t,
            Message::Close(_) => return Err(EndReason::ClientClosed),
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => return Ok(()),
            Message::Binary(_) => {
                return Err(self.fatal(ApiError::invalid(
                    "invalid_event",
                    "binary messages are not part of the Realtime API: events are JSON text",
                )))
            }
        };
        let event = match client_event::parse(text.as_str()) {
            Ok(e) => e,
            Err(e) => return Err(self.fatal(e)),
        };
        let done = match self.endpoint {
            Endpoint::Conversation => self.on_conversation_event(&event).await,
            Endpoint::Translation => self.on_translation_event(&event).await,
        };
        match done {
            Ok(()) => {}
            Err(Reject::Refused(e)) => {
                let e = e.about(event.id());
                let id = self.wire.next_event_id();
                self.send_event(&e.to_event(&id)).await?;
            }
            Err(Reject::Fatal(e)) => return Err(self.fatal(e.about(event.id()))),
            Err(Reject::End(reason)) => return Err(reason),
        }
        self.flush_wire(false).await
    }

    /// A read that failed: a message over the size bound or not UTF-8 is
    /// malformed input (an `error` first), the rest as for every WebSocket.
    fn socket_error(&mut self, e: async_tungstenite::tungstenite::Error) -> EndReason {
        use async_tungstenite::tungstenite::Error;
        match e {
            Error::Capacity(c) => self.fatal(ApiError::invalid(
                "event_too_large",
                format!("event larger than realtime.max_event_bytes: {c}"),
            )),
            Error::Utf8(_) => self.fatal(ApiError::invalid(
                "invalid_event",
                "a text message that is not UTF-8",
            )),
            other => ws_end_reason(other),
        }
    }

    /// Malformed input: kept for the goodbye, and the session's end.
    fn fatal(&mut self, e: ApiError) -> EndReason {
        let reason = EndReason::ProtocolError(e.message.clone());
        self.fatal = Some(e);
        reason
    }

    /// An event of an endpoint that does not take it, or of no endpoint.
    pub fn unsupported(&self, event: &ClientEvent) -> Reject {
        let path = match self.endpoint {
            Endpoint::Conversation => "/v1/realtime",
            Endpoint::Translation => "/v1/realtime/translations",
        };
        let what = if event.kind() == Kind::Other {
            "is not an event moshid supports"
        } else {
            "is not an event of this endpoint"
        };
        Reject::Refused(ApiError::invalid(
            "unsupported_event",
            format!(
                "`{}` {what} ({path})",
                client_event::clip(event.type_name.as_str())
            ),
        ))
    }

    /// `input_audio_buffer.append` (either endpoint's name for it).
    pub async fn on_append(&mut self, event: &ClientEvent<'_>) -> Result<(), Reject> {
        let Some(audio) = event.audio.as_ref() else {
            return Err(Reject::Fatal(
                ApiError::invalid("invalid_event", "`audio` is missing").param("audio"),
            ));
        };
        let ctx = self.link.app.ctx.clone();
        let t = ctx.metrics_on().then(Instant::now);
        self.input.decode(audio.as_str()).map_err(Reject::Fatal)?;
        self.take_pending();
        if let Some(t) = t {
            ctx.stages.record(Stage::Decode, t.elapsed());
        }
        self.emit_vad_events().await?;
        Ok(())
    }

    /// Sends the frames the pending audio completes, within the budget;
    /// speech detection runs on each.
    fn take_pending(&mut self) {
        if !self.input.has_pending() {
            return;
        }
        let budget = self.link.budget(None);
        let arrived = self.last_rx;
        let (link, rec, vad, vad_events) = (
            &mut self.link,
            &mut self.rec,
            &mut self.vad,
            &mut self.vad_events,
        );
        self.input.take(budget, &mut self.frame, |f| {
            link.send(f, arrived, rec);
            if let Some(e) = vad.as_mut().and_then(|v| v.push(f)) {
                // Sized for a budget's frames: never grows.
                if vad_events.len() < vad_events.capacity() {
                    vad_events.push_back(e);
                }
            }
        });
    }

    /// Audio that waited for room, the speech events it gave, the drain.
    async fn feed(&mut self) -> Result<(), EndReason> {
        self.take_pending();
        self.emit_vad_events().await?;
        self.drain_step();
        self.flush_wire(false).await
    }

    /// Takes the engine's answers and writes their events.
    async fn pump(&mut self) -> Result<(), EndReason> {
        let ctx = self.link.app.ctx.clone();
        let metrics_on = ctx.metrics_on();
        let out_frames = &mut self.out_frames;
        let mut lost = 0;
        self.link.pump_each(&mut self.rec, |answer| {
            let t = metrics_on.then(Instant::now);
            if !out_frames.push(&answer.pcm, answer.text_token) {
                lost += 1;
            }
            if let Some(t) = t {
                ctx.stages.record(Stage::Encode, t.elapsed());
            }
        })?;
        self.rec.frames_dropped += lost;
        while !self.out_frames.is_empty() {
            let t = metrics_on.then(Instant::now);
            match self.endpoint {
                Endpoint::Conversation => self.emit_conversation_frame().await?,
                Endpoint::Translation => self.emit_translation_frame().await?,
            }
            self.out_frames.pop();
            self.frames_emitted += 1;
            if let Some(t) = t {
                if let Some(previous) = self.unrecorded_send.replace(t.elapsed()) {
                    ctx.stages.record(Stage::Send, previous);
                }
            }
        }
        self.flush_wire(metrics_on).await
    }

    /// Makes room for one frame's deltas in the wire.
    pub async fn room_for_a_frame(&mut self) -> Result<(), EndReason> {
        if !self.wire.has_room_for_a_frame() {
            self.flush_wire(false).await?;
        }
        Ok(())
    }

    /// Queues one event built as a JSON value (written with the next
    /// batch; one larger than the whole buffer goes through tungstenite).
    pub async fn send_event(&mut self, event: &Value) -> Result<(), EndReason> {
        self.wire.serialize(event);
        if self.wire.serialized_too_large() {
            self.flush_wire(false).await?;
            let text = self.wire.scratch_text().to_string();
            return self
                .ws
                .send(Message::Text(text.into()))
                .await
                .map_err(ws_end_reason);
        }
        if self.wire.push_serialized().is_err() {
            self.flush_wire(false).await?;
            self.wire
                .push_serialized()
                .expect("an event that is not too large fits an empty buffer");
        }
        Ok(())
    }

    /// Writes the wire to the socket with one `write_all`, after whatever
    /// tungstenite holds. With metrics on, the write is added to the last
    /// frame's `send` sample.
    pub async fn flush_wire(&mut self, metrics_on: bool) -> Result<(), EndReason> {
        if self.wire.is_empty() {
            return Ok(());
        }
        let t = metrics_on.then(Instant::now);
        self.ws.flush().await.map_err(ws_end_reason)?;
        let written = self.ws.get_mut().write_all(self.wire.as_bytes()).await;
        self.wire.clear();
        if let (Some(t), Some(send)) = (t, self.unrecorded_send.take()) {
            self.link
                .app
                .ctx
                .stages
                .record(Stage::Send, send + t.elapsed());
        }
        written.map_err(io_end)
    }

    /// Releases the slot, tells the client how the session ended, logs it.
    async fn finish(mut self, reason: EndReason) -> SessionRecord {
        self.link.release();
        let client_gone = matches!(
            reason,
            EndReason::ClientClosed | EndReason::SendFailed(_) | EndReason::SlowConsumer
        );
        let limit = Duration::from_millis(self.shared.config.session.send_timeout_ms);
        if !client_gone {
            // Best effort, bounded: a response in progress ends incomplete.
            let _ = glommio::timer::timeout(limit, async {
                let _ = self.close_open_response(Ending::SessionEnded).await;
                let _ = self.flush_wire(false).await;
                Ok(())
            })
            .await;
        }
        self.rec.end(reason);
        self.link.finish_events(&self.rec);
        let reason = self.rec.end_reason.clone().expect("set just above");
        if !client_gone {
            let _ = glommio::timer::timeout(limit, async {
                self.goodbye(&reason).await;
                Ok(())
            })
            .await;
        } else if matches!(reason, EndReason::ClientClosed) {
            // Complete the closing handshake: tungstenite queued the reply to
            // the client's close frame and writes it on a flush (its `close`
            // refuses to write once the peer has closed).
            let _ = glommio::timer::timeout(limit, async {
                let _ = self.ws.flush().await;
                let _ = self.ws.close(None).await;
                Ok(())
            })
            .await;
        }
        self.rec.log();
        self.rec
    }

    /// `session.closed` after a translation's close, else an `error`
    /// event where the end is one; then a close frame saying why.
    async fn goodbye(&mut self, reason: &EndReason) {
        let event = if *reason == EndReason::InputFinished {
            let mut e = serde_json::json!({
                "type": "session.closed",
                "event_id": self.wire.next_event_id(),
            });
            e["record"] = self.rec.to_json();
            Some(e)
        } else {
            let e = self.fatal.take().or_else(|| end_error(reason));
            e.map(|e| e.to_event(&self.wire.next_event_id()))
        };
        if let Some(event) = event {
            let _ = self.send_event(&event).await;
            let _ = self.flush_wire(false).await;
        }
        let _ = self.ws.close(Some(close_frame(reason))).await;
    }
}

enum Wake {
    Message(Option<Result<Message, async_tungstenite::tungstenite::Error>>),
    Engine,
    Timer,
}

/// The `error` event of a session's end, where the end is an error.
fn end_error(reason: &EndReason) -> Option<ApiError> {
    Some(match reason {
        EndReason::ProtocolError(d) => ApiError::invalid("protocol_error", d.clone()),
        EndReason::BadParameters(d) => ApiError::invalid("bad_parameters", d.clone()),
        EndReason::Refused(d) => ApiError::server("session_refused", d.clone()),
        EndReason::IdleTimeout => ApiError::invalid(
            "idle_timeout",
            "no event received for session.idle_timeout_ms",
        ),
        EndReason::MaxDuration => ApiError::invalid(
            "session_expired",
            "maximum session length reached (session.max_session_seconds)",
        ),
        EndReason::ServerShutdown => ApiError::server("server_shutdown", "server shutting down"),
        EndReason::ModelFault => {
            ApiError::server("model_fault", "the model failed for this session")
        }
        EndReason::EngineStalled => {
            ApiError::server("engine_stalled", "the engine did not answer in time")
        }
        EndReason::SendFailed(d) => ApiError::server("internal_error", d.clone()),
        EndReason::ClientClosed | EndReason::InputFinished | EndReason::SlowConsumer => {
            return None
        }
    })
}

/// The close frame of a session's end (its reason at most 123 bytes).
fn close_frame(reason: &EndReason) -> CloseFrame {
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
    CloseFrame {
        code,
        reason: reason.label().into(),
    }
}

/// A socket write's failure as the session's end.
fn io_end(e: std::io::Error) -> EndReason {
    match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => EndReason::SlowConsumer,
        std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::UnexpectedEof => EndReason::ClientClosed,
        _ => EndReason::SendFailed(e.to_string()),
    }
}

/// Ends a session that never started: an `error` event, a close, the log.
async fn refuse(
    mut ws: Ws,
    mut rec: SessionRecord,
    reason: EndReason,
    e: ApiError,
    app: &CoreApp,
) -> SessionRecord {
    if rec.end_reason.is_none() {
        rec.end(reason);
    }
    let reason = rec.end_reason.clone().expect("ended");
    let limit = Duration::from_millis(app.shared.config.session.send_timeout_ms);
    let event = e.to_event(&format!("event_{}_0", rec.id)).to_string();
    let _ = glommio::timer::timeout(limit, async {
        let _ = ws.send(Message::Text(event.into())).await;
        let _ = ws.close(Some(close_frame(&reason))).await;
        Ok(())
    })
    .await;
    rec.log();
    rec
}
