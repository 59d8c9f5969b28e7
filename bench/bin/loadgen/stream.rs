//! One simulated caller: a WebSocket session on `/api/chat` (or on
//! `/v1/realtime`, [`crate::wire`]) that sends audio at real-time pace and
//! times every answer.
//!
//! Each caller is one thread that owns its socket (tungstenite over a
//! non-blocking `TcpStream` once the session has started). It sleeps in
//! `ppoll` until the socket is readable or the next send deadline, so it
//! wakes only for a message or a send, on time to the microsecond (socket
//! timeouts would round up to the kernel tick, 4 ms, and make every send
//! late); nothing spins. Timeline of caller
//! `s` in a step whose clock starts at `t0`:
//! - its "microphone" starts at `t0 + offset_s` (`offset_s` uniform in
//!   [0, 80 ms), seeded), so callers are spread over the frame period as real
//!   ones are;
//! - frame `i` is complete at `start + (i + 1) · 80 ms` (absolute deadlines,
//!   no drift) and is sent then, plus a uniform send jitter in
//!   [0, `jitter_ms`] (sends never reorder), unless lost (probability `loss`;
//!   a lost frame is not sent at all);
//! - after the last frame it waits until every frame that can be answered has
//!   been (see [`crate::stats`]) or `drain` has passed, then closes.
//!
//! Invariants: all callers of a step connect (and get their handshake or
//! refusal) before any of them starts sending; every caller passes both start
//! barriers exactly once, whatever happens to its connection, so a refusal
//! or an error never blocks the step. Latencies are measured from when a
//! frame was complete, not from when it was sent, so send jitter and a
//! late-waking load generator count as latency; the send lag is reported
//! separately so that the second can be told apart.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
pub(crate) use moshid::client::would_block;
use moshid::protocol::kind;
use moshid_testkit::chat::{await_handshake, upgrade, NotStarted};
use serde_json::Value;
use tungstenite::{Message, WebSocket};

use crate::audio::{EncodedAudio, Rng};
use crate::stats::FrameMatcher;
use crate::wire::{self, Protocol};

/// Audio frame period.
const FRAME: Duration = Duration::from_millis(80);
/// How long closing waits for the server's side of the close.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// What every caller of a step shares.
pub struct StepShared {
    pub url: String,
    /// What the callers speak.
    pub protocol: Protocol,
    /// Frames each caller captures.
    pub frames: usize,
    pub model_delay: usize,
    pub jitter_ms: f64,
    pub loss: f64,
    pub connect_timeout: Duration,
    /// Longest wait for answers after the last frame.
    pub drain: Duration,
    /// What every caller sends.
    pub audio: Arc<EncodedAudio>,
    /// Passed once connected (or refused).
    pub connected: Barrier,
    /// Passed once `t0` is set.
    pub go: Barrier,
    /// The step's clock origin.
    pub t0: OnceLock<Instant>,
}

/// What one caller saw.
#[derive(Debug)]
pub struct Outcome {
    /// The session started (handshake received).
    pub accepted: bool,
    /// The server's message when it refused the session.
    pub refused: Option<String>,
    /// What went wrong otherwise (connection, protocol, early close).
    pub error: Option<String>,
    /// Frames captured (sent or lost).
    pub frames_captured: usize,
    /// Frames dropped on the send side (`--loss`).
    pub frames_lost: usize,
    /// Answers matched to frames.
    pub matcher: FrameMatcher,
    /// How late each send was against its schedule (ms).
    pub send_lag_ms: Vec<f64>,
    /// Text messages received.
    pub text_messages: usize,
    /// The last metadata message.
    pub metadata: Option<Value>,
    /// The decoded answer audio, when this caller was asked to keep it.
    pub answer_pcm: Option<Vec<f32>>,
}

