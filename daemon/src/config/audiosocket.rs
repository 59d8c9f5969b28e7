//! `audiosocket.*`: the Asterisk AudioSocket listener (address, peers
//! allowed, bounds) and its calls' session parameters.

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// `audiosocket.*`: the Asterisk AudioSocket listener (TCP, one per I/O core).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AudioSocketConfig {
    /// Whether the listener runs.
    pub enabled: bool,
    /// Address every I/O core binds (`SO_REUSEPORT`); port 0 picks one.
    pub address: SocketAddr,
    /// Largest message payload accepted, in bytes (a bigger one is refused
    /// with error code 0x04 from its header alone).
    pub max_payload_bytes: usize,
    /// Time allowed for the UUID message after the connection opens, in
    /// milliseconds.
    pub uuid_timeout_ms: u64,
    /// Open AudioSocket connections per I/O core beyond which new ones are
    /// closed at once.
    pub max_connections_per_core: usize,
    /// Addresses allowed to connect (Asterisk's); empty: anyone, which is
    /// accepted only on a loopback address (the protocol carries no
    /// credentials).
    pub allowed_peers: Vec<std::net::IpAddr>,
    /// Session parameters of every call (`text_temperature`, `seed`,
    /// `condition.NAME`, … as in a chat query), checked against the model
    /// at start.
    pub params: std::collections::BTreeMap<String, String>,
}

impl Default for AudioSocketConfig {
    fn default() -> Self {
        AudioSocketConfig {
            enabled: false,
            address: "127.0.0.1:9092".parse().expect("valid literal"),
            max_payload_bytes: 8192,
            uuid_timeout_ms: 5_000,
            max_connections_per_core: 1024,
            allowed_peers: Vec::new(),
            params: Default::default(),
        }
    }
}

impl AudioSocketConfig {
    /// Checks the section's bounds, and its port against the shared
    /// listener's (`listen`); errors name the key.
    pub fn validate(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        let a = self;
        if !(1920..=65535).contains(&a.max_payload_bytes) {
            return Err(invalid(
                "audiosocket.max_payload_bytes",
                "must be between 1920 (20 ms at 48 kHz) and 65535 (the header's limit)",
            ));
        }
        if a.uuid_timeout_ms == 0 {
            return Err(invalid("audiosocket.uuid_timeout_ms", "must be positive"));
        }
        if a.max_connections_per_core == 0 {
            return Err(invalid(
                "audiosocket.max_connections_per_core",
                "must be positive",
            ));
        }
        if a.enabled {
            if a.address.port() != 0 && a.address.port() == listen.port() {
                return Err(invalid(
                    "audiosocket.address",
                    format!("uses port {}, the port of listen.address", a.address.port()),
                ));
            }
            if !a.address.ip().is_loopback() && a.allowed_peers.is_empty() {
                return Err(invalid(
                    "audiosocket.allowed_peers",
                    format!(
                        "is required when listening on {} (not loopback): AudioSocket carries no credentials, list Asterisk's addresses",
                        a.address
                    ),
                ));
            }
        }
        Ok(())
    }
}
