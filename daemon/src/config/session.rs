//! `session.*`: every session's bounds (message size, frames in flight,
//! idle and send timeouts, length, drain) and its webhook.

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// `session.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Largest WebSocket message accepted, in bytes.
    pub max_message_bytes: usize,
    /// Frames sent to the engine and not yet answered, per session, beyond
    /// which the session stops reading its socket (backpressure).
    pub max_frames_in_flight: usize,
    /// A session that sends nothing for this long is closed, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Longest session, in seconds (0: unlimited).
    pub max_session_seconds: u64,
    /// A client that does not take what is sent to it for this long is
    /// closed (slow consumer), in milliseconds: the daemon never buffers
    /// output without bound.
    pub send_timeout_ms: u64,
    /// On shutdown, how long sessions may go on before they are closed, in
    /// milliseconds.
    pub drain_grace_ms: u64,
    /// After the end of input, the most silent frames fed to a model that
    /// must be drained (Hibiki) before the session ends anyway.
    pub drain_max_frames: usize,
    /// Where every session's final record (with its whole text) is POSTed
    /// as JSON (`http://` or `https://`; `null`: nowhere unless the session
    /// names its own, see `events.session_webhook_prefixes`).
    pub webhook_url: Option<String>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            max_message_bytes: 64 * 1024,
            max_frames_in_flight: 4,
            idle_timeout_ms: 30_000,
            max_session_seconds: 3_600,
            send_timeout_ms: 5_000,
            drain_grace_ms: 30_000,
            drain_max_frames: 250,
            webhook_url: None,
        }
    }
}

impl SessionConfig {
    /// Checks the section's bounds against the engine's queue per slot
    /// (`engine.queued_frames_per_slot`); errors name the key.
    pub fn validate(&self, queued_frames_per_slot: usize) -> Result<(), ConfigError> {
        let s = self;
        if s.max_message_bytes < 1024 {
            return Err(invalid(
                "session.max_message_bytes",
                "must be at least 1024",
            ));
        }
        if s.max_frames_in_flight == 0 {
            return Err(invalid("session.max_frames_in_flight", "must be positive"));
        }
        if s.max_frames_in_flight > queued_frames_per_slot {
            // More in flight than the engine queues would turn backpressure
            // into dropped frames: the engine answers the excess `Dropped`.
            return Err(invalid(
                "session.max_frames_in_flight",
                format!(
                    "must not exceed enginqueued_frames_per_slot ({})",
                    queued_frames_per_slot
                ),
            ));
        }
        if s.idle_timeout_ms == 0 {
            return Err(invalid("session.idle_timeout_ms", "must be positive"));
        }
        if s.send_timeout_ms == 0 {
            return Err(invalid("session.send_timeout_ms", "must be positive"));
        }
        Ok(())
    }
}
