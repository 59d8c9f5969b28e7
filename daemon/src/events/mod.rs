//! Every session's text and events, live: Server-Sent Events on
//! `GET /v1/sessions/{id}/events` for any transport (WebSocket chat, RTP,
//! AudioSocket, Media Streams), and the final record with
//! the whole text to a webhook.
//!
//! The shape:
//! * A session, when admitted, opens an [`EventSink`] in the daemon's
//!   [`EventHub`] ([`hub`]): its own [`ring::EventRing`] of fixed-size
//!   records (text pieces as token ids with their frame and time, DTMF
//!   digits, state changes), a preallocated buffer for the whole text, and
//!   its webhook, if any ([`webhook`]).
//! * Subscribers ([`sse`]) on any I/O core read the ring with their own
//!   cursor; their core's [`relay`] polls the rings they follow and wakes
//!   them. The session never waits for a subscriber, never locks and never
//!   wakes another core: a subscriber that falls behind loses the oldest
//!   events (counted, and told), one that stops reading is closed.
//! * At its end the session sets its final record (its [`SessionRecord`]
//!   plus the text, DTMF digits and counts), which its subscribers get as
//!   `event: end`, and offers it to the webhook queue, delivered by
//!   threads of their own; it leaves the registry whatever way it ends.
//!
//! Cost on a session's hot path: per text piece, DTMF digit or state
//! change, one ring record (a few atomic stores) and, for text, a copy of
//! the piece into the session's own buffer; nothing per frame otherwise,
//! no allocation, no lock, no system call. Per session: the ring
//! (`events.ring_events` × 32 bytes) and the text buffer
//! (`events.max_text_bytes`), allocated at admission.
//!
//! [`SessionRecord`]: crate::session::record::SessionRecord

pub mod event;
pub mod hub;
pub mod relay;
pub mod ring;
pub mod webhook;

pub use crate::config::events::EventsConfig;
pub use event::{Event, SessionState};

/// Where sessions are listed and their events served
/// (`GET /v1/sessions/{id}/events`, [`crate::api::events`]); session
/// descriptions link to it.
pub const SESSIONS_PATH: &str = "/v1/sessions";
pub use hub::{Channel, EventHub, EventSink, SubscribeError, Subscription};
