//! The daemon's configuration: a JSON file (every bound lives here), command
//! line overrides, and validation at start with errors that name the key.
//!
//! Invariants: a [`Config`] returned by [`Config::load`] has passed
//! [`Config::validate`]; no value in it is guessed — conflicting settings are
//! refused. Unknown keys are refused (serde's `deny_unknown_fields`), so a
//! typo cannot silently leave a default in place.
//!
//! One file per section, each with its types, defaults and `validate`
//! (errors name the key); a section's checks that need another section's
//! value take it as an argument. [`Config::validate`] runs them in the
//! file's order of keys.

pub mod audiosocket;
pub mod defaults;
pub mod engine;
pub mod events;
pub mod keys;
pub mod listen;
pub mod media_streams;
pub mod metrics;
pub mod model;
pub mod realtime;
pub mod rtp;
pub mod runtime;
pub mod session;
pub mod sip;

pub use audiosocket::AudioSocketConfig;
pub use defaults::GenDefaults;
pub use engine::EngineConfig;
pub use listen::{ListenConfig, AUTO_CONNECTIONS_PER_IP, AUTO_PENDING_PER_IP};
pub use media_streams::MediaStreamsConfig;
pub use metrics::MetricsConfig;
pub use model::{Backend, CudaConfig, CudaPrecision, KvCacheType, ModelConfig, CPU_DEFAULT_SLOTS};
pub use rtp::RtpConfig;
pub use runtime::RuntimeConfig;
pub use session::SessionConfig;

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid JSON, or has unknown keys or wrong types.
    #[error("config {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// serde's message (names the key).
        source: serde_json::Error,
    },
    /// A value outside what the daemon supports.
    #[error("config key `{key}`: {why}")]
    Invalid {
        /// Dotted key.
        key: &'static str,
        /// What is wrong.
        why: String,
    },
}

fn invalid(key: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        why: why.into(),
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Model and backend.
    pub model: ModelConfig,
    /// Cores.
    pub runtime: RuntimeConfig,
    /// Engine.
    pub engine: EngineConfig,
    /// Listener and control API.
    pub listen: ListenConfig,
    /// Per-session bounds.
    pub session: SessionConfig,
    /// Decoding defaults.
    pub defaults: GenDefaults,
    /// Stage metrics.
    pub metrics: MetricsConfig,
    /// RTP transport.
    pub rtp: RtpConfig,
    /// Asterisk AudioSocket transport.
    pub audiosocket: AudioSocketConfig,
    /// Media Streams WebSocket transport.
    pub media_streams: MediaStreamsConfig,
    /// The OpenAI Realtime endpoints.
    pub realtime: realtime::RealtimeConfig,
    /// Live session events and webhooks.
    pub events: events::EventsConfig,
    /// The SIP endpoint.
    pub sip: sip::SipConfig,
}

