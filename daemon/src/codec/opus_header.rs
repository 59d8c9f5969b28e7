//! Ogg Opus header packets (RFC 7845 §5): `OpusHead` parsing and writing,
//! `OpusTags` writing (received tags are only checked for their magic).

use super::error::OpusHeadError;

pub const OPUS_HEAD_MAGIC: &[u8; 8] = b"OpusHead";
pub const OPUS_TAGS_MAGIC: &[u8; 8] = b"OpusTags";
/// Size of an `OpusHead` with channel mapping family 0.
pub const OPUS_HEAD_BYTES: usize = 19;

/// Vendor string of the `OpusTags` packet we write.
pub const OPUS_TAGS_VENDOR: &str = "moshid";
/// Size of our `OpusTags`: magic, vendor length, vendor, comment count.
pub const OPUS_TAGS_BYTES: usize = 8 + 4 + OPUS_TAGS_VENDOR.len() + 4;

/// The identification header of an Ogg Opus stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpusHead {
    pub version: u8,
    pub channel_count: u8,
    /// Samples at 48 kHz to drop from the start of the decoded stream.
    pub pre_skip_48k: u16,
    /// Sample rate of the original input; informative only.
    pub input_sample_rate_hz: u32,
    /// Gain to apply on output, Q7.8 dB.
    pub output_gain_q8_db: i16,
    pub mapping_family: u8,
}

impl OpusHead {
    /// Parses and validates: major version 0, mapping family 0, 1 or 2 channels.
    /// Bytes after the 19th are ignored (allowed by RFC 7845 for minor versions).
    pub fn parse(packet: &[u8]) -> Result<Self, OpusHeadError> {
        if packet.len() < OPUS_HEAD_BYTES {
            return Err(OpusHeadError::TooShort {
                len_bytes: packet.len(),
            });
        }
        let head = Self {
            version: packet[8],
            channel_count: packet[9],
            pre_skip_48k: u16::from_le_bytes([packet[10], packet[11]]),
            input_sample_rate_hz: u32::from_le_bytes([
                packet[12], packet[13], packet[14], packet[15],
            ]),
            output_gain_q8_db: i16::from_le_bytes([packet[16], packet[17]]),
            mapping_family: packet[18],
        };
        if head.version >> 4 != 0 {
            return Err(OpusHeadError::UnsupportedVersion {
                version: head.version,
            });
        }
        if head.mapping_family != 0 {
            return Err(OpusHeadError::UnsupportedMappingFamily {
                family: head.mapping_family,
            });
        }
        if !(1..=2).contains(&head.channel_count) {
            return Err(OpusHeadError::UnsupportedChannelCount {
                channel_count: head.channel_count,
            });
        }
        Ok(head)
    }

    /// Serialises with mapping family 0.
    pub fn write(&self, out: &mut [u8; OPUS_HEAD_BYTES]) {
        out[0..8].copy_from_slice(OPUS_HEAD_MAGIC);
        out[8] = self.version;
        out[9] = self.channel_count;
        out[10..12].copy_from_slice(&self.pre_skip_48k.to_le_bytes());
        out[12..16].copy_from_slice(&self.input_sample_rate_hz.to_le_bytes());
        out[16..18].copy_from_slice(&self.output_gain_q8_db.to_le_bytes());
        out[18] = self.mapping_family;
    }
}

/// Writes our `OpusTags` packet (vendor [`OPUS_TAGS_VENDOR`], no comments).
pub fn write_opus_tags(out: &mut [u8; OPUS_TAGS_BYTES]) {
    let vendor = OPUS_TAGS_VENDOR.as_bytes();
    out[0..8].copy_from_slice(OPUS_TAGS_MAGIC);
    out[8..12].copy_from_slice(&(vendor.len() as u32).to_le_bytes());
    out[12..12 + vendor.len()].copy_from_slice(vendor);
    out[12 + vendor.len()..].copy_from_slice(&0u32.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OpusHead sphn 0.2 writes.
    const SPHN_HEAD: [u8; 19] = *b"OpusHead\x01\x01\x00\x0f\x80\xbb\x00\x00\x00\x00\x00";

    #[test]
    fn parses_sphn_head_and_writes_it_back() {
        let head = OpusHead::parse(&SPHN_HEAD).unwrap();
        assert_eq!(head.pre_skip_48k, 3840);
        assert_eq!(head.input_sample_rate_hz, 48_000);
        assert_eq!(head.channel_count, 1);
        let mut out = [0u8; OPUS_HEAD_BYTES];
        head.write(&mut out);
        assert_eq!(out, SPHN_HEAD);
    }

    #[test]
    fn rejects_unsupported_heads() {
        let with = |i: usize, v: u8| {
            let mut h = SPHN_HEAD;
            h[i] = v;
            OpusHead::parse(&h)
        };
        assert_eq!(
            OpusHead::parse(&SPHN_HEAD[..18]),
            Err(OpusHeadError::TooShort { len_bytes: 18 })
        );
        assert_eq!(
            with(8, 0x10),
            Err(OpusHeadError::UnsupportedVersion { version: 0x10 })
        );
        assert!(with(8, 0x0f).is_ok());
        assert_eq!(
            with(9, 0),
            Err(OpusHeadError::UnsupportedChannelCount { channel_count: 0 })
        );
        assert_eq!(
            with(9, 3),
            Err(OpusHeadError::UnsupportedChannelCount { channel_count: 3 })
        );
        assert!(with(9, 2).is_ok());
        assert_eq!(
            with(18, 1),
            Err(OpusHeadError::UnsupportedMappingFamily { family: 1 })
        );
    }

    #[test]
    fn tags_layout() {
        let mut out = [0u8; OPUS_TAGS_BYTES];
        write_opus_tags(&mut out);
        assert_eq!(&out[..8], OPUS_TAGS_MAGIC);
        assert_eq!(&out[8..12], &6u32.to_le_bytes());
        assert_eq!(&out[12..18], b"moshid");
        assert_eq!(&out[18..], &[0, 0, 0, 0]);
    }
}
