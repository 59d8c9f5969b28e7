//! What every session keeps about itself whatever the metrics switch says:
//! frames in and out, tokens generated, how it ended. It is part of the
//! session (sent to the client at the end where the protocol allows, written
//! to the log) and dropped with it; nothing here is shared or retained.

use crate::log_record::{LogLine, Record};
use serde::Serialize;
use std::time::Instant;

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum EndReason {
    /// The client closed the connection or the stream.
    ClientClosed,
    /// The client said its input was finished and every frame was answered.
    InputFinished,
    /// The client broke the protocol (the detail says how).
    ProtocolError(String),
    /// The client sent nothing for too long.
    IdleTimeout,
    /// The session reached its configured length.
    MaxDuration,
    /// The session was not admitted (the detail says why).
    Refused(String),
    /// The client asked for parameters the model cannot use.
    BadParameters(String),
    /// The model failed for this stream.
    ModelFault,
    /// The engine did not answer in time.
    EngineStalled,
    /// The client did not read what we sent.
    SlowConsumer,
    /// Sending to the client failed.
    SendFailed(String),
    /// The daemon is shutting down.
    ServerShutdown,
}

impl EndReason {
    /// A short stable label (logs, metrics).
    pub fn label(&self) -> &'static str {
        match self {
            EndReason::ClientClosed => "client_closed",
            EndReason::InputFinished => "input_finished",
            EndReason::ProtocolError(_) => "protocol_error",
            EndReason::IdleTimeout => "idle_timeout",
            EndReason::MaxDuration => "max_duration",
            EndReason::Refused(_) => "refused",
            EndReason::BadParameters(_) => "bad_parameters",
            EndReason::ModelFault => "model_fault",
            EndReason::EngineStalled => "engine_stalled",
            EndReason::SlowConsumer => "slow_consumer",
            EndReason::SendFailed(_) => "send_failed",
            EndReason::ServerShutdown => "server_shutdown",
        }
    }
}

/// The session's own accounting.
#[derive(Debug, Clone, Serialize)]
pub struct SessionRecord {
    /// Session id (per daemon, increasing).
    pub id: u64,
    /// Transport name (`ws`, `rtp`, …).
    pub transport: &'static str,
    /// Slot held, if admitted.
    pub slot: Option<u32>,
    /// Frames sent to the engine.
    pub frames_in: u64,
    /// Audio frames received from the model.
    pub frames_out: u64,
    /// Text tokens generated (printed or not).
    pub text_tokens: u64,
    /// Frames dropped (engine queue or lane full).
    pub frames_dropped: u64,
    /// Frames stepped by a late engine tick.
    pub late_frames: u64,
    /// How it ended (set once).
    pub end_reason: Option<EndReason>,
    /// Length in milliseconds (set at the end).
    pub duration_ms: u64,
    #[serde(skip)]
    started: Option<Instant>,
}

impl SessionRecord {
    /// A record for a session starting now.
    pub fn start(id: u64, transport: &'static str) -> Self {
        SessionRecord {
            id,
            transport,
            slot: None,
            frames_in: 0,
            frames_out: 0,
            text_tokens: 0,
            frames_dropped: 0,
            late_frames: 0,
            end_reason: None,
            duration_ms: 0,
            started: Some(Instant::now()),
        }
    }

    /// Sets the end reason unless one is already set (the first cause wins).
    pub fn end(&mut self, reason: EndReason) {
        if self.end_reason.is_none() {
            self.end_reason = Some(reason);
        }
        if let Some(t) = self.started {
            self.duration_ms = t.elapsed().as_millis() as u64;
        }
    }

    /// Counts the session's length from now (a session reserved before its
    /// media began: an outbound call that rang first).
    pub fn restart_clock(&mut self) {
        self.started = Some(Instant::now());
    }

    /// Seconds since the start.
    pub fn elapsed_secs(&self) -> f64 {
        self.started.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    /// The JSON sent to the client in the final metadata message.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "session": self })
    }

    /// Writes the session's end as a [`Record::SessionEnd`] log record.
    pub fn log(&self) {
        let reason = self.end_reason.as_ref();
        let line = LogLine::new(Record::SessionEnd)
            .field("id", self.id)
            .field("transport", self.transport)
            .opt("slot", self.slot)
            .field("frames_in", self.frames_in)
            .field("frames_out", self.frames_out)
            .field("text_tokens", self.text_tokens)
            .field("dropped", self.frames_dropped)
            .field("late", self.late_frames)
            .field("duration_ms", self.duration_ms)
            .field("reason", reason.map_or("unknown", EndReason::label));
        match reason {
            Some(
                EndReason::ProtocolError(d)
                | EndReason::Refused(d)
                | EndReason::BadParameters(d)
                | EndReason::SendFailed(d),
            ) => line.quoted("detail", d),
            _ => line,
        }
        .emit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_end_reason_wins_and_serializes() {
        let mut r = SessionRecord::start(7, "ws");
        r.text_tokens = 3;
        r.end(EndReason::ProtocolError("bad ogg".into()));
        r.end(EndReason::ClientClosed);
        let j = r.to_json();
        assert_eq!(j["session"]["end_reason"]["kind"], "protocol_error");
        assert_eq!(j["session"]["end_reason"]["detail"], "bad ogg");
        assert_eq!(j["session"]["text_tokens"], 3);
    }
}
