//! Typed errors of the codec layer.
//!
//! Every error concerns one session's stream only: the transport closes that
//! session (or reports the error to it) and nothing else is affected. No input
//! makes the codec panic. Once a decoder or reader has returned an error other
//! than [`CodecError::BufferFull`], its stream is unusable and every further
//! call returns [`CodecError::StreamFailed`].

use thiserror::Error;

/// What is wrong with an `OpusHead` identification header (RFC 7845 §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum OpusHeadError {
    #[error("OpusHead is {len_bytes} bytes, at least 19 are required")]
    TooShort { len_bytes: usize },
    #[error("OpusHead major version {version:#04x} is not supported (major version must be 0)")]
    UnsupportedVersion { version: u8 },
    #[error(
        "OpusHead channel count {channel_count} is not supported (1 or 2 with mapping family 0)"
    )]
    UnsupportedChannelCount { channel_count: u8 },
    #[error("OpusHead channel mapping family {family} is not supported (only family 0)")]
    UnsupportedMappingFamily { family: u8 },
}

/// A libopus call that failed, and why (comparable, unlike `opus::Error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpusFailure {
    pub function: &'static str,
    pub code: opus::ErrorCode,
}

impl From<opus::Error> for OpusFailure {
    fn from(e: opus::Error) -> Self {
        Self {
            function: e.function(),
            code: e.code(),
        }
    }
}

impl std::fmt::Display for OpusFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {:?}", self.function, self.code)
    }
}

impl CodecError {
    pub(crate) fn opus_decode(e: opus::Error) -> Self {
        Self::OpusDecode(e.into())
    }
    pub(crate) fn opus_encode(e: opus::Error) -> Self {
        Self::OpusEncode(e.into())
    }
    pub(crate) fn opus_init(e: opus::Error) -> Self {
        Self::OpusInit(e.into())
    }
}

/// Errors of the Ogg paging and Opus stream layers.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodecError {
    /// A configuration value is out of range (programming error of the caller).
    #[error("invalid codec configuration: {0}")]
    InvalidConfig(&'static str),

    /// The chunk does not fit in the session's byte buffer. The chunk was not
    /// consumed and the stream stays usable: drain the decoder first, or
    /// configure a larger `max_buffered_bytes`.
    #[error("chunk of {incoming_bytes} bytes does not fit: {buffered_bytes} of {max_buffered_bytes} bytes already buffered")]
    BufferFull {
        buffered_bytes: usize,
        incoming_bytes: usize,
        max_buffered_bytes: usize,
    },

    /// The bytes where a page must start are not `OggS`.
    #[error("bad Ogg capture pattern {found:02x?} (expected \"OggS\")")]
    BadCapturePattern { found: [u8; 4] },
    #[error("unsupported Ogg stream structure version {version}")]
    UnsupportedOggVersion { version: u8 },
    #[error("Ogg page header type {header_type:#04x} has reserved bits set")]
    BadHeaderType { header_type: u8 },
    #[error("Ogg page of {page_bytes} bytes exceeds the limit of {max_page_bytes} bytes")]
    PageTooLarge {
        page_bytes: usize,
        max_page_bytes: usize,
    },
    #[error(
        "Ogg page {sequence}: CRC mismatch (page says {expected:#010x}, computed {computed:#010x})"
    )]
    CrcMismatch {
        sequence: u32,
        expected: u32,
        computed: u32,
    },
    #[error("Ogg page of serial {found:#010x} in stream {expected:#010x} (multiplexed streams are not supported)")]
    UnexpectedSerial { expected: u32, found: u32 },
    #[error("Ogg page sequence gap: expected page {expected}, got {found}")]
    SequenceGap { expected: u32, found: u32 },
    /// The page's "continued packet" flag disagrees with whether the previous
    /// page left a packet unfinished.
    #[error("Ogg page {sequence}: continued-packet flag is {page_continued} but a packet is {} pending", if *.packet_pending { "" } else { "not" })]
    ContinuationMismatch {
        sequence: u32,
        page_continued: bool,
        packet_pending: bool,
    },
    #[error("Ogg page {sequence} follows the end-of-stream page without starting a new stream")]
    PageAfterEndOfStream { sequence: u32 },
    #[error("Ogg packet exceeds the limit of {max_packet_bytes} bytes")]
    PacketTooLarge { max_packet_bytes: usize },

    #[error("first packet of the stream is not an OpusHead")]
    MissingOpusHead,
    #[error("bad OpusHead: {0}")]
    BadOpusHead(#[from] OpusHeadError),
    #[error("second packet of the stream is not OpusTags")]
    MissingOpusTags,
    #[error("empty Opus audio packet")]
    EmptyPacket,
    #[error("opus decode error: {0}")]
    OpusDecode(OpusFailure),
    #[error("opus encode error: {0}")]
    OpusEncode(OpusFailure),
    #[error("opus setup error: {0}")]
    OpusInit(OpusFailure),

    /// The caller's output buffer cannot hold what one call may write.
    #[error("output buffer of {available_bytes} bytes, {required_bytes} bytes required")]
    OutputTooSmall {
        available_bytes: usize,
        required_bytes: usize,
    },

    /// An earlier error made this stream unusable.
    #[error("stream failed earlier and cannot be used any more")]
    StreamFailed,
}
