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
pub mod page;
pub mod router;
pub mod rtp;
pub mod sip;
