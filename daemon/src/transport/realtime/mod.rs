//! The OpenAI Realtime API on the shared listener, so that voice-agent
//! software built on it (the official SDKs' `realtime.connect`, Pipecat,
//! LiveKit Agents, telephony bridges) uses moshid unmodified:
//!
//! * `GET /v1/realtime` (WebSocket): a conversation with a Moshi-family
//!   model ([`conversation`]);
//! * `GET /v1/realtime/translations` (WebSocket): a continuous translation
//!   with a Hibiki model ([`translation`]).
//!
//! Both take the listener's TLS, token (`Authorization: Bearer`, or the
//! browsers' subprotocol `openai-insecure-api-key.<token>`), limits and
//! admission, as `/api/chat` does; `?model=` is accepted and not checked
//! (`session.created` reports the served model); the other query
//! parameters are every transport's session parameters, plus `responses`
//! (`turns` or `continuous`, [`responses`]).
//!
//! A full-duplex model behind a turn-shaped API — the choices, each
//! documented where it is made:
//!
//! * Responses: the model speaks whenever it wants; its continuous output
//!   is cut into responses by its text stream ([`responses`]).
//! * Cancel and barge-in: the response ends `cancelled`; the model cannot
//!   be stopped, so the rest of its utterance is not sent ([`responses`]).
//! * `instructions` and `voice`: the models served have no role or voice
//!   prompt, so they are refused with an `error` naming the field, never
//!   ignored ([`settings`]); so are tools, text input and transcription.
//! * Speech events: `server_vad` on the caller's audio ([`vad`]).
//!
//! Files: [`client_event`] (parsing, pure, fuzzed), [`settings`] (what
//! `session.update` may change), [`responses`] and [`vad`] (pure state),
//! [`audio`] (wire audio to model frames and back), [`wire`] (server events
//! framed in place), [`error`] (the `error` event), [`session`] (the loop,
//! set-up and end), [`conversation`] and [`translation`] (each endpoint's
//! events).
//!
//! Invariants: a connection never leaves the core that accepted it; a
//! session's data is every transport's: its events (SSE, webhook) under its
//! id and `sess_<id>`, its final record, stage metrics, frames measured for
//! phase as `/api/chat`'s, back-pressure through its socket; see
//! [`session`] for buffers and bounds.

pub mod audio;
pub mod client_event;
pub mod conversation;
pub mod error;
pub mod responses;
pub mod session;
pub mod settings;
pub mod translation;
pub mod vad;
pub mod wire;

pub use session::run;
pub use settings::Endpoint;
