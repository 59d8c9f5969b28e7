//! One soak session: connects when it arrives, sends its frames at real
//! time (absolute deadlines from its own start), times every answer as the
//! ramp's callers do ([`crate::stats::FrameMatcher`]), and ends the way its
//! plan says — the end-of-input message and the server's record, a
//! WebSocket close, or a TCP connection dropped mid-stream.
//!
//! Invariants: one thread per session, sleeping in `ppoll` until the socket
//! is readable or its next send (see [`crate::stream`]); every wait is
//! bounded (connect timeout, drain limit); the outcome is returned whatever
//! happens, so the runner always learns how a session ended.

use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use moshid::client::decode_audio;
use moshid::codec::{DecoderConfig, OggOpusDecoder};
use moshid::protocol::{kind, END_OF_INPUT_MESSAGE};
use tungstenite::{Bytes, Message};

use crate::audio::{EncodedAudio, StreamWriter};
use crate::stats::FrameMatcher;
use crate::stream::{connect, flush_then_wait, wait_readable, would_block, Connected};

/// Audio frame period.
const FRAME: Duration = Duration::from_millis(80);

/// How a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// `0x03 0x01` after the last frame, then the server's record and close.
    EndOfInput,
    /// A WebSocket close once every frame is answered.
    Close,
    /// The TCP connection dropped after the last frame, answers or not.
    Abrupt,
}

/// What one session does.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Frames sent.
    pub frames: usize,
    pub ending: Ending,
    /// Where in the shared audio it starts.
    pub first_frame: usize,
    /// Longer than the model's context (its KV cache wraps).
    pub long: bool,
}

/// What the runner needs of every session.
#[derive(Debug)]
pub struct Outcome {
    pub plan: Plan,
    /// Seconds since the run's epoch.
    pub started_s: f64,
    pub ended_s: f64,
    pub accepted: bool,
    pub refused: Option<String>,
    pub error: Option<String>,
    pub frames_sent: usize,
    pub answers: usize,
    /// Frames that should have been answered and were not (not counted
    /// for abrupt ends: the client left first).
    pub unanswered: usize,
    /// (arrival, seconds since the epoch; added latency, ms) of every answer.
    pub latencies: Vec<(f64, f64)>,
    /// Latencies of answers to frames past the model's context (ms).
    pub past_context_ms: Vec<f64>,
    /// Long calls only: (index of the frame that released the answer,
    /// added latency in ms) of every answer, to tell what the position in
    /// the call (the KV ring's wrap) does from what the call's age does.
    pub long_by_frame: Vec<(u32, f64)>,
    /// `end_reason.kind` of the server's record, when one came.
    pub end_reason: Option<String>,
}

/// Shared by every session of a run.
pub struct Shared {
    pub url: String,
    pub audio: EncodedAudio,
    pub epoch: Instant,
    pub connect_timeout: Duration,
    /// Longest wait for answers (and the record) after the last frame.
    pub drain: Duration,
    pub model_delay: usize,
    pub context_frames: usize,
}

/// Runs one session to its end.
pub fn run(shared: &Shared, plan: Plan) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome {
        plan,
        started_s: started.duration_since(shared.epoch).as_secs_f64(),
        ended_s: 0.0,
        accepted: false,
        refused: None,
        error: None,
        frames_sent: 0,
        answers: 0,
        unanswered: 0,
        latencies: Vec::new(),
        past_context_ms: Vec::new(),
        long_by_frame: Vec::new(),
        end_reason: None,
    };
    match connect(&shared.url, shared.connect_timeout) {
        Connected::Ok(ws) => {
            out.accepted = true;
            if let Err(e) = session(shared, *ws, &mut out) {
                out.error = Some(format!("{e:#}"));
            }
        }
        Connected::Refused(m) => out.refused = Some(m),
        Connected::Failed(m) => out.error = Some(m),
    }
    out.ended_s = shared.epoch.elapsed().as_secs_f64();
    out
}

