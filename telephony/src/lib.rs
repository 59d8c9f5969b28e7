//! Telephony protocols, without I/O: what moshid's telephony transports
//! (RTP, SIP, AudioSocket, Media Streams) speak on the wire, apart from the
//! sessions that carry it.
//!
//! * Audio: G.711 μ-law and A-law ([`g711`]), L16 ([`l16`]), Opus at the
//!   RTP layer's rates ([`codec`]), fixed-chunk resampling to and from the
//!   model's 24 kHz ([`resample`]).
//! * [`rtp`]: RFC 3550 packets, extended sequence numbers and timestamps,
//!   the jitter buffer and its loss concealment, RFC 4733 DTMF, the paced
//!   sender's packets and the release clock's arithmetic.
//! * [`sip`]: RFC 3261 messages, URIs, TCP framing, digest authentication
//!   (headers, responses, signed nonces), responses and requests built,
//!   server transactions, SDP offer/answer.
//! * [`audiosocket`]: Asterisk AudioSocket framing; [`media_streams`]: the
//!   JSON events of Twilio-style Media Streams.
//!
//! A crate of its own so that Cargo keeps the direction: the protocols know
//! nothing of the daemon (no sockets, executors, engine or configuration),
//! and the daemon's transports build their sessions on them.
//!
//! Invariants: every codec and resampler is made once per session; per
//! packet and per frame nothing allocates; every parser returns an error
//! for bad input, never panics (the parsers are fuzzed, `fuzz/`).

pub mod audiosocket;
pub mod codec;
pub mod g711;
pub mod l16;
pub mod media_streams;
pub mod resample;
pub mod rtp;
pub mod sip;

pub use codec::{CodecError, CodecKind, CodecSpec, MediaDecoder, MediaEncoder};
pub use resample::FrameResampler;

/// The model's sample rate, which resamplers convert to and from and Opus
/// runs at (the daemon checks at compile time that it is its own).
pub const MODEL_RATE_HZ: u32 = 24_000;