impl Outcome {
    fn new(delay: usize) -> Self {
        Outcome {
            accepted: false,
            refused: None,
            error: None,
            frames_captured: 0,
            frames_lost: 0,
            matcher: FrameMatcher::new(delay),
            send_lag_ms: Vec::new(),
            text_messages: 0,
            metadata: None,
            answer_pcm: None,
        }
    }
}

pub(crate) enum Connected {
    Ok(Box<WebSocket<TcpStream>>),
    Refused(String),
    Failed(String),
}

/// Runs caller `index` (offset and seed given) through the step.
/// With `keep_answer`, the decoded answer audio is kept in the outcome.
pub fn run_caller(shared: &StepShared, offset: Duration, seed: u64, keep_answer: bool) -> Outcome {
    let connected = connect_with(&shared.url, shared.connect_timeout, shared.protocol);
    shared.connected.wait();
    shared.go.wait();
    let t0 = *shared.t0.get().expect("t0 is set before the go barrier");
    let mut outcome = Outcome::new(shared.model_delay);
    if keep_answer {
        outcome.answer_pcm = Some(Vec::new());
    }
    match connected {
        Connected::Ok(ws) => {
            outcome.accepted = true;
            if let Err(e) = session(shared, *ws, t0, offset, seed, &mut outcome) {
                outcome.error = Some(format!("{e:#}"));
            }
        }
        Connected::Refused(message) => outcome.refused = Some(message),
        Connected::Failed(message) => outcome.error = Some(message),
    }
    outcome
}

/// TCP connect, WebSocket upgrade, then the session handshake or a
/// refusal (an error message first, or an HTTP error on the upgrade) on
/// `/api/chat`: the test kit's [`upgrade`] and [`await_handshake`].
pub(crate) fn connect(url: &str, timeout: Duration) -> Connected {
    connect_with(url, timeout, Protocol::Chat)
}

/// [`connect`] for a caller speaking `protocol`: the kit's upgrade, then
/// that protocol's handshake or refusal.
pub(crate) fn connect_with(url: &str, timeout: Duration, protocol: Protocol) -> Connected {
    let deadline = Instant::now() + timeout;
    let started = upgrade(url, timeout).and_then(|mut ws| {
        match protocol {
            Protocol::Chat => await_handshake(&mut ws, deadline),
            Protocol::Realtime => wire::await_session_created(&mut ws, deadline),
        }
        .map(|()| ws)
    });
    match started {
        Ok(ws) => Connected::Ok(Box::new(ws)),
        Err(NotStarted::Refused(why)) => Connected::Refused(why),
        Err(NotStarted::Closed) => Connected::Failed("closed before the handshake".into()),
        Err(NotStarted::Unexpected(m)) => Connected::Failed(format!(
            "a message of kind {:?} before the handshake",
            m.first()
        )),
        Err(NotStarted::Failed(why)) => Connected::Failed(why),
    }
}

fn ms_since(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64() * 1e3
}

