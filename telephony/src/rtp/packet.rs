//! RTP packets (RFC 3550 §5.1): parsing what arrives, writing what we send,
//! and telling RTCP apart when it shares the port (RFC 5761 §4).
//!
//! Parsing accepts version 2 only and skips what this daemon does not use:
//! the CSRC list, a header extension (RFC 3550 §5.3.1 / RFC 8285; its
//! length is honoured) and padding (the last byte counts the padding bytes,
//! itself included). It borrows the payload from the datagram: no copy, no
//! allocation.
//!
//! RTCP: on a muxed port, packets whose second byte is 192–223 (RTCP packet
//! types 200–204 SR/RR/SDES/BYE/APP plus the RFC 5761 reserved range, which
//! RTP payload types 64–95 would collide with) are RTCP. This daemon
//! recognises them and ignores them (counted): it neither needs the sender
//! reports (the jitter buffer measures arrival itself) nor sends RTCP.

/// Bytes of the fixed RTP header.
pub const HEADER_BYTES: usize = 12;

/// Why a datagram is not an RTP packet we accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Shorter than the headers it announces.
    #[error("truncated packet")]
    Truncated,
    /// Not RTP version 2.
    #[error("RTP version {0}, not 2")]
    Version(u8),
    /// The padding count is zero or exceeds the payload.
    #[error("bad padding")]
    Padding,
}

/// A parsed RTP packet borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtpPacket<'a> {
    /// Marker bit.
    pub marker: bool,
    /// Payload type (7 bits).
    pub payload_type: u8,
    /// Sequence number.
    pub sequence: u16,
    /// Timestamp.
    pub timestamp: u32,
    /// Synchronisation source.
    pub ssrc: u32,
    /// The payload, without padding.
    pub payload: &'a [u8],
}

/// Whether a datagram on an RTP/RTCP-muxed port is RTCP (RFC 5761 §4).
pub fn is_rtcp(datagram: &[u8]) -> bool {
    datagram.len() >= 8 && datagram[0] >> 6 == 2 && (192..=223).contains(&datagram[1])
}

/// Parses an RTP packet.
pub fn parse(datagram: &[u8]) -> Result<RtpPacket<'_>, ParseError> {
    if datagram.len() < HEADER_BYTES {
        return Err(ParseError::Truncated);
    }
    let b0 = datagram[0];
    let version = b0 >> 6;
    if version != 2 {
        return Err(ParseError::Version(version));
    }
    let padding = b0 & 0x20 != 0;
    let extension = b0 & 0x10 != 0;
    let csrc_count = (b0 & 0x0F) as usize;
    let b1 = datagram[1];
    let mut start = HEADER_BYTES + 4 * csrc_count;
    if datagram.len() < start {
        return Err(ParseError::Truncated);
    }
    if extension {
        if datagram.len() < start + 4 {
            return Err(ParseError::Truncated);
        }
        let words = u16::from_be_bytes([datagram[start + 2], datagram[start + 3]]) as usize;
        start += 4 + 4 * words;
        if datagram.len() < start {
            return Err(ParseError::Truncated);
        }
    }
    let mut end = datagram.len();
    if padding {
        let pad = datagram[end - 1] as usize;
        if pad == 0 || pad > end - start {
            return Err(ParseError::Padding);
        }
        end -= pad;
    }
    Ok(RtpPacket {
        marker: b1 & 0x80 != 0,
        payload_type: b1 & 0x7F,
        sequence: u16::from_be_bytes([datagram[2], datagram[3]]),
        timestamp: u32::from_be_bytes([datagram[4], datagram[5], datagram[6], datagram[7]]),
        ssrc: u32::from_be_bytes([datagram[8], datagram[9], datagram[10], datagram[11]]),
        payload: &datagram[start..end],
    })
}

/// Writes a 12-byte header (version 2, no padding, extension or CSRC) into
/// `out[..12]`.
pub fn write_header(
    out: &mut [u8],
    marker: bool,
    payload_type: u8,
    sequence: u16,
    timestamp: u32,
    ssrc: u32,
) {
    out[0] = 0x80;
    out[1] = ((marker as u8) << 7) | (payload_type & 0x7F);
    out[2..4].copy_from_slice(&sequence.to_be_bytes());
    out[4..8].copy_from_slice(&timestamp.to_be_bytes());
    out[8..12].copy_from_slice(&ssrc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut buf = [0u8; 16];
        write_header(&mut buf, true, 0, 65535, 0xDEAD_BEEF, 42);
        buf[12..].copy_from_slice(&[1, 2, 3, 4]);
        let p = parse(&buf).unwrap();
        assert!(p.marker);
        assert_eq!(
            (p.payload_type, p.sequence, p.timestamp, p.ssrc),
            (0, 65535, 0xDEAD_BEEF, 42)
        );
        assert_eq!(p.payload, &[1, 2, 3, 4]);
        assert!(!is_rtcp(&buf));
    }

    #[test]
    fn csrc_extension_and_padding_are_skipped() {
        let mut buf = Vec::new();
        // V=2, P=1, X=1, CC=2; PT 8.
        buf.extend_from_slice(&[0b1011_0010, 8, 0, 7, 0, 0, 0, 160, 0, 0, 0, 9]);
        buf.extend_from_slice(&[0xAA; 8]); // two CSRCs
        buf.extend_from_slice(&[0xBE, 0xDE, 0, 1, 0x11, 0x22, 0x33, 0x44]); // extension, one word
        buf.extend_from_slice(&[5, 6, 7]); // payload
        buf.extend_from_slice(&[0, 0, 3]); // three bytes of padding
        let p = parse(&buf).unwrap();
        assert_eq!(
            (p.payload_type, p.sequence, p.timestamp, p.ssrc),
            (8, 7, 160, 9)
        );
        assert_eq!(p.payload, &[5, 6, 7]);
    }

    #[test]
    fn bad_packets_are_refused() {
        assert_eq!(parse(&[0x80; 11]), Err(ParseError::Truncated));
        assert_eq!(parse(&[0x40; 12]), Err(ParseError::Version(1)));
        let mut bad_pad = [0u8; 13];
        bad_pad[0] = 0xA0;
        bad_pad[12] = 5;
        assert_eq!(parse(&bad_pad), Err(ParseError::Padding));
        let mut cc = [0u8; 12];
        cc[0] = 0x81;
        assert_eq!(parse(&cc), Err(ParseError::Truncated));
    }

    #[test]
    fn rtcp_is_recognised() {
        // A receiver report header (PT 201) and a sender report (200).
        assert!(is_rtcp(&[0x81, 201, 0, 7, 0, 0, 0, 1]));
        assert!(is_rtcp(&[0x80, 200, 0, 6, 0, 0, 0, 1, 0, 0, 0, 0]));
        // RTP payload type 72 with the marker set has second byte 200 too:
        // RFC 5761 forbids payload types 64–95 on a muxed port for that reason.
        assert!(!is_rtcp(&[0x80, 0x60, 0, 1, 0, 0, 0, 0]));
    }
}
