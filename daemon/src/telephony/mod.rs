//! Telephony audio shared by the telephony transports (RTP now; AudioSocket
//! and Media Streams later): G.711 μ-law and A-law, L16, Opus at the RTP
//! layer's rates, and fixed-chunk resampling to and from the model's 24 kHz.
//!
//! Invariants: every codec and resampler is made once per session; per
//! packet and per frame nothing allocates.

pub mod codec;
pub mod g711;
pub mod l16;
pub mod resample;

pub use codec::{CodecError, CodecKind, CodecSpec, MediaDecoder, MediaEncoder};
pub use resample::FrameResampler;
