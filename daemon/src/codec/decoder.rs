//! `OggOpusDecoder`: a client's Ogg Opus byte stream in, 24 kHz mono f32 out.
//!
//! Usage per received 0x01 payload (pull model, nothing allocates):
//! ```ignore
//! decoder.push_bytes(payload)?;
//! while let Some(pcm) = decoder.next_pcm()? { /* feed a FrameCutter */ }
//! ```
//! Invariants:
//! - The stream must start with `OpusHead` then `OpusTags` (RFC 7845); every
//!   later packet is audio (no magic sniffing: an audio packet may start with
//!   the bytes "OpusHead"). A chained stream (new BOS page) restarts this.
//! - `OpusHead`: major version 0, mapping family 0, 1 or 2 channels. Stereo is
//!   downmixed to mono by libopus (a mono decoder decodes any Opus packet). The
//!   output gain is applied; the input sample rate is informative only.
//! - Pre-skip: with `trim_pre_skip` the first `ceil(pre_skip_48k / 2)` samples
//!   are dropped, as RFC 7845 requires. sphn's reader (the official server)
//!   does not trim, so `trim_pre_skip: false` reproduces it sample for sample.
//!   End trimming (EOS granule) is not done: live streams do not end cleanly.
//! - Each `next_pcm` returns the output of one packet: at most
//!   [`MAX_PACKET_SAMPLES`] (120 ms), never empty. Pacing is the caller's: a
//!   small packet can decode to 120 ms, so the transport should bound decoded
//!   audio against wall-clock time if clients are untrusted.
//! - Errors (other than `BufferFull`) are final: later calls return
//!   [`CodecError::StreamFailed`].

use super::error::CodecError;
use super::ogg_reader::{OggPacketReader, OggReaderConfig, OGG_MAX_PAGE_BYTES};
use super::opus_header::{OpusHead, OPUS_HEAD_MAGIC, OPUS_TAGS_MAGIC};
use super::{MAX_PACKET_SAMPLES, SAMPLE_RATE_HZ};

/// Bounds and behaviour of one session's decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Largest accepted Ogg page, header included.
    pub max_page_bytes: usize,
    /// Largest accepted packet (audio or header), possibly spanning pages.
    pub max_packet_bytes: usize,
    /// Input buffer capacity; must be at least `max_page_bytes`. The transport
    /// should cap WebSocket messages at `max_buffered_bytes - max_page_bytes`
    /// (a drained decoder holds less than one page).
    pub max_buffered_bytes: usize,
    /// Drop the `OpusHead` pre-skip from the start of the output.
    pub trim_pre_skip: bool,
}