/// The session proper: send on schedule, time the answers, close.
fn session(
    shared: &StepShared,
    mut ws: WebSocket<TcpStream>,
    t0: Instant,
    offset: Duration,
    seed: u64,
    out: &mut Outcome,
) -> Result<()> {
    let mut rng = Rng::new(seed);
    let start = t0 + offset;
    // Schedule: capture-complete time and send time of every frame.
    let mut schedule = Vec::with_capacity(shared.frames);
    let mut last_send = start;
    for i in 0..shared.frames {
        let complete = start + FRAME * (i as u32 + 1);
        let jitter = Duration::from_secs_f64(rng.range(0.0, shared.jitter_ms.max(0.0)) / 1e3);
        let send = (complete + jitter).max(last_send);
        last_send = send;
        let lost = shared.loss > 0.0 && rng.unit() < shared.loss;
        schedule.push((complete, send, lost));
    }
    let mut caller = shared.protocol.caller(&shared.audio)?;
    ws.get_ref().set_nonblocking(true)?;
    let fd = ws.get_ref().as_raw_fd();
    let mut next = 0usize;
    let mut drain_until: Option<Instant> = None;
    // tungstenite holds bytes the socket has not taken yet.
    let mut unflushed = false;
    loop {
        let now = Instant::now();
        let wake = if let Some(&(complete, send, lost)) = schedule.get(next) {
            if now >= send {
                if lost {
                    out.frames_lost += 1;
                } else {
                    let message = caller.frame_message(&shared.audio, next)?;
                    match ws.send(message) {
                        Ok(()) => {}
                        // Queued in tungstenite; flushed below.
                        Err(e) if would_block(&e) => unflushed = true,
                        Err(e) => return Err(anyhow!("sending frame {next}: {e}")),
                    }
                    out.matcher.frame_sent(ms_since(t0, complete));
                }
                out.send_lag_ms.push((now - send).as_secs_f64() * 1e3);
                out.frames_captured += 1;
                next += 1;
                continue;
            }
            send
        } else {
            let until = *drain_until.get_or_insert(now + shared.drain);
            if out.matcher.all_answered() || now >= until {
                break;
            }
            until
        };
        if !flush_then_wait(&mut ws, fd, &mut unflushed, wake, now)? {
            continue;
        }
        // Everything readable now (tungstenite may also hold whole messages
        // from an earlier read, so always read until it would block).
        loop {
            match ws.read() {
                Ok(msg @ (Message::Binary(_) | Message::Text(_))) => {
                    let arrival = ms_since(t0, Instant::now());
                    caller.on_message(msg, arrival, out)?;
                }
                Ok(Message::Close(_)) => {
                    if next < schedule.len() {
                        return Err(anyhow!("server closed after {next} frames"));
                    }
                    close(&mut ws, fd, out);
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) if would_block(&e) => break,
                Err(e) => return Err(anyhow!("after {next} frames: {e}")),
            }
        }
    }
    close(&mut ws, fd, out);
    Ok(())
}

/// Flushes what tungstenite holds when `unflushed` (a socket that was
/// full), then waits until the socket is readable or `wake` comes — at most
/// 1 ms while bytes are still held, to flush them again. `Ok(true)`: readable.
pub(crate) fn flush_then_wait(
    ws: &mut WebSocket<TcpStream>,
    fd: RawFd,
    unflushed: &mut bool,
    wake: Instant,
    now: Instant,
) -> Result<bool> {
    if *unflushed {
        match ws.flush() {
            Ok(()) => *unflushed = false,
            Err(e) if would_block(&e) => {}
            Err(e) => return Err(anyhow!("flushing: {e}")),
        }
    }
    let mut wait = wake.saturating_duration_since(now);
    if *unflushed {
        wait = wait.min(Duration::from_millis(1));
    }
    Ok(wait_readable(fd, wait)?)
}

/// Waits at most `timeout` (nanosecond resolution, unlike socket timeouts,
/// which round up to the kernel's tick) for `fd` to be readable.
pub(crate) fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd and a valid timespec that outlive the call;
    // a null signal mask leaves the thread's mask alone.
    let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(r > 0)
}

/// Closes the session (non-blocking socket), keeping a metadata message
/// that comes meanwhile; waits at most `CLOSE_GRACE` for the server.
fn close(ws: &mut WebSocket<TcpStream>, fd: RawFd, out: &mut Outcome) {
    let deadline = Instant::now() + CLOSE_GRACE;
    let _ = ws.close(None);
    loop {
        match ws.read() {
            Ok(Message::Binary(data)) if data.first() == Some(&kind::METADATA) => {
                out.metadata = serde_json::from_slice(&data[1..]).ok();
            }
            Ok(_) => {}
            Err(e) if would_block(&e) => {
                let _ = ws.flush();
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || wait_readable(fd, left.min(Duration::from_millis(50))).is_err()
                {
                    break;
                }
            }
            Err(_) => break,
        }
    }
}
