//! moshid: the daemon's library (runtime, engine, transports, control API).
//!
//! The path of one frame: a transport on an I/O core decodes and cuts 80 ms
//! frames, pushes them through its lane to the engine thread, which steps
//! every stream of a phase group as one batch and sends each output back to
//! the stream's core, where it is encoded and sent.
//!
//! Layers, top to bottom; a module imports only from layers below its own
//! (and, within a layer, without a circle), which `daemon/tests/layers.rs`
//! checks:
//!
//! 1. start-up: `cli`, `runtime`, `agent`, `systemd`, `check_checkpoint`,
//!    `client` (`moshid client`), `backend`, `preflight`;
//! 2. [`api`]: the HTTP router and every control endpoint, `/metrics` and
//!    `/capacity`, session events, the page;
//! 3. [`transport`]: WebSocket chat, Media Streams, AudioSocket, SIP, RTP,
//!    around the session core they share ([`transport::link`],
//!    [`transport::line`], [`transport::ws_out`]);
//! 4. the per-core session API: [`tls`], [`app`] (what every session on a
//!    core reaches), [`io`] (accept, connections, mailboxes), [`events`],
//!    [`session`];
//! 5. [`config`] (every section and its validation);
//! 6. [`engine`];
//! 7. leaves: [`codec`], [`http`] parsing, [`metrics`] counters, [`heap`],
//!    [`protocol`] (the WebSocket message kinds), [`hub`], [`random_weights`]
//!    (the shapes served with random weights; it imports nothing of the
//!    daemon), and the frame constants below.
//!
//! Below them all, crates of their own: the telephony protocols
//! (`moshid-telephony`), the model (`moshid-model`), the GPU kernels
//! (`moshid-kernels`) and the frame lanes (`moshid-ringbuf`).

/// Samples per model frame (80 ms at 24 kHz).
pub const FRAME_SAMPLES: usize = 1920;
/// Model frame duration in milliseconds.
pub const FRAME_MS: f64 = 80.0;
/// The model's sample rate.
pub const SAMPLE_RATE_HZ: u32 = 24_000;

// The telephony protocols resample to and from this rate.
const _: () = assert!(moshid_telephony::MODEL_RATE_HZ == SAMPLE_RATE_HZ);

pub mod agent;
pub mod api;
pub mod app;
pub mod backend;
pub mod check_checkpoint;
pub mod cli;
pub mod client;
pub mod codec;
pub mod config;
pub mod engine;
pub mod events;
pub mod heap;
pub mod http;
pub mod hub;
pub mod io;
pub mod log_record;
pub mod metrics;
pub mod preflight;
pub mod protocol;
pub mod random_weights;
pub mod runtime;
pub mod session;
pub mod systemd;
pub mod tls;
pub mod transport;
