//! The HTTP API: the router of the shared listener and every control
//! endpoint behind it — health and readiness, `/capacity`, `/metrics` and
//! its switch, the RTP and SIP control calls, live session events, the model
//! description and the browser page.
//!
//! Invariants: this layer sits above the transports and the per-core
//! session API and is imported by nothing below it (only start-up code uses
//! it); every handler answers with a clear HTTP error, never a panic.

pub mod events;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod page;
pub mod router;
pub mod routes;
pub mod rtp;
pub mod sip;

use crate::transport::rtp::Registry;
use crate::transport::sip::status::SipShared;
use std::sync::Arc;

/// Daemon-wide values only the HTTP API (and start-up) reaches, beside
/// every core's [`CoreApp`](crate::app::CoreApp).
pub struct ApiShared {
    /// Live RTP sessions (the control API reaches them from any core; the
    /// RTP and SIP transports hold the same registry).
    pub rtp: Arc<Registry>,
    /// The SIP calls moshid places and its registrations (every core's SIP
    /// endpoint holds the same tables).
    pub sip: Arc<SipShared>,
    /// The loaded model, described (`GET /v1/model`).
    pub model: model::ModelDescription,
    /// The listener's TLS, when `listen.tls_cert_file` is set.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
}
