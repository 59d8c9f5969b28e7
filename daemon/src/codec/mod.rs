//! Audio codec layer of the WebSocket transport: Ogg Opus in both directions.
//!
//! Kyutai's protocol carries audio in binary messages of kind `0x01` whose
//! payload is a run of bytes of one Ogg Opus stream (24 kHz mono source;
//! `OpusHead` and `OpusTags` pages first). Clients send page bytes as they are
//! produced, so a message may hold part of a page or several pages; the
//! official server feeds every payload to `sphn.OpusStreamReader` and sends
//! whatever pages `sphn.OpusStreamWriter` produced for each 80 ms frame.
//!
//! - [`OggOpusDecoder`]: payload bytes in (any split), 24 kHz mono f32 out.
//! - [`FrameCutter`]: decoded PCM in, complete [`FRAME_SAMPLES`] frames out.
//! - [`OggOpusEncoder`]: [`FRAME_SAMPLES`] frames in, Ogg pages out, laid out
//!   as sphn does (see `encoder.rs`).
//!
//! Invariants shared by all of them:
//! - All memory is per session and allocated in `new`, sized from the bounds
//!   in [`DecoderConfig`] / [`EncoderConfig`]; the steady state (push bytes,
//!   decode, cut, encode) never allocates. A client sending garbage cannot make
//!   a session buffer more than `max_buffered_bytes`.
//! - No input panics; errors are typed ([`CodecError`]), concern one session,
//!   and are final for that session's stream.
//! - Sample counts are 24 kHz samples unless a name says `_48k` (Ogg granule
//!   positions and `OpusHead` pre-skip are in 48 kHz samples).
//!
//! The Ogg layer is hand-written rather than taken from the `ogg` crate
//! because that crate allocates on the hot path: its `PacketReader` needs a
//! blocking `Read + Seek` source and allocates a `Vec` for every page's
//! segment table and body and for every packet, its `BasePacketReader` is fed
//! pages built from owned `Vec`s, and its `PacketWriter` allocates per page.
//! Here pages are parsed in place from one fixed buffer, packets assembled in
//! another, and pages written straight into the caller's slice.

mod decoder;
mod encoder;
mod error;
mod frame_cutter;
pub mod ogg_crc;
pub mod ogg_reader;
pub mod ogg_writer;
pub mod opus_header;
pub mod resample;

pub use decoder::{DecoderConfig, OggOpusDecoder};
pub use encoder::{EncoderConfig, OggOpusEncoder, OpusApplication, ENCODER_PACKET_SAMPLES};
pub use error::{CodecError, OpusFailure, OpusHeadError};
pub use frame_cutter::{FrameCutter, DEFAULT_CUTTER_CAPACITY_SAMPLES};

/// Sample rate of the PCM the codec layer takes and returns (Mimi's rate).
pub const SAMPLE_RATE_HZ: u32 = 24_000;
/// Samples per model frame: 80 ms at 24 kHz.
pub const FRAME_SAMPLES: usize = 1920;
/// Rate of Ogg Opus granule positions and pre-skip, whatever the coded rate.
pub const OPUS_GRANULE_RATE_HZ: u32 = 48_000;
/// Most samples one Opus packet decodes to at 24 kHz (120 ms).
pub const MAX_PACKET_SAMPLES: usize = 2880;
