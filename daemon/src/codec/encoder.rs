//! `OggOpusEncoder`: 1920-sample (80 ms) 24 kHz mono frames in, Ogg pages out,
//! laid out as `sphn.OpusStreamWriter` (what Kyutai's clients expect) does.
//!
//! Wire layout (checked against sphn 0.2.1, see `tests/codec_sphn_interop.rs`):
//! - first call: page 0 `OpusHead` (BOS), page 1 `OpusTags`, then audio;
//! - each frame is encoded as two 960-sample (40 ms) Opus packets, each on its
//!   own page, so one call writes two pages (granule after each: +1920 at 48 kHz,
//!   i.e. cumulative 48 kHz samples, pre-skip included);
//! - libopus at 24 kHz, mono, application VOIP, default bitrate; no EOS page.
//!
//! Deliberate differences from sphn (readers ignore them): `OpusHead` pre-skip
//! is the encoder's real lookahead (312 at 48 kHz) instead of sphn's fixed
//! 3840, the input sample rate field says 24000 instead of 48000, and the
//! vendor string is "moshid". Non-finite input samples are encoded as 0.
//!
//! Nothing allocates after `new`; `encode_frame` writes into the caller's slice,
//! which must hold [`OggOpusEncoder::max_output_bytes_per_frame`] bytes.

use super::error::CodecError;
use super::ogg_writer::{
    ogg_page_bytes_for_packet, OggPageWriter, OGG_MAX_SINGLE_PAGE_PACKET_BYTES,
};
use super::opus_header::{write_opus_tags, OpusHead, OPUS_HEAD_BYTES, OPUS_TAGS_BYTES};
use super::{FRAME_SAMPLES, OPUS_GRANULE_RATE_HZ, SAMPLE_RATE_HZ};

/// Samples (24 kHz) per Opus packet: 40 ms, as sphn.
pub const ENCODER_PACKET_SAMPLES: usize = 960;
const PACKETS_PER_FRAME: usize = FRAME_SAMPLES / ENCODER_PACKET_SAMPLES;
const GRANULE_PER_PACKET_48K: u64 =
    (ENCODER_PACKET_SAMPLES as u64) * (OPUS_GRANULE_RATE_HZ / SAMPLE_RATE_HZ) as u64;
/// Default cap on one encoded packet: the RFC 6716 limit of one Opus frame,
/// far above any bitrate we use (255 kbit/s for 40 ms packets).
const OPUS_MAX_FRAME_BYTES: usize = 1275;

/// libopus coding mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpusApplication {
    /// Speech-optimised (what sphn and Kyutai's servers use).
    Voip,
    /// General audio.
    Audio,
}

/// Settings of one session's encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Ogg stream serial (sphn uses 42).
    pub serial: u32,
    pub application: OpusApplication,
    /// Target bitrate; `None` keeps libopus's default (as sphn).
    pub bitrate_bps: Option<i32>,
    /// Cap on one encoded packet (libopus lowers quality to fit).
    pub max_packet_bytes: usize,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        Self {
            serial: 42,
            application: OpusApplication::Voip,
            bitrate_bps: None,
            max_packet_bytes: OPUS_MAX_FRAME_BYTES,
        }
    }
}

/// Per-session Ogg Opus encoder.
pub struct OggOpusEncoder {
    opus: opus::Encoder,
    pages: OggPageWriter,
    head: OpusHead,
    packet: Box<[u8]>,
    pcm: Box<[f32]>,
    headers_written: bool,
    granule_48k: u64,
}

