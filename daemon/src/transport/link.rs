//! A session's link to the engine, shared by AudioSocket, Media Streams and
//! the Realtime API: frames sent and answered, the in-flight bound, the
//! answer timeout, and the engine's answers turned into queued line packets
//! ([`EngineLink::pump`]) or handed to the session ([`EngineLink::pump_each`]).
//!
//! Invariants: frames in flight never exceed `session.max_frames_in_flight`
//! nor what the line's packet queue can still take once every frame in
//! flight is answered ([`EngineLink::budget`]), so neither the mailbox nor
//! the queue overflows for a well-behaved engine; a frame the lane refuses
//! is counted as dropped, never retried. Nothing here allocates after
//! [`EngineLink::new`].
//!
//! Each answer's text piece goes to the session's [`EventSink`]; with
//! stage metrics on (read once per batch of answers), each model frame's
//! resampling and encoding into line packets is one `encode` sample.

use super::line::{LineOut, PACKETS_PER_FRAME};
use crate::app::CoreApp;
use crate::engine::admission::Ticket;
use crate::engine::records::{FromEngine, FromEngineKind};
use crate::events::EventSink;
use crate::io::mailbox::Mailbox;
use crate::metrics::Stage;
use crate::session::record::{EndReason, SessionRecord};
use crate::FRAME_SAMPLES;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long the engine may leave a frame unanswered (it ticks every 80 ms;
/// this is many ticks).
pub const ENGINE_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// One admitted session's side of the engine.
pub struct EngineLink {
    /// The core's view.
    pub app: CoreApp,
    /// The slot held.
    pub ticket: Ticket,
    /// Where the engine's answers arrive.
    pub mailbox: Rc<Mailbox>,
    in_flight: usize,
    max_in_flight: usize,
    sent: u64,
    answered: u64,
    last_progress: Instant,
    record: Box<FromEngine>,
    /// The session's events (taken when they are finished).
    events: Option<EventSink>,
}

impl EngineLink {
    /// The link of an admitted session, with its event sink.
    pub fn new(app: CoreApp, ticket: Ticket, mailbox: Rc<Mailbox>, events: EventSink) -> Self {
        let max_in_flight = app.shared.config.session.max_frames_in_flight;
        EngineLink {
            app,
            ticket,
            mailbox,
            in_flight: 0,
            max_in_flight,
            sent: 0,
            answered: 0,
            last_progress: Instant::now(),
            record: Box::default(),
            events: Some(events),
        }
    }

    /// The session's event sink (until [`EngineLink::finish_events`]).
    pub fn events(&mut self) -> Option<&mut EventSink> {
        self.events.as_mut()
    }

    /// Sets the session's final record for its subscribers and webhook.
    pub fn finish_events(&mut self, rec: &SessionRecord) {
        if let Some(events) = self.events.take() {
            events.finish(rec);
        }
    }

    /// Frames sent to the engine and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Frames sent so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Frames answered so far (answers come in order).
    pub fn answered(&self) -> u64 {
        self.answered
    }

    /// Frames that may be sent now: within the in-flight bound, and such
    /// that `out` can take the answers of every frame in flight.
    pub fn budget(&self, out: Option<&LineOut>) -> usize {
        let by_bound = self.max_in_flight.saturating_sub(self.in_flight);
        let by_room = match out {
            Some(out) => {
                ((out.capacity() - out.len()) / PACKETS_PER_FRAME).saturating_sub(self.in_flight)
            }
            None => by_bound,
        };
        by_bound.min(by_room)
    }

    /// Sends one frame (the caller checked [`EngineLink::budget`]) whose
    /// last sample arrived at `completed_at`: the engine measures the
    /// stream's phase from it, as for a WebSocket stream, and ticks the
    /// stream's group right after its frames complete (the caller's
    /// network, not moshid, decides when that is).
    pub fn send(
        &mut self,
        frame: &[f32; FRAME_SAMPLES],
        completed_at: Instant,
        rec: &mut SessionRecord,
    ) {
        let ctx = &self.app.ctx;
        let pushed_at = ctx.metrics_on().then(Instant::now);
        match ctx.send_completed_frame(self.ticket, frame, pushed_at, Some(completed_at)) {
            Ok(()) => {
                self.note_sent();
                rec.frames_in += 1;
            }
            Err(_) => rec.frames_dropped += 1,
        }
    }

    /// Takes every answer waiting: audio goes to `out` (when the line is
    /// set up; before, there is none to answer). Returns how many answers
    /// were taken, or the end of the session on a model fault.
    pub fn pump(
        &mut self,
        mut out: Option<&mut LineOut>,
        rec: &mut SessionRecord,
    ) -> Result<usize, EndReason> {
        let ctx = self.app.ctx.clone();
        let mut metrics_on = None;
        self.pump_each(rec, |answer| {
            if let Some(out) = out.as_deref_mut() {
                let t = metrics_on
                    .get_or_insert_with(|| ctx.metrics_on())
                    .then(Instant::now);
                out.push_frame(&answer.pcm);
                if let Some(t) = t {
                    ctx.stages.record(Stage::Encode, t.elapsed());
                }
            }
        })
    }

    /// Takes every answer waiting and hands each model output (its PCM and
    /// text token) to `on_output`, in order; the accounting (frames out,
    /// tokens, drops, late frames) and the text events are done here.
    /// Returns how many answers were taken, or the end of the session on a
    /// model fault.
    pub fn pump_each(
        &mut self,
        rec: &mut SessionRecord,
        mut on_output: impl FnMut(&FromEngine),
    ) -> Result<usize, EndReason> {
        let mut n = 0;
        while self.mailbox.take(&mut self.record) {
            if self.record.kind == FromEngineKind::PromptReady {
                // Answers no frame: the prompt ran before the first frames.
                continue;
            }
            n += 1;
            self.in_flight = self.in_flight.saturating_sub(1);
            self.answered += 1;
            self.last_progress = Instant::now();
            if self.record.late {
                rec.late_frames += 1;
            }
            match self.record.kind {
                FromEngineKind::NoOutputYet | FromEngineKind::PromptReady => {}
                FromEngineKind::Dropped => rec.frames_dropped += 1,
                FromEngineKind::Fault => return Err(EndReason::ModelFault),
                FromEngineKind::Output => {
                    rec.frames_out += 1;
                    rec.text_tokens += 1;
                    on_output(&self.record);
                    let token = self.record.text_token;
                    if let (Some(piece), Some(events)) = (
                        self.app.shared.pieces.text_for_token(token),
                        self.events.as_mut(),
                    ) {
                        events.text(rec.frames_out - 1, token, piece);
                    }
                }
            }
        }
        Ok(n)
    }

    /// Tells the engine the input is over (a model that must be drained:
    /// its next step feeds the end-of-stream input); counted in flight.
    pub fn send_end_of_input(&mut self) -> bool {
        let sent = self.app.ctx.send_end_of_input(self.ticket).is_ok();
        if sent {
            self.note_sent();
        }
        sent
    }

    /// Sends one frame the client did not send (silence fed while a model
    /// is drained): in flight, but not one of the record's `frames_in`.
    pub fn send_filler(&mut self, frame: &[f32; FRAME_SAMPLES], rec: &mut SessionRecord) {
        match self.app.ctx.send_frame(self.ticket, frame) {
            Ok(()) => self.note_sent(),
            Err(_) => rec.frames_dropped += 1,
        }
    }

    fn note_sent(&mut self) {
        if self.in_flight == 0 {
            self.last_progress = Instant::now();
        }
        self.in_flight += 1;
        self.sent += 1;
    }

    /// When the oldest unanswered frame times out, if any is in flight.
    pub fn stall_deadline(&self) -> Option<Instant> {
        (self.in_flight > 0).then(|| self.last_progress + ENGINE_ANSWER_TIMEOUT)
    }

    /// Releases the slot (once, at the end).
    pub fn release(&self) {
        self.app.ctx.end_session(self.ticket);
    }
}

/// How a WebSocket session ends on an error of its socket or of the
/// WebSocket protocol (the chat and Media Streams sessions alike): the
/// peer closing or resetting is `ClientClosed`; a write that timed out —
/// the socket's write timeout, `session.send_timeout_ms`, where the session
/// sets one — means the peer stopped reading (`SlowConsumer`); anything
/// else is a protocol error naming the cause.
pub fn ws_end_reason(e: async_tungstenite::tungstenite::Error) -> EndReason {
    use async_tungstenite::tungstenite::error::ProtocolError;
    use async_tungstenite::tungstenite::Error;
    match e {
        Error::ConnectionClosed | Error::AlreadyClosed => EndReason::ClientClosed,
        Error::Io(io) => match io.kind() {
            std::io::ErrorKind::TimedOut => EndReason::SlowConsumer,
            std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof => EndReason::ClientClosed,
            _ => EndReason::ProtocolError(format!("connection error: {io}")),
        },
        Error::Capacity(c) => EndReason::ProtocolError(format!("message too large: {c}")),
        Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => EndReason::ClientClosed,
        Error::Protocol(p) => EndReason::ProtocolError(format!("WebSocket protocol: {p}")),
        other => EndReason::ProtocolError(other.to_string()),
    }
}
