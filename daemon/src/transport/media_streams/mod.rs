//! Media Streams: a bidirectional WebSocket of JSON events in Twilio's
//! shape (`<Connect><Stream url="wss://…/v1/media-stream"/></Connect>`), on
//! the shared listener at `/v1/media-stream`.
//!
//! The provider sends `connected`, `start` (stream id, `mediaFormat`
//! `audio/x-mulaw` 8000 Hz mono, `customParameters` → session parameters),
//! `media` (base64 G.711, usually 20 ms each), `mark`, `clear`, `dtmf` and
//! `stop`; the daemon answers with `media` events of 20 ms (160 bytes of
//! G.711, base64) paced at 20 ms, echoes marks once the audio before them
//! was sent, and flushes its queued audio on `clear` (barge-in).
//!
//! Files: `moshid_telephony::media_streams` (JSON in and out; pure) and
//! [`session`] (one stream). The audio path, packet queue, pacer and engine
//! link are shared with AudioSocket ([`crate::transport::line`],
//! [`crate::transport::link`]).
//!
//! Invariants: a connection never leaves the core that accepted it; a bad
//! event (bad JSON, bad base64, `media` before `start`, an unknown event)
//! ends only its own stream, with an `error` event and a close frame giving
//! the reason; see [`session`] for buffers and bounds.

pub mod session;

pub use session::run;