impl Default for DecoderConfig {
    fn default() -> Self {
        Self {
            max_page_bytes: OGG_MAX_PAGE_BYTES,
            max_packet_bytes: 16 * 1024,
            max_buffered_bytes: 128 * 1024,
            trim_pre_skip: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeaderState {
    ExpectOpusHead,
    ExpectOpusTags,
    Audio,
}

/// Outcome of consuming one packet.
enum Step {
    NeedBytes,
    NoOutput,
    Pcm { start: usize, end: usize },
}

/// Per-session Ogg Opus decoder.
pub struct OggOpusDecoder {
    ogg: OggPacketReader,
    opus: opus::Decoder,
    pcm: Box<[f32]>,
    state: HeaderState,
    head: Option<OpusHead>,
    trim_pre_skip: bool,
    pre_skip_left_samples: usize,
    output_samples: u64,
    failed: bool,
}

impl OggOpusDecoder {
    pub fn new(config: DecoderConfig) -> Result<Self, CodecError> {
        let ogg = OggPacketReader::new(OggReaderConfig {
            max_page_bytes: config.max_page_bytes,
            max_packet_bytes: config.max_packet_bytes,
            max_buffered_bytes: config.max_buffered_bytes,
        })?;
        let opus = opus::Decoder::new(SAMPLE_RATE_HZ, opus::Channels::Mono)
            .map_err(CodecError::opus_init)?;
        Ok(Self {
            ogg,
            opus,
            pcm: vec![0f32; MAX_PACKET_SAMPLES].into_boxed_slice(),
            state: HeaderState::ExpectOpusHead,
            head: None,
            trim_pre_skip: config.trim_pre_skip,
            pre_skip_left_samples: 0,
            output_samples: 0,
            failed: false,
        })
    }

    /// Forgets the stream (for reuse by a new session); keeps the buffers.
    pub fn reset(&mut self) -> Result<(), CodecError> {
        self.ogg.reset();
        self.opus.reset_state().map_err(CodecError::opus_init)?;
        self.state = HeaderState::ExpectOpusHead;
        self.head = None;
        self.pre_skip_left_samples = 0;
        self.output_samples = 0;
        self.failed = false;
        Ok(())
    }

    /// The current stream's `OpusHead`, once seen.
    pub fn head(&self) -> Option<&OpusHead> {
        self.head.as_ref()
    }

    /// Samples returned by `next_pcm` so far.
    pub fn output_samples(&self) -> u64 {
        self.output_samples
    }

    /// Bytes received but not yet decoded.
    pub fn buffered_bytes(&self) -> usize {
        self.ogg.buffered_bytes()
    }

    /// Appends a run of Ogg stream bytes of any length. Call `next_pcm` until
    /// it returns `None` before pushing again, or the buffer may fill up.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Result<(), CodecError> {
        if self.failed {
            return Err(CodecError::StreamFailed);
        }
        self.ogg.push_bytes(bytes)
    }

    /// Decoded 24 kHz mono PCM of the next audio packet, or `None` when more
    /// bytes are needed. The slice is valid until the next call.
    pub fn next_pcm(&mut self) -> Result<Option<&[f32]>, CodecError> {
        if self.failed {
            return Err(CodecError::StreamFailed);
        }
        loop {
            match self.step() {
                Ok(Step::NeedBytes) => return Ok(None),
                Ok(Step::NoOutput) => continue,
                Ok(Step::Pcm { start, end }) => {
                    self.output_samples += (end - start) as u64;
                    return Ok(Some(&self.pcm[start..end]));
                }
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            }
        }
    }

    fn step(&mut self) -> Result<Step, CodecError> {
        let Some(packet) = self.ogg.next_packet()? else {
            return Ok(Step::NeedBytes);
        };
        if packet.starts_stream {
            self.state = HeaderState::ExpectOpusHead;
        }
        match self.state {
            HeaderState::ExpectOpusHead => {
                if !packet.data.starts_with(OPUS_HEAD_MAGIC) {
                    return Err(CodecError::MissingOpusHead);
                }
                let head = OpusHead::parse(packet.data)?;
                self.opus.reset_state().map_err(CodecError::opus_init)?;
                self.opus
                    .set_gain(i32::from(head.output_gain_q8_db))
                    .map_err(CodecError::opus_init)?;
                self.pre_skip_left_samples = if self.trim_pre_skip {
                    usize::from(head.pre_skip_48k).div_ceil(2)
                } else {
                    0
                };
                self.head = Some(head);
                self.state = HeaderState::ExpectOpusTags;
                Ok(Step::NoOutput)
            }
            HeaderState::ExpectOpusTags => {
                if !packet.data.starts_with(OPUS_TAGS_MAGIC) {
                    return Err(CodecError::MissingOpusTags);
                }
                self.state = HeaderState::Audio;
                Ok(Step::NoOutput)
            }
            HeaderState::Audio => {
                // An empty slice would ask libopus for 120 ms of concealment.
                if packet.data.is_empty() {
                    return Err(CodecError::EmptyPacket);
                }
                let decoded = self
                    .opus
                    .decode_float(packet.data, &mut self.pcm, false)
                    .map_err(CodecError::opus_decode)?;
                let decoded = decoded.min(self.pcm.len());
                let skip = decoded.min(self.pre_skip_left_samples);
                self.pre_skip_left_samples -= skip;
                if skip == decoded {
                    Ok(Step::NoOutput)
                } else {
                    Ok(Step::Pcm {
                        start: skip,
                        end: decoded,
                    })
                }
            }
        }
    }
}
