//! `media_streams.*`: the Media Streams WebSocket (`/v1/media-stream`).

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// `media_streams.*`: the Media Streams WebSocket (`/v1/media-stream`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MediaStreamsConfig {
    /// Whether `/v1/media-stream` is served.
    pub enabled: bool,
    /// `mark` events waiting for their echo, per stream, beyond which the
    /// stream is closed (protocol error).
    pub max_pending_marks: usize,
}

impl Default for MediaStreamsConfig {
    fn default() -> Self {
        MediaStreamsConfig {
            enabled: true,
            max_pending_marks: 256,
        }
    }
}

impl MediaStreamsConfig {
    /// Checks the section's bounds; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_pending_marks == 0 {
            return Err(invalid(
                "media_streams.max_pending_marks",
                "must be positive",
            ));
        }
        Ok(())
    }
}
