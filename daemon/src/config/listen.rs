//! `listen.*`: the shared listener (address, TLS, token), its bounds on
//! connections, pending connections and requests, and the HAProxy agent.

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `listen.*`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenConfig {
    /// Address of the WebSocket + HTTP control listener.
    pub address: SocketAddr,
    /// Open connections per I/O core beyond which new ones are closed at once.
    pub max_connections_per_core: usize,
    /// Open connections from one client IP address per I/O core beyond which
    /// new ones from that address are closed at once (0: no per-address
    /// limit; `null`: 0 on a loopback listener, [`AUTO_CONNECTIONS_PER_IP`]
    /// otherwise). Counted per core, so a client may hold up to this many on
    /// each core. Behind a load balancer every connection comes from the
    /// balancer's address: set it to 0 there.
    pub max_connections_per_ip: Option<usize>,
    /// Connections per I/O core that have not completed their first request
    /// or handshake (HTTP head and body, WebSocket upgrade, AudioSocket UUID,
    /// and whatever a listener adds before it), across every listener of the
    /// core. A new connection over it closes the oldest of them. Never more
    /// than `max_connections_per_core` apply.
    pub max_pending_per_core: usize,
    /// Such connections from one client IP address per I/O core; a new one
    /// over it closes that address's oldest (0: no per-address budget;
    /// `null`: 0 on a loopback listener, [`AUTO_PENDING_PER_IP`] otherwise).
    pub max_pending_per_ip: Option<usize>,
    /// Address of the HAProxy agent-check responder (`null`: none). It
    /// answers every connection with one line (`up ready N%`, `drain` or
    /// `maint`) and closes; no token, it discloses only that line.
    pub agent_address: Option<SocketAddr>,
    /// Bearer token required when the listener is not on loopback.
    pub token: Option<String>,
    /// Largest HTTP request head, in bytes.
    pub max_head_bytes: usize,
    /// Largest HTTP request body, in bytes.
    pub max_body_bytes: usize,
    /// Time allowed from accept to a complete request (head and body; for a
    /// WebSocket, its upgrade request), in milliseconds.
    pub head_timeout_ms: u64,
    /// PEM certificate chain (leaf first): with `tls_key_file`, every
    /// connection on `address` is TLS (`https://`, `wss://`). Reloaded on
    /// SIGHUP.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub tls_key_file: Option<PathBuf>,
    /// Time allowed for a TLS handshake, in milliseconds (counted before
    /// `head_timeout_ms`).
    pub tls_handshake_timeout_ms: u64,
    /// Connections the kernel queues for `accept` per listening socket
    /// (this listener's and AudioSocket's, one per I/O core); Linux caps it
    /// at `net.core.somaxconn`. A full queue drops new clients' SYNs, which
    /// they retry only after a second.
    pub backlog: u32,
}

/// `listen.max_connections_per_ip` when `null` and the listener is not on
/// loopback: per core, well above what one browser, office NAT or PBX holds,
/// far below what locks others out.
pub const AUTO_CONNECTIONS_PER_IP: usize = 128;
/// `listen.max_pending_per_ip` when `null` and the listener is not on
/// loopback: per core; a browser opens at most 6 connections to a host at
/// once, and a prompt client is pending for milliseconds.
pub const AUTO_PENDING_PER_IP: usize = 16;

impl ListenConfig {
    /// `max_connections_per_ip` with `null` resolved (see the key), never
    /// above `max_connections_per_core`; 0: no per-address limit.
    pub fn connections_per_ip(&self) -> usize {
        self.resolve(self.max_connections_per_ip, AUTO_CONNECTIONS_PER_IP)
            .min(self.max_connections_per_core)
    }

    /// `max_pending_per_core`, never above `max_connections_per_core`.
    pub fn pending_per_core(&self) -> usize {
        self.max_pending_per_core.min(self.max_connections_per_core)
    }

    /// `max_pending_per_ip` with `null` resolved (see the key), never above
    /// [`pending_per_core`](Self::pending_per_core); 0: no per-address budget.
    pub fn pending_per_ip(&self) -> usize {
        self.resolve(self.max_pending_per_ip, AUTO_PENDING_PER_IP)
            .min(self.pending_per_core())
    }

    fn resolve(&self, value: Option<usize>, auto: usize) -> usize {
        match value {
            Some(v) => v,
            None if self.address.ip().is_loopback() => 0,
            None => auto,
        }
    }
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            address: "127.0.0.1:8998".parse().expect("valid literal"),
            max_connections_per_core: 1024,
            max_connections_per_ip: None,
            max_pending_per_core: 256,
            max_pending_per_ip: None,
            agent_address: None,
            token: None,
            max_head_bytes: 16 * 1024,
            max_body_bytes: 64 * 1024,
            head_timeout_ms: 3_000,
            backlog: 4096,
            tls_cert_file: None,
            tls_key_file: None,
            tls_handshake_timeout_ms: 5_000,
        }
    }
}

impl ListenConfig {
    /// Checks the section's bounds; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
        if l.max_connections_per_core == 0 {
            return Err(invalid(
                "listen.max_connections_per_core",
                "must be positive",
            ));
        }
        if let Some(n) = l
            .max_connections_per_ip
            .filter(|&n| n > l.max_connections_per_core)
        {
            return Err(invalid(
                "listen.max_connections_per_ip",
                format!(
                    "{n} exceeds listen.max_connections_per_core ({}): it would never apply",
                    l.max_connections_per_core
                ),
            ));
        }
        if !(1..=65_535).contains(&l.backlog) {
            return Err(invalid("listen.backlog", "must be between 1 and 65535"));
        }
        if l.max_pending_per_core == 0 {
            return Err(invalid("listen.max_pending_per_core", "must be positive"));
        }
        if let Some(n) = l.max_pending_per_ip.filter(|&n| n > l.pending_per_core()) {
            return Err(invalid(
                "listen.max_pending_per_ip",
                format!(
                    "{n} exceeds listen.max_pending_per_core ({}): it would never apply",
                    l.pending_per_core()
                ),
            ));
        }
        if let Some(agent) = l.agent_address {
            if agent.port() != 0 && agent.port() == l.address.port() {
                return Err(invalid(
                    "listen.agent_address",
                    format!("uses port {}, the port of listen.address", agent.port()),
                ));
            }
        }
        match (&l.tls_cert_file, &l.tls_key_file) {
            (Some(_), None) => {
                return Err(invalid(
                    "listen.tls_key_file",
                    "is required with `listen.tls_cert_file`",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "listen.tls_cert_file",
                    "is required with `listen.tls_key_file`",
                ))
            }
            _ => {}
        }
        if l.tls_handshake_timeout_ms == 0 {
            return Err(invalid(
                "listen.tls_handshake_timeout_ms",
                "must be positive",
            ));
        }
        if !l.address.ip().is_loopback() && l.token.as_deref().is_none_or(str::is_empty) {
            return Err(invalid(
                "listen.token",
                format!(
                    "is required when listening on {} (not loopback): set a bearer token",
                    l.address
                ),
            ));
        }
        if l.max_head_bytes < 512 || l.max_body_bytes == 0 || l.head_timeout_ms == 0 {
            return Err(invalid(
                "listen.max_head_bytes",
                "max_head_bytes ≥ 512, max_body_bytes and head_timeout_ms positive",
            ));
        }
        Ok(())
    }
}