impl Config {
    /// Reads a config file (missing keys take their defaults) and validates it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let cfg: Config = serde_json::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every bound; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        self.runtime.validate()?;
        self.engine.validate()?;
        self.listen.validate()?;
        self.session.validate(self.engine.queued_frames_per_slot)?;
        self.rtp.validate()?;
        self.audiosocket.validate(self.listen.address)?;
        events::validate(&self.events, self.session.webhook_url.as_deref())
            .map_err(|(key, why)| invalid(key, why))?;
        sip::validate(&self.sip, self.listen.address).map_err(|(key, why)| invalid(key, why))?;
        realtime::validate(&self.realtime).map_err(|(key, why)| invalid(key, why))?;
        self.media_streams.validate()?;
        self.defaults.validate()
        // `metrics.*` has nothing to check (see [`metrics`]).
    }

    /// Frame records a lane between one I/O core and the engine holds.
    pub fn lane_capacity_frames(&self) -> usize {
        // Every slot may have its in-flight frames in the lane at once, plus
        // one open and one close record per slot.
        self.model.max_slots.unwrap_or(CPU_DEFAULT_SLOTS) * (self.session.max_frames_in_flight + 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::grouping::MaxGroups;

    fn parse(text: &str) -> Result<Config, String> {
        let cfg: Config = serde_json::from_str(text).map_err(|e| e.to_string())?;
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }

    #[test]
    fn empty_object_is_the_default() {
        let c = parse("{}").unwrap();
        assert_eq!(c.listen.address.port(), 8998);
        assert_eq!(c.engine.phase_groups, MaxGroups::Auto);
        let c = parse(r#"{"engine": {"phase_groups": 4}}"#).unwrap();
        assert_eq!(c.engine.phase_groups, MaxGroups::Fixed(4));
        let c = parse(r#"{"engine": {"phase_groups": "auto"}}"#).unwrap();
        assert_eq!(c.engine.phase_groups, MaxGroups::Auto);
        assert!(parse(r#"{"engine": {"phase_groups": "many"}}"#).is_err());
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = parse(r#"{"engine": {"phase_grups": 2}}"#).unwrap_err();
        assert!(e.contains("phase_grups"), "{e}");
        let e = parse(r#"{"enigne": {}}"#).unwrap_err();
        assert!(e.contains("enigne"), "{e}");
    }

    #[test]
    fn bounds_are_checked_by_key() {
        let e = parse(r#"{"engine": {"phase_groups": 5}}"#).unwrap_err();
        assert!(e.contains("engine.phase_groups"), "{e}");
        let e = parse(r#"{"model": {"max_slots": 0}}"#).unwrap_err();
        assert!(e.contains("model.max_slots"), "{e}");
        let e = parse(r#"{"runtime": {"io_cores": 2, "io_cpus": [0]}}"#).unwrap_err();
        assert!(e.contains("runtime.io_cpus"), "{e}");
        let e = parse(r#"{"engine": {"phase_groups": 4, "budget_margin_ms": 80}}"#).unwrap_err();
        assert!(e.contains("engine.budget_margin_ms"), "{e}");
        let e = parse(r#"{"engine": {"prompt_cache_mib": 1048577}}"#).unwrap_err();
        assert!(e.contains("engine.prompt_cache_mib"), "{e}");
        let c = parse(r#"{"engine": {"prompt_cache_mib": 0}}"#).unwrap();
        assert_eq!(c.engine.prompt_cache_mib, 0);
    }

    #[test]
    fn rtp_section_is_validated_by_key() {
        let c = parse(r#"{"rtp": {"jitter_min_ms": 20, "jitter_max_ms": 200}}"#).unwrap();
        assert!(c.rtp.enabled);
        let e = parse(r#"{"rtp": {"jitter_min_ms": 80, "jitter_max_ms": 60}}"#).unwrap_err();
        assert!(e.contains("rtp.jitter_max_ms"), "{e}");
        let e = parse(r#"{"rtp": {"inactivity_timeout_ms": 0}}"#).unwrap_err();
        assert!(e.contains("rtp.inactivity_timeout_ms"), "{e}");
        let e = parse(r#"{"rtp": {"max_sessions": 0}}"#).unwrap_err();
        assert!(e.contains("rtp.max_sessions"), "{e}");
        let e = parse(r#"{"rtp": {"bind_address": "239.1.1.1"}}"#).unwrap_err();
        assert!(e.contains("rtp.bind_address"), "{e}");
        let e = parse(r#"{"rtp": {"jitter_mn_ms": 5}}"#).unwrap_err();
        assert!(e.contains("jitter_mn_ms"), "{e}");
    }

    #[test]
    fn per_address_limits_default_on_off_loopback() {
        let c = parse("{}").unwrap();
        assert_eq!(
            (c.listen.connections_per_ip(), c.listen.pending_per_ip()),
            (0, 0)
        );
        assert_eq!(c.listen.pending_per_core(), 256);
        let c = parse(r#"{"listen": {"address": "0.0.0.0:8998", "token": "t"}}"#).unwrap();
        assert_eq!(
            (c.listen.connections_per_ip(), c.listen.pending_per_ip()),
            (AUTO_CONNECTIONS_PER_IP, AUTO_PENDING_PER_IP)
        );
        // Explicit values win, 0 included (behind a load balancer).
        let c = parse(
            r#"{"listen": {"address": "0.0.0.0:8998", "token": "t",
                "max_connections_per_ip": 0, "max_pending_per_ip": 0}}"#,
        )
        .unwrap();
        assert_eq!(
            (c.listen.connections_per_ip(), c.listen.pending_per_ip()),
            (0, 0)
        );
        // Defaults never exceed the per-core bounds they sit under.
        let c = parse(
            r#"{"listen": {"address": "0.0.0.0:8998", "token": "t", "max_connections_per_core": 10}}"#,
        )
        .unwrap();
        assert_eq!(c.listen.pending_per_core(), 10);
        assert_eq!(
            (c.listen.connections_per_ip(), c.listen.pending_per_ip()),
            (10, 10)
        );
        let e = parse(r#"{"listen": {"max_pending_per_core": 0}}"#).unwrap_err();
        assert!(e.contains("listen.max_pending_per_core"), "{e}");
        let e = parse(r#"{"listen": {"max_pending_per_core": 4, "max_pending_per_ip": 5}}"#)
            .unwrap_err();
        assert!(e.contains("listen.max_pending_per_ip"), "{e}");
    }

    #[test]
    fn public_listener_needs_a_token() {
        let e = parse(r#"{"listen": {"address": "0.0.0.0:8998"}}"#).unwrap_err();
        assert!(e.contains("listen.token"), "{e}");
        parse(r#"{"listen": {"address": "0.0.0.0:8998", "token": "s3cret"}}"#).unwrap();
    }

    #[test]
    fn tls_files_come_in_pairs() {
        let e = parse(r#"{"listen": {"tls_cert_file": "/etc/moshid/cert.pem"}}"#).unwrap_err();
        assert!(e.contains("listen.tls_key_file"), "{e}");
        let e = parse(r#"{"listen": {"tls_key_file": "/etc/moshid/key.pem"}}"#).unwrap_err();
        assert!(e.contains("listen.tls_cert_file"), "{e}");
        let e = parse(r#"{"listen": {"tls_handshake_timeout_ms": 0}}"#).unwrap_err();
        assert!(e.contains("listen.tls_handshake_timeout_ms"), "{e}");
        let c =
            parse(r#"{"listen": {"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem"}}"#).unwrap();
        assert_eq!(c.listen.tls_handshake_timeout_ms, 5_000);
    }

    #[test]
    fn per_ip_limit_and_agent_address_are_checked() {
        let e =
            parse(r#"{"listen": {"max_connections_per_core": 8, "max_connections_per_ip": 9}}"#)
                .unwrap_err();
        assert!(e.contains("listen.max_connections_per_ip"), "{e}");
        let e = parse(
            r#"{"listen": {"address": "127.0.0.1:8998", "agent_address": "127.0.0.1:8998"}}"#,
        )
        .unwrap_err();
        assert!(e.contains("listen.agent_address"), "{e}");
        let c =
            parse(r#"{"listen": {"max_connections_per_ip": 4, "agent_address": "0.0.0.0:9998"}}"#)
                .unwrap();
        assert_eq!(c.listen.max_connections_per_ip, Some(4));
        assert_eq!(c.listen.agent_address.map(|a| a.port()), Some(9998));
    }

    #[test]
    fn metrics_section_defaults_and_refusals() {
        let c = parse("{}").unwrap();
        assert!(!c.metrics.enabled);
        assert!(c.metrics.runtime_switch);
        let c = parse(r#"{"metrics": {"enabled": true, "runtime_switch": false}}"#).unwrap();
        assert!(c.metrics.enabled && !c.metrics.runtime_switch);
        let e = parse(r#"{"metrics": {"enabled": "yes"}}"#).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        let e = parse(r#"{"metrics": {"enable": true}}"#).unwrap_err();
        assert!(e.contains("enable"), "{e}");
    }

    #[test]
    fn telephony_sections_are_validated_by_key() {
        let c = parse("{}").unwrap();
        assert!(!c.audiosocket.enabled && c.media_streams.enabled);
        let c = parse(r#"{"audiosocket": {"enabled": true, "address": "127.0.0.1:0", "params": {"seed": "7"}}}"#).unwrap();
        assert_eq!(
            c.audiosocket.params.get("seed").map(String::as_str),
            Some("7")
        );
        let e = parse(r#"{"audiosocket": {"max_payload_bytes": 100}}"#).unwrap_err();
        assert!(e.contains("audiosocket.max_payload_bytes"), "{e}");
        let e = parse(r#"{"audiosocket": {"max_payload_bytes": 70000}}"#).unwrap_err();
        assert!(e.contains("audiosocket.max_payload_bytes"), "{e}");
        let e = parse(r#"{"audiosocket": {"uuid_timeout_ms": 0}}"#).unwrap_err();
        assert!(e.contains("audiosocket.uuid_timeout_ms"), "{e}");
        let e =
            parse(r#"{"audiosocket": {"enabled": true, "address": "0.0.0.0:9092"}}"#).unwrap_err();
        assert!(e.contains("audiosocket.allowed_peers"), "{e}");
        parse(r#"{"audiosocket": {"enabled": true, "address": "0.0.0.0:9092", "allowed_peers": ["10.1.2.3"]}}"#).unwrap();
        let e = parse(r#"{"audiosocket": {"enabled": true, "address": "127.0.0.1:8998"}}"#)
            .unwrap_err();
        assert!(e.contains("audiosocket.address"), "{e}");
        let e = parse(r#"{"audiosocket": {"enabeld": true}}"#).unwrap_err();
        assert!(e.contains("enabeld"), "{e}");
        let e = parse(r#"{"media_streams": {"max_pending_marks": 0}}"#).unwrap_err();
        assert!(e.contains("media_streams.max_pending_marks"), "{e}");
    }
}