impl OggOpusEncoder {
    pub fn new(config: EncoderConfig) -> Result<Self, CodecError> {
        if config.max_packet_bytes == 0
            || config.max_packet_bytes > OGG_MAX_SINGLE_PAGE_PACKET_BYTES
        {
            return Err(CodecError::InvalidConfig(
                "encoder max_packet_bytes out of range",
            ));
        }
        let application = match config.application {
            OpusApplication::Voip => opus::Application::Voip,
            OpusApplication::Audio => opus::Application::Audio,
        };
        let mut opus = opus::Encoder::new(SAMPLE_RATE_HZ, opus::Channels::Mono, application)
            .map_err(CodecError::opus_init)?;
        if let Some(bps) = config.bitrate_bps {
            opus.set_bitrate(opus::Bitrate::Bits(bps))
                .map_err(CodecError::opus_init)?;
        }
        let lookahead_samples = opus.get_lookahead().map_err(CodecError::opus_init)?;
        let scale = (OPUS_GRANULE_RATE_HZ / SAMPLE_RATE_HZ) as i32;
        let pre_skip_48k = u16::try_from(lookahead_samples.max(0) * scale).unwrap_or(u16::MAX);
        Ok(Self {
            opus,
            pages: OggPageWriter::new(config.serial),
            head: OpusHead {
                version: 1,
                channel_count: 1,
                pre_skip_48k,
                input_sample_rate_hz: SAMPLE_RATE_HZ,
                output_gain_q8_db: 0,
                mapping_family: 0,
            },
            packet: vec![0u8; config.max_packet_bytes].into_boxed_slice(),
            pcm: vec![0f32; ENCODER_PACKET_SAMPLES].into_boxed_slice(),
            headers_written: false,
            granule_48k: 0,
        })
    }

    /// The `OpusHead` this encoder writes.
    pub fn head(&self) -> &OpusHead {
        &self.head
    }

    /// Granule position (48 kHz samples) after the last page written.
    pub fn granule_position_48k(&self) -> u64 {
        self.granule_48k
    }

    /// Bytes `encode_frame` may write in one call (the first call, with headers).
    pub fn max_output_bytes_per_frame(&self) -> usize {
        ogg_page_bytes_for_packet(OPUS_HEAD_BYTES)
            + ogg_page_bytes_for_packet(OPUS_TAGS_BYTES)
            + PACKETS_PER_FRAME * ogg_page_bytes_for_packet(self.packet.len())
    }

    /// Encodes one 80 ms frame and writes the resulting pages (preceded by the
    /// header pages on the first call) at the start of `out`; returns the byte
    /// count, which is never 0. `out` must hold `max_output_bytes_per_frame()`
    /// bytes, checked before anything is encoded so that state never advances
    /// on error. Send `0x01` followed by these bytes as one message.
    pub fn encode_frame(
        &mut self,
        frame: &[f32; FRAME_SAMPLES],
        out: &mut [u8],
    ) -> Result<usize, CodecError> {
        let required_bytes = self.max_output_bytes_per_frame();
        if out.len() < required_bytes {
            return Err(CodecError::OutputTooSmall {
                available_bytes: out.len(),
                required_bytes,
            });
        }
        let mut written = 0;
        if !self.headers_written {
            let mut head = [0u8; OPUS_HEAD_BYTES];
            self.head.write(&mut head);
            written += self.pages.write_page(&mut out[written..], &head, 0, 0)?;
            let mut tags = [0u8; OPUS_TAGS_BYTES];
            write_opus_tags(&mut tags);
            written += self.pages.write_page(&mut out[written..], &tags, 0, 0)?;
            self.headers_written = true;
        }
        for chunk in frame.chunks_exact(ENCODER_PACKET_SAMPLES) {
            // Encoded where it lies; only a packet holding a non-finite
            // sample is copied, to encode those as 0.
            let pcm: &[f32] = if chunk.iter().all(|s| s.is_finite()) {
                chunk
            } else {
                for (dst, &src) in self.pcm.iter_mut().zip(chunk) {
                    *dst = if src.is_finite() { src } else { 0.0 };
                }
                &self.pcm
            };
            let packet_bytes = self
                .opus
                .encode_float(pcm, &mut self.packet)
                .map_err(CodecError::opus_encode)?;
            self.granule_48k += GRANULE_PER_PACKET_48K;
            written += self.pages.write_page(
                &mut out[written..],
                &self.packet[..packet_bytes],
                self.granule_48k,
                0,
            )?;
        }
        Ok(written)
    }
}
