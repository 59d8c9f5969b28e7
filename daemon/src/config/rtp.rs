//! `rtp.*`: the RTP transport (its sessions' sockets, inactivity, jitter
//! buffer and number).

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// `rtp.*`: the RTP telephony transport (`POST /v1/rtp/sessions`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RtpConfig {
    /// Whether RTP sessions can be created.
    pub enabled: bool,
    /// Address the sessions' UDP sockets bind to (port chosen by the
    /// kernel); `null`: the listener's address.
    pub bind_address: Option<std::net::IpAddr>,
    /// A session that receives no RTP for this long ends, in milliseconds
    /// (counted from its creation until the first packet).
    pub inactivity_timeout_ms: u64,
    /// Smallest jitter buffer target depth, in milliseconds.
    pub jitter_min_ms: u32,
    /// Largest jitter buffer target depth, in milliseconds.
    pub jitter_max_ms: u32,
    /// RTP sessions alive at once (each also needs a model slot).
    pub max_sessions: usize,
}

impl Default for RtpConfig {
    fn default() -> Self {
        RtpConfig {
            enabled: true,
            bind_address: None,
            inactivity_timeout_ms: 30_000,
            jitter_min_ms: 40,
            jitter_max_ms: 120,
            max_sessions: 256,
        }
    }
}

impl RtpConfig {
    /// Checks the section's bounds; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let rtp = self;
        if rtp.inactivity_timeout_ms < 100 {
            return Err(invalid("rtp.inactivity_timeout_ms", "must be at least 100"));
        }
        if !(10..=1000).contains(&rtp.jitter_min_ms) {
            return Err(invalid("rtp.jitter_min_ms", "must be between 10 and 1000"));
        }
        if rtp.jitter_max_ms < rtp.jitter_min_ms || rtp.jitter_max_ms > 2000 {
            return Err(invalid(
                "rtp.jitter_max_ms",
                format!(
                    "must be between rtp.jitter_min_ms ({}) and 2000",
                    rtp.jitter_min_ms
                ),
            ));
        }
        if rtp.max_sessions == 0 {
            return Err(invalid("rtp.max_sessions", "must be positive"));
        }
        if rtp.bind_address.is_some_and(|a| a.is_multicast()) {
            return Err(invalid("rtp.bind_address", "must be a unicast address"));
        }
        Ok(())
    }
}
