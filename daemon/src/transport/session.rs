//! The session core the transports share: taking a slot and opening the
//! session's events ([`admit`]), the wait loop of a paced session
//! ([`run`]: the peer's input, the engine's answers and the next packet
//! time, whichever comes first), the checks that end a session (shutdown,
//! length, idle, a stalled engine), the slot's release and the record at
//! the end, and how socket and WebSocket errors end a session
//! ([`io_end_reason`], [`ws_end_reason`]).
//!
//! A transport supplies what is its own through [`Transport`]: how it
//! reads, decodes what it read into frames for the engine, encodes and
//! sends what is due, and says goodbye. AudioSocket and Media Streams run
//! on [`run`]; the chat and RTP sessions take their slot through
//! [`admit`] and end through the same mappings, with loops of their own
//! (the chat's input is unpaced and it drains the model at the end of
//! input; RTP releases frames on the engine's tick from a jitter buffer).
//!
//! Invariants: one task per session; the loop never waits on one thing
//! only — input, answers and the timer race, and the timer is one timer
//! reset for each wait; a transport that cannot take more audio (the
//! engine's budget, [`EngineLink::budget`]) stops reading, so TCP slows its
//! peer; whatever ends the session, its slot is released exactly once and
//! its events get the final record before the goodbye is sent.

use super::line::LineOut;
use super::link::EngineLink;
use crate::app::CoreApp;
use crate::engine::admission::{Refusal, Ticket};
use crate::events::webhook::WebhookUrl;
use crate::events::{EventSink, SessionState};
use crate::io::mailbox::Mailbox;
use crate::session::record::{EndReason, SessionRecord};
use glommio::timer::Timer;
use moshid_model::streaming::SessionParams;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Longest the loop sleeps without a deadline (shutdown, session length).
const HOUSEKEEPING: Duration = Duration::from_millis(500);

/// A session's slot and event stream, as [`admit`] hands them out.
pub struct Admitted {
    /// The slot held.
    pub ticket: Ticket,
    /// Where the engine's answers arrive.
    pub mailbox: Rc<Mailbox>,
    /// The session's events.
    pub events: EventSink,
}

/// Takes a slot for a session with `params` (its mailbox holds one record
/// per frame in flight plus one for a fault) and opens its event stream
/// under its record's id and `alias`; the record names the slot.
pub fn admit(
    app: &CoreApp,
    rec: &mut SessionRecord,
    params: SessionParams,
    alias: Option<String>,
    state: SessionState,
    webhook: Option<WebhookUrl>,
) -> Result<Admitted, Refusal> {
    let frames = app.shared.config.session.max_frames_in_flight + 1;
    let (ticket, mailbox) = app.ctx.admit(params, frames)?;
    rec.slot = Some(ticket.slot);
    let events = app
        .shared
        .events
        .open(rec, alias, app.ctx.core, state, webhook);
    Ok(Admitted {
        ticket,
        mailbox,
        events,
    })
}

/// An admitted session's side of the loop: its link to the engine, its
/// record, when the peer was last heard from, the loop's timer.
pub struct Core {
    /// The engine link (slot, answers, events).
    pub link: EngineLink,
    /// The session's record.
    pub rec: SessionRecord,
    /// When the last input arrived: frames it completed were complete then.
    pub last_rx: Instant,
    timer: Timer,
}

impl Core {
    /// The core of a session admitted as `admitted`.
    pub fn new(app: CoreApp, admitted: Admitted, rec: SessionRecord) -> Self {
        let Admitted {
            ticket,
            mailbox,
            events,
        } = admitted;
        Core {
            link: EngineLink::new(app, ticket, mailbox, events),
            rec,
            last_rx: Instant::now(),
            timer: Timer::new(HOUSEKEEPING),
        }
    }
}

/// What a transport supplies to [`run`]. Every method that returns `Err`
/// ends the session with that reason.
///
/// The loop, each turn: [`prepare`](Transport::prepare); the engine's
/// answers into [`output`](Transport::output), then
/// [`on_answers`](Transport::on_answers) and
/// [`take_waiting`](Transport::take_waiting) when there were any;
/// [`send_due`](Transport::send_due); `take_waiting`; the end checks; then
/// it waits for input (when [`ready_to_read`](Transport::ready_to_read)),
/// an answer or the next deadline, and hands input to
/// [`on_input`](Transport::on_input).
// Sessions run on one glommio executor: their futures are never sent
// between threads, so no `Send` bound is wanted on them.
#[allow(async_fn_in_trait)]
pub trait Transport {
    /// What one read from the peer yields.
    type Input;

    /// Reads from the peer. Cancel-safe: the loop drops it when an answer
    /// or a deadline comes first.
    async fn read(&mut self) -> Self::Input;

    /// Whether the loop may read now (false while audio already read waits
    /// for the engine's budget); may make room to read into.
    fn ready_to_read(&mut self) -> bool;

    /// Handles what was read (its audio goes to the engine through
    /// `core.link`, as far as the budget allows).
    async fn on_input(&mut self, core: &mut Core, input: Self::Input) -> Result<(), EndReason>;

    /// Takes audio that waits (read before, not yet sent to the engine), as
    /// far as the engine's budget allows.
    fn take_waiting(&mut self, core: &mut Core) -> Result<(), EndReason>;

    /// Where the engine's answers go (`None` before the session's output
    /// is set up: the answers are counted and their text kept).
    fn output(&mut self) -> Option<&mut LineOut>;

    /// Sends what is due at `now`.
    async fn send_due(&mut self, core: &mut Core, now: Instant) -> Result<(), EndReason>;

    /// When something is next due to be sent, if anything is.
    fn next_send(&self) -> Option<Instant>;