fn session(
    shared: &Shared,
    mut ws: tungstenite::WebSocket<std::net::TcpStream>,
    out: &mut Outcome,
) -> Result<()> {
    let plan = out.plan;
    let epoch = shared.epoch;
    let ms = |t: Instant| t.saturating_duration_since(epoch).as_secs_f64() * 1e3;
    let start = Instant::now();
    let mut matcher = FrameMatcher::new(shared.model_delay);
    let mut complete_ms: Vec<f64> = Vec::with_capacity(plan.frames);
    let mut writer = StreamWriter::new(&shared.audio);
    let mut decoder = OggOpusDecoder::new(DecoderConfig {
        trim_pre_skip: false,
        ..DecoderConfig::default()
    })?;
    ws.get_ref().set_nonblocking(true)?;
    let fd = ws.get_ref().as_raw_fd();
    let mut next = 0usize;
    let mut unflushed = false;
    let mut drain_until: Option<Instant> = None;
    let mut end_sent = false;
    loop {
        let now = Instant::now();
        let wake = if next < plan.frames {
            let due = start + FRAME * (next as u32 + 1);
            if now >= due {
                let message = writer.message(&shared.audio, plan.first_frame + next)?;
                match ws.send(Message::Binary(Bytes::copy_from_slice(message))) {
                    Ok(()) => {}
                    Err(e) if would_block(&e) => unflushed = true,
                    Err(e) => return Err(anyhow!("sending frame {next}: {e}")),
                }
                complete_ms.push(ms(due));
                matcher.frame_sent(ms(due));
                next += 1;
                continue;
            }
            due
        } else {
            if plan.ending == Ending::Abrupt {
                // Gone without a word: the daemon finds out from TCP.
                let _ = ws.get_ref().shutdown(Shutdown::Both);
                break;
            }
            if plan.ending == Ending::EndOfInput && !end_sent {
                match ws.send(Message::Binary(Bytes::from_static(&END_OF_INPUT_MESSAGE))) {
                    Ok(()) => {}
                    Err(e) if would_block(&e) => unflushed = true,
                    Err(e) => return Err(anyhow!("sending end of input: {e}")),
                }
                end_sent = true;
            }
            let until = *drain_until.get_or_insert(now + shared.drain);
            let done = match plan.ending {
                // The server closes after its record.
                Ending::EndOfInput => false,
                _ => matcher.all_answered(),
            };
            if done || now >= until {
                if plan.ending == Ending::EndOfInput {
                    return Err(anyhow!(
                        "no record within {:?} of the end of input",
                        shared.drain
                    ));
                }
                break;
            }
            until
        };
        if !flush_then_wait(&mut ws, fd, &mut unflushed, wake, now)? {
            continue;
        }
        loop {
            match ws.read() {
                Ok(Message::Binary(data)) => {
                    let arrival = ms(Instant::now());
                    match data.first() {
                        Some(&kind::AUDIO) => {
                            let samples = decode_audio(&mut decoder, &data[1..])?.len();
                            let before = matcher.latencies().len();
                            matcher.audio(samples, arrival);
                            for k in before..matcher.latencies().len() {
                                let l = matcher.latencies()[k];
                                out.latencies.push((arrival / 1e3, l));
                                // Answer k was released by frame k + delay.
                                if k + shared.model_delay >= shared.context_frames {
                                    out.past_context_ms.push(l);
                                }
                                if plan.long {
                                    out.long_by_frame.push(((k + shared.model_delay) as u32, l));
                                }
                            }
                        }
                        Some(&kind::METADATA) => {
                            let v: serde_json::Value =
                                serde_json::from_slice(&data[1..]).unwrap_or_default();
                            out.end_reason = v["session"]["end_reason"]["kind"]
                                .as_str()
                                .map(String::from);
                        }
                        Some(&kind::ERROR) => {
                            return Err(anyhow!(
                                "server error: {}",
                                String::from_utf8_lossy(&data[1..])
                            ))
                        }
                        _ => {}
                    }
                }
                Ok(Message::Close(_)) => {
                    if next < plan.frames {
                        return Err(anyhow!("server closed after {next} frames"));
                    }
                    let _ = ws.flush();
                    finish(out, &matcher, plan);
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) if would_block(&e) => break,
                Err(tungstenite::Error::ConnectionClosed) if end_sent => {
                    finish(out, &matcher, plan);
                    return Ok(());
                }
                Err(e) => return Err(anyhow!("after {next} frames: {e}")),
            }
        }
    }
    if plan.ending == Ending::Close {
        let _ = ws.close(None);
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            match ws.read() {
                Ok(_) => {}
                Err(e) if would_block(&e) => {
                    let _ = ws.flush();
                    let _ = wait_readable(fd, Duration::from_millis(20));
                }
                Err(_) => break,
            }
        }
    }
    finish(out, &matcher, plan);
    Ok(())
}

fn finish(out: &mut Outcome, matcher: &FrameMatcher, plan: Plan) {
    out.frames_sent = matcher.frames_sent();
    out.answers = matcher.answers();
    out.unanswered = if plan.ending == Ending::Abrupt {
        0
    } else {
        matcher.unanswered()
    };
}