    /// At the start of each turn, before the answers are taken.
    fn prepare(&mut self, _now: Instant) {}

    /// After answers were queued into [`output`](Transport::output).
    fn on_answers(&mut self, _core: &mut Core) {}

    /// Tells the peer how the session ended (the slot is released and the
    /// final record set already).
    async fn goodbye(&mut self, core: &Core, reason: &EndReason);

    /// The transport's own end: its log line, closing its connection.
    async fn close(self, rec: &SessionRecord, reason: &EndReason);
}

/// Runs an admitted session to its end: the wait loop, then the slot's
/// release, the final record (events, webhook, log) and the transport's
/// goodbye and close. Returns the record.
pub async fn run<T: Transport>(mut transport: T, mut core: Core) -> SessionRecord {
    let reason = serve(&mut transport, &mut core).await;
    core.link.release();
    core.rec.end(reason);
    core.link.finish_events(&core.rec);
    let reason = core.rec.end_reason.clone().expect("set just above");
    transport.goodbye(&core, &reason).await;
    core.rec.log();
    transport.close(&core.rec, &reason).await;
    core.rec
}

/// What woke the loop.
enum Wake<I> {
    Input(I),
    Engine,
    Timer,
}

/// The wait loop; returns why the session ends.
async fn serve<T: Transport>(t: &mut T, core: &mut Core) -> EndReason {
    let session = &core.link.app.shared.config.session;
    let idle = Duration::from_millis(session.idle_timeout_ms);
    let max_secs = session.max_session_seconds;
    // Input already read (behind the transport's own start).
    if let Err(reason) = t.take_waiting(core) {
        return reason;
    }
    loop {
        let now = Instant::now();
        if let Err(reason) = turn(t, core, now).await {
            return reason;
        }
        if let Some(reason) = end_check(core, idle, max_secs) {
            return reason;
        }
        let now = Instant::now();
        let mut wake_at = (now + HOUSEKEEPING).min(core.last_rx + idle);
        for d in [t.next_send(), core.link.stall_deadline()]
            .into_iter()
            .flatten()
        {
            wake_at = wake_at.min(d);
        }
        core.timer.reset(wake_at.saturating_duration_since(now));
        let can_read = t.ready_to_read();
        let wake = {
            let read = async {
                if can_read {
                    Wake::Input(t.read().await)
                } else {
                    futures_lite::future::pending().await
                }
            };
            let mailbox = &core.link.mailbox;
            let engine = async {
                mailbox.ready().await;
                Wake::Engine
            };
            let timer = &mut core.timer;
            let tick = async {
                timer.await;
                Wake::Timer
            };
            futures_lite::future::or(read, futures_lite::future::or(engine, tick)).await
        };
        if let Wake::Input(input) = wake {
            core.last_rx = Instant::now();
            if let Err(reason) = t.on_input(core, input).await {
                return reason;
            }
        }
    }
}

/// One turn's work before the wait: answers in, packets out, waiting
/// audio on to the engine.
async fn turn<T: Transport>(t: &mut T, core: &mut Core, now: Instant) -> Result<(), EndReason> {
    t.prepare(now);
    if core.link.pump(t.output(), &mut core.rec)? > 0 {
        // Answers make room: audio that waited may go on.
        t.on_answers(core);
        t.take_waiting(core)?;
    }
    t.send_due(core, now).await?;
    // Sent packets make room too.
    t.take_waiting(core)
}

/// Why the session must end now, if it must: shutdown, its length, no
/// input for `idle`, an engine that stopped answering.
fn end_check(core: &Core, idle: Duration, max_secs: u64) -> Option<EndReason> {
    if core.link.mailbox.shutdown_requested() {
        return Some(EndReason::ServerShutdown);
    }
    if max_secs > 0 && core.rec.elapsed_secs() > max_secs as f64 {
        return Some(EndReason::MaxDuration);
    }
    let now = Instant::now();
    if now.duration_since(core.last_rx) >= idle {
        return Some(EndReason::IdleTimeout);
    }
    if core.link.stall_deadline().is_some_and(|d| now >= d) {
        return Some(EndReason::EngineStalled);
    }
    None
}

/// DTMF digits kept for a session's end-of-session log line.
const DTMF_LOG_DIGITS: usize = 32;

/// The DTMF digits a session received: each goes to its events at once;
/// the count and the first [`DTMF_LOG_DIGITS`] are kept for its log line.
#[derive(Default)]
pub struct DtmfLog {
    count: u64,
    digits: [u8; DTMF_LOG_DIGITS],
}

impl DtmfLog {
    /// Records `digit` (an ASCII byte; anything else is logged as `?`).
    pub fn record(&mut self, core: &mut Core, digit: u8) {
        if let Some(events) = core.link.events() {
            events.dtmf(digit, 0);
        }
        if let Some(slot) = self.digits.get_mut(self.count as usize) {
            *slot = if digit.is_ascii_graphic() {
                digit
            } else {
                b'?'
            };
        }
        self.count += 1;
    }

    /// Digits received.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The first digits received, as text.
    pub fn digits(&self) -> std::borrow::Cow<'_, str> {
        let kept = (self.count as usize).min(DTMF_LOG_DIGITS);
        String::from_utf8_lossy(&self.digits[..kept])
    }
}

/// How a session ends on an error of its socket: a write that timed out —
/// the socket's write timeout, `session.send_timeout_ms` — means the peer
/// stopped reading (`SlowConsumer`); a reset, broken pipe, early end of
/// stream or abort is the peer gone (`ClientClosed`); anything else is a
/// failed send naming the cause.
pub fn io_end_reason(e: std::io::Error) -> EndReason {
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
